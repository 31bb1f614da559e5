"""`bostudio daemon|tui|ps|stop`: the daemon, its terminal UI, and the models it runs."""

from __future__ import annotations

import argparse
import sys

from bostudio.cli.options import add_daemon_address, add_engine, add_pull, add_rpc, add_stall_timeout, json_flag
from bostudio.cli.output import print_json, report_unit


def _daemon_options(args: argparse.Namespace):
    from pathlib import Path

    from bostudio.daemon.http.limits import HttpLimits
    from bostudio.daemon.service import DaemonOptions
    from bostudio.daemon.supervise.supervisor import SupervisorOptions

    from bostudio.pairing.edge.fetch import resolve_pull_policy
    from bostudio.rpc.workers import select_workers, workers_from_config

    pull = resolve_pull_policy(args.pull, interactive=False)
    sup = SupervisorOptions(engine=args.engine, memory_budget=int(args.memory_budget * (1 << 20)),
                            idle_ttl=args.idle_ttl, stall_timeout=args.stall_timeout,
                            stream_idle_timeout=args.stream_idle_timeout, failed_cooldown=args.failed_cooldown,
                            prompt_reuse=not args.no_prompt_reuse, prompt_store_dir=args.prompt_store_dir,
                            prompt_store_bytes=int(args.prompt_store_mib * (1 << 20)),
                            max_body=int(args.max_body_mib * (1 << 20)),
                            pull="never" if pull == "ask" else pull,
                            workers=select_workers(args.rpc, workers_from_config()),
                            allow_any_model_path=args.allow_any_model_path,
                            context_overflow=args.context_overflow)
    limits = HttpLimits(header_timeout=args.header_timeout, keepalive_timeout=args.keepalive_timeout,
                        body_timeout=args.body_timeout, max_connections=args.max_connections,
                        max_header_bytes=int(args.max_header_kib * 1024), max_headers=args.max_headers)
    return DaemonOptions(host=args.host, port=args.port, require_token=args.require_token,
                         allow_hosts=tuple(args.allow_host), supervisor=sup, limits=limits,
                         record=str(Path(args.record).expanduser().resolve()) if getattr(args, "record", None) else None)


def _daemon_args(args: argparse.Namespace) -> list[str]:
    """The daemon options of this command line, to pass to a background daemon."""
    from pathlib import Path

    out = ["--memory-budget", str(args.memory_budget), "--idle-ttl", str(args.idle_ttl),
           "--stall-timeout", str(args.stall_timeout), "--stream-idle-timeout", str(args.stream_idle_timeout),
           "--failed-cooldown", str(args.failed_cooldown), "--prompt-store-mib", str(args.prompt_store_mib),
           "--max-body-mib", str(args.max_body_mib), "--header-timeout", str(args.header_timeout),
           "--keepalive-timeout", str(args.keepalive_timeout), "--body-timeout", str(args.body_timeout),
           "--max-connections", str(args.max_connections), "--max-header-kib", str(args.max_header_kib),
           "--max-headers", str(args.max_headers), "--context-overflow", args.context_overflow]
    out += ["--allow-any-model-path"] if args.allow_any_model_path else []
    out += ["--no-prompt-reuse"] if args.no_prompt_reuse else []
    out += ["--prompt-store-dir", args.prompt_store_dir] if args.prompt_store_dir else []
    out += ["--engine", args.engine] if args.engine else []
    out += ["--pull", args.pull] if args.pull else []
    out += ["--rpc", args.rpc] if args.rpc else []
    out += ["--record", str(Path(args.record).expanduser().resolve())] if getattr(args, "record", None) else []
    out += ["--require-token"] if args.require_token else []
    for h in args.allow_host:
        out += ["--allow-host", h]
    return out


def cmd_daemon(args: argparse.Namespace) -> int:
    from bostudio.daemon.service import run_daemon

    return run_daemon(_daemon_options(args))


def cmd_daemon_start(args: argparse.Namespace) -> int:
    from bostudio.daemon.service import start_background

    from bostudio.daemon import state

    # A daemon that already runs keeps the options it was started with (often by `launch` or `up`, with the
    # defaults): say so, or `daemon start --record DIR` would seem to record and save nothing.
    already = state.running()
    rec = start_background(_daemon_options(args), _daemon_args(args))
    if args.json:
        print_json({"pid": rec.pid, "url": rec.url, "base_url": rec.url + "/v1",
                    "already_running": already is not None})
    elif already is not None:
        print(f"bostudio daemon already running at {rec.url} (pid {rec.pid}); OpenAI base URL {rec.url}/v1\n"
              "  it keeps the options it was started with: to start it with this command line's, run "
              "`bostudio daemon stop` first")
    else:
        print(f"bostudio daemon running at {rec.url} (pid {rec.pid}); OpenAI base URL {rec.url}/v1")
    return 0


