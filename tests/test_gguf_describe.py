"""describe() on small GGUFs written with gguf-py's GGUFWriter, one per kind of architecture."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from bostudio.gguf import describe, read_header
from tests.gguf_factory import VOCAB, tiny_llama


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
