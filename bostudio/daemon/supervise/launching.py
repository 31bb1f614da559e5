"""A daemon child's launch decision, gathered as for `bostudio up`: the one launch path (bostudio/launch) with
what the daemon adds (the model's kind, the profile's fallback under auto, the draft length settled at run time,
the other children sharing the host's cores)."""

from __future__ import annotations

import logging

from bostudio.engine.discover import Engine
from bostudio.gguf import ModelInfo
from bostudio.hardware import Device
from bostudio.launch import Decision, LaunchInputs, child_intent, decide, gather
from bostudio.profiles import find_profile, speculator_from_json
from bostudio.rpc.probe import Pool
from bostudio.speculation import Speculator

log = logging.getLogger("bostudio.daemon")


def child_inputs(info: ModelInfo, engine: Engine, spec_mode: str, ctx: int | None, cache_type: str = "f16", *,
                 pull: str = "never", workload: str | None = None, fallback: str | None = None,
                 prompt_reuse: bool = False, pool: Pool = Pool(), devices: tuple[Device, ...] | None = None,
                 children: int = 1, draft_len: tuple[int, str] | None = None) -> LaunchInputs:
    """The launch decision's inputs for a daemon child, gathered as for `bostudio up` (a tuned profile
    for `workload`, else the pairing table, auto-detection and compatibility check, a hub drafter
    fetched as `pull` allows). `fallback` (why auto gave up on the speculator) runs the profile's
    next-best kind, else none. With prompt reuse the plan has a host prompt cache and full SWA caches;
    embedding and rerank models get their flags and no speculator (gathered from the header). RPC workers
    in `pool` add their devices; `devices` replaces this machine's (Supervisor.planning_devices). `ctx` None:
    the largest context that fits, up to the training context. `children`: the llama-servers sharing the
    host's cores with this one (its CPU threads are planned for that). `draft_len`: (n, why) the acceptance
    check settled on under auto (policy.adapt_draft_length); the plan prices and runs that length."""
    return gather(info, engine, child_intent(spec_mode, ctx, cache_type, prompt_reuse=prompt_reuse, children=children,
                                             draft_len=draft_len),
                  pool=pool, workload=workload, pull=pull, devices=devices,
                  speculator=fallback_speculator(info, engine, workload, fallback) if fallback is not None else None,
                  log=lambda msg: log.info("%s: %s", info.path.name, msg))


def decide_child(info: ModelInfo, engine: Engine, spec_mode: str, ctx: int | None, cache_type: str = "f16",
                 **kw) -> Decision:  # type: ignore[no-untyped-def]
    """The launch decision for a daemon child: `chosen.total` decides what gets evicted, and
    `Decision.argv` is what runs. Raises PlanError if it cannot fit."""
    return decide(child_inputs(info, engine, spec_mode, ctx, cache_type, **kw))


def fallback_speculator(info: ModelInfo, engine: Engine, workload: str | None, why: str) -> Speculator:
    """After acceptance fell below break-even under auto: the profile's best configuration of another kind
    that beat off, else no speculation."""
    found = find_profile(info.path, engine, workload) if workload else None
    nxt = found.profile.next_best() if found and found.profile else None
    if nxt is not None and all(t in engine.spec_types for t in nxt.speculator["spec_types"]):
        return speculator_from_json(nxt.speculator, f"auto: {why}; the next-best profile entry {nxt.label} "
                                                    f"({nxt.speedup:.2f}x of off when tuned)")
    return Speculator("none", reason=f"auto: {why}; without speculation until the workload changes")