def cmd_daemon_stop(args: argparse.Namespace) -> int:
    from bostudio.daemon.service import stop_daemon

    rec = stop_daemon()
    if rec is None:
        print("bostudio daemon is not running")
        return 0
    print(f"bostudio daemon (pid {rec.pid}) stopped")
    return 0


def cmd_daemon_status(args: argparse.Namespace) -> int:
    from bostudio.daemon import state
    from bostudio.daemon.client import DaemonClient

    rec = state.running()
    if rec is None:
        if args.json:
            print_json({"running": False})
        else:
            print("bostudio daemon is not running (start it with `bostudio daemon start`)")
        return 3  # like systemctl: "not running"
    with DaemonClient(rec.url) as client:
        status = client.status()
    if args.json:
        print_json(dict(status, running=True, url=rec.url))
        return 0
    print(f"bostudio daemon {status['version']} running at {rec.url} (pid {rec.pid}, up {status['uptime_s']:.0f} s)")
    print(f"  OpenAI base URL : {rec.url}/v1")
    print(f"  memory budget   : {status['memory_budget_bytes'] >> 20} MiB; idle unload after {status['idle_ttl_s']:.0f} s")
    print(f"  also speaks     : Anthropic ({rec.url}/v1/messages), Ollama ({rec.url}/api), llama.cpp routes")
    store = status.get("prompt_store")
    if store:
        print(f"  saved prompts   : {len(store['entries'])} model state(s), {store['bytes'] >> 20} of "
              f"{store['cap_bytes'] >> 20} MiB in {store['dir']}")
    for name, st in sorted(status["instances"].items()):
        print(f"  {name}: {st}")
    return 0


def cmd_daemon_install(args: argparse.Namespace) -> int:
    from bostudio.daemon.service import install_unit

    platform = args.platform
    if platform == "auto":
        platform = "macos" if sys.platform == "darwin" else "linux"
    return report_unit(*install_unit(platform, args.host, args.port, write=not args.print), args.print)


def cmd_daemon_token(args: argparse.Namespace) -> int:
    from bostudio.daemon.http.security import create_token, read_token, token_path

    path = token_path()
    if args.new or read_token(path) is None:
        create_token(path)
    print(read_token(path) if args.show else path)
    return 0


