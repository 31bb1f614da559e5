"""Precision copies made with the engine's llama-quantize: made once, beside the source in a hidden folder that
no catalog lists, re-made when the source changes, never half-written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bostudio.catalog.stores import scan_dir
from bostudio.engine import quantize as quantize_module
from bostudio.engine.quantize import precision_copy, precision_copy_path
from bostudio.errors import ConfigError
from bostudio.gguf import describe
from bostudio.gguf.synth import tiny_llama


def test_precision_copy_is_made_once_and_again_when_the_source_changes(engine, tmp_path: Path, monkeypatch) -> None:
    src = tiny_llama(tmp_path / "tiny.gguf")
    copy = precision_copy(src, engine, "F16", log=lambda m: None)
    assert copy == precision_copy_path(src, "F16") == tmp_path / ".full-precision" / "tiny.F16.gguf"
    assert describe(copy).n_layer == describe(src).n_layer
    assert [f.path for f in scan_dir(tmp_path, "models")] == [src]  # not listed as a model
    assert not list(copy.parent.glob("*.partial"))

    calls: list[Path] = []
    real = quantize_module.quantize
    monkeypatch.setattr(quantize_module, "quantize", lambda eng, s, out, q: calls.append(out) or real(eng, s, out, q))
    assert precision_copy(src, engine, "F16", log=lambda m: None) == copy
    assert calls == []  # cached
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the source changed
    assert precision_copy(src, engine, "F16", log=lambda m: None) == copy
    assert calls == [copy]


def test_unknown_type_is_a_clear_error_and_leaves_nothing(engine, tmp_path: Path) -> None:
    src = tiny_llama(tmp_path / "tiny.gguf")
    with pytest.raises(ConfigError, match="could not make a NOPE copy"):
        precision_copy(src, engine, "NOPE", log=lambda m: None)
    assert not precision_copy_path(src, "NOPE").exists()
    assert not [p for p in (tmp_path / ".full-precision").iterdir() if p.suffix in (".gguf", ".partial")]
