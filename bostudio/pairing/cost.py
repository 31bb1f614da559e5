"""What a speculator costs in memory, according to the planner: the bytes it adds at the same context and
offload (draft weights, the draft's or MTP head's KV cache and buffers, the n-gram table). Pure."""

from __future__ import annotations

from typing import Iterable

from bostudio.gguf import ModelInfo
from bostudio.hardware.device import CPU_ONLY, Device
from bostudio.planner import NO_SPEC, Intent, memory_uses
from bostudio.speculation import Speculator


def speculator_memory_bytes(target: ModelInfo, sp: Speculator, draft: ModelInfo | None, ctx: int,
                            devices: Iterable[Device] = CPU_ONLY) -> int:
    """Bytes `sp` adds to running `target` at `ctx` tokens on `devices` (all layers offloaded when there is a
    GPU), according to the planner's memory model: draft weights and context, an MTP head's context, the
    n-gram table, and the larger output buffers any speculator needs."""
    devs = tuple(devices)
    ngl = target.n_block + 1 if any(d.is_gpu for d in devs) else 0
    intent = Intent(ctx=ctx, draft_cache_type_k=sp.cache_type_k_draft or "f16",
                    draft_cache_type_v=sp.cache_type_v_draft or "f16")

    def total(spec: Speculator, d: ModelInfo | None) -> int:
        return sum(u.bytes for u in memory_uses(target, devs, intent, spec, ctx, ngl, draft=d)[0])

    if sp.kind == "none":
        return 0
    return max(0, total(sp, draft) - total(NO_SPEC, None))


def context_tokens_for(target: ModelInfo, n_bytes: int, ctx: int, devices: Iterable[Device] = CPU_ONLY) -> int:
    """How many tokens of `target`'s context `n_bytes` would pay for at about `ctx` tokens (the planner's
    KV cache, recurrent state and buffers per token, measured between ctx/2 and ctx)."""
    devs = tuple(devices)
    ngl = target.n_block + 1 if any(d.is_gpu for d in devs) else 0
    lo, hi = max(256, ctx // 2), max(512, ctx)

    def total(n: int) -> int:
        return sum(u.bytes for u in memory_uses(target, devs, Intent(ctx=n), NO_SPEC, n, ngl)[0])

    per_token = (total(hi) - total(lo)) / (hi - lo)
    return int(n_bytes / per_token) if per_token > 0 else 0
