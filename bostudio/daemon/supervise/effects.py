"""The effects runner: it executes what supervise/lifecycle.py decides, and is the only code of the supervisor
that starts and stops processes, waits on them, reads their logs and saves their slots. What it waits for (a
load, a child's exit, a back-off, the requests on a dead child) comes back as the lifecycle's next event.

Everything runs on the daemon's one event loop (no locks): children are forked from the loop's thread, which
lives as long as the daemon, so PR_SET_PDEATHSIG kills them when the daemon dies. Blocking work that forks
nothing (waiting for a group to exit, the probe request, headers, plans) goes to threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict

import httpx

from bostudio.gguf.capabilities import model_caps
from bostudio.daemon.supervise import lifecycle as lc
from bostudio.daemon.supervise.instance import Instance
from bostudio.daemon.supervise.launching import decide_child
from bostudio.daemon.supervise.prefill import PrefillTracker
from bostudio.daemon.supervise.slots import restore_slots, save_slots, state_key
from bostudio.errors import BostudioError, ModelError, ModelFileError, PlanError
from bostudio.gguf import describe
from bostudio.profiles import predicted_break_even, tune_refusals
from bostudio.rpc.probe import Pool, discover_pool
from bostudio.rpc.workers import Worker
from bostudio.runtime.client import AsyncLlamaClient, LlamaClient
from bostudio.runtime.net import free_loopback_port
from bostudio.runtime.process import ServerProcess, tail
from bostudio.runtime.verify import verify_speculation

log = logging.getLogger("bostudio.daemon")

UPSTREAM_TIMEOUT = httpx.Timeout(10.0, connect=2.0)
PROGRESS_TIMEOUT = httpx.Timeout(5.0, connect=2.0)  # a busy child's /slots, read for prompt progress
SAVE_TIMEOUT_S = 120.0  # saving slot states before a stop; past it the stop goes on without them
SETTLE_S = 10.0  # after a child's death, how long its requests may take to notice (hang guard)
TASK_CANCEL_TIMEOUT_S = 30.0  # a cancelled lifecycle task that does not end in this time is left behind


def unreachable_workers(workers: list[Worker], timeout: float = 2.0) -> list[Worker]:
    """The workers nothing listens for any more (a TCP connect; the handshake would block a live one)."""
    dead = []
    for w in workers:
        try:
            with socket.create_connection((w.host, w.port), timeout=timeout):
                pass
        except OSError:
            dead.append(w)
    return dead


class EffectsRunner:
    """Runs one instance's effects for the supervisor `sup` (its options, slot store, event bus, the other
    instances a load makes room among)."""

    def __init__(self, sup) -> None:  # type: ignore[no-untyped-def]  (supervisor.Supervisor; it imports this)
        self.sup = sup

    @property
    def opts(self):  # type: ignore[no-untyped-def]
        return self.sup.opts

    async def run(self, inst: Instance, effects: list) -> lc.Event | None:
        """Run `effects` in order; the event the last waiting one ended in (None: nothing to wait for)."""
        event = None
        for eff in effects:
            got = await self.run_one(inst, eff)
            if got is not None:
                event = got
        return event

    async def run_one(self, inst: Instance, eff: lc.Effect) -> lc.Event | None:
        if isinstance(eff, lc.StartChild):
            return await self.start_child(inst)
        if isinstance(eff, lc.WatchChild):
            return await self.watch_child(inst)
        if isinstance(eff, lc.AwaitSettle):
            return lc.Settled(await self.requests_it_broke(inst), eff.why)
        if isinstance(eff, lc.Retry):
            await asyncio.sleep(eff.delay)
            return lc.RetryDue()
        if isinstance(eff, lc.StopChild):
            try:
                await self.stop_process(inst)
            except Exception:
                log.exception("%s: stopping the process failed", inst.name)
            return None
        if isinstance(eff, lc.SaveSlots):
            try:
                await asyncio.wait_for(self.save_prompts(inst, eff.reason), SAVE_TIMEOUT_S)
            except Exception as exc:  # the store is a cache: losing it must not keep a model running
                log.warning("%s: saving the prompts before %s failed: %r", inst.name, eff.reason, exc)
            return None
        if isinstance(eff, lc.CancelTask):
            if inst.task is not None and not inst.task.done():
                inst.task.cancel()
                try:
                    await asyncio.wait_for(asyncio.shield(inst.task), TASK_CANCEL_TIMEOUT_S)
                except (asyncio.CancelledError, Exception):
                    pass
            return None
        self.run_now(inst, eff)
        return None

    def run_now(self, inst: Instance, eff: lc.Effect) -> None:
        """The effects that wait for nothing."""
        if isinstance(eff, lc.Announce):
            self.announce(inst, eff.state, **eff.extra)
        elif isinstance(eff, lc.ClearError):
            inst.error = None
        elif isinstance(eff, lc.FreshReady):
            if eff.always or inst.ready is None or inst.ready.done():
                inst.ready = asyncio.get_running_loop().create_future()
                inst.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "never retrieved"
        elif isinstance(eff, lc.ResolveReady):
            fut = inst.ready
            if fut is not None and not fut.done():
                if eff.error is None:
                    fut.set_result(inst)
                else:
                    fut.set_exception(eff.error)
        elif isinstance(eff, lc.MarkFailed):
            exc = eff.error
            inst.error = {"message": exc.message, "hint": exc.hint, "type": type(exc).__name__,
                          "log_tail": tail(inst.log_path, 20), "plan": inst.plan_json()}
            inst.cfg_cooldown = self.opts.failed_cooldown
            self.announce(inst, lc.FAILED, error=inst.error)
            self.run_now(inst, lc.ResolveReady(exc))
        elif isinstance(eff, lc.MarkLost):
            inst.error = {"message": eff.why, "hint": "relaunching without it if the model still fits",
                          "type": "WorkerLost", "log_tail": tail(inst.log_path, 20), "plan": inst.plan_json()}
            self.announce(inst, lc.FAILED, error=inst.error, reason=eff.why)
        elif isinstance(eff, lc.NoteChildren):
            self.sup.note_children()
        elif isinstance(eff, lc.Warn):
            log.warning("%s", eff.message)
        else:
            raise TypeError(f"not an effect this runner knows: {eff!r}")

    def announce(self, inst: Instance, state: str, **extra: object) -> None:
        log.info("%s: %s %s", inst.name, state, extra or "")
        shown = inst.to_json()
        shown["state"] = state  # (a `failed` on the way to a relaunch is announced, not kept)
        self.sup.bus.publish("state", model=inst.name, state=state, instance=shown, **extra)

    # ------------------------------------------------------------------ loading

    async def start_child(self, inst: Instance) -> lc.Event:
        """Plan, start, wait ready, probe and restore a child: Loaded, or LoadFailed with what went wrong."""
        try:
            await self.launch_once(inst)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, BostudioError):
                log.exception("%s: unexpected error while loading", inst.name)
            return lc.LoadFailed(exc, inst.plan_json().get("summary", "unknown"), inst.cfg.port is not None)
        return lc.Loaded()

    async def launch_once(self, inst: Instance) -> None:
        sup = self.sup
        cfg = inst.cfg
        # Probing the engine and reading a large GGUF header take a while: not on the event loop.
        engine = await asyncio.to_thread(lambda: sup.engine)
        try:
            info = await asyncio.to_thread(describe, cfg.path)
            caps = await asyncio.to_thread(model_caps, cfg.path)
        except ModelError as exc:  # a broken header, a file gone: the file's fault, not a crash
            raise ModelFileError(f"{cfg.name}: {exc.message}", exc.hint) from exc
        workload = await asyncio.to_thread(cfg.resolved_workload)
        workers = sup.workers_for(cfg.name)
        inst.pool = await asyncio.to_thread(discover_pool, engine, workers) if workers else Pool()
        for problem in inst.pool.problems:
            log.warning("%s: %s; planning without it", cfg.name, problem)
        try:
            devices = await asyncio.to_thread(sup.planning_devices, engine, cfg.name)
            # The plans route (daemon/http/plans.py) feeds child_inputs the same children and draft length.
            children, draft_len = 1 + sup.children_beside(cfg.name), cfg.settled_draft_len()
            decision = await asyncio.to_thread(
                lambda: decide_child(info, engine, cfg.spec, cfg.ctx, cfg.cache_type, pull=self.opts.pull,
                                     workload=workload, fallback=cfg.fallback(workload),
                                     prompt_reuse=sup.slot_store is not None, pool=inst.pool,
                                     devices=devices, children=children, draft_len=draft_len))
        except PlanError as exc:
            if inst.lost_workers:  # it fitted with the worker that died: say so; retrying cannot help
                raise lc.WorkerLostError(f"{cfg.name} does not fit without the lost rpc worker(s) "
                                         f"{', '.join(inst.lost_workers)}: {exc.message}",
                                         "restart the worker's `bostudio rpc serve`, then restart the model") from exc
            # A plan is a function of the file's header and this machine: planned again it fails again.
            raise ModelFileError(f"{cfg.name} cannot be planned: {exc.message}", exc.hint) from exc
        except ModelError as exc:  # the header read again by the planner (a draft's, a split part's)
            raise ModelFileError(f"{cfg.name}: {exc.message}", exc.hint) from exc
        planned = decision.plan
        inst.break_even, inst.break_even_source = await asyncio.to_thread(
            predicted_break_even, cfg.path, engine, workload)
        inst.tune_refused = await asyncio.to_thread(tune_refusals, cfg.path, engine, workload)
        inst.speculator = decision.speculator
        reuse = sup.slot_store is not None and decision.prompt_reuse
        inst.state_key = (await asyncio.to_thread(state_key, cfg.path, engine.commit, decision.ctx,
                                                  planned.intent.cache_type_k, "auto", planned.intent.swa_full,
                                                  planned.intent.flash_attn != "off")
                          if reuse else None)
        inst.decision, inst.kind, inst.budget_bytes = decision, caps.kind, sup.budget()
        await sup.make_room(inst, decision.bytes)  # what it is evicted by is what runs

        inst.port = cfg.port or free_loopback_port(avoid={i.port for i in sup.instances.values()
                                                           if i is not inst and i.port})
        inst.api_key = secrets.token_urlsafe(32)
        argv = decision.argv(port=inst.port, alias=cfg.name,
                             slot_dir=sup.slot_store.ensure() if reuse and sup.slot_store is not None else None)
        # The key goes through the environment, not argv (which every local user can read).
        env = engine.server_env({**os.environ, "LLAMA_API_KEY": inst.api_key})
        inst.proc = ServerProcess(argv, inst.port, inst.log_path, api_key=inst.api_key, env=env)
        inst.in_flight.clear()  # requests of earlier launches ended with them
        inst.died_with.clear()
        inst.loads += 1
        inst.proc.start()  # on the loop's thread: see the module docstring
        sup.note_children()
        sup.bus.publish("launch", model=cfg.name, pid=inst.proc.pid, port=inst.port, argv=argv)
        inst.ready_s = await inst.proc.wait_ready_async(self.opts.load_timeout, self.opts.stall_timeout)
        if inst.http is not None:
            await inst.http.aclose()
        # For /metrics and /slots; proxied requests take the passthrough path (bostudio/runtime/passthrough.py).
        inst.http = AsyncLlamaClient(inst.proc.base_url, inst.api_key, UPSTREAM_TIMEOUT, name=f"llama-server for {cfg.name}")
        if caps.kind == "chat":  # embedding and rerank models generate nothing to probe
            status = await asyncio.to_thread(self.probe, inst)
            inst.spec_status = asdict(status)
        else:
            inst.spec_status = None
        inst.spec_base = (inst.stats.draft_tokens, inst.stats.draft_accepted, inst.stats.requests)
        inst.spec_check = None
        inst.draft_advice = None
        inst.prefill = PrefillTracker()  # the new child numbers its tasks from zero
        inst.stats.mean_accepted_length = None  # the new child's /metrics start from zero
        await self.restore_prompts(inst)
        inst.ready_since = time.monotonic()
        inst.last_used = time.monotonic()

    def probe(self, inst: Instance):  # type: ignore[no-untyped-def]
        assert inst.proc is not None and inst.speculator is not None
        with LlamaClient(inst.proc.base_url, inst.api_key, timeout=httpx.Timeout(self.opts.stall_timeout, connect=2.0),
                         log_path=inst.log_path) as client:
            return verify_speculation(client, inst.speculator, inst.log_path, self.opts.probe_tokens,
                                      timeout=max(self.opts.stall_timeout, 120.0))

    # ------------------------------------------------------------------ a running child

    async def watch_child(self, inst: Instance) -> lc.Event:
        """Wait for the child's exit: Exited, with the rpc workers it used that no longer answer."""
        assert inst.proc is not None and inst.proc.proc is not None
        while (code := inst.proc.proc.poll()) is None:
            await asyncio.sleep(0.2)
        assert inst.life is not None
        dead: tuple[str, ...] = ()
        if not inst.life.stopping and inst.pool.probes:
            found = await asyncio.to_thread(unreachable_workers, [p.worker for p in inst.pool.probes if p.ok])
            dead = tuple(w.endpoint for w in found)
        lines = tail(inst.log_path, 5)
        return lc.Exited(code, f"llama-server exited with code {code}: " + (lines[-1] if lines else ""), dead)

    async def requests_it_broke(self, inst: Instance) -> int | None:
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

    async def stop_process(self, inst: Instance) -> None:
        proc = inst.proc
        if proc is not None and proc.proc is not None:
            await asyncio.to_thread(proc.stop, self.opts.grace)
        if inst.http is not None:
            await inst.http.aclose()
            inst.http = None
        inst.ready_since = None
        self.sup.note_children()

    # ------------------------------------------------------------------ prompt reuse

    async def save_prompts(self, inst: Instance, reason: str) -> None:
        """Save the slots of a child about to stop (stop, idle, eviction, relaunch, shutdown)."""
        store = self.sup.slot_store
        if store is None or inst.state_key is None or inst.http is None:
            return
        proc = inst.proc
        if proc is None or not proc.alive():
            return
        started = time.monotonic()
        saved = await save_slots(inst.http, store, inst.state_key)
        if saved:
            inst.prompts = {**inst.prompts, "saved_slots": len(saved),
                            "saved_tokens": sum(v["tokens"] for v in saved.values()),
                            "saved_s": round(time.monotonic() - started, 3), "saved_on": reason}
            self.sup.bus.publish("prompts", model=inst.name, action="saved", slots=saved)
            log.info("%s: saved %d slot(s) before %s", inst.name, len(saved), reason)

    async def restore_prompts(self, inst: Instance) -> None:
        """Restore the slot states saved for exactly this child's identity, before it is ready."""
        store = self.sup.slot_store
        if store is None or inst.state_key is None or inst.http is None:
            inst.prompts = {}
            return
        started = time.monotonic()
        try:
            restored = await restore_slots(inst.http, store, inst.state_key)
        except Exception as exc:  # a store problem costs the saved prompts, never the load
            log.warning("%s: restoring saved prompts failed: %r", inst.name, exc)
            inst.prompts = {"key": inst.state_key.digest, "restored_slots": 0, "error": str(exc)}
            return
        inst.prompts = {"key": inst.state_key.digest, "restored_slots": len(restored),
                        "restored_tokens": sum(restored.values()),
                        "restored_s": round(time.monotonic() - started, 3)}
        if restored:
            self.sup.bus.publish("prompts", model=inst.name, action="restored", slots=restored)
            log.info("%s: restored %d slot(s), %d tokens", inst.name, len(restored), sum(restored.values()))
