"""The supervisor: llama-server instances by model name, started on demand, stopped, restarted, unloaded when
idle or when memory is needed; the background loops that watch them (idle, stats, prompt progress, speculation).

Each instance's lifecycle moves only through lifecycle.step (pure); its effects run in effects.EffectsRunner.
Everything runs on the daemon's one event loop (no locks).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bostudio import paths
from bostudio.catalog.resolve import looks_like_path, model_name, resolve_model
from bostudio.daemon.modelpaths import check_model_path, check_spec
from bostudio.daemon.state import ChildRecord
from bostudio.daemon.supervise import lifecycle as lc
from bostudio.daemon.supervise import policy
from bostudio.daemon.supervise.effects import PROGRESS_TIMEOUT, SAVE_TIMEOUT_S, TASK_CANCEL_TIMEOUT_S, EffectsRunner
from bostudio.daemon.supervise.events import EventBus
from bostudio.daemon.supervise.instance import Instance, ModelConfig
from bostudio.daemon.supervise.lifecycle import READY, RESIDENT_STATES, STOPPING
from bostudio.daemon.supervise.slots import SlotStore
from bostudio.engine.discover import Engine, find_engine
from bostudio.errors import ModelError, ModelFileError, OutOfMemoryError, RequestError, ServerError
from bostudio.gguf import describe
from bostudio.hardware import Device, discover_devices
from bostudio.planner.memory import cache_type as cache_type_of
from bostudio.rpc.probe import Pool, discover_pool
from bostudio.rpc.workers import Worker
from bostudio.runtime.client import ChildError
from bostudio.runtime.metrics import parse_metrics
from bostudio.runtime.process import LOAD_TIMEOUT_S
from bostudio.speculation import draft_length, draft_length_ceiling, parse_spec

log = logging.getLogger("bostudio.daemon")

PROGRESS_POLL_S = 1.0  # how often a busy child's /slots is read for prompt progress (answered mid-batch)


@dataclass(frozen=True)
class SupervisorOptions:
    engine: str | None = None  # explicit llama-server path (else the best one found)
    memory_budget: int = 0  # bytes; 0: 80% of this machine's RAM
    idle_ttl: float = 600.0  # seconds; 0: never unload idle models
    stall_timeout: float = 120.0  # a silent loader is killed after this
    load_timeout: float = LOAD_TIMEOUT_S
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
    context_overflow: str = "trim"  # a prompt over the context: trim earlier turns' middles | refuse (400)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


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
        self.effects = EffectsRunner(self)

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

    def children_beside(self, name: str) -> int:
        """The resident children other than `name`'s: a launch of `name` splits the host's CPU threads
        (planner.threads) with them, so a child launched beside two others gets a third of the rule."""
        return sum(1 for n, i in self.instances.items() if n != name and i.state in RESIDENT_STATES)

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
                busy += i.bytes
                continue
            for device, n in i.device_bytes().items():
                freed[device] = freed.get(device, 0) + n
        out = []
        for d in discover_devices(engine_devices=engine.devices, host_amx=engine.amx).devices:
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
        if inst is None:
            what = lc.START
        else:
            assert inst.life is not None
            what = lc.on_request(inst.life, inst.error.get("type") if inst.error else None, time.time(),
                                 self.opts.failed_cooldown)
        if what == lc.SERVE:
            assert inst is not None
            inst.last_used = time.monotonic()
            return inst
        if what == lc.START:
            inst = await self.start(self.config_for(name))
        elif what == lc.RETRY:
            assert inst is not None
            log.info("%s: retrying after the failure cool-down", name)
            inst = self.launch(inst.cfg)
        elif what == lc.REFUSE_FILE:
            assert inst is not None and inst.error is not None
            raise ModelFileError(inst.error["message"], inst.error["hint"])  # still the file's fault (422)
        elif what == lc.REFUSE:
            assert inst is not None
            retry = inst.retry_json()
            raise ServerError(f"model {name} failed: {inst.error['message'] if inst.error else 'unknown'}",
                              f"see GET /bostudio/instances/{name}/log; restart it with POST "
                              f"/bostudio/instances/{name}/restart"
                              + (f" (retried automatically in {retry['in_s']:.0f} s)"
                                 if self.opts.failed_cooldown > 0 and retry and retry["in_s"] is not None else ""))
        assert inst.ready is not None
        await asyncio.wait_for(asyncio.shield(inst.ready), self.opts.load_timeout)
        inst.last_used = time.monotonic()
        return inst

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
        effects = self.apply(inst, lc.Launch())
        spawn = next(n for n, eff in enumerate(effects) if isinstance(eff, lc.Spawn))
        for eff in effects[:spawn]:
            self.effects.run_now(inst, eff)
        inst.task = asyncio.create_task(self._lifecycle(inst, effects[spawn + 1:]), name=f"instance {cfg.name}")
        return inst

    def apply(self, inst: Instance, event: lc.Event) -> list:
        """Move `inst`'s lifecycle by `event`: its new state, and the effects to run."""
        assert inst.life is not None
        inst.life, effects = lc.step(inst.life, event, time.monotonic(), time.time())
        return effects

    async def _lifecycle(self, inst: Instance, effects: list) -> None:
        """Load, serve, and after a crash relaunch with backoff, until stopped or failed: each effect that
        waits ends in the next event, and the table (lifecycle.step) says what follows."""
        while effects:
            event = await self.effects.run(inst, effects)
            if event is None:
                return
            effects = self.apply(inst, event)

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
        effects = self.apply(inst, lc.Stop(reason))
        try:
            await self.effects.run(inst, [e for e in effects if not isinstance(e, lc.StopChild)])
        finally:  # whatever happened on the way, the child's process group is stopped
            await self.effects.run(inst, [e for e in effects if isinstance(e, lc.StopChild)])
            await self.effects.run(inst, self.apply(inst, lc.Stopped(reason)))

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

    def note_children(self) -> None:
        """The live children changed: tell the daemon (its state file)."""
        self.on_children(self.children())

    def views(self) -> list[lc.View]:
        return [lc.View(i.name, i.state, i.bytes, i.last_used, i.active) for i in self.instances.values()]

    async def make_room(self, inst: Instance, need: int) -> None:
        """Stop idle models, least recently used first, until `need` more bytes fit the budget."""
        victims = lc.evictions(self.views(), inst.name, need, self.budget())
        if victims is not None:  # each offload device must hold what lands on it too
            on_device, want, capacity = await asyncio.to_thread(self._device_room, inst)
            more = lc.device_evictions(self.views(), inst.name, victims, on_device, want, capacity)
            victims = None if more is None else victims + more
        if victims is None:
            raise OutOfMemoryError(f"{inst.name} needs {need / policy.MIB:.0f} MiB and does not fit the memory "
                                   f"budget of {self.budget() / policy.MIB:.0f} MiB next to the busy models",
                                   "stop a model (`bostudio stop MODEL`), use a smaller context, or raise "
                                   "--memory-budget")
        for name in victims:
            log.info("%s: evicted to make room for %s", name, inst.name)
            self.bus.publish("evict", model=name, for_model=inst.name)
            await self.stop(name, reason="evicted")

    def _device_room(self, inst: Instance) -> tuple[dict[str, dict[str, int]], dict[str, int], dict[str, int]]:
        """(what each resident holds per offload device, what `inst` needs there, what each device holds: its
        free memory as the engine listed it, or its cap from config.toml) for lifecycle.device_evictions.
        Blocking (device probes): call it off the event loop."""
        capacity = {d.label: min(d.usable_bytes, d.budget_bytes if d.budget_bytes is not None else d.usable_bytes)
                    for d in discover_devices(engine_devices=self.engine.devices, host_amx=self.engine.amx).devices if d.is_gpu and not d.remote}
        on_device = {i.name: i.device_bytes() for i in self.instances.values()
                     if i is not inst and i.state in RESIDENT_STATES}
        return on_device, inst.device_bytes(), capacity

    # ------------------------------------------------------------------ background loops

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.2, min(5.0, self.opts.idle_ttl / 4)) if self.opts.idle_ttl > 0 else 5.0)
            for name in lc.idle(self.views(), time.monotonic(), self.opts.idle_ttl):
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
                except ChildError:
                    continue
                self.bus.publish("stats", model=inst.name, stats=inst.stats.to_json())
            for inst in list(self.instances.values()):
                if inst.state == READY:
                    await self.check_speculation(inst)

    async def _progress_loop(self) -> None:
        """While a child has requests in flight, read its /slots for the prompts in progress and
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
                except (ChildError, ValueError):
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

    async def adapt_draft_length(self, inst: Instance, verdict: policy.SpecVerdict) -> bool:
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

    async def check_speculation(self, inst: Instance) -> None:
        """Acceptance since launch against the break-even: flag it (ps, events); under auto, relaunch with
        the next-best profile entry or without speculation at the next idle moment."""
        d0, a0, r0 = inst.spec_base
        st = inst.stats
        verdict = policy.judge_acceptance(st.draft_tokens - d0, st.draft_accepted - a0, st.requests - r0,
                                          inst.break_even)
        was = inst.spec_check["state"] if inst.spec_check else None
        inst.spec_check = dict(verdict.to_json(), break_even_source=inst.break_even_source)
        speculating = inst.speculator is not None and inst.speculator.kind != "none"
        if speculating and inst.cfg.spec == "auto" and await self.adapt_draft_length(inst, verdict):
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