def _fmt(value: object, spec: str = "", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def cmd_ps(args: argparse.Namespace) -> int:
    from bostudio.daemon.client import DaemonClient

    if args.watch:
        return _watch_ps(args.watch)
    with DaemonClient() as client:
        rows = client.instances()
    if args.json:
        print_json(rows)
        return 0
    return _print_ps(rows)


def _watch_ps(interval: float) -> int:
    """`ps --watch`: the table again every `interval` seconds until Ctrl-C (a long prefill, watched from a
    second terminal beside the agent)."""
    import time

    from bostudio.daemon.client import DaemonClient

    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
    try:
        with DaemonClient() as client:
            while True:
                rows = client.instances()
                print(clear + time.strftime("%H:%M:%S") + f"  every {interval:g} s, Ctrl-C stops")
                _print_ps(rows)
                sys.stdout.flush()
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _print_ps(rows: list[dict]) -> int:
    """`bostudio ps`'s table: a row per model, then what needs saying about it."""
    from bostudio.display import escape_terminal, prefill_line

    if not rows:
        print("no models loaded (the daemon loads one on the first request that names it)")
        return 0
    print(f"{'MODEL':32} {'STATE':10} {'PID':>7} {'PORT':>6} {'SPECULATION':14} {'TOK/S':>6} {'ACCEPT':>6} "
          f"{'MEAN LEN':>8} {'REQS':>5} {'PROMPTS':>16}")
    for r in rows:
        st = r["stats"]
        rate = st.get("acceptance_rate")
        print(f"{r['model'][:32]:32} {r['state']:10} {_fmt(r['pid']):>7} {_fmt(r['port']):>6} "
              f"{_fmt(r['speculation'])[:14]:14} {_fmt(st.get('decode_tok_s_avg'), '.1f'):>6} "
              f"{'-' if rate is None else format(100 * rate, '.0f') + '%':>6} "
              f"{_fmt(st.get('mean_accepted_length'), '.2f'):>8} {st['requests']:>5} {_prompts(r.get('prompts')):>16}")
        for p in r.get("prefill") or []:  # a prompt in progress, its rate and the time left
            print(f"  {escape_terminal(prefill_line(p))}")
        if r.get("chat_template", {}).get("is_fallback"):  # the model runs bostudio's fallback template: say so
            print(f"  chat template: {r['chat_template']['label']}")
        if st.get("context_trims"):
            print(f"  requests over the context, sent with earlier turns shortened: {st['context_trims']} "
                  "(--context-overflow)")
        if st.get("tool_calls_rescued"):
            print(f"  tool calls written as text and sent as calls: {st['tool_calls_rescued']} "
                  f"(of {st['requests']} requests)")
        if st.get("tool_calls_forced"):
            print(f"  tool calls written in a broken form, asked again with the call forced: "
                  f"{st['tool_calls_forced']} (of {st['requests']} requests)")
        if st.get("runaways_stopped"):
            print(f"  answers stopped in a loop (ended as the output limit ends them): {st['runaways_stopped']} "
                  f"(of {st['requests']} requests)")
        retry = r.get("retry")
        if retry:
            when = "" if retry.get("in_s") is None else f" (in {retry['in_s']:.0f} s)"
            print(f"  failed: {r['error']['message'] if r.get('error') else 'unknown'}; retried {retry['how']}{when}")
    for r in rows:  # speculation that does not pay on this workload (the daemon's break-even check)
        if r.get("spec_flagged"):
            print(f"  ! {r['model']}: {r['spec_check']['detail']} (break-even from {r['break_even_source']})")
        for refused in (r.get("tune_refused") or [])[:3]:
            print(f"  - {r['model']}: tune refused {refused['label']} ({refused['lost']}): {refused['why']}")
        if r.get("auto_off"):
            print(f"  ! {r['model']}: auto switched speculation for workload {r['auto_off']['workload']!r}: "
                  f"{r['auto_off']['reason']}")
        dl = r.get("draft_length")
        if dl and (dl.get("adapted") or (dl.get("advice") or {}).get("action") in ("shorter", "longer")):
            advice = dl.get("advice") or {}
            pending = (f"; next: {advice['n_max']} tokens when idle ({advice['detail']})"
                       if advice.get("action") in ("shorter", "longer") else "")
            print(f"  ~ {r['model']}: drafts of {dl['n_max']} tokens"
                  + (f" (adapted at run time: {dl['reason']})" if dl.get("adapted") else "") + pending)
    return 0


def _prompts(p: dict | None) -> str:
    """Saved prompt states of an instance: restored at its last load / saved at its last stop."""
    if not p:
        return "-"
    parts = []
    if p.get("restored_slots"):
        parts.append(f"{p['restored_tokens']}t restored")
    if p.get("saved_slots"):
        parts.append(f"{p['saved_tokens']}t saved")
    return ", ".join(parts) or "none saved"


def cmd_stop(args: argparse.Namespace) -> int:
    from bostudio.daemon.client import DaemonClient

    with DaemonClient() as client:
        inst = client.stop(args.model)
    if args.json:
        print_json(inst)
    else:
        print(f"{inst['model']}: {inst['state']}")
    return 0


def cmd_tui(args: argparse.Namespace) -> int:
    from bostudio.tui import run_tui

    return run_tui(getattr(args, "host", None), getattr(args, "port", None), tui_daemon_args(args))


def tui_daemon_args(args: argparse.Namespace) -> list[str]:
    """The options the TUI gives a daemon it starts: the engine, and the pull policy for hub drafters
    (the daemon loads the models the TUI launches, so the policy is the daemon's)."""
    extra = ["--engine", args.engine] if getattr(args, "engine", None) else []
    return extra + (["--pull", args.pull] if getattr(args, "pull", None) else [])


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """daemon (run it, or manage a background one) and tui, its client that starts one."""
    from bostudio.daemon import DEFAULT_HOST, DEFAULT_PORT

    common = argparse.ArgumentParser(add_help=False)
    add_daemon_address(common, f"address to bind (default {DEFAULT_HOST}; any other address needs a token, see "
                                "`daemon token`)", f"port (default {DEFAULT_PORT})")
    add_engine(common, "llama-server binary for every instance")
    common.add_argument("--memory-budget", type=float, default=0, metavar="MIB",
                        help="memory the loaded models may use together; the least recently used is unloaded "
                             "to make room (default 0: 80%% of RAM)")
    common.add_argument("--idle-ttl", type=float, default=600, metavar="S",
                        help="unload a model idle for S seconds (default 600; 0: never)")
    add_stall_timeout(common, 120)
    add_pull(common, "may a drafter the pairing table names be downloaded from the hub when a model loads? "
                     "(default: [pull] policy in config.toml, else never; `ask` counts as never, as no one "
                     "can answer in a daemon)")
    common.add_argument("--stream-idle-timeout", type=float, default=300, metavar="S",
                        help="end a response whose body stalls for S seconds mid-stream with an error "
                             "(default 300; 0: never)")
    common.add_argument("--failed-cooldown", type=float, default=60, metavar="S",
                        help="retry a failed model on the next request after S seconds (default 60; 0: only "
                             "on an explicit restart); `bostudio ps` says when")
    common.add_argument("--context-overflow", choices=("trim", "refuse"), default="trim",
                        help="a conversation longer than the model's context: `trim` elides the middle of its "
                             "longest earlier texts until it fits, leaving a marker (default; the agent's own "
                             "transcript is untouched); `refuse` answers 400 with the numbers")
    common.add_argument("--max-body-mib", type=float, default=64, metavar="MIB",
                        help="refuse model-route request bodies larger than this with 413 (default 64; "
                             "control-API bodies: 1 MiB)")
    common.add_argument("--header-timeout", type=float, default=10, metavar="S",
                        help="close a connection whose request line and headers take longer than S seconds "
                             "(408; default 10)")
    common.add_argument("--keepalive-timeout", type=float, default=5, metavar="S",
                        help="close a kept-alive connection idle for S seconds between requests (default 5)")
    common.add_argument("--body-timeout", type=float, default=30, metavar="S",
                        help="refuse a request whose body stalls for S seconds (408; default 30)")
    common.add_argument("--max-connections", type=int, default=256, metavar="N",
                        help="refuse connections beyond N open ones (503; default 256); with a token "
                             "required, one that showed it keeps its place and the oldest idle one that "
                             "did not is closed instead")
    common.add_argument("--max-header-kib", type=float, default=64, metavar="KIB",
                        help="refuse a request line plus headers larger than this (431; default 64)")
    common.add_argument("--max-headers", type=int, default=100, metavar="N",
                        help="refuse a request with more than N header lines (431; default 100)")
    common.add_argument("--allow-any-model-path", action="store_true",
                        help="let the control API load a GGUF anywhere on this machine (default: only inside "
                             "the directories `bostudio ls` scans)")
    common.add_argument("--no-prompt-reuse", action="store_true",
                        help="no prompt reuse across reloads: no slot save/restore, llama-server's own "
                             "--cache-ram default (by default it is sized by the plan)")
    common.add_argument("--prompt-store-dir", default=None, metavar="DIR",
                        help="where saved prompt states live (default: XDG cache dir/bostudio/prompt-cache)")
    common.add_argument("--prompt-store-mib", type=float, default=4096, metavar="MIB",
                        help="disk cap of saved prompt states, least recently used evicted (default 4096)")
    common.add_argument("--require-token", action="store_true",
                        help="require the token even on loopback (always required on other addresses)")
    common.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also accept this Host header name (e.g. the machine's DNS name); repeatable")
    add_rpc(common, "; a child that loses a worker is relaunched without it if it still fits")
    common.add_argument("--record", default=None, metavar="DIR",
                        help="save every request body (route, headers without credentials, body, time) to DIR, "
                             "one numbered file each (0600; DIR created 0700, refused if others may write "
                             "it), in the order received; `bostudio bench --workload DIR` replays the session")
    p = sub.add_parser("daemon", parents=[common], help="run the daemon: one OpenAI endpoint for every model",
                       description="Run the bostudio daemon in the foreground: one OpenAI-compatible endpoint "
                                   "(/v1) that loads models on demand, routes by `model`, supervises the "
                                   "llama-server instances and measures them; a control API under /bostudio. "
                                   "Each model runs the launch `bostudio up`/`plan` show: the largest context "
                                   "that fits (up to its training context), 4 slots sharing one KV pool; "
                                   "requests the pool cannot hold together wait their turn, and a prompt "
                                   "longer than the context gets 400. Each route forwards only the fields "
                                   "its API defines (others are dropped, noted in the log; README 'Fields "
                                   "that reach llama-server'), and every generating request has an output "
                                   "limit (a quarter of the context unless it sets one). "
                                   "With an ACTION, manage a background daemon instead.")
    p.set_defaults(func=cmd_daemon)
    dsub = p.add_subparsers(dest="daemon_command", metavar="ACTION")
    d = dsub.add_parser("start", parents=[common, json_flag()], help="start the daemon in the background",
                        description="Start the daemon in the background (if none runs) and wait until it "
                                    "answers. A daemon that already runs keeps the options it was started with: "
                                    "`bostudio daemon stop` first to change them.")
    d.set_defaults(func=cmd_daemon_start)
    d = dsub.add_parser("stop", help="stop the background daemon and every model it runs",
                        description="SIGTERM the daemon (it stops every llama-server first); SIGKILL after 30 s.")
    d.set_defaults(func=cmd_daemon_stop)
    d = dsub.add_parser("status", parents=[json_flag()], help="is the daemon running, where, with what",
                        description="Show whether the daemon runs, its address and its instances. "
                                    "Exit status 3 when it does not run.")
    d.set_defaults(func=cmd_daemon_status)
    d = dsub.add_parser("install", help="write a systemd user unit (Linux) or launchd agent (macOS)",
                        description="Write a user service that runs the daemon at login: "
                                    "$XDG_CONFIG_HOME/systemd/user/bostudio.service on Linux, "
                                    "~/Library/LaunchAgents/dev.bostudio.daemon.plist on macOS.")
    d.add_argument("--platform", choices=("auto", "linux", "macos"), default="auto",
                   help="which service format (default: this machine's)")
    add_daemon_address(d, f"address (default {DEFAULT_HOST})", f"port (default {DEFAULT_PORT})")
    d.add_argument("--print", action="store_true", help="print the unit instead of writing it")
    d.set_defaults(func=cmd_daemon_install)
    d = dsub.add_parser("token", help="create (or show) the daemon's 256-bit access token",
                        description="Create the token file ($XDG_CONFIG_HOME/bostudio/token, mode 0600) if "
                                    "missing and print its path. Clients send it as `Authorization: Bearer "
                                    "TOKEN`; it is required when the daemon listens beyond loopback.")
    d.add_argument("--new", action="store_true", help="replace the token with a fresh one")
    d.add_argument("--show", action="store_true", help="print the token instead of the file's path")
    d.set_defaults(func=cmd_daemon_token)

    p = sub.add_parser("tui", help="the terminal UI (also: `bostudio` with no arguments)",
                       description="Open the terminal UI: devices, the model catalog with pairings, the memory "
                                   "plan (edit context, KV type, speculation), launch with one key, live stats "
                                   "and logs, bench. It is a client of the daemon and starts one in the "
                                   "background if none runs. F1-F5 switch screens, Ctrl+Q quits.")
    add_daemon_address(p, f"address for a daemon it starts (default {DEFAULT_HOST})",
                           f"port for a daemon it starts (default {DEFAULT_PORT}); a running daemon is used as it is",
                       defaults=False)
    add_engine(p, "llama-server for a daemon it starts")
    add_pull(p, "for a daemon it starts: may a drafter the pairing table names be downloaded from the hub when a "
                "launched model needs it? (default: [pull] policy in config.toml, else never)")
    p.set_defaults(func=cmd_tui)


def add_instance_parsers(sub: argparse._SubParsersAction) -> None:
    """ps, stop: the models the daemon runs."""
    p = sub.add_parser("ps", parents=[json_flag()], help="list the models the daemon runs, with live stats",
                       description="List the daemon's instances: state, pid, port, speculation, decode tok/s, "
                                   "draft acceptance rate, mean accepted length, requests served; under a model, "
                                   "each prompt it is processing now (tokens done of the total, the measured "
                                   "prefill rate, the time left).")
    p.add_argument("--watch", type=float, nargs="?", const=1.0, default=None, metavar="SECONDS",
                   help="show the table again every SECONDS (default 1) until Ctrl-C: watch a long prefill "
                        "from a second terminal")
    p.set_defaults(func=cmd_ps)
    p = sub.add_parser("stop", parents=[json_flag()], help="stop one model in the daemon",
                       description="Stop MODEL's llama-server (SIGTERM, then SIGKILL to its process group). "
                                   "The next request that names it loads it again.")
    p.add_argument("model", metavar="MODEL", help="the model name (as `bostudio ps` shows it)")
    p.set_defaults(func=cmd_stop)
