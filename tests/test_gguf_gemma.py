"""describe() on the real Gemma 3 270M Q4_K_M file (262k-token vocabulary), checked against gguf-py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bostudio.gguf import ModelInfo, describe, read_header


@pytest.fixture(scope="module")
def gemma_info(gemma_gguf: Path):
    return describe(gemma_gguf)


def test_gemma_hyperparameters(gemma_info) -> None:
    m = gemma_info
    assert (m.architecture, m.name, m.size_label, m.quant, m.file_type) == \
        ("gemma3", "Gemma 3 270m", "270M", "Q4_K_M", 15)
    assert (m.n_block, m.n_layer, m.n_nextn, m.n_embd, m.n_ctx_train) == (18, 18, 0, 640, 32768)
    assert m.n_head == (4,) * 18 and m.n_head_kv == (1,) * 18
    assert (m.head_dim_k, m.head_dim_v) == (256, 256)
    assert m.rope.freq_base == 1_000_000.0
    # gemma3: sliding window 512 on every layer but each 6th
    assert m.sliding_window == 512 and m.swa_type == "standard"
    assert [il for il, swa in enumerate(m.swa_layers) if not swa] == [5, 11, 17]
    assert not any(m.recurrent_layers) and not m.is_mla and not m.is_moe
    assert m.drafter is None and not m.has_mtp and m.kind == "model"
    assert not m.has_chat_template


def test_gemma_tokenizer(gemma_info) -> None:
    t = gemma_info.tokenizer
    assert (t.model, t.pre, t.vocab_size) == ("llama", "default", 262144)
    assert (t.bos_id, t.eos_id, t.unk_id, t.pad_id, t.add_bos, t.add_eos) == (2, 1, 3, 0, True, False)
    assert len(t.fingerprint) == 64
    assert t.token_texts(0, 5) == ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    assert t.token_texts(262142) == ["<unused6240>", "<unused6241>"]


def test_gemma_sizes(gemma_info) -> None:
    """Byte counts as gguf-py's GGUFReader reports them for this file (checked once by hand: GGUFReader takes
    ~16 s here; tests/test_gguf_describe.py holds every size against GGUFReader on small files each run)."""
    m = gemma_info
    assert (m.tensor_bytes, m.n_params, m.token_embd_bytes, m.other_bytes) == \
        (246_587_904, 268_098_176, 178_257_920, 2560)
    assert m.output_bytes == 0  # tied to token_embd
    assert m.layer_bytes[:2] == (3_995_648, 3_995_648) and len(m.layer_bytes) == 18
    assert sum(m.layer_bytes) + m.token_embd_bytes + m.other_bytes == m.tensor_bytes
    assert m.file_size == 253_113_024
    header = read_header(m.path)
    assert header.data_offsets == (6_525_120,)
    assert m.tokenizer.token_texts(1000, 1003) == ["put", "▁di", "erm"]


def test_the_catalog_cache_round_trip_gives_the_same_description(gemma_info) -> None:
    """What the catalog index stores (to_json through JSON) rebuilds an equal ModelInfo: the nested tables too
    (tensor_places, matmul_bytes_by_type), which JSON turns into lists of lists."""
    again = ModelInfo.from_json(json.loads(json.dumps(gemma_info.to_json())))
    assert again.tensor_places == gemma_info.tensor_places and again.tensor_places
    assert again.matmul_bytes_by_type == gemma_info.matmul_bytes_by_type and again.matmul_bytes_by_type
    assert again == replace(gemma_info, chat_template=None, tokenizer=again.tokenizer)
