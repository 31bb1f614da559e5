"""Split GGUFs (NAME-0000i-of-0000N.gguf) read as one model."""

from __future__ import annotations

from pathlib import Path

import pytest

from bostudio.errors import GGUFFormatError
from bostudio.gguf import describe, read_header, split_part_names
from bostudio.gguf.synth import tiny_llama


def test_split_parts_read_as_one_model(tmp_path: Path) -> None:
    whole = describe(tiny_llama(tmp_path / "whole.gguf", n_layer=3))
    tiny_llama(tmp_path / "split.gguf", n_layer=3, split_max_tensors=12)
    parts = sorted(tmp_path.glob("split-*-of-*.gguf"))
    assert len(parts) == 3
    for any_part in parts:  # any part names the whole model
        m = describe(any_part)
        assert m.parts == tuple(parts) and m.path == parts[0]
        assert (m.tensor_bytes, m.layer_bytes, m.n_params, m.token_embd_bytes, m.output_bytes) == \
            (whole.tensor_bytes, whole.layer_bytes, whole.n_params, whole.token_embd_bytes, whole.output_bytes)
        assert m.tokenizer.fingerprint == whole.tokenizer.fingerprint
        assert m.file_size == sum(p.stat().st_size for p in parts)
    header = read_header(parts[1])
    assert sorted({t.part for t in header.tensors}) == [0, 1, 2]


def test_missing_part_is_named(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "split.gguf", n_layer=3, split_max_tensors=12)
    (tmp_path / "split-00002-of-00003.gguf").unlink()
    with pytest.raises(GGUFFormatError, match="missing part.*split-00002-of-00003.gguf") as err:
        describe(tmp_path / "split-00001-of-00003.gguf")
    assert "download all 3 parts" in err.value.hint


def test_part_renamed_out_of_order_is_refused(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "split.gguf", n_layer=3, split_max_tensors=12)
    a, b = tmp_path / "split-00002-of-00003.gguf", tmp_path / "split-00003-of-00003.gguf"
    a.rename(tmp_path / "x"), b.rename(a), (tmp_path / "x").rename(b)
    with pytest.raises(GGUFFormatError, match="split.no is 2, expected 1"):
        describe(a)


def test_part_without_split_name_is_refused(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "split.gguf", n_layer=3, split_max_tensors=12)
    lone = (tmp_path / "split-00001-of-00003.gguf").rename(tmp_path / "renamed.gguf")
    with pytest.raises(GGUFFormatError, match="one part of a 3-part split model"):
        describe(lone)


@pytest.mark.parametrize("name, expected", [
    ("m-00002-of-00003.gguf", ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]),
    ("m.gguf", None),
    ("m-00004-of-00003.gguf", None),
    ("m-00000-of-00000.gguf", None),
])
def test_split_part_names(name: str, expected: list[str] | None) -> None:
    assert split_part_names(name) == expected
