"""Crafted and broken GGUFs: each is refused with a GGUFFormatError that names the file and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from bostudio.errors import GGUFFormatError
from bostudio.gguf import describe, read_header
from tests.gguf_raw import (ARCH, ARRAY, BOOL, FLOAT32, INT32, STRING, UINT32, UINT64, gguf, kv, minimal, s,
                            tensor_info)

BIG = 2**63 - 1

# (case id, file bytes, expected text in the message)
HOSTILE = [
    ("bad-magic", b"GGML" + minimal()[4:], "not a GGUF file"),
    ("version-1", gguf([ARCH], version=1), "version 1"),
    ("version-99", gguf([ARCH], version=99), "unsupported GGUF version 99"),
    ("empty", b"", "past the end"),
    ("truncated-header", minimal()[:20], "past the end"),
    ("absurd-kv-count", gguf([ARCH], n_kv=BIG), "metadata count"),
    ("absurd-tensor-count", gguf([ARCH], n_tensors=BIG), "tensor count"),
    ("absurd-key-length", gguf([b"\xff" * 8 + b"k" * 16], n_kv=1), "metadata key #0"),
    ("absurd-string-value", gguf([s("general.name") + b"\x08\0\0\0" + b"\xff" * 8], n_kv=1), "general.name"),
    ("absurd-array-count", gguf([s("a") + b"\x09\0\0\0" + b"\x04\0\0\0" + b"\xff" * 7 + b"\x0f"]),
     "more than the file can hold"),
    ("absurd-string-array", gguf([s("t") + b"\x09\0\0\0" + b"\x08\0\0\0" + b"\xff" * 7 + b"\x0f"]),
     "more than the file can hold"),
    ("absurd-string-in-array", gguf([s("t") + b"\x09\0\0\0\x08\0\0\0" + (2).to_bytes(8, "little") + s("ok") +
                                     b"\xf0" * 8 + b"x" * 16]), "array 't'"),
    ("empty-key", gguf([kv("", UINT32, 1)]), "empty"),
    ("invalid-value-type", gguf([s("k") + b"\x0d\0\0\0" + b"\0" * 8]), "invalid type 13"),
    ("array-of-arrays", gguf([s("k") + b"\x09\0\0\0\x09\0\0\0" + b"\0" * 8]), "invalid element type"),
    ("duplicate-key", gguf([ARCH, kv("general.name", STRING, "a"), kv("general.name", STRING, "b")]),
     "duplicate metadata key 'general.name'"),
    ("alignment-not-power-of-2", minimal([kv("general.alignment", UINT32, 48)]), "not a power of 2"),
    ("alignment-zero", minimal([kv("general.alignment", UINT32, 0)]), "not a power of 2"),
    ("alignment-wrong-type", minimal([kv("general.alignment", UINT64, 32)]), "expected UINT32"),
    ("misaligned-tensor", gguf([ARCH], [tensor_info("a", (4,)), tensor_info("b", (4,), offset=16)],
                               data=b"\0" * 64), "misaligned or overlapping"),
    ("overlapping-tensors", gguf([ARCH], [tensor_info("a", (64,)), tensor_info("b", (4,), offset=0)],
                                 data=b"\0" * 512), "expected 256"),
    ("duplicate-tensor", gguf([ARCH], [tensor_info("a", (4,)), tensor_info("a", (4,), offset=32)],
                              data=b"\0" * 64), "duplicate tensor name 'a'"),
    ("data-past-eof", gguf([ARCH], [tensor_info("a", (1024,))], data=b"\0" * 100), "past the end"),
    ("too-many-dims", gguf([ARCH], [tensor_info("a", (1, 1, 1, 1, 1))]), "5 dimensions"),
    ("negative-dim", gguf([ARCH], [tensor_info("a", (-4,))]), "negative dimension"),
    ("shape-overflow", gguf([ARCH], [tensor_info("a", (2**62, 2**62))]), "overflows"),
    ("removed-ggml-type", gguf([ARCH], [tensor_info("a", (32,), ggml_type=4)]), "unknown ggml type 4"),
    ("row-not-whole-blocks", gguf([ARCH], [tensor_info("a", (33,), ggml_type=2)], data=b"\0" * 64),
     "not a multiple"),
    ("tensor-name-too-long", gguf([ARCH], [tensor_info("x" * 64, (4,))], data=b"\0" * 16), "tensor name #0"),
]

# Files whose header parses, but whose metadata describe() cannot accept.
BAD_METADATA = [
    ("no-architecture", gguf([kv("general.name", STRING, "x")]), "general.architecture"),
    ("head-count-kv-strings", minimal([kv("llama.attention.head_count_kv", ARRAY, (STRING, ["a"]))]),
     "head_count_kv' has type ARRAY of STRING"),
    ("head-count-float", minimal([kv("llama.attention.head_count", FLOAT32, 4.0)]), "expected an integer"),
    ("per-layer-wrong-length", minimal([kv("llama.attention.head_count_kv", ARRAY, (INT32, [1, 2, 3]))]),
     "3 entries, expected one per layer (1)"),
    ("tokens-not-strings", minimal([kv("tokenizer.ggml.tokens", ARRAY, (INT32, [1, 2]))]),
     "tokenizer.ggml.tokens' has type ARRAY of INT32"),
    ("add-bos-not-bool", minimal([kv("tokenizer.ggml.add_bos_token", UINT32, 1)]), "expected BOOL"),
    ("block-count-absurd", gguf([ARCH, kv("llama.block_count", UINT32, 2**31)]), "at most 512"),
    ("nextn-exceeds-blocks", minimal([kv("llama.nextn_predict_layers", UINT32, 2)]), "exceeds block_count"),
    ("tensor-beyond-block-count", gguf([ARCH, kv("llama.block_count", UINT32, 1)],
                                       [tensor_info("blk.7.x", (4,))], data=b"\0" * 16), "layer 7"),
    ("bool-array-too-long", minimal([kv("llama.attention.sliding_window_pattern", ARRAY, (BOOL, [True] * 3))]),
     "3 entries for 1 layers"),
]


@pytest.mark.parametrize("case", HOSTILE + BAD_METADATA, ids=[c[0] for c in HOSTILE + BAD_METADATA])
def test_hostile_file_is_refused(tmp_path: Path, case) -> None:
    _, data, expected = case
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFFormatError) as err:
        describe(path)
    assert str(path) in err.value.message
    assert expected in err.value.message
    assert err.value.hint


def test_minimal_file_is_accepted(tmp_path: Path) -> None:
    """The base the hostile cases break is itself valid, so each case fails for its own reason."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(minimal())
    m = describe(path)
    assert (m.architecture, m.n_block, m.tensor_bytes) == ("llama", 1, 32)


def test_big_endian_file_is_read(tmp_path: Path) -> None:
    import struct
    data = b"GGUF" + struct.pack(">IQQ", 3, 0, 2) + \
        struct.pack(">Q", 20) + b"general.architecture" + struct.pack(">IQ", 8, 5) + b"llama" + \
        struct.pack(">Q", 17) + b"llama.block_count" + struct.pack(">II", 4, 3)
    path = tmp_path / "be.gguf"
    path.write_bytes(data)
    h = read_header(path)
    assert (h.byteorder, h.get("llama.block_count")) == (">", 3)


def test_missing_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(GGUFFormatError, match="cannot open"):
        read_header(tmp_path / "nope.gguf")
