"""`bostudio up`: serve one model with speculation in the foreground, verified, until Ctrl-C/SIGTERM."""

from __future__ import annotations

import errno
import signal
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from bostudio import paths
from bostudio.bench.profiles import default_workload
from bostudio.catalog.resolve import model_name, resolve_model
from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.engine.discover import Engine, find_engine
from bostudio.errors import ConfigError, PortInUseError, ServerError
from bostudio.gguf import describe
from bostudio.gguf.template import TemplateChoice, template_for
from bostudio.launch import decide_launch
from bostudio.pairing.fetch import interactive_ask, resolve_pull_policy
from bostudio.planner import Plan
from bostudio.planner.pool import placement_lines
from bostudio.rpc.probe import Pool, discover_pool
from bostudio.rpc.workers import Worker, select_workers, workers_from_config
from bostudio.runtime.client import LlamaClient
from bostudio.runtime.process import ServerProcess, tail
from bostudio.speculation import Speculator, parse_spec

# A probe that makes n-gram speculation draft: the continuation repeats text already in the context.
PROBE_PROMPT = "def add(a, b):\n    return a + b\n\n" * 6 + "def add(a, b):\n"
PROBE_TOKENS = 48


@dataclass(frozen=True)
class UpOptions:
    model: str | None = None
    ctx: int | None = None  # None: as large as fits, up to the training context
    cache_type: str = "f16"
    spec: str = "auto"
    port: int = 8080
    host: str = "127.0.0.1"
    engine: str | None = None
    workload: str | None = None  # the tuned profile to use in auto mode; None: config.toml's, else "code"
    pull: str | None = None  # ask | always | never; None: config.toml [pull], else ask on a terminal, never headless
    rpc: str | None = None  # --rpc HOST:PORT,...; None: config.toml's [[rpc]] workers; "none": no workers


@dataclass(frozen=True)
class SpecStatus:
    active: bool
    detail: str
    draft_n: int = 0
    draft_accepted: int = 0


def check_port_free(host: str, port: int) -> None:
    if not 0 < port < 65536:
        raise ConfigError(f"port {port} is out of range", "use a port between 1 and 65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(f"port {port} on {host} is already in use",
                                     "stop what is using it, or pick another port with --port P") from exc
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
                raise ConfigError(f"cannot bind {host}: no such local address",
                                  "use --host 127.0.0.1 (default) or an address of this machine") from exc
            if exc.errno == errno.EACCES:
                raise PortInUseError(f"not allowed to bind port {port}", "use a port above 1024") from exc
            raise


def _spec_failure_reason(log_path: Path) -> str:
    for line in reversed(tail(log_path, 400)):
        for marker in ("failed to initialize speculative decoding context:",
                       "no implementations specified for speculative decoding",
                       "speculative decoding not supported by this context",
                       "vocabs are not compatible"):
            if marker in line:
                return line[line.index(marker):].strip()
    return "llama-server created no speculative context for the slots (see the log)"


def verify_speculation(client: LlamaClient, speculator: Speculator, log_path: Path,
                       n_predict: int = PROBE_TOKENS) -> SpecStatus:
    """Send one greedy probe; speculation is active if the probe drafted, or /slots says so."""
    result = client.completion(PROBE_PROMPT, n_predict)
    timings = result.get("timings", {})
    draft_n = int(timings.get("draft_n", 0))
    accepted = int(timings.get("draft_n_accepted", 0))
    if speculator.kind == "none":
        if draft_n:
            return SpecStatus(True, f"UNEXPECTED: speculation is on ({draft_n} drafted) though it was switched off",
                              draft_n, accepted)
        return SpecStatus(False, "off", 0, 0)
    if draft_n > 0:
        return SpecStatus(True, f"active: the probe drafted {draft_n} tokens, {accepted} accepted "
                                f"({100 * accepted / draft_n:.0f}%)", draft_n, accepted)
    slots = client.slots()
    if slots and all(s.get("speculative") for s in slots):
        return SpecStatus(True, "active (every slot has a speculative context; the probe drafted nothing yet)")
    return SpecStatus(False, "INACTIVE: " + _spec_failure_reason(log_path))


def _raise_stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Prepared:
    """Everything decided before launch: the engine, the argv's spec and the memory plan."""

    engine: Engine
    launch: LaunchSpec
    plan: Plan
    argv: list[str]


def prepare_launch(opts: UpOptions, note=print) -> Prepared:  # type: ignore[no-untyped-def]
    """Resolve, check and plan `opts` into a launch; raises BostudioError on anything wrong."""
    request = parse_spec(opts.spec)
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
    decision = decide_launch(info, request, engine, ctx=opts.ctx, cache_type=opts.cache_type, pull=policy,
                             ask=interactive_ask() if policy == "ask" else None, log=note,
                             workload=workload, pool=pool)
    launch = replace(decision.launch_spec(model, model_name(model), opts.port, opts.host),
                     chat_template=template_for(info))  # issue21: the chat template (gguf/template.py)
    return Prepared(engine, launch, decision.plan, build_argv(engine.path, engine.flags, launch))


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
    server = ServerProcess(argv, opts.port, log_path, host=opts.host)

    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        note(f"starting llama-server on {alias} (speculation: {speculator.label}; log: {log_path})")
        server.start()
        ready_s = server.wait_ready()
        with LlamaClient(server.base_url) as client:
            status = verify_speculation(client, speculator, log_path)
        devices = ", ".join(d.name for d in engine.devices) or "CPU"
        say(f"bostudio up: {alias} is ready in {ready_s:.1f} s")
        say(f"  OpenAI base URL : {server.base_url}/v1")
        say(f"  model           : {alias}")
        say(f"  speculation     : {speculator.label} - {status.detail}")
        say(f"  why             : {speculator.reason}")
        say(f"  memory plan     : {plan.chosen.n_ctx} tokens of context; {plan.why}")
        say(template_line(prep.launch.chat_template))  # issue21
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
    except httpx.HTTPError as exc:
        raise ServerError(f"llama-server did not answer the probe request: {exc}",
                          f"see the log: {log_path}") from exc
    finally:
        # Signals during clean-up must not interrupt it.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        server.stop()
        for s, h in previous.items():
            signal.signal(s, h)
        signal.signal(signal.SIGINT, signal.default_int_handler)
