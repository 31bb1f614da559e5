"""The supervisor: llama-server instances started on demand, checked ready, restarted after crashes,
unloaded when idle or when memory is needed, stopped as process groups.

Everything runs on the daemon's one event loop (no locks): children are forked from the loop's
thread, which lives as long as the daemon, so PR_SET_PDEATHSIG kills them when the daemon dies.
Blocking work that forks nothing (waiting for a group to exit, the probe request) goes to threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from bostudio import paths
from bostudio.catalog.resolve import looks_like_path, model_name, resolve_model
from bostudio.daemon import policy
from bostudio.daemon.capabilities import ModelCaps, model_caps
from bostudio.daemon.modelpaths import check_model_path, check_spec
from bostudio.daemon.prefill import PrefillTracker
from bostudio.daemon.slots import SlotStore, StateKey, restore_slots, save_slots, state_key
from bostudio.daemon.events import EventBus
from bostudio.daemon.state import ChildRecord, instance_log_path
from bostudio.daemon.stats import InstanceStats
from bostudio.runtime.metrics import parse_metrics
from bostudio.engine.discover import Engine, find_engine
from bostudio.errors import (BostudioError, ModelError, ModelFileError, OutOfMemoryError, PlanError, PortInUseError,
                             RequestError, ServerError)
from bostudio.gguf import ModelInfo, describe
from bostudio.hardware import Device, discover_devices
from bostudio.launch import Decision, LaunchInputs, LaunchIntent, Layout, decide, gather
from bostudio.daemon.admission import Admission
from bostudio.planner.memory import cache_type as cache_type_of
from bostudio.planner.fit import PROMPT_CACHE
from bostudio.profiles import (DEFAULT_BREAK_EVEN, default_workload, find_profile, predicted_break_even,
                               speculator_from_json, tune_refusals)
from bostudio.rpc.probe import Pool, discover_pool
from bostudio.rpc.workers import Worker
from bostudio.runtime.client import LlamaClient
from bostudio.runtime.net import free_loopback_port
from bostudio.runtime.process import CrashHistory, ServerProcess, tail
from bostudio.runtime.verify import verify_speculation
from bostudio.speculation import Speculator, draft_length, draft_length_ceiling, parse_spec, with_draft_length

log = logging.getLogger("bostudio.daemon")

# Instance states. `restarting` waits out a backoff after a crash; `failed` needs an explicit start.
STOPPED, LOADING, READY, RESTARTING, FAILED, STOPPING = "stopped", "loading", "ready", "restarting", "failed", "stopping"
RESIDENT_STATES = (LOADING, READY, RESTARTING)
UPSTREAM_TIMEOUT = httpx.Timeout(10.0, connect=2.0)
PROGRESS_POLL_S = 1.0  # how often a busy child's /slots is read for prompt progress (answered mid-batch)
PROGRESS_TIMEOUT = httpx.Timeout(5.0, connect=2.0)
SAVE_TIMEOUT_S = 120.0  # saving slot states before a stop; past it the stop goes on without them
SETTLE_S = 10.0  # after a child's death, how long its requests may take to notice (hang guard)
TASK_CANCEL_TIMEOUT_S = 30.0  # a cancelled lifecycle task that does not end in this time is left behind


@dataclass(frozen=True)
class SupervisorOptions:
    engine: str | None = None  # explicit llama-server path (else the best one found)
    memory_budget: int = 0  # bytes; 0: 80% of this machine's RAM
    idle_ttl: float = 600.0  # seconds; 0: never unload idle models
    stall_timeout: float = 120.0  # a silent loader is killed after this
    load_timeout: float = 900.0
    grace: float = 10.0  # SIGTERM -> SIGKILL
    probe_tokens: int = 16
    ctx: int | None = None  # None: the largest context that fits, up to the model's training context
    spec: str = "auto"
    stream_idle_timeout: float = 300.0  # a response body silent this long mid-stream ends with an error
    failed_cooldown: float = 60.0  # a failed model is retried on the next request after this (0: never)
    prompt_reuse: bool = True  # sized --cache-ram, slots saved before a stop and restored on load
    prompt_store_dir: str | None = None  # default: XDG cache dir/prompt-cache
    prompt_store_bytes: int = 4 << 30  # disk cap of saved slot states (LRU)
    max_body: int = 64 << 20  # request bodies above this are refused (413)
    pull: str = "never"  # hub drafters: always | never (no one answers an `ask` in a daemon)
    workers: tuple[Worker, ...] = ()  # RPC workers (--rpc or config.toml [[rpc]]) every child may use
    allow_any_model_path: bool = False  # the control API may load GGUFs outside the catalog's directories


@dataclass
class ModelConfig:
    """What to launch for one model name (changed by the control API; survives restarts)."""

    name: str
    path: Path
    ctx: int | None  # None: the largest that fits, up to the training context
    spec: str
    port: int | None = None  # pinned child port (else a free one per launch)
    cache_type: str = "f16"  # -ctk/-ctv of the target's KV cache
    workload: str | None = None  # whose tuned profile auto uses (None: config.toml's [workload], else "code")
    # Under auto, speculation that fell below break-even on a workload stays off until the workload changes.
    auto_off: str | None = None  # that workload
    auto_off_reason: str = ""
    # Under auto, the draft length the acceptance check settled on (None: the plan's), and the length that
    # last fell below break-even (lengthening stays below half of it). Cleared when the workload changes.
    draft_len: int | None = None
    draft_len_failed: int | None = None
    draft_len_reason: str = ""

    def resolved_workload(self) -> str:
        return self.workload or default_workload(self.name)

    def fallback(self, workload: str) -> str | None:
        """Why auto gave up on speculation for `workload` (None: it did not)."""
        return self.auto_off_reason if self.spec == "auto" and self.auto_off == workload else None


def child_inputs(info: ModelInfo, engine: Engine, spec_mode: str, ctx: int | None, cache_type: str = "f16", *,
                 pull: str = "never", workload: str | None = None, fallback: str | None = None,
                 prompt_reuse: bool = False, caps: ModelCaps | None = None, pool: Pool = Pool(),
                 devices: tuple[Device, ...] | None = None, children: int = 1,
                 draft_len: tuple[int, str] | None = None) -> LaunchInputs:
    """The launch decision's inputs for a daemon child, gathered as for `bostudio up` (a tuned profile
    for `workload`, else the pairing table, auto-detection and compatibility check, a hub drafter
    fetched as `pull` allows). `fallback` (why auto gave up on the speculator) runs the profile's
    next-best kind, else none. With prompt reuse the plan has a host prompt cache and full SWA caches;
    embedding and rerank models (`caps`) get their flags and no speculator. RPC workers in `pool` add
    their devices; `devices` replaces this machine's (Supervisor.planning_devices). `ctx` None: the largest
    context that fits, up to the training context. `children`: the llama-servers sharing the host's cores
    with this one (its CPU threads are planned for that). `draft_len`: (n, why) the acceptance check settled
    on under auto (policy.adapt_draft_length); the plan prices and runs that length."""
    generates = caps is None or caps.kind == "chat"
    intent = LaunchIntent(ctx=ctx, cache_type=cache_type, spec=spec_mode, prompt_reuse=prompt_reuse,
                          kind_args=caps.launch_args() if caps is not None else (), generates=generates,
                          children=children)
    speculator = fallback_speculator(info, engine, workload, fallback) if fallback is not None and generates else None
    inputs = gather(info, engine, intent, pool=pool, workload=workload, pull=pull, speculator=speculator,
                    devices=devices, log=lambda msg: log.info("%s: %s", info.path.name, msg))
    if draft_len is not None and draft_length(inputs.speculator) is not None:
        n, why = draft_len
        inputs = replace(inputs, speculator=with_draft_length(inputs.speculator, n,
                                                              f"draft length {n} at run time: {why}"))
    return inputs


def decide_child(info: ModelInfo, engine: Engine, spec_mode: str, ctx: int | None, cache_type: str = "f16",
                 **kw) -> Decision:  # type: ignore[no-untyped-def]
    """The launch decision for a daemon child: `chosen.total` decides what gets evicted, and
    `Decision.argv` is what runs. Raises PlanError if it cannot fit."""
    return decide(child_inputs(info, engine, spec_mode, ctx, cache_type, **kw))


def _template_json(path: Path) -> dict | None:
    """The chat template the model is served with (gguf/template.py), None when unreadable."""
    try:
        return model_caps(path).template.to_json()
    except (OSError, BostudioError):
        return None


def fallback_speculator(info: ModelInfo, engine: Engine, workload: str | None, why: str) -> Speculator:
    """After acceptance fell below break-even under auto: the profile's best configuration of another kind
    that beat off, else no speculation."""
    found = find_profile(info.path, engine, workload) if workload else None
    nxt = found.profile.next_best() if found and found.profile else None
    if nxt is not None and all(t in engine.spec_types for t in nxt.speculator["spec_types"]):
        return speculator_from_json(nxt.speculator, f"auto: {why}; the next-best profile entry {nxt.label} "
                                                    f"({nxt.speedup:.2f}x of off when tuned)")
    return Speculator("none", reason=f"auto: {why}; without speculation until the workload changes")


class WorkerLostError(PlanError):
    """The model no longer fits once an RPC worker it used has died."""


def unreachable_workers(workers: list[Worker], timeout: float = 2.0) -> list[Worker]:
    """The workers nothing listens for any more (a TCP connect; the handshake would block a live one)."""
    import socket

    dead = []
    for w in workers:
        try:
            with socket.create_connection((w.host, w.port), timeout=timeout):
                pass
        except OSError:
            dead.append(w)
    return dead


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


@dataclass
class Instance:
    cfg: ModelConfig
    state: str = STOPPED
    proc: ServerProcess | None = None
    port: int | None = None
    api_key: str = ""
    http: httpx.AsyncClient | None = None
    speculator: Speculator | None = None
    spec_status: dict | None = None
    plan: dict = field(default_factory=dict)
    error: dict | None = None
    loads: int = 0
    ready_s: float | None = None
    ready_since: float | None = None
    last_used: float = field(default_factory=time.monotonic)
    active: int = 0
    stats: InstanceStats = field(default_factory=InstanceStats)
    crashes: CrashHistory = field(default_factory=CrashHistory)
    ready: asyncio.Future | None = None
    task: asyncio.Task | None = None
    stopping: bool = False
    break_even: float = DEFAULT_BREAK_EVEN  # acceptance below which speculation stops paying
    break_even_source: str = "default"
    spec_base: tuple[int, int, int] = (0, 0, 0)  # (drafted, accepted, requests) at the last launch
    spec_check: dict | None = None  # the last policy.SpecVerdict
    tune_refused: list = field(default_factory=list)  # what the workload's profile refused (profiles.tune_refusals)
    draft_advice: dict | None = None  # the last policy.DraftAdvice (under auto)
    scraped: tuple[int, int] = (0, 0)  # (requests, tokens) at the last /metrics scrape
    cfg_cooldown: float = 0.0
    failed_at: float | None = None  # wall time the model was marked failed
    state_key: StateKey | None = None  # what this child's saved slot states are valid for
    prompts: dict = field(default_factory=dict)  # restored/saved slot states, for ps
    pool: Pool = field(default_factory=Pool)  # the RPC workers of the running child
    lost_workers: tuple[str, ...] = ()  # workers that died under this model: later launches go without them
    layout: Layout | None = None  # the running child's slots and KV pool (admission reserves in it)
    admission: Admission = field(default_factory=Admission)  # requests in the KV pool, and those queued
    stop_task: asyncio.Future | None = None  # the stop in progress: a concurrent stop or start waits for it
    # Per launch (`loads`): requests in flight, counted by the router from their first byte to the child
    # until they end, and those whose connection broke with the request in it (router._ended).
    in_flight: dict[int, int] = field(default_factory=dict)
    died_with: dict[int, int] = field(default_factory=dict)
    prefill: PrefillTracker = field(default_factory=PrefillTracker)  # the prompts the child is processing now

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def log_path(self) -> Path:
        return instance_log_path(self.name)

    def to_json(self) -> dict:
        return {
            "model": self.name, "path": str(self.cfg.path), "state": self.state,
            "pid": self.proc.pid if self.proc and self.state in RESIDENT_STATES + (STOPPING,) else None,
            "port": self.port if self.state in RESIDENT_STATES else None,
            "ctx": self.plan.get("ctx", self.cfg.ctx), "ctx_asked": self.cfg.ctx, "cache_type": self.cfg.cache_type, "spec_mode": self.cfg.spec,
            "speculation": self.speculator.label if self.speculator else None,
            "speculation_reason": self.speculator.reason if self.speculator else None,
            "spec_status": self.spec_status, "plan": self.plan, "error": self.error, "loads": self.loads,
            "crashes_recent": len(self.crashes.times), "ready_s": self.ready_s,
            "uptime_s": time.monotonic() - self.ready_since if self.ready_since and self.state == READY else None,
            "idle_s": time.monotonic() - self.last_used, "active_requests": self.active,
            "stats": self.stats.to_json(), "log": str(self.log_path),
            "retry": self.retry_json(), "prompts": self.prompts,
            "workload": self.cfg.workload, "spec_check": self.spec_check,
            "chat_template": _template_json(self.cfg.path),  # issue21: which template, fallback or not
            "spec_flagged": bool(self.spec_check and self.spec_check["state"] == "below"),
            "break_even_source": self.break_even_source,
            "tune_refused": self.tune_refused,
            "auto_off": ({"workload": self.cfg.auto_off, "reason": self.cfg.auto_off_reason}
                         if self.cfg.auto_off else None),
            "admission": self.admission.to_json(),  # KV tokens reserved by requests in flight, and those queued
            "prefill": self.prefill_json(),  # issue33: the prompts in progress, their rate and time left
            "draft_length": ({"n_max": draft_length(self.speculator), "adapted": self.cfg.draft_len is not None,
                              "reason": self.cfg.draft_len_reason, "advice": self.draft_advice}
                             if self.speculator is not None and draft_length(self.speculator) is not None else None),
            "rpc": {"workers": self.pool.rpc, "lost": list(self.lost_workers),
                    "problems": list(self.pool.problems)} if self.pool.probes or self.lost_workers else None,
        }

    def prefill_json(self) -> list[dict]:
        """The prompts the child is processing now: tokens done of the total, the rate, the time left
        (before a prompt's first batch is done, estimated from the child's last long prefill)."""
        if self.state != READY:  # a child that stopped or crashed mid-prompt processes nothing
            return []
        return self.prefill.to_json(time.monotonic(), self.stats.long_prefill_tok_s)

    def retry_json(self) -> dict | None:
        """When a failed model is tried again: on the next request after the cool-down, or now on an
        explicit restart."""
        if self.state != FAILED or self.failed_at is None:
            return None
        cooldown = self.cfg_cooldown
        if cooldown <= 0:
            return {"how": "explicit restart only (bostudio restart MODEL)", "at": None, "in_s": None}
        at = self.failed_at + cooldown
        return {"how": "on the next request after the cool-down, or at once with an explicit restart",
                "at": at, "in_s": max(0.0, at - time.time())}


class Supervisor:
    def __init__(self, options: SupervisorOptions, bus: EventBus,
                 on_children: Callable[[list[ChildRecord]], None] = lambda children: None) -> None:
        self.opts = options
        self.bus = bus
        self.on_children = on_children
        self.instances: dict[str, Instance] = {}
        self.configs: dict[str, ModelConfig] = {}
        self._engine: Engine | None = None
        self._background: list[asyncio.Task] = []
        store_dir = Path(options.prompt_store_dir) if options.prompt_store_dir else paths.cache_dir() / "prompt-cache"
        self.slot_store = SlotStore(store_dir, options.prompt_store_bytes) if options.prompt_reuse else None

    # ------------------------------------------------------------------ catalog and engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = find_engine(self.opts.engine)
        return self._engine

    def workers_for(self, name: str) -> tuple[Worker, ...]:
        """The RPC workers a launch of model `name` may use: the configured ones, less those that died
        under it."""
        inst = self.instances.get(name)
        lost = inst.lost_workers if inst is not None else ()
        return tuple(w for w in self.opts.workers if w.endpoint not in lost)

    def view_pool(self, name: str) -> Pool:
        """The pool a plan view of `name` shows: the running child's (an rpc-server serves one client at a
        time, so a busy worker cannot be probed), else what its launch would probe."""
        inst = self.instances.get(name)
        if inst is not None and inst.pool.probes and inst.state in RESIDENT_STATES + (STOPPING,):
            return inst.pool
        workers = self.workers_for(name)
        return discover_pool(self.engine, workers) if workers else Pool()

    def planning_devices(self, engine: Engine, name: str, running: bool = False) -> tuple[Device, ...]:
        """This machine's devices as a load of `name` may use them: the memory of idle models counts as
        free (the load evicts them when it needs the room; with `running`, `name`'s own too, as a
        relaunch frees it), and the host may hold at most the memory budget less what busy models
        keep. So the largest context that fits is the same whichever idle models happen to be loaded."""
        freed: dict[str, int] = {}
        busy = 0
        for i in self.instances.values():
            if i.state not in RESIDENT_STATES or (i.name == name and not running):
                continue
            if i.name != name and (i.active > 0 or i.state != READY):
                busy += int(i.plan.get("bytes", 0))
                continue
            for u in i.plan.get("uses", []):
                freed[u["device"]] = freed.get(u["device"], 0) + int(u["bytes"])
        out = []
        for d in discover_devices(engine_devices=engine.devices).devices:
            free = None if d.free_bytes is None else min(d.total_bytes, d.free_bytes + freed.get(d.label, 0))
            if d.is_gpu:
                out.append(d.with_(free_bytes=free))
                continue
            cap = max(0, self.budget() - busy)
            out.append(d.with_(free_bytes=free, budget_bytes=cap if d.budget_bytes is None else min(cap, d.budget_bytes)))
        return tuple(out)

    def budget(self) -> int:
        if self.opts.memory_budget > 0:
            return self.opts.memory_budget
        import psutil

        return int(psutil.virtual_memory().total * 0.8)

    def catalog(self) -> dict[str, Path]:
        """Every model name the router serves: GGUFs in the models dir plus models started by path."""
        # is_file() is a stat: a FIFO or device named *.gguf is never listed, so nothing opens it.
        found = {model_name(p): p for p in sorted(paths.models_dir().glob("*.gguf")) if p.is_file()}
        found.update({name: cfg.path for name, cfg in list(self.configs.items())})  # list(): a worker may call it
        return found

    def config_for(self, name: str) -> ModelConfig:
        if name in self.configs:
            return self.configs[name]
        path = self.catalog().get(name)
        if path is None:
            known = ", ".join(sorted(self.catalog())) or "none"
            raise ModelError(f"model {name!r} does not exist", f"GET /v1/models lists the models: {known}")
        cfg = ModelConfig(name, path, self.opts.ctx, self.opts.spec)
        self.configs[name] = cfg
        return cfg

    def locate(self, model: str) -> Path | None:
        """The GGUF of a model given by path or by a name resolve_model knows (None: a catalog name).
        A path must be a regular GGUF file inside the catalog's directories (modelpaths.check_model_path).
        May assemble the embedded default model: call it off the event loop."""
        if model in self.catalog():
            return None
        if looks_like_path(model) or os.sep in model or Path(model).expanduser().exists():
            return check_model_path(model, self.opts.allow_any_model_path)
        return resolve_model(model, log=log.info)

    def admit_start(self, model: str, ctx: int | None = None, spec: str | None = None) -> Path | None:
        """locate() plus the checks of a start request's values: a draft path as a model path, a context
        no larger than the model was trained for. Blocking (headers, stat): call it off the event loop.
        Raises before anything is registered, so a refused value never sticks to the model's config."""
        path = self.locate(model)
        check_spec(spec, self.opts.allow_any_model_path)
        known = self.configs.get(model)
        target = path or (known.path if known else self.catalog().get(model))
        if ctx is not None and target is not None:  # (an unknown name is refused by register)
            trained = describe(target).n_ctx_train
            if trained and ctx > trained:
                raise RequestError(f"ctx {ctx} is larger than the {trained} tokens {model_name(target)} was "
                                   "trained for", f"ask for at most {trained}; GET /bostudio/plans/MODEL?ctx=N "
                                                  "shows the memory a context needs")
        return path

    def register(self, model: str, ctx: int | None = None, spec: str | None = None,
                 port: int | None = None, path: Path | None = None, cache_type: str | None = None,
                 workload: str | None = None) -> ModelConfig:
        """A model named or given by path (control API): its config, updated with what was asked. `path`
        is what admit_start() returned (called off the event loop); without it, a model given by path
        goes through the same model-path check (locate), blocking."""
        if path is None and model in self.catalog():
            cfg = self.config_for(model)
        else:
            path = path or self.locate(model)
            assert path is not None  # (locate returns None only for a catalog name)
            name = model_name(path)
            known = self.catalog().get(name)
            if known is not None and not _same_file(known, path):
                # Never let a name silently pick another file than the one asked for.
                raise RequestError(f"a model named {name!r} is already served from {str(known)!r}; "
                                   f"{str(path)!r} has the same name",
                                   "rename one of the files, or use the model by its name")
            cfg = self.configs.get(name) or ModelConfig(name, path, self.opts.ctx, self.opts.spec)
            self.configs[name] = cfg
        if spec is not None:
            parse_spec("auto" if spec == "on" else spec)  # a bad value fails here, before any relaunch
            cfg.spec = spec  # (a draft:PATH was checked by admit_start, off the loop)
        if ctx is not None:
            cfg.ctx = ctx
        if port is not None:
            cfg.port = port
        if workload is not None:
            cfg.workload = workload  # a new workload: auto may speculate again (auto_off names the old one)
            cfg.draft_len = cfg.draft_len_failed = None
        if cache_type is not None:
            cache_type_of(cache_type)  # an unknown type fails here, with the valid ones named
            cfg.cache_type = cache_type
        return cfg

    # ------------------------------------------------------------------ the public operations

    async def get_ready(self, name: str) -> Instance:
        """The ready instance for `name`, loading it on demand. Callers queue here while it loads."""
        inst = self.instances.get(name)
        if inst is not None and inst.state == READY:
            inst.last_used = time.monotonic()
            return inst
        if inst is None or inst.state in (STOPPED, STOPPING):  # a stop in progress finishes first
            inst = await self.start(self.config_for(name))
        elif inst.state == FAILED and self._cooled_down(inst):
            log.info("%s: retrying after the failure cool-down", name)
            inst = self.launch(inst.cfg)
        elif inst.state == FAILED and inst.error and inst.error.get("type") == ModelFileError.__name__:
            raise ModelFileError(inst.error["message"], inst.error["hint"])  # still the file's fault (422)
        elif inst.state == FAILED:
            raise ServerError(f"model {name} failed: {inst.error['message'] if inst.error else 'unknown'}",
                              f"see GET /bostudio/instances/{name}/log; restart it with POST "
                              f"/bostudio/instances/{name}/restart"
                              + (f" (retried automatically in {inst.retry_json()['in_s']:.0f} s)"
                                 if self.opts.failed_cooldown > 0 else ""))
        assert inst.ready is not None
        await asyncio.wait_for(asyncio.shield(inst.ready), self.opts.load_timeout)
        inst.last_used = time.monotonic()
        return inst

    def _cooled_down(self, inst: Instance) -> bool:
        return (self.opts.failed_cooldown > 0 and inst.failed_at is not None
                and time.time() - inst.failed_at >= self.opts.failed_cooldown)

    async def confirm_exited(self, inst: Instance, wait: float = 2.0) -> bool:
        """True if `inst`'s server has exited; then waits until the supervisor has noticed, so that
        the next get_ready() waits for the restart instead of routing to the dead port."""
        proc = inst.proc
        deadline = time.monotonic() + wait
        # A SIGKILLed server tears down for a moment: its socket may still take a connection.
        while proc is not None and proc.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc is None or proc.alive():
            return False
        while inst.state == READY and inst.proc is proc and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return True

    def stop_timeout(self) -> float:
        """The longest a stop can take: saving prompts, the lifecycle task's end, SIGTERM, SIGKILL."""
        return SAVE_TIMEOUT_S + TASK_CANCEL_TIMEOUT_S + self.opts.grace + 30.0

    async def start(self, cfg: ModelConfig) -> Instance:
        """launch(), after a stop in progress for the same model has finished (a bounded wait)."""
        inst = self.instances.get(cfg.name)
        if inst is not None and inst.state == STOPPING:
            await self._wait_stopped(inst)
        return self.launch(cfg)

    async def _wait_stopped(self, inst: Instance) -> None:
        """Wait for the stop in progress of `inst`; ServerError if it does not end in stop_timeout()."""
        try:
            if inst.stop_task is not None:
                await asyncio.wait_for(asyncio.shield(inst.stop_task), self.stop_timeout())
            deadline = time.monotonic() + self.stop_timeout()
            while inst.state == STOPPING and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        except asyncio.TimeoutError:
            pass
        if inst.state == STOPPING:
            raise ServerError(f"{inst.name} is still stopping after {self.stop_timeout():.0f} s",
                              f"see the daemon log and {inst.log_path}")

    def launch(self, cfg: ModelConfig) -> Instance:
        """Start (or keep) the instance of `cfg` loading; returns at once."""
        inst = self.instances.get(cfg.name)
        if inst is not None and inst.state in RESIDENT_STATES:
            return inst
        if inst is None or inst.cfg is not cfg:
            inst = Instance(cfg)
            self.instances[cfg.name] = inst
        inst.stopping = False
        inst.error = None
        inst.failed_at = None
        inst.crashes.reset()
        inst.ready = asyncio.get_running_loop().create_future()
        inst.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "never retrieved"
        self._set_state(inst, LOADING)
        inst.task = asyncio.create_task(self._lifecycle(inst), name=f"instance {cfg.name}")
        return inst

    async def stop(self, name: str, reason: str = "stopped") -> Instance:
        """Stop `name`'s child. Always completes (bounded): a failure to save its prompts or any other
        error on the way is logged and the stop goes on. A concurrent stop waits for this one; the
        stop itself runs on even if the caller (a client that hung up) is cancelled."""
        inst = self.instances.get(name)
        if inst is None:
            raise ModelError(f"model {name!r} is not running", "GET /bostudio/instances lists what runs")
        if inst.stop_task is None or inst.stop_task.done():
            inst.stop_task = asyncio.ensure_future(self._stop(inst, reason))
        await asyncio.wait_for(asyncio.shield(inst.stop_task), self.stop_timeout() + 10.0)
        return inst

    async def _stop(self, inst: Instance, reason: str) -> None:
        inst.stopping = True
        failed = inst.state == FAILED
        was_ready = inst.state == READY
        try:
            if inst.state in RESIDENT_STATES:
                self._set_state(inst, STOPPING, reason=reason)
            if was_ready:
                try:
                    await asyncio.wait_for(self._save_prompts(inst, reason), SAVE_TIMEOUT_S)
                except Exception as exc:  # the store is a cache: losing it must not keep a model running
                    log.warning("%s: saving the prompts before %s failed: %r", inst.name, reason, exc)
            if inst.task is not None and not inst.task.done():
                inst.task.cancel()
                try:
                    await asyncio.wait_for(asyncio.shield(inst.task), TASK_CANCEL_TIMEOUT_S)
                except (asyncio.CancelledError, Exception):
                    pass
        finally:
            try:
                await self._stop_process(inst)
            except Exception:
                log.exception("%s: stopping the process failed", inst.name)
            if not failed:
                self._set_state(inst, STOPPED, reason=reason)
            self._resolve(inst, ServerError(f"model {inst.name} was {reason} while loading", "send the request again"))

    async def restart(self, name: str) -> Instance:
        cfg = self.config_for(name)
        if name in self.instances:
            await self.stop(name, reason="restarting")
        return self.launch(cfg)

    async def set_speculation(self, name: str, mode: str, path: Path | None = None) -> Instance:
        """Switch speculation on/off/auto (or a specific mode) for `name`; relaunch it if it runs. `path`:
        what admit_start(name, spec=mode) returned (the same model-path check as a start)."""
        cfg = self.register(name, spec=mode, path=path)
        inst = self.instances.get(cfg.name)
        if inst is not None and inst.state in RESIDENT_STATES:
            return await self.restart(cfg.name)
        return inst or Instance(cfg)

    async def shutdown(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*(self.stop(n, reason="daemon shutdown") for n, i in list(self.instances.items())
                               if i.state in RESIDENT_STATES + (STOPPING,)), return_exceptions=True)

    def start_background(self) -> None:
        self._background = [asyncio.create_task(self._idle_loop()), asyncio.create_task(self._stats_loop()),
                            asyncio.create_task(self._progress_loop())]

    def children(self) -> list[ChildRecord]:
        out = []
        for inst in self.instances.values():
            p = inst.proc
            if p is not None and p.alive() and p.pid is not None and inst.port is not None:
                ct = p.create_time
                if ct is not None:
                    out.append(ChildRecord(inst.name, p.pid, ct, inst.port))
        return out

    # ------------------------------------------------------------------ lifecycle

    def _set_state(self, inst: Instance, state: str, **extra: object) -> None:
        inst.state = state
        log.info("%s: %s %s", inst.name, state, extra or "")
        self.bus.publish("state", model=inst.name, state=state, instance=inst.to_json(), **extra)

    def _resolve(self, inst: Instance, error: BaseException | None) -> None:
        fut = inst.ready
        if fut is None or fut.done():
            return
        if error is None:
            fut.set_result(inst)
        else:
            fut.set_exception(error)

    def _fail(self, inst: Instance, exc: BostudioError) -> None:
        inst.error = {"message": exc.message, "hint": exc.hint, "type": type(exc).__name__,
                      "log_tail": tail(inst.log_path, 20), "plan": inst.plan}
        inst.failed_at = time.time()
        inst.cfg_cooldown = self.opts.failed_cooldown
        self._set_state(inst, FAILED, error=inst.error)
        self._resolve(inst, exc)

    async def _lifecycle(self, inst: Instance) -> None:
        """Load, serve, and after a crash restart with backoff, until stopped or crash-looping."""
        while True:
            try:
                await self._launch_once(inst)
            except asyncio.CancelledError:
                raise
            except WorkerLostError as exc:
                await self._stop_process(inst)
                self._fail(inst, exc)
                return
            except OutOfMemoryError as exc:
                # Restarting would run out of memory again: report it with the plan that caused it.
                await self._stop_process(inst)
                exc.message += f" (plan: {inst.plan.get('summary', 'unknown')})"
                self._fail(inst, exc)
                return
            except ModelFileError as exc:
                # The file's own fault: every relaunch would fail the same way. Failed at once (422 to
                # the requests waiting), no crash counted, no back-off.
                await self._stop_process(inst)
                self._fail(inst, exc)
                return
            except PortInUseError as exc:
                await self._stop_process(inst)
                if inst.cfg.port is not None:  # a pinned port that is taken will stay taken
                    self._fail(inst, exc)
                    return
                if self._crashed(inst, str(exc)):  # the next launch picks another free port
                    return
                await self._backoff(inst)
                continue
            except BostudioError as exc:
                await self._stop_process(inst)
                if self._crashed(inst, str(exc)):
                    return
                await self._backoff(inst)
                continue
            except Exception as exc:  # a bug must not leave requests waiting forever
                log.exception("%s: unexpected error while loading", inst.name)
                await self._stop_process(inst)
                self._fail(inst, ServerError(f"unexpected error while loading: {exc!r}", "see the daemon log"))
                return
            self._resolve(inst, None)
            code = await self._wait_exit(inst)
            if inst.stopping:
                return
            if await self._lost_worker(inst, code):
                continue  # relaunch at once, without the dead worker
            lines = tail(inst.log_path, 5)
            why = f"llama-server exited with code {code}: " + (lines[-1] if lines else "")
            self._exited(inst, why)  # new requests wait for the relaunch from here on
            if await self._requests_it_broke(inst) == 1:
                # It died of one request: that one was answered 502 and is not sent again; the others
                # queue for the relaunch. Counted, one client could crash-loop a model for everyone.
                log.warning("%s: %s, while serving one request (answered 502, not sent again); relaunching, "
                            "not counted toward the crash loop", inst.name, why)
                self._set_state(inst, LOADING, reason="relaunching after a request that ended the child")
                continue
            if self._crashed(inst, why):
                return
            await self._backoff(inst)

    async def _lost_worker(self, inst: Instance, code: int | None) -> bool:
        """After the child died: if an RPC worker it used no longer answers, mark the model failed
        with that reason, drop the worker, and (True) let the lifecycle relaunch without it. The dead
        child's process group is gone before the relaunch (no orphan). A relaunch that no longer
        fits fails with PlanError, which _fail reports."""
        if not inst.pool.probes:
            return False
        dead = await asyncio.to_thread(unreachable_workers, [p.worker for p in inst.pool.probes if p.ok])
        if not dead:
            return False
        await self._stop_process(inst)
        inst.lost_workers += tuple(w.endpoint for w in dead)
        why = (f"rpc worker {', '.join(w.endpoint for w in dead)} stopped answering; llama-server exited "
               f"with code {code}")
        inst.error = {"message": why, "hint": "relaunching without it if the model still fits",
                      "type": "WorkerLost", "log_tail": tail(inst.log_path, 20), "plan": inst.plan}
        self._set_state(inst, FAILED, error=inst.error, reason=why)
        if inst.ready is None or inst.ready.done():
            inst.ready = asyncio.get_running_loop().create_future()
            inst.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._set_state(inst, LOADING, reason=f"relaunching without {', '.join(w.endpoint for w in dead)}")
        return True

    def _crashed(self, inst: Instance, why: str) -> bool:
        """Count a crash; after too many in the window mark the model failed. True when failed."""
        inst.crashes.record(time.monotonic())
        self.on_children(self.children())
        if inst.crashes.crash_loop():
            self._fail(inst, ServerError(
                f"{inst.name} crashed {len(inst.crashes.times)} times in {inst.crashes.window:.0f} s; "
                f"last: {why}", f"see the log {inst.log_path}; restart it with `bostudio up --daemon {inst.name}`"))
            return True
        self._set_state(inst, RESTARTING, reason=why, crashes=len(inst.crashes.times))
        if inst.ready is None or inst.ready.done():
            inst.ready = asyncio.get_running_loop().create_future()
            inst.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        return False

    def _exited(self, inst: Instance, why: str) -> None:
        """The child exited on its own: requests from now on wait for the relaunch (a fresh `ready`)."""
        self.on_children(self.children())
        self._set_state(inst, RESTARTING, reason=why, crashes=len(inst.crashes.times))
        if inst.ready is None or inst.ready.done():
            inst.ready = asyncio.get_running_loop().create_future()
            inst.ready.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _requests_it_broke(self, inst: Instance) -> int | None:
        """How many requests the exited child's death broke (router._ended), once every request on its
        launch has ended: each finds the connection gone at once, so this is quick; None when they did not
        end within SETTLE_S (a hang guard: then the death is counted as a crash)."""
        launch = inst.loads
        deadline = time.monotonic() + SETTLE_S
        while inst.in_flight.get(launch, 0) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if inst.in_flight.get(launch, 0) > 0:
            return None
        return inst.died_with.get(launch, 0)

    async def _backoff(self, inst: Instance) -> None:
        await asyncio.sleep(inst.crashes.backoff())
        self._set_state(inst, LOADING)

    async def _launch_once(self, inst: Instance) -> None:
        cfg = inst.cfg
        # Probing the engine and reading a large GGUF header take a while: not on the event loop.
        engine = await asyncio.to_thread(lambda: self.engine)
        try:
            info = await asyncio.to_thread(describe, cfg.path)
            caps = await asyncio.to_thread(model_caps, cfg.path)
        except ModelError as exc:  # a broken header, a file gone: the file's fault, not a crash
            raise ModelFileError(f"{cfg.name}: {exc.message}", exc.hint) from exc
        workload = await asyncio.to_thread(cfg.resolved_workload)
        workers = self.workers_for(cfg.name)
        inst.pool = await asyncio.to_thread(discover_pool, engine, workers) if workers else Pool()
        for problem in inst.pool.problems:
            log.warning("%s: %s; planning without it", cfg.name, problem)
        try:
            devices = await asyncio.to_thread(self.planning_devices, engine, cfg.name)
            # CPU threads (planner.threads) are split between this child and those already resident (a child
            # launched alone gets the whole rule; one launched beside two others, a third of it).
            others = sum(1 for i in self.instances.values() if i is not inst and i.state in RESIDENT_STATES)
            draft_len = (cfg.draft_len, cfg.draft_len_reason) if cfg.draft_len is not None and cfg.spec == "auto" \
                else None
            decision = await asyncio.to_thread(
                lambda: decide_child(info, engine, cfg.spec, cfg.ctx, cfg.cache_type, pull=self.opts.pull,
                                     workload=workload, fallback=cfg.fallback(workload),
                                     prompt_reuse=self.slot_store is not None, caps=caps, pool=inst.pool,
                                     devices=devices, children=1 + others, draft_len=draft_len))
        except PlanError as exc:
            if inst.lost_workers:  # it fitted with the worker that died: say so; retrying cannot help
                raise WorkerLostError(f"{cfg.name} does not fit without the lost rpc worker(s) "
                                      f"{', '.join(inst.lost_workers)}: {exc.message}",
                                      "restart the worker's `bostudio rpc serve`, then restart the model") from exc
            # A plan is a function of the file's header and this machine: planned again it fails again.
            raise ModelFileError(f"{cfg.name} cannot be planned: {exc.message}", exc.hint) from exc
        except ModelError as exc:  # the header read again by the planner (a draft's, a split part's)
            raise ModelFileError(f"{cfg.name}: {exc.message}", exc.hint) from exc
        planned = decision.plan
        speculator = decision.speculator
        inst.break_even, inst.break_even_source = await asyncio.to_thread(
            predicted_break_even, cfg.path, engine, workload)
        inst.tune_refused = await asyncio.to_thread(tune_refusals, cfg.path, engine, workload)
        need = decision.bytes  # what it is evicted by is what runs
        inst.speculator = speculator
        inst.layout = decision.layout
        reuse = self.slot_store is not None and decision.prompt_reuse
        inst.state_key = (await asyncio.to_thread(state_key, cfg.path, engine.commit, decision.ctx,
                                                  planned.intent.cache_type_k, "auto", planned.intent.swa_full,
                                                  planned.intent.flash_attn != "off")
                          if reuse else None)
        inst.plan = {"bytes": need, "weights_bytes": info.file_size, "ctx": decision.ctx, "ctx_asked": cfg.ctx,
                     "n_ctx_train": info.n_ctx_train,
                     "cache_type": cfg.cache_type, "layout": decision.layout.to_json(),
                     "kind": caps.kind, "prompt_cache_bytes": planned.chosen.component_bytes(PROMPT_CACHE),
                     "budget_bytes": self.budget(), "why": planned.why,
                     "threads": planned.threads.to_json() if planned.threads is not None else None,
                     "flash_attn": planned.flash_attn_json(),
                     "uses": [{"device": u.device, "component": u.component, "bytes": u.bytes}
                              for u in planned.chosen.uses],
                     "summary": f"{need / policy.MIB:.0f} MiB for {cfg.name} at ctx {decision.ctx} with "
                                f"speculation {speculator.label}, budget {self.budget() / policy.MIB:.0f} MiB"}
        await self._make_room(inst, need)

        inst.port = cfg.port or free_loopback_port(avoid={i.port for i in self.instances.values()
                                                           if i is not inst and i.port})
        inst.api_key = secrets.token_urlsafe(32)
        argv = decision.argv(port=inst.port, alias=cfg.name,
                             slot_dir=self.slot_store.ensure() if reuse and self.slot_store is not None else None)
        # The key goes through the environment, not argv (which every local user can read).
        env = {**os.environ, "LLAMA_API_KEY": inst.api_key}
        inst.proc = ServerProcess(argv, inst.port, inst.log_path, api_key=inst.api_key, env=env)
        inst.in_flight.clear()  # requests of earlier launches ended with them
        inst.died_with.clear()
        inst.loads += 1
        inst.proc.start()  # on the loop's thread: see the module docstring
        self.on_children(self.children())
        self.bus.publish("launch", model=cfg.name, pid=inst.proc.pid, port=inst.port, argv=argv)
        inst.ready_s = await self._wait_ready(inst)
        if inst.http is not None:
            await inst.http.aclose()
        # For /metrics; proxied requests take the passthrough path (bostudio/runtime/passthrough.py).
        inst.http = httpx.AsyncClient(base_url=inst.proc.base_url, timeout=UPSTREAM_TIMEOUT, trust_env=False,
                                      headers={"Authorization": f"Bearer {inst.api_key}"})
        if caps.kind == "chat":  # embedding and rerank models generate nothing to probe
            status = await asyncio.to_thread(self._probe, inst)
            inst.spec_status = asdict(status)
        else:
            inst.spec_status = None
        inst.spec_base = (inst.stats.draft_tokens, inst.stats.draft_accepted, inst.stats.requests)
        inst.spec_check = None
        inst.draft_advice = None
        inst.prefill = PrefillTracker()  # the new child numbers its tasks from zero
        inst.stats.mean_accepted_length = None  # the new child's /metrics start from zero
        await self._restore_prompts(inst)
        inst.ready_since = time.monotonic()
        inst.last_used = time.monotonic()
        self._set_state(inst, READY)

    async def _save_prompts(self, inst: Instance, reason: str) -> None:
        """Save the slots of a child about to stop (stop, idle, eviction, relaunch, shutdown)."""
        if self.slot_store is None or inst.state_key is None or inst.http is None:
            return
        proc = inst.proc
        if proc is None or not proc.alive():
            return
        started = time.monotonic()
        saved = await save_slots(inst.http, self.slot_store, inst.state_key)
        if saved:
            inst.prompts = {**inst.prompts, "saved_slots": len(saved),
                            "saved_tokens": sum(v["tokens"] for v in saved.values()),
                            "saved_s": round(time.monotonic() - started, 3), "saved_on": reason}
            self.bus.publish("prompts", model=inst.name, action="saved", slots=saved)
            log.info("%s: saved %d slot(s) before %s", inst.name, len(saved), reason)

    async def _restore_prompts(self, inst: Instance) -> None:
        """Restore the slot states saved for exactly this child's identity, before it is ready."""
        if self.slot_store is None or inst.state_key is None or inst.http is None:
            inst.prompts = {}
            return
        started = time.monotonic()
        try:
            restored = await restore_slots(inst.http, self.slot_store, inst.state_key)
        except Exception as exc:  # a store problem costs the saved prompts, never the load
            log.warning("%s: restoring saved prompts failed: %r", inst.name, exc)
            inst.prompts = {"key": inst.state_key.digest, "restored_slots": 0, "error": str(exc)}
            return
        inst.prompts = {"key": inst.state_key.digest, "restored_slots": len(restored),
                        "restored_tokens": sum(restored.values()),
                        "restored_s": round(time.monotonic() - started, 3)}
        if restored:
            self.bus.publish("prompts", model=inst.name, action="restored", slots=restored)
            log.info("%s: restored %d slot(s), %d tokens", inst.name, len(restored), sum(restored.values()))

    def _probe(self, inst: Instance):
        assert inst.proc is not None and inst.speculator is not None
        with LlamaClient(inst.proc.base_url, inst.api_key, timeout=httpx.Timeout(self.opts.stall_timeout, connect=2.0),
                         log_path=inst.log_path) as client:
            return verify_speculation(client, inst.speculator, inst.log_path, self.opts.probe_tokens)

    async def _wait_ready(self, inst: Instance) -> float:
        assert inst.proc is not None
        return await inst.proc.wait_ready_async(self.opts.load_timeout, self.opts.stall_timeout)

    async def _wait_exit(self, inst: Instance) -> int | None:
        assert inst.proc is not None and inst.proc.proc is not None
        while True:
            code = inst.proc.proc.poll()
            if code is not None:
                return code
            await asyncio.sleep(0.2)

    async def _stop_process(self, inst: Instance) -> None:
        proc = inst.proc
        if proc is not None and proc.proc is not None:
            await asyncio.to_thread(proc.stop, self.opts.grace)
        if inst.http is not None:
            await inst.http.aclose()
            inst.http = None
        inst.ready_since = None
        self.on_children(self.children())

    async def _make_room(self, inst: Instance, need: int) -> None:
        resident = [policy.Resident(i.name, int(i.plan.get("bytes", 0)), i.last_used,
                                    busy=i.active > 0 or i.state != READY)
                    for i in self.instances.values() if i is not inst and i.state in RESIDENT_STATES]
        victims = policy.choose_evictions(resident, need, self.budget())
        if victims is not None:  # each offload device must hold what lands on it too
            by_device = await asyncio.to_thread(self._device_room, inst)
            more = policy.choose_device_evictions([r for r in resident if r.name not in victims], *by_device)
            victims = None if more is None else victims + more
        if victims is None:
            raise OutOfMemoryError(f"{inst.name} needs {need / policy.MIB:.0f} MiB and does not fit the memory "
                                   f"budget of {self.budget() / policy.MIB:.0f} MiB next to the busy models",
                                   "stop a model (`bostudio stop MODEL`), use a smaller context, or raise "
                                   "--memory-budget")
        for name in victims:
            self.bus.publish("evict", model=name, for_model=inst.name)
            await self.stop(name, reason="evicted")

    def _device_room(self, inst: Instance) -> tuple[dict[str, dict[str, int]], dict[str, int], dict[str, int]]:
        """(what each resident holds per offload device, what `inst` needs there, what each device holds:
        its free memory as the engine listed it, or its cap from config.toml) for choose_device_evictions."""
        def per_device(plan: dict) -> dict[str, int]:
            out: dict[str, int] = {}
            for u in plan.get("uses", []):
                out[u["device"]] = out.get(u["device"], 0) + int(u["bytes"])
            return out

        capacity = {d.label: min(d.usable_bytes, d.budget_bytes if d.budget_bytes is not None else d.usable_bytes)
                    for d in discover_devices(engine_devices=self.engine.devices).devices if d.is_gpu and not d.remote}
        on_device = {i.name: per_device(i.plan) for i in self.instances.values()
                     if i is not inst and i.state in RESIDENT_STATES}
        return on_device, per_device(inst.plan), capacity

    # ------------------------------------------------------------------ background loops

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.2, min(5.0, self.opts.idle_ttl / 4)) if self.opts.idle_ttl > 0 else 5.0)
            resident = [policy.Resident(i.name, 0, i.last_used, busy=i.active > 0)
                        for i in self.instances.values() if i.state == READY]
            for name in policy.idle_expired(resident, time.monotonic(), self.opts.idle_ttl):
                try:
                    await self.stop(name, reason="idle")
                except Exception:  # one model's failed stop must not end idle unloading for all
                    log.exception("%s: idle stop failed", name)

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(2.0)
            for inst in list(self.instances.values()):
                # A request counts when it starts and its timings land when it ends: publish on either.
                seen = (inst.stats.requests, inst.stats.tokens_generated)
                if inst.state != READY or inst.http is None or seen == inst.scraped:
                    continue
                inst.scraped = seen
                try:
                    r = await inst.http.get("/metrics", timeout=5.0)
                    if r.status_code == 200:
                        inst.stats.add_metrics(parse_metrics(r.text))
                except httpx.HTTPError:
                    continue
                self.bus.publish("stats", model=inst.name, stats=inst.stats.to_json())
            for inst in list(self.instances.values()):
                if inst.state == READY:
                    await self._check_speculation(inst)

    async def _progress_loop(self) -> None:
        """While a child has requests in flight, read its /slots for the prompts in progress (issue 33) and
        publish them; once more when they end, so a watcher sees the prefill finish."""
        while True:
            await asyncio.sleep(PROGRESS_POLL_S)
            for inst in list(self.instances.values()):
                busy = inst.active > 0 or bool(inst.prefill.jobs) or bool(inst.prefill.live)
                if inst.state != READY or inst.http is None or not busy:
                    continue
                try:
                    r = await inst.http.get("/slots", timeout=PROGRESS_TIMEOUT)
                    slots = r.json() if r.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    continue
                if slots is None:
                    continue
                was_live = bool(inst.prefill.live)
                try:
                    inst.prefill.observe(slots, time.monotonic(), inst.active)
                except Exception:  # a surprise in one answer must not end progress reports for every model
                    log.exception("%s: reading prompt progress from /slots failed", inst.name)
                    continue
                if inst.prefill.live or was_live:
                    self.bus.publish("progress", model=inst.name, prefill=inst.prefill_json())

    async def _adapt_draft_length(self, inst: Instance, verdict: policy.SpecVerdict) -> bool:
        """Under auto: move the draft length with the acceptance (policy.adapt_draft_length). The pinned
        llama-server honours no per-request draft setting (README, "What llama-server honours per request"),
        so a new length is a relaunch, at the next idle moment (no request is cut; prompt reuse keeps the
        slots); until then ps and the events say what is coming. True when the length is being handled."""
        assert inst.speculator is not None
        n = draft_length(inst.speculator)
        if n is None:
            return False
        st = inst.stats
        per_draft = st.mean_accepted_length - 1.0 if st.mean_accepted_length is not None else None
        advice = policy.adapt_draft_length(n, verdict, per_draft, draft_length_ceiling(inst.speculator),
                                           inst.cfg.draft_len_failed)
        before = inst.draft_advice
        inst.draft_advice = advice.to_json()
        if advice.action not in (policy.SHORTER, policy.LONGER):
            return False
        if before != inst.draft_advice:
            log.warning("%s: %s", inst.name, advice.detail)
            self.bus.publish("speculation", model=inst.name, flagged=verdict.state == "below", check=inst.spec_check,
                             draft_length=advice.n_max, was=n,
                             message=f"{inst.name}: {advice.detail}; relaunching with drafts of {advice.n_max} tokens "
                                     "when idle (--spec auto)")
        if inst.active > 0:
            return True  # done at the next idle moment
        if advice.action == policy.SHORTER:
            inst.cfg.draft_len_failed = n
        inst.cfg.draft_len, inst.cfg.draft_len_reason = advice.n_max, advice.detail
        self.bus.publish("speculation", model=inst.name, relaunch=True, draft_length=advice.n_max, was=n,
                         message=f"{inst.name}: relaunching with drafts of {advice.n_max} tokens (was {n})")
        await self.restart(inst.name)
        return True

    async def _check_speculation(self, inst: Instance) -> None:
        """Acceptance since launch against the break-even: flag it (ps, events); under auto, relaunch with
        the next-best profile entry or without speculation at the next idle moment."""
        d0, a0, r0 = inst.spec_base
        st = inst.stats
        verdict = policy.judge_acceptance(st.draft_tokens - d0, st.draft_accepted - a0, st.requests - r0,
                                          inst.break_even)
        was = inst.spec_check["state"] if inst.spec_check else None
        inst.spec_check = dict(verdict.to_json(), break_even_source=inst.break_even_source)
        speculating = inst.speculator is not None and inst.speculator.kind != "none"
        if speculating and inst.cfg.spec == "auto" and await self._adapt_draft_length(inst, verdict):
            return
        action = policy.fallback_action(verdict, inst.cfg.spec, speculating, busy=inst.active > 0)
        if action == policy.NONE:
            return
        if was != "below":
            log.warning("%s: %s", inst.name, verdict.detail)
            self.bus.publish("speculation", model=inst.name, flagged=True, check=inst.spec_check,
                             message=f"{inst.name}: {verdict.detail}" + (
                                 "; relaunching without it when idle (--spec auto)" if inst.cfg.spec == "auto"
                                 else f"; kept, since speculation was set to {inst.cfg.spec!r}"))
        if action == policy.RELAUNCH:
            workload = await asyncio.to_thread(inst.cfg.resolved_workload)
            inst.cfg.auto_off, inst.cfg.auto_off_reason = workload, verdict.detail
            # restart() stops through stop(), which saves the slots' prompts first (prompt reuse).
            self.bus.publish("speculation", model=inst.name, relaunch=True, workload=workload,
                             message=f"{inst.name}: relaunching with another speculator or none for workload "
                                     f"{workload!r}: {verdict.detail}")
            await self.restart(inst.name)

