"""What to launch for one model: the speculator (pairing table + compatibility check) and the memory
plan (context, offload, cache types), for `bostudio up` and the daemon alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
from pathlib import Path

from bostudio.engine.argv import LaunchSpec
from bostudio.engine.discover import Engine
from bostudio.errors import ModelError
from bostudio.gguf import ModelInfo, describe
from bostudio.hardware import discover_devices
from bostudio.pairing.fetch import AskFn, choose_and_fetch
from bostudio.planner import Plan, plan_for_launch
from bostudio.rpc.probe import Pool
from bostudio.speculation import SpecRequest


@dataclass(frozen=True)
class LaunchDecision:
    plan: Plan
    args: tuple[str, ...]  # the plan's memory flags, except -c (LaunchSpec carries the context)
    pool: Pool = Pool()  # the RPC workers used (none: a local launch)

    @property
    def speculator(self):  # type: ignore[no-untyped-def]
        return self.plan.chosen.speculator

    @property
    def ctx(self) -> int:
        return self.plan.chosen.n_ctx

    @property
    def bytes(self) -> int:
        """Everything the instance takes on all devices, by the planner's memory model."""
        return self.plan.chosen.total

    def launch_spec(self, model: Path, alias: str, port: int, host: str = "127.0.0.1",
                    api_key: str | None = None) -> LaunchSpec:
        return LaunchSpec(model=model, alias=alias, port=port, host=host, ctx=self.ctx,
                          speculator=self.speculator, api_key=api_key, extra_args=self.args,
                          rpc=self.rpc, verbosity=4 if self.rpc else None)  # -lv 4 logs each device's buffers

    @property
    def rpc(self) -> str | None:
        """--rpc for the pool's workers: all of them, in probe order, so the RPCn names the plan
        uses in -dev/-ts/-devd are the ones llama-server gives them."""
        return self.pool.rpc if self.pool.devices else None


def decide_launch(info: ModelInfo, request: SpecRequest, engine: Engine, *, ctx: int | None = None,
                  cache_type: str = "f16", pull: str = "never", ask: AskFn | None = None,
                  log: Callable[[str], None] = lambda _: None, workload: str | None = None,
                  pool: Pool = Pool()) -> LaunchDecision:
    """Choose the speculator (fetching a hub drafter as the pull policy allows) and plan memory, over
    this machine's devices and the RPC workers of `pool` (bostudio.rpc.probe.discover_pool). Raises
    for an incompatible draft or a model that does not fit. With `workload`, auto mode takes the tuned
    profile for it when a fresh one exists (`bostudio tune`)."""
    if request.mode == "self-draft":
        # The seeds' layout: a low-bit copy of the target drafts for it (made once, cached); the
        # planner puts the copy whole on the fastest device and spreads the target.
        from bostudio.pairing.pair import make_self_draft

        assert request.quant is not None
        request = SpecRequest("draft", make_self_draft(info.path, request.quant, engine, log=log))
    if request.draft is not None:
        if not request.draft.is_file():
            raise ModelError(f"draft model {request.draft} not found",
                             "pass an existing .gguf file as --spec draft:PATH")
        describe(request.draft)  # a damaged draft is a clear error here, not a crash in llama-server
    devices = discover_devices(engine_devices=engine.devices).devices + pool.devices
    # The pairing table, auto-detection and the compatibility check; an incompatible draft raises here.
    speculator = choose_and_fetch(info, request, engine, ctx or info.n_ctx_train, devices=devices, policy=pull,
                                  ask=ask, log=log, workload=workload).speculator
    if speculator.draft is not None and not speculator.draft.is_file():
        raise ModelError(f"the chosen draft {speculator.draft} is not on this machine",
                         "run `bostudio pair` to see why")
    draft_info = describe(speculator.draft) if speculator.draft is not None else None
    # In auto mode the plan may trade a draft for a cheaper speculator when it costs too much context.
    mode = {"auto": "auto", "off": "off"}.get(request.mode, "on")
    plan = plan_for_launch(info, devices, ctx=ctx, speculator=speculator, draft=draft_info,
                           speculation=mode, cache_type=cache_type)
    args = plan.llama_args()
    i = args.index("-c")
    return LaunchDecision(plan, tuple(args[:i] + args[i + 2:]), pool)
