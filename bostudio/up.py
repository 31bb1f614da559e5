"""`bostudio up`: serve one model with speculation in the foreground, verified, until Ctrl-C/SIGTERM."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass

from bostudio import paths
from bostudio.catalog.resolve import model_name, resolve_model
from bostudio.engine.argv import LaunchSpec
from bostudio.engine.discover import Engine, find_engine
from bostudio.errors import ConfigError, ServerError
from bostudio.gguf import describe
from bostudio.gguf.template import TemplateChoice
from bostudio.launch import Decision, gather_and_decide, serve_intent
from bostudio.pairing.edge.fetch import interactive_ask, resolve_pull_policy
from bostudio.planner import Plan
from bostudio.planner.pool import placement_lines
from bostudio.profiles import default_workload
from bostudio.rpc.probe import Pool, discover_pool
from bostudio.rpc.workers import Worker, select_workers, workers_from_config
from bostudio.runtime.client import LlamaClient
from bostudio.runtime.net import check_port_free
from bostudio.runtime.process import LOAD_TIMEOUT_S, ServerProcess, tail
from bostudio.runtime.verify import verify_speculation
from bostudio.speculation import parse_spec


@dataclass(frozen=True)
class UpOptions:
    model: str | None = None
    ctx: int | None = None  # None: as large as fits, up to the training context
    cache_type: str = "f16"
    flash_attn: str = "auto"  # auto: the plan chooses (off on a CPU alone, on with a GPU) | on | off
    spec: str = "auto"
    port: int = 8080
    host: str = "127.0.0.1"
    engine: str | None = None
    workload: str | None = None  # the tuned profile to use in auto mode; None: config.toml's, else "code"
    pull: str | None = None  # ask | always | never; None: config.toml [pull], else ask on a terminal, never headless
    rpc: str | None = None  # --rpc HOST:PORT,...; None: config.toml's [[rpc]] workers; "none": no workers
    stall_timeout: float = 120.0  # a loading llama-server silent this long is stopped (one printing progress never)


def _raise_stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Prepared:
    """Everything decided before launch: the engine, the argv's spec and the memory plan."""

    engine: Engine
    launch: LaunchSpec
    plan: Plan
    argv: list[str]
    decision: Decision


def prepare_launch(opts: UpOptions, note=print) -> Prepared:  # type: ignore[no-untyped-def]
    """Resolve, check and plan `opts` into a launch; raises BostudioError on anything wrong."""
    parse_spec(opts.spec)  # a bad --spec fails before anything is read
    if opts.ctx is not None and opts.ctx < 256:
        raise ConfigError(f"--ctx {opts.ctx} is too small", "use at least 256 tokens, or leave it to the plan")
    model = resolve_model(opts.model, log=note)
    info = describe(model)  # raises GGUFFormatError for truncated or crafted files
    check_port_free(opts.host, opts.port)
    workers = select_workers(opts.rpc, workers_from_config())  # a malformed --rpc fails before any probe
    engine = find_engine(opts.engine)
    workload = opts.workload or default_workload(model_name(model))
    pool = worker_pool(engine, workers, note)
    policy = resolve_pull_policy(opts.pull)
    decision = gather_and_decide(info, engine, serve_intent(ctx=opts.ctx, cache_type=opts.cache_type, spec=opts.spec,
                                                            flash_attn=opts.flash_attn),
                                 pool=pool, workload=workload, pull=policy,
                                 ask=interactive_ask() if policy == "ask" else None, log=note)
    launch = decision.launch_spec(port=opts.port, alias=model_name(model), host=opts.host)
    argv = decision.argv(port=opts.port, alias=model_name(model), host=opts.host)
    return Prepared(engine, launch, decision.plan, argv, decision)


def template_line(choice: TemplateChoice | None) -> str:
    """The summary's chat-template line; a GGUF without a template is most likely a base model."""
    line = "  chat template   : " + (choice.label if choice else "the GGUF's own")
    if choice is not None and choice.reason.startswith("the GGUF has no chat template"):
        line += ("\n  note            : no chat template usually means a base (not instruction-tuned) model: "
                 "it continues text rather than following instructions")
    return line


def worker_pool(engine: Engine, workers: tuple[Worker, ...], note=print) -> Pool:  # type: ignore[no-untyped-def]
    """`workers` probed through `engine`; a worker that cannot be used is one line through `note`,
    and the launch goes on without it."""
    if not workers:
        return Pool()
    pool = discover_pool(engine, workers)
    for problem in pool.problems:
        note(f"{problem}; going on without it")
    return pool


def run_up(opts: UpOptions, out=sys.stdout) -> int:
    def say(msg: str) -> None:
        print(msg, file=out, flush=True)

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    prep = prepare_launch(opts, note)
    engine, plan, speculator, alias = prep.engine, prep.plan, prep.launch.speculator, prep.launch.alias
    argv = prep.argv
    log_path = paths.logs_dir() / f"up-{opts.port}.log"
    server = ServerProcess(argv, opts.port, log_path, host=opts.host, env=engine.server_env())

    # SIGINT too: a shell starts a background job with SIGINT ignored, and Python then installs no
    # handler of its own, so `kill -INT` (or a supervisor's Ctrl-C) would not stop it.
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        note(f"starting llama-server on {alias} (speculation: {speculator.label}; log: {log_path})")
        server.start()
        ready_s = server.wait_ready(timeout=LOAD_TIMEOUT_S, stall_timeout=opts.stall_timeout)
        with LlamaClient(server.base_url, log_path=log_path) as client:
            status = verify_speculation(client, speculator, log_path, timeout=max(opts.stall_timeout, 120.0))
        devices = ", ".join(d.name for d in engine.devices) or "CPU"
        say(f"bostudio up: {alias} is ready in {ready_s:.1f} s")
        say(f"  OpenAI base URL : {server.base_url}/v1")
        say(f"  model           : {alias}")
        say(f"  speculation     : {speculator.label} - {status.detail}")
        say(f"  why             : {speculator.reason}")
        say(f"  memory plan     : {plan.chosen.n_ctx} tokens of context; {plan.why}")
        say(f"  slots           : {prep.decision.layout.line()}")
        say(template_line(prep.launch.chat_template))
        if prep.launch.rpc or plan.chosen.split or plan.chosen.draft_device:
            if prep.launch.rpc:
                say(f"  rpc workers     : {prep.launch.rpc}")
            for line in placement_lines(plan):
                say(f"  placement       : {line}")
        say(f"  engine          : {engine.path} ({engine.version}, commit {engine.commit}, {devices})")
        say(f"  log             : {log_path}")
        say("Press Ctrl-C to stop.")
        while server.alive():
            time.sleep(0.5)
        lines = tail(log_path, 5)
        raise ServerError("llama-server stopped unexpectedly: " + (lines[-1] if lines else "no output"),
                          f"see the log: {log_path}")
    except KeyboardInterrupt:
        note("stopping llama-server ...")
        return 0
    finally:
        # Signals during clean-up must not interrupt it.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        server.stop()
        for s, h in previous.items():
            signal.signal(s, h)
