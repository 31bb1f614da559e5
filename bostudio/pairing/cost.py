"""What a speculator costs in memory, according to the planner: the bytes it adds at the same context and
offload (draft weights, the draft's or MTP head's KV cache and buffers, the n-gram table). Pure."""

from __future__ import annotations

from typing import Iterable

from bostudio.gguf import ModelInfo
from bostudio.hardware.device import Device
from bostudio.planner import Intent, memory_uses
from bostudio.planner import Speculator as PlanSpeculator
from bostudio.planner.fit import NGRAM_MOD_BYTES
from bostudio.speculation import Speculator

CPU_ONLY = (Device(vendor="cpu", backend="cpu", name="CPU"),)


def _plan_speculators(sp: Speculator, draft: ModelInfo | None) -> list[PlanSpeculator]:
    out = []
    if sp.kind == "mtp" and draft is None:
        out.append(PlanSpeculator("mtp", n_max=sp.n_max or 3))
    elif sp.kind != "none" and sp.kind != "ngram" and draft is not None:
        # draft, dflash, dspark, eagle3 and MTP sidecars are all a second model with its own context
        out.append(PlanSpeculator("draft", draft=draft, n_max=sp.n_max or 16,
                                  cache_type_k=sp.cache_type_k_draft or "f16",
                                  cache_type_v=sp.cache_type_v_draft or "f16"))
    return out


def speculator_memory_bytes(target: ModelInfo, sp: Speculator, draft: ModelInfo | None, ctx: int,
                            devices: Iterable[Device] = CPU_ONLY) -> int:
    """Bytes `sp` adds to running `target` at `ctx` tokens on `devices` (all layers offloaded when there is a
    GPU), according to the planner's memory model."""
    devs = tuple(devices)
    ngl = target.n_block + 1 if any(d.is_gpu for d in devs) else 0
    intent = Intent(ctx=ctx)
    base = sum(u.bytes for u in memory_uses(target, devs, intent, PlanSpeculator("none"), ctx, ngl)[0])
    cost = 0
    for ps in _plan_speculators(sp, draft):
        cost += sum(u.bytes for u in memory_uses(target, devs, intent, ps, ctx, ngl)[0]) - base
    if "ngram-mod" in sp.spec_types:
        cost += NGRAM_MOD_BYTES
    return max(0, cost)
