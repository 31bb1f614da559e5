"""What a speculator costs in memory, according to the planner: the bytes it adds at the same context and
offload (draft weights, the draft's or MTP head's KV cache and buffers, the n-gram table). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from bostudio.gguf import ModelInfo
from bostudio.hardware.device import CPU_ONLY, Device
from bostudio.planner import NO_SPEC, Intent, memory_uses
from bostudio.planner.fit import fastest_device
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


# ------------------------------------------------------------------------------------ what a draft step costs

# A draft step at or above this share of a target step's time never pays (drafting one token that is always
# accepted gains 1 token for 1 + cost target steps); below it, its break-even acceptance says how much pays.
MAX_STEP_COST = 1.0
# A draft that must be accepted more often than this to pay is passed over by auto (a same-family drafter
# is accepted 60-95% of the time: 59% on free code, 93% on edits, Qwen2.5-Coder 0.5B for the 1.5B);
# `bostudio tune` measures it and may still choose it.
MAX_BREAK_EVEN = 0.75
# The acceptance a draft length is planned for (best_draft_length): a same-family drafter on agent work.
PLANNED_ACCEPTANCE = 0.8
# What each drafted token adds to the target's verification batch, in target decode steps. A GPU reads the
# weights once for a batch of a few tokens (memory bound): about nothing. A CPU core computes every token of
# the batch: measured on this project's 2-core EPYC at -t 1 -tb 1 (Qwen2.5-Coder 1.5B Q4_K_M; README,
# "Where a draft round's time goes"), a batch of 2 tokens cost 1.6 target steps, of 9 tokens 4.2, of 17
# tokens 6.5: about 0.35 per token beyond the first.
CPU_VERIFY_PER_TOKEN = 0.35
GPU_VERIFY_PER_TOKEN = 0.0
# The pinned llama-server hands every batch the target decodes to the draft as well (server-context.cpp:3721-3729
# calls common_speculative_process; draft-simple decodes it whole, speculative.cpp:262-302; the TODO there,
# TAG_SPEC_AVOID_DRAFT_REEVAL, names it): the draft re-evaluates the verified batch it drafted, then decodes
# the last token again to start the next draft (speculative.cpp:328). So a round of n drafted tokens costs
# the target's verification, the draft's copy of that batch, and n draft steps.
DRAFT_REEVALUATES_BATCH = True


def weight_bytes_per_token(m: ModelInfo) -> int:
    """Weight bytes one decode step reads: every block (its experts scaled to the ones used) and the output
    projection (token_embd when the output is tied to it; the input embedding reads one row only)."""
    blocks = sum(m.layer_bytes)
    if m.n_expert and m.n_expert_used and m.n_ff_exp:
        # routed experts: each token reads n_expert_used of n_expert; three matrices of n_embd x n_ff_exp
        expert = 3 * m.n_embd * m.n_ff_exp * m.n_expert * (m.tensor_bytes / max(1, m.n_params))
        moe_blocks = max(0, len(m.layer_bytes) - m.leading_dense_blocks)
        unused = expert * (1 - m.n_expert_used / m.n_expert) * moe_blocks
        blocks = max(blocks // 8, int(blocks - unused))
    return blocks + (m.output_bytes or m.token_embd_bytes) + m.other_bytes


@dataclass(frozen=True)
class StepCost:
    """A draft step's time relative to a target step's, from the weight bytes each reads per token and the
    bandwidth of the device each runs on (a decode step streams every weight once: memory bound)."""

    ratio: float
    draft_bytes: int
    target_bytes: int
    draft_device: str
    target_device: str
    bandwidth_known: bool  # False: both on one device, or bandwidths unknown: the ratio of bytes
    verify_per_token: float = CPU_VERIFY_PER_TOKEN  # target steps each drafted token adds to verification

    def verify(self, n: int) -> float:
        """The target's verification of n drafted tokens (and its own), in target decode steps."""
        return 1.0 + self.verify_per_token * n

    def round_cost(self, n: int) -> float:
        """One round of n drafted tokens, in target steps: n draft steps, the target's verification batch
        and (llama.cpp's) the draft's re-evaluation of that batch."""
        batch = self.verify(n) * (1.0 + (self.ratio if DRAFT_REEVALUATES_BATCH else 0.0))
        return n * self.ratio + batch

    def break_even(self, n: int) -> float | None:
        return draft_break_even(self.ratio, n, self.round_cost(n) - n * self.ratio)

    def best_speedup(self, n: int, acceptance: float = 1.0) -> float:
        """Tokens per target step of a round at `acceptance` (1.0: the ceiling, every draft accepted)."""
        return expected_tokens(acceptance, n) / self.round_cost(n)

    def text(self) -> str:
        where = (f"{self.draft_device} vs {self.target_device}" if self.bandwidth_known
                 else f"both on {self.target_device}" if self.draft_device == self.target_device
                 else "bandwidth unknown, bytes only")
        verify = (f"; verifying adds {self.verify_per_token:.2f} target step per drafted token (a CPU computes "
                  "each), and llama-server re-evaluates the verified batch in the draft" if self.verify_per_token
                  else "; llama-server re-evaluates the verified batch in the draft")
        return (f"a draft step costs {self.ratio:.2f} of a target step ({_mb(self.draft_bytes)} vs "
                f"{_mb(self.target_bytes)} of weights read per token, {where}){verify}")

    def to_json(self) -> dict:
        return {"ratio": round(self.ratio, 4), "draft_bytes": self.draft_bytes, "target_bytes": self.target_bytes,
                "draft_device": self.draft_device, "target_device": self.target_device,
                "bandwidth_known": self.bandwidth_known, "verify_per_token": self.verify_per_token}


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def draft_step_cost(target: ModelInfo, draft: ModelInfo, devices: Iterable[Device] = CPU_ONLY) -> StepCost:
    """What one draft step costs relative to one target step, on the devices the plan puts them on: the draft
    whole on the fastest device (planner.fit.fastest_device), the target's layers spread over the GPUs in
    proportion to their memory (the host when there is none)."""
    devs = tuple(devices) or CPU_ONLY
    d_bytes, t_bytes = weight_bytes_per_token(draft), weight_bytes_per_token(target)
    fast = fastest_device(devs)
    gpus = [d for d in devs if d.is_gpu and not d.remote]
    spread = gpus or [next((d for d in devs if not d.is_gpu), devs[0])]
    label = "+".join(d.label for d in spread)
    verify = GPU_VERIFY_PER_TOKEN if gpus else CPU_VERIFY_PER_TOKEN  # the target's layers verify where they run
    if all(d.bandwidth_gbs for d in spread) and fast.bandwidth_gbs:
        total = sum(d.usable_bytes for d in spread) or len(spread)
        t_time = sum((d.usable_bytes or 1) / total * t_bytes / d.bandwidth_gbs  # type: ignore[operator]
                     for d in spread)
        d_time = d_bytes / fast.bandwidth_gbs
        return StepCost(d_time / t_time, d_bytes, t_bytes, fast.label, label, True, verify)
    return StepCost(d_bytes / max(1, t_bytes), d_bytes, t_bytes, fast.label, label, False, verify)


