"""describe() on small GGUFs written with gguf-py's GGUFWriter, one per kind of architecture."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from bostudio.gguf import describe, read_header
from bostudio.gguf.synth import VOCAB, tiny_llama


def test_llama_dense(tmp_path: Path) -> None:
    m = describe(tiny_llama(tmp_path / "llama.gguf", n_layer=3))
    assert (m.architecture, m.name, m.kind, m.quant) == ("llama", "tiny llama", "model", "F32")
    assert (m.n_block, m.n_layer, m.n_nextn, m.n_embd, m.n_ctx_train) == (3, 3, 0, 64, 2048)
    assert m.n_head == (4, 4, 4) and m.n_head_kv == (2, 2, 2) and m.n_ff == (128,) * 3
    assert (m.head_dim_k, m.head_dim_v, m.head_dim_k_swa, m.head_dim_v_swa) == (16, 16, 16, 16)
    assert m.rope.dimension_count == 16 and m.rope.freq_base == 10000.0 and m.rope.scaling_type == "none"
    assert m.swa_layers == (False,) * 3 and m.sliding_window == 0
    per_layer = 4 * (64 + 64 * 64 + 2 * 64 * 32 + 64 * 64 + 64 + 3 * 64 * 128)
    assert m.layer_bytes == (per_layer,) * 3
    assert m.token_embd_bytes == m.output_bytes == 4 * 64 * len(VOCAB)
    assert m.other_bytes == 4 * 64
    assert m.tokenizer.vocab_size == len(VOCAB) and m.n_vocab == len(VOCAB)
    assert m.tokenizer.token_texts() == VOCAB


def test_sizes_agree_with_gguf_py(tmp_path: Path) -> None:
    path = tiny_llama(tmp_path / "llama.gguf")
    header = read_header(path)
    ref = gguf.GGUFReader(str(path))
    assert [(t.name, t.n_bytes, header.data_offsets[0] + t.offset) for t in header.tensors] == \
        [(t.name, int(t.n_bytes), int(t.data_offset)) for t in ref.tensors]
    assert describe(header).n_params == sum(int(t.n_elements) for t in ref.tensors)


def _norms(n_block: int, n_embd: int = 64) -> dict[str, tuple[int, ...]]:
    """One small tensor per block, so every blk.N exists (describe() sizes layers from tensor names)."""
    return {f"blk.{i}.attn_norm.weight": (n_embd,) for i in range(n_block)}


BASE = {".context_length": 4096, ".embedding_length": 64, ".attention.head_count": 4}

# (case id, architecture, metadata, tensors, expected ModelInfo attributes)
CASES = [
    ("qwen3-dense", "qwen3",
     {**BASE, ".block_count": 2, ".attention.head_count_kv": 2, ".attention.key_length": 32,
      ".attention.value_length": 32, ".feed_forward_length": 96},
     {"token_embd.weight": (64, 32), **_norms(2)},
     dict(n_layer=2, n_head=(4, 4), n_head_kv=(2, 2), head_dim_k=32, head_dim_v=32, n_ff=(96, 96),
          output_bytes=0, token_embd_bytes=4 * 64 * 32, is_moe=False, drafter=None)),
    ("qwen3moe", "qwen3moe",
     {**BASE, ".block_count": 2, ".attention.head_count_kv": 4, ".expert_count": 8,
      ".expert_used_count": 2, ".expert_feed_forward_length": 32},
     {"token_embd.weight": (64, 32), **_norms(2),
      "blk.0.ffn_gate_exps.weight": (64, 32, 8), "blk.1.ffn_gate_exps.weight": (64, 32, 8)},
     dict(is_moe=True, n_expert=8, n_expert_used=2, n_expert_shared=0, n_ff_exp=32,
          layer_bytes=(4 * (64 + 64 * 32 * 8),) * 2, head_dim_k=16)),
    ("gemma3-swa", "gemma3",
     {**BASE, ".block_count": 12, ".attention.head_count_kv": 1, ".attention.key_length": 256,
      ".attention.value_length": 256, ".attention.sliding_window": 128},
     {"token_embd.weight": (64, 32), **_norms(12)},
     dict(sliding_window=128, swa_type="standard", head_dim_k=256,
          swa_layers=tuple(i not in (5, 11) for i in range(12)))),
    ("gemma3-pattern-array", "gemma3",
     {**BASE, ".block_count": 4, ".attention.sliding_window": 64,
      ".attention.sliding_window_pattern": [True, False, True, False]},
     _norms(4), dict(swa_layers=(True, False, True, False))),
    ("gemma3-no-window", "gemma3", {**BASE, ".block_count": 6}, _norms(6),
     dict(sliding_window=0, swa_type="none", swa_layers=(False,) * 6)),
    ("gemma2-default-window", "gemma2", {**BASE, ".block_count": 4}, _norms(4),
     dict(sliding_window=4096, swa_layers=(True, False, True, False))),
    ("llama-per-layer-kv", "llama",
     {**BASE, ".block_count": 3, ".attention.head_count_kv": [2, 2, 1], ".feed_forward_length": [64, 128, 64]},
     _norms(3), dict(n_head_kv=(2, 2, 1), n_ff=(64, 128, 64), head_dim_k=16)),
    ("llama-yarn", "llama",
     {**BASE, ".block_count": 1, ".rope.scaling.type": "yarn", ".rope.scaling.factor": 4.0,
      ".rope.scaling.original_context_length": 1024, ".rope.freq_base": 500000.0},
     _norms(1), dict(rope_check=("yarn", 4.0, 1024, 500000.0))),
    ("qwen3next-hybrid", "qwen3next",
     {**BASE, ".block_count": 8, ".attention.head_count_kv": 2, ".ssm.conv_kernel": 4,
      ".ssm.inner_size": 128, ".ssm.state_size": 16, ".ssm.group_count": 2, ".ssm.time_step_rank": 8},
     _norms(8),
     dict(recurrent_layers=(True, True, True, False) * 2, is_hybrid=True, is_recurrent=False,
          ssm_d_conv=4, ssm_d_inner=128, ssm_d_state=16, ssm_n_group=2, ssm_dt_rank=8)),
    ("jamba-kv-zero", "jamba",
     {**BASE, ".block_count": 4, ".attention.head_count_kv": [0, 0, 0, 4], ".ssm.conv_kernel": 4,
      ".ssm.inner_size": 128, ".ssm.state_size": 16, ".ssm.time_step_rank": 4},
     _norms(4), dict(recurrent_layers=(True, True, True, False), is_hybrid=True)),
    ("mamba2-recurrent", "mamba2",
     {".context_length": 1 << 20, ".embedding_length": 64, ".block_count": 2, ".ssm.conv_kernel": 4,
      ".ssm.inner_size": 128, ".ssm.state_size": 64, ".ssm.group_count": 1, ".ssm.time_step_rank": 4},
     _norms(2), dict(recurrent_layers=(True, True), is_recurrent=True, is_hybrid=False, n_head=(0, 0),
                     head_dim_k=0)),
    ("rwkv6", "rwkv6",
     {".context_length": 1 << 20, ".embedding_length": 64, ".block_count": 2, ".wkv.head_size": 16},
     _norms(2), dict(is_recurrent=True, wkv_head_size=16, token_shift_count=2)),
    ("deepseek2-mla", "deepseek2",
     {**BASE, ".block_count": 3, ".attention.head_count_kv": 1, ".attention.kv_lora_rank": 32,
      ".attention.q_lora_rank": 48, ".attention.key_length": 48, ".attention.value_length": 32,
      ".attention.key_length_mla": 24, ".attention.value_length_mla": 16, ".expert_count": 4,
      ".expert_used_count": 2, ".expert_shared_count": 1, ".leading_dense_block_count": 1},
     _norms(3),
     dict(is_mla=True, kv_lora_rank=32, q_lora_rank=48, key_length_mla=24, value_length_mla=16,
          head_dim_k=48, head_dim_v=32, n_head_kv=(1, 1, 1), n_expert_shared=1, leading_dense_blocks=1)),
    ("deepseek2-mla-zero", "deepseek2",
     {**BASE, ".block_count": 1, ".attention.kv_lora_rank": 0, ".attention.key_length_mla": 0,
      ".attention.value_length_mla": 0},
     _norms(1), dict(is_mla=False, kv_lora_rank=None, key_length_mla=None)),
    ("glm4moe-nextn", "glm4moe",
     {**BASE, ".block_count": 4, ".nextn_predict_layers": 1},
     {"token_embd.weight": (64, 32), **_norms(4), "blk.3.nextn.eh_proj.weight": (128, 64)},
     dict(n_block=4, n_layer=3, n_nextn=1, has_mtp=True, mtp_usable=True, drafter=None, kind="model")),
    ("glm4-nextn-kept-but-unused", "glm4",
     {**BASE, ".block_count": 3, ".nextn_predict_layers": 1},
     {"token_embd.weight": (64, 32), **_norms(3), "blk.2.nextn.eh_proj.weight": (128, 64)},
     dict(n_layer=2, n_nextn=1, has_mtp=True, mtp_usable=False)),
    ("qwen35-mtp-sidecar", "qwen35",
     {**BASE, ".block_count": 5, ".nextn_predict_layers": 1, ".ssm.conv_kernel": 4,
      ".ssm.inner_size": 64, ".ssm.state_size": 16, ".ssm.group_count": 2, ".ssm.time_step_rank": 4},
     {"token_embd.weight": (64, 32), "blk.4.nextn.eh_proj.weight": (128, 64),
      "blk.4.nextn.enorm.weight": (64,)},
     dict(n_layer=4, n_nextn=1, has_mtp=True, drafter="mtp-sidecar", kind="drafter",
          recurrent_layers=(True, True, True, False, False), swa_layers=(False,) * 5)),
    ("dflash", "dflash",
     {**BASE, ".block_count": 1, "dflash.block_size": 8, "dflash.target_layers": [1, 3, 5]},
     _norms(1), dict(drafter="dflash", drafter_block_size=8, drafter_target_layers=(1, 3, 5))),
    ("dspark", "dflash", {**BASE, ".block_count": 1},
     {**_norms(1), "markov_w1.weight": (64, 64), "markov_w2.weight": (64, 64)},
     dict(drafter="dspark", drafter_block_size=16, kind="drafter")),
    ("eagle3", "eagle3",
     {**BASE, ".block_count": 1, "eagle3.target_layers": [2, 10, 20], "eagle3.target_hidden_size": 256},
     {**_norms(1), "fc.weight": (192, 64)},
     dict(drafter="eagle3", drafter_target_layers=(2, 10, 20), drafter_target_hidden=256)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_describe_table(tmp_path: Path, case) -> None:
    from bostudio.gguf.synth import write_model

    _, arch, kv, tensors, expected = case
    m = describe(write_model(tmp_path / "m.gguf", arch, kv, tensors))
    assert m.architecture == arch
    for attr, want in expected.items():
        if attr == "rope_check":
            assert (m.rope.scaling_type, m.rope.scaling_factor, m.rope.original_ctx, m.rope.freq_base) == want
        else:
            assert getattr(m, attr) == want, attr
    # invariants for every architecture
    assert len(m.layer_bytes) == len(m.n_head) == len(m.swa_layers) == len(m.recurrent_layers) == m.n_block
    assert m.n_layer + m.n_nextn == m.n_block
    assert sum(m.layer_bytes) + m.token_embd_bytes + m.output_bytes + m.other_bytes == m.tensor_bytes
