"""Per-architecture rules llama.cpp applies when a GGUF leaves something implicit.

Which layers use sliding-window attention and which are recurrent is often not written in the file: llama.cpp
fills it in per architecture (src/models/<arch>.cpp, load_arch_hparams). These tables copy those rules for the
pinned llama.cpp; an architecture missing here gets only what its keys say.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SwaRule:
    """How an architecture picks its SWA layers when `attention.sliding_window_pattern` is absent."""

    pattern: int  # every pattern-th layer is full attention (0: all SWA)
    dense_first: bool = False  # the full layer comes first in each group instead of last
    needs_window: bool = False  # SWA only when attention.sliding_window > 0
    default_window: int = 0  # window llama.cpp assumes when the key is absent
    kind: str = "standard"


SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2, default_window=4096),
    "gemma3": SwaRule(6, needs_window=True),
    "gemma3n": SwaRule(5),
    "gemma-embedding": SwaRule(6, kind="symmetric"),
    "cohere2": SwaRule(4),
    "cohere2moe": SwaRule(4, dense_first=True),
    "gpt-oss": SwaRule(2),
    "olmo2": SwaRule(4, needs_window=True),
    "afmoe": SwaRule(4, needs_window=True),
    "mellum": SwaRule(4, needs_window=True),
    "plamo3": SwaRule(8, needs_window=True),
    "smallthinker": SwaRule(4, dense_first=True, needs_window=True),
    "laguna": SwaRule(4, dense_first=True, needs_window=True),
    "modern-bert": SwaRule(3, dense_first=True, needs_window=True, kind="symmetric"),
    "exaone-moe": SwaRule(4, default_window=128),
    "muse-glimmer": SwaRule(4),
    # llama4: chunked attention unless attention.sliding_window is explicitly 0
    "llama4": SwaRule(4, default_window=8192, kind="chunked"),
}
# exaone4 uses SWA only in its 64-layer (32B) variant
EXAONE4_SWA = SwaRule(4, default_window=4096)


def swa_pattern(n_layer: int, n_block: int, pattern: int, dense_first: bool) -> tuple[bool, ...]:
    """llama_hparams::set_swa_pattern: which of n_block layers are SWA; NextN layers never are."""
    out = []
    for il in range(n_block):
        if il >= n_layer:
            out.append(False)
        elif pattern == 0:
            out.append(True)
        elif dense_first:
            out.append(il % pattern != 0)
        else:
            out.append(il % pattern < pattern - 1)
    return tuple(out)


RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
RWKV_ARCHS = frozenset({"rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# hybrids whose linear-attention layers are all but every full_attention_interval-th one
INTERVAL_HYBRIDS = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4, "qwen4exp": 4, "minimax-01": 8}
# hybrids whose recurrent layers are the trunk layers with head_count_kv == 0
KV_ZERO_HYBRIDS = frozenset({"jamba", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "kimi-linear",
                             "bailingmoe3", "kimi-k3"})
# as above, over all blocks (NextN included)
KV_ZERO_ALL_BLOCKS = frozenset({"glm5-next"})
# hybrids whose recurrent layers have neither attention nor FFN (head_count_kv == 0 and feed_forward == 0)
KV_AND_FF_ZERO_HYBRIDS = frozenset({"nemotron_h", "nemotron_h_moe"})
# every layer has a recurrent (Mamba) mixer next to its attention
ALL_RECURRENT_HYBRIDS = frozenset({"falcon-h1"})

# Architectures with an MTP draft graph (LLM_GRAPH_TYPE_DECODER_MTP in src/models): for them NextN layers can
# drive --spec-type draft-mtp. glm4, bailingmoe2, exaone4, exaone-moe and dots3note only keep NextN tensors.
MTP_GRAPH_ARCHS = frozenset({"deepseek2", "deepseek32", "deepseek4", "qwen3next", "qwen35", "qwen35moe", "step35",
                             "glm4moe", "glm-dsa", "glm5-next", "bailingmoe3", "cohere2moe", "nemotron_h_moe",
                             "hy_v3", "mimo2"})