def best_draft_length(step: StepCost, acceptance: float = PLANNED_ACCEPTANCE, ceiling: int = 16) -> int:
    """The n_max that commits the most tokens per unit of time at `acceptance` (shortest on a tie): for a
    draft at 0.4 of a step, 3 on a GPU, where verification costs one step whatever the length, and 1 on a
    CPU, where each drafted token adds to it. With p_min a draft stops early anyway."""
    return max(range(1, ceiling + 1), key=lambda n: (step.best_speedup(n, acceptance), -n))


def expected_tokens(acceptance: float, n: int) -> float:
    """Tokens one round commits when each of its `n` drafted tokens is accepted with probability `acceptance`
    (until the first rejection) plus the target's own token: (1 - a^(n+1)) / (1 - a)."""
    a = min(max(acceptance, 0.0), 1.0)
    return float(n + 1) if a >= 1.0 else (1 - a ** (n + 1)) / (1 - a)


def draft_break_even(cost: float, n: int, verify: float = 1.0) -> float | None:
    """The per-token acceptance above which drafting `n` tokens at `cost` target steps each, then verifying
    them in a batch that costs `verify` target steps, beats plain decoding (one token per target step); None
    when it never does."""
    need = n * cost + verify
    if n < 1 or expected_tokens(1.0, n) <= need:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, n) < need else (lo, mid)
    return hi
