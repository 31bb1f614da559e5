"""The edge of the launch decision: gather its inputs once (the model's capabilities, hence its kind and
the flags that kind needs; this machine's devices, the RPC pool's; the speculator from a tuned profile /
the pairing tables / a hub pull as the pull policy allows; the draft's header), then hand them to the pure
decision (bostudio.launch.decide). Callers state only what the user asked for (LaunchIntent)."""

from __future__ import annotations

from typing import Callable

from bostudio.engine.discover import Engine
from bostudio.errors import ModelError
from bostudio.gguf import ModelInfo, describe
from bostudio.gguf.capabilities import model_caps
from bostudio.hardware import Device, discover_devices
from bostudio.launch.decide import Decision, LaunchInputs, LaunchIntent, decide
from bostudio.pairing.edge.fetch import AskFn, choose_and_fetch
from bostudio.rpc.probe import Pool
from bostudio.speculation import DRAFT_N_MAX, SpecRequest, Speculator, draft_length, parse_spec, with_draft_length


def gather(info: ModelInfo, engine: Engine, intent: LaunchIntent = LaunchIntent(), *, pool: Pool = Pool(),
           workload: str | None = None, pull: str = "never", ask: AskFn | None = None,
           log: Callable[[str], None] = lambda _: None, speculator: Speculator | None = None,
           devices: tuple[Device, ...] | None = None, make_self_draft: bool = True) -> LaunchInputs:
    """The inputs of one launch decision for `info` on `engine`.

    `intent.spec` is the request (auto chooses with the tuned profile for `workload` first, then the
    pairing tables, auto-detection and the compatibility check; a hub drafter is pulled as `pull`
    allows). `speculator` replaces that choice (the daemon's fallback after speculation fell below
    break-even). `devices` replaces this machine's (`plan --devices-file`); the pool's devices are added
    either way. `make_self_draft=False` plans a self-draft before its low-bit copy exists (`plan`).
    The model's kind (chat, embedding, rerank: bostudio.gguf.capabilities) comes from its header; a model
    read from a remote header alone is planned as a chat model. `intent.draft_len` replaces the draft
    length of a speculator that has one. Raises for a missing or damaged draft and an incompatible one."""
    caps = model_caps(info.path) if info.path.is_file() else None
    generates = caps is None or caps.kind == "chat"
    request = parse_spec("off" if not generates else "auto" if intent.spec == "on" else intent.spec)
    base = discover_devices(engine_devices=engine.devices, host_amx=engine.amx).devices if devices is None else devices
    all_devices = tuple(base) + tuple(pool.devices)
    if speculator is None:
        speculator = _choose(info, request, engine, intent, all_devices, workload, pull, ask, log, make_self_draft)
    if intent.draft_len is not None and draft_length(speculator) is not None:
        n, why = intent.draft_len
        speculator = with_draft_length(speculator, n, f"draft length {n} at run time: {why}")
    draft = None
    if speculator.draft is not None:
        if not speculator.draft.is_file():
            if make_self_draft:
                raise ModelError(f"the chosen draft {speculator.draft} is not on this machine",
                                 "run `bostudio pair` to see why")
            from bostudio.pairing.edge.pair import self_draft_info  # planned before the copy exists

            draft = self_draft_info(info, request.quant or "Q2_K") if request.mode == "self-draft" else None
        if draft is None:
            draft = describe(speculator.draft)  # a damaged draft is a clear error here, not in llama-server
    return LaunchInputs(info, engine, all_devices, speculator, draft, pool, intent, caps)


def _choose(info: ModelInfo, request: SpecRequest, engine: Engine, intent: LaunchIntent,
            devices: tuple[Device, ...], workload: str | None, pull: str, ask: AskFn | None,
            log: Callable[[str], None], make: bool) -> Speculator:
    if request.mode == "self-draft":
        # The seeds' layout: a low-bit copy of the target drafts for it (made once, cached); the
        # planner puts the copy whole on the fastest device and spreads the target.
        from bostudio.pairing.edge.pair import make_self_draft, self_draft_info

        assert request.quant is not None
        if not make:
            d = self_draft_info(info, request.quant)
            return Speculator("draft", ("draft-simple",), draft=d.path, n_max=DRAFT_N_MAX,
                              reason=f"self-draft: a {request.quant} copy of the target drafts for it")
        request = SpecRequest("draft", make_self_draft(info.path, request.quant, engine, log=log))
    if request.draft is not None:
        if not request.draft.is_file():
            raise ModelError(f"draft model {request.draft} not found",
                             "pass an existing .gguf file as --spec draft:PATH")
        describe(request.draft)
    # The same context as the plan searches up to: the pairing's memory check prices the draft there.
    return choose_and_fetch(info, request, engine, intent.ctx or info.n_ctx_train, devices=devices, policy=pull,
                            ask=ask, log=log, workload=workload).speculator


def gather_and_decide(info: ModelInfo, engine: Engine, intent: LaunchIntent = LaunchIntent(),
                      **kw) -> Decision:  # type: ignore[no-untyped-def]
    """gather() then decide(): what `up`, the daemon and bench launch."""
    return decide(gather(info, engine, intent, **kw))
