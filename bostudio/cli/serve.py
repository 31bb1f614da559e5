"""`bostudio up|pair|devices|plan`: serve one model, and what it would get."""

from __future__ import annotations

import argparse
import sys

from bostudio.cli.options import (add_cache_type, add_ctx, add_engine, add_flash_attn, add_pull, add_rpc, add_spec,
                                   add_stall_timeout, add_workload, json_flag, model_or_default)
from bostudio.cli.output import print_json, quote


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
    result = discover_devices(engine_devices=engine.devices if engine else None,
                              host_amx=engine.amx if engine else False)
    notes = tuple(f"engine: {n}" for n in engine.notes()) if engine else ()
    return result.devices, tuple(problems) + result.problems + notes, engine


def cmd_devices(args: argparse.Namespace) -> int:
    from bostudio.planner.render import _size

    devices, problems, engine = _local_devices(args.engine)
    server = engine.path if engine else None
    pool_devices, pool_problems = _pool(args.engine, args.rpc)
    devices, problems = devices + pool_devices, problems + pool_problems
    if args.json:
        print_json({"devices": [d.to_json() for d in devices], "problems": list(problems),
                     "engine": str(server) if server else None})
        return 0
    for d in devices:
        free = _size(d.free_bytes).strip() if d.free_bytes is not None else "unknown"
        bw = f"{d.bandwidth_gbs:.0f} GB/s" if d.bandwidth_gbs else "unknown"
        print(f"{d.label:<10} {d.vendor:<7} {d.backend:<7} {d.name}"
              + (f"  (worker {d.endpoint}" + (f", budget {_size(d.budget_bytes).strip()})" if d.budget_bytes
                                               else ")") if d.endpoint else ""))
        print(f"           total {_size(d.total_bytes).strip()}, free {free}, "
              f"{'software, ' if d.software else ''}{'unified' if d.unified else 'dedicated'}, "
              f"driver {d.driver or 'unknown'}, "
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
    from bostudio.engine.discover import find_engine
    from bostudio.errors import ConfigError
    from bostudio.hardware import load_devices_file
    from bostudio.launch import LaunchIntent, gather, view
    from bostudio.planner.memory import GIB, cache_type
    from bostudio.engine.argv import plan_args
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
    # The same gather -> decide as `up`, the daemon and bench (bostudio.launch): the same speculator choice
    # (tuned profile for the workload, pairing tables, auto-detection, compatibility check), the model's kind
    # from its header, and the same argv.
    intent = LaunchIntent(ctx=args.ctx, cache_type=args.cache_type, spec=spec, flash_attn=args.flash_attn,
                          speculation=None if args.spec_mode == "auto" else args.spec_mode,
                          draft_cache_type=args.draft_cache_type, min_ctx=args.min_ctx, n_parallel=args.parallel,
                          reserve=int(args.reserve_gib * GIB), prompt_reuse=args.prompt_cache)
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
        print_json(dict(plan_json(p, plan_args(p)), speculation=speculator.label, reason=speculator.reason,
                         draft_step=step[0].to_json() if step else None,
                         draft_break_even=step[1] if step else None,
                         draft=str(speculator.draft) if speculator.draft else None, workload=workload,
                         ctx=decision.ctx, layout=decision.layout.to_json(), argv=argv, fits=refused is None,
                         not_fit_reason=refused or "", chat_template=decision.template_json()))
    else:
        from bostudio.display import terminal_print

        terminal_print(render_plan(p, plan_args(p)))  # file names and GGUF strings inside: never raw to the terminal
        terminal_print(f"speculator: {speculator.label} ({speculator.reason})")
        if step:
            pays = "never pays" if step[1] is None else f"pays above {100 * step[1]:.0f}% acceptance"
            terminal_print(f"draft step: {step[0].text()}; {pays} at n_max {step[2]}"
                           + (f", p_min {speculator.p_min:g}" if speculator.p_min is not None else ""))
        terminal_print(f"slots: {decision.layout.line()}")
        terminal_print(f"chat template: {decision.template_label()}")
        if refused is not None:
            terminal_print(f"does not launch: {refused}")
        terminal_print("runs: " + " ".join(quote(a) for a in argv))
    return 0 if refused is None else 1


def _draft_step(inputs):  # type: ignore[no-untyped-def]
    """(a draft model's step cost on the plan's devices, its break-even acceptance, n_max), or None."""
    from bostudio.pairing.core.cost import draft_step_cost
    from bostudio.speculation import DRAFT_N_MAX

    sp = inputs.speculator
    if sp.kind != "draft" or inputs.draft is None:
        return None
    step = draft_step_cost(inputs.info, inputs.draft, inputs.devices)
    n = sp.n_max or DRAFT_N_MAX
    return step, step.break_even(n), n


def _rpc_pool(engine, rpc: str | None):  # type: ignore[no-untyped-def]
    """The RPC workers named by --rpc or config.toml, probed through `engine` (an empty Pool: none)."""
    from bostudio.rpc.workers import select_workers, workers_from_config
    from bostudio.up import worker_pool

    return worker_pool(engine, select_workers(rpc, workers_from_config()), note=lambda _: None)


def cmd_up(args: argparse.Namespace) -> int:
    from bostudio.up import UpOptions, run_up

    if args.daemon:
        return cmd_up_daemon(args)
    return run_up(UpOptions(model=args.model, ctx=args.ctx, cache_type=args.cache_type, flash_attn=args.flash_attn,
                            spec=args.spec,
                            port=args.port or 8080, host=args.host, engine=args.engine, pull=args.pull,
                            workload=args.workload, rpc=args.rpc,
                            stall_timeout=120.0 if args.stall_timeout is None else args.stall_timeout))


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
    from bostudio.launch import LaunchIntent, gather, view
    from bostudio.pairing.edge.fetch import pair_model
    from bostudio.pairing.edge.pair import make_self_draft, record_self_draft
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
    decision, refused = view(gather(info, engine, LaunchIntent(ctx=args.ctx, spec=args.spec),
                                    workload=workload, speculator=report.selection.speculator))
    argv = decision.argv(port=8080, alias=model_name(model))
    if args.json:
        print_json(dict(report.to_json(), workload=workload, ctx=decision.ctx,
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
    out("      " + " ".join(quote(a) for a in argv))
    return 0 if sel.chosen is not None or request.mode == "off" else 1


def _print_pairing_table(as_json: bool) -> int:
    from bostudio.pairing.edge.fetch import table_hub_report
    from bostudio.pairing.core.table import load_pairings

    report = table_hub_report(load_pairings())
    if as_json:
        print_json(report)
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
    extra += ["--stall-timeout", str(args.stall_timeout)] if args.stall_timeout is not None else []
    rec = start_background(DaemonOptions(host=args.host, port=args.port or DEFAULT_PORT), extra)
    model = args.model or DEFAULT_NAME
    if Path(model).expanduser().is_file():
        model = str(Path(model).expanduser().resolve())  # the daemon may run in another directory
    with DaemonClient(rec.url) as client:
        inst = client.start(model, spec=args.spec, ctx=args.ctx, workload=args.workload)
    if args.json:
        print_json(dict(inst, base_url=f"{rec.url}/v1"))
        return 0
    status = inst.get("spec_status") or {}
    print(f"bostudio up: {inst['model']} is ready in {inst['ready_s'] or 0:.1f} s (daemon pid {rec.pid})")
    print(f"  OpenAI base URL : {rec.url}/v1")
    print(f"  model           : {inst['model']}")
    print(f"  speculation     : {inst['speculation']} - {status.get('detail', 'unknown')}")
    print(f"  why             : {inst['speculation_reason']}")
    if inst.get("chat_template"):  # which template the model runs, fallback or its own
        print("  chat template   : " + escape_untrusted(inst["chat_template"]["label"]))
    print(f"  log             : {inst['log']}")
    print(f"It keeps running in the daemon: `bostudio ps` lists it, `bostudio stop {inst['model']}` stops it.")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """up, pair, devices, plan: serve one model, and what it would get."""
    p = sub.add_parser("up", parents=[model_or_default()], help="serve a model with speculative decoding (foreground)",
                       description="Launch llama-server on MODEL with speculation, wait until it is "
                                   "ready, verify that speculation is really active, print the OpenAI "
                                   "base URL, and stay in the foreground until Ctrl-C / SIGTERM.")
    add_ctx(p, "context size in tokens (default: the largest the memory plan fits, up to the "
               "model's training context)")
    add_cache_type(p, "KV cache type: f16 (default), bf16, q8_0, q4_0, ... (quantized V turns flash attention on)",
                   metavar="T")
    add_flash_attn(p)
    add_spec(p, "auto | off | ngram | draft:PATH | mtp | self-draft:QUANT (default auto: what pays on "
                "this machine; n-gram speculation on a CPU, the model's MTP head when it has one; "
                "self-draft:Q2_K drafts with a low-bit copy of MODEL kept whole on the fastest device)")
    p.add_argument("--port", type=int, default=None, metavar="P",
                   help="port to listen on (default 8080; with --daemon the daemon's port, default 8642)")
    p.add_argument("--host", default="127.0.0.1", metavar="H",
                   help="address to bind (default 127.0.0.1, loopback only)")
    add_engine(p, "llama-server binary to use (default: the best one found, see `engine list`)")
    add_stall_timeout(p, None)
    add_pull(p, "may a drafter the pairing table names be downloaded from the hub? ask (default on a terminal: shows "
                "its size, memory and why, then asks), always, never (default headless); or [pull] policy in "
                "config.toml. A declined or failed pull falls back to the next candidate", ask=True)
    add_rpc(p)
    p.add_argument("--daemon", action="store_true",
                   help="load MODEL in the bostudio daemon (started in the background if none runs), print "
                        "the summary and return; the model keeps serving on the daemon's one endpoint")
    p.add_argument("--json", action="store_true", help="with --daemon: print the instance as JSON")
    add_workload(p, "with --spec auto: use the profile `bostudio tune` saved for this workload (code, edit, chat...; "
                    "default: [workload] in config.toml, else code); a stale profile is ignored", metavar="W")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("pair", parents=[model_or_default(), json_flag()],
                       help="show which speculator a model gets, and why",
                       description="Choose the speculator for MODEL from the pairing tables (yours in "
                                   "$XDG_CONFIG_HOME/bostudio/pairings.toml, then the shipped one) and what "
                                   "is detected: its MTP head, drafter GGUFs, every smaller local model "
                                   "llama.cpp accepts as its draft, n-gram speculation. Shows every candidate, "
                                   "why it was passed over, what it costs in memory and, for a draft model, "
                                   "what a draft step costs against a target step and the acceptance above "
                                   "which it pays; with a tuned profile, what tune refused and by how much it "
                                   "lost. A draft pair llama.cpp would refuse is never chosen.")
    add_spec(p, "auto | off | ngram | draft:PATH | mtp (default auto), as for `up`")
    add_ctx(p, "context for the memory figures and the launch shown (default: as `up`, the largest "
               "that fits, up to the training context)")
    add_workload(p, "whose tuned profile auto uses, as `up --workload` (default: config.toml's [workload], "
                    "else code)")
    p.add_argument("--self-draft", default=None, metavar="QUANT",
                   help="first make a low-bit copy of MODEL (Q2_K, Q3_K_S, IQ2_XXS...) with llama-quantize "
                        "and record it as MODEL's draft in your pairings.toml")
    p.add_argument("--table", action="store_true",
                   help="instead of one model: every pairing table entry, what each candidate would use and "
                        "from where (the hub ref it would fetch), with the source of that reference")
    p.add_argument("--no-probe", action="store_true",
                   help="skip tokenizing the probe corpus with both models of a draft pair")
    add_engine(p, "llama-server whose spec types count (default: the best one found)")
    p.set_defaults(func=cmd_pair)

    p = sub.add_parser("devices", help="list GPUs and host memory",
                       description="Probe every GPU vendor (NVIDIA via NVML, AMD via amdsmi or sysfs, "
                                   "Intel via sysfs or xpu-smi, Apple via sysctl) and host RAM, and "
                                   "cross-check with the engine's `llama-server --list-devices`. A vendor "
                                   "that cannot be read is a note, never an error.")
    p.add_argument("--json", action="store_true", help="print JSON (usable as plan --devices-file)")
    add_engine(p, "llama-server to cross-check with (default: LLAMA_SERVER or the chosen engine)")
    add_rpc(p, "; each probed through the engine (`llama-server --rpc W --list-devices`)")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("plan", help="plan memory: context, offload, and the draft-vs-context trade-off",
                       description="Predict what MODEL needs on each device (weights, KV cache, recurrent "
                                   "state, compute and output buffers, the speculator's share) from its GGUF "
                                   "header, find the largest context and offload that fit with the "
                                   "speculator and without it, and choose. Shows the slot layout and the "
                                   "llama-server argv `up` runs for the same options (the daemon runs the same "
                                   "with --prompt-cache). Exits 1 when nothing fits.")
    p.add_argument("model", metavar="MODEL", help="a GGUF file, or a model name in models/")
    add_ctx(p, "plan exactly this context (default: as large as fits, up to the training context)")
    p.add_argument("--min-ctx", type=int, default=32768, metavar="N",
                   help="context the speculator must leave in auto mode (default 32768, capped at training)")
    add_cache_type(p, "KV cache type for -ctk/-ctv: f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, f32 "
                      "(default f16)")
    add_flash_attn(p)
    p.add_argument("--draft-cache-type", default=None, metavar="TYPE",
                   help="the draft's KV cache type for -ctkd/-ctvd (default: the pairing's cache_type_k_draft, "
                        "else f16, llama.cpp's default)")
    add_workload(p, "whose tuned profile auto uses, as `up --workload` (default: config.toml's [workload], "
                    "else code)")
    p.add_argument("--port", type=int, default=8080, metavar="P",
                   help="the port in the argv shown (default 8080, as `up`)")
    add_spec(p, "auto | off | ngram | mtp | draft:PATH | self-draft:QUANT (default auto: chosen as `up`, `pair` and "
                "the daemon choose: pairing tables, auto-detection, compatibility check; self-draft plans MODEL's own "
                "low-bit copy as the draft, whole on the fastest device, without making it)", metavar="SPEC")
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
    add_engine(p, "llama-server for the device cross-check")
    add_rpc(p, " (not with --devices-file, which lists RPC devices itself: \"backend\": \"rpc\")")
    p.add_argument("--json", action="store_true", help="print JSON")  # last in plan's help, as before
    p.set_defaults(func=cmd_plan)
