"""A file's digest: its sha256, computed once and cached by path, size and mtime; read from the name of a
content-addressed store's blob."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from bostudio.catalog.digest import digest_cache_file, file_digest, record_digest


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_computed_once_then_read_from_the_cache_until_the_file_changes(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"x" * 5000)
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    assert file_digest(f) == want
    assert digest_cache_file().is_file()
    st = f.stat()
    f.write_bytes(b"GGUF" + b"y" * 5000)  # same size; the mtime put back: the cache still answers
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_digest(f) == want
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a change the stat sees
    assert file_digest(f) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_a_recorded_digest_is_served_and_a_link_shares_its_targets(tmp_path: Path) -> None:
    f = tmp_path / "big.gguf"
    f.write_bytes(b"GGUF")
    record_digest(f, "a" * 64)
    link = tmp_path / "link.gguf"
    link.symlink_to(f)
    assert file_digest(link) == file_digest(f) == "a" * 64


@pytest.mark.parametrize("name", ["sha256-" + "b" * 64, "c" * 64])
def test_a_blob_named_by_its_sha256_is_not_read(tmp_path: Path, name: str) -> None:
    blob = tmp_path / "blobs" / name
    blob.parent.mkdir()
    blob.write_bytes(b"not what the name says: the store named it, the name is taken")
    link = tmp_path / "snapshots" / "model.gguf"
    link.parent.mkdir()
    link.symlink_to(blob)
    assert file_digest(link) == name[-64:]
    assert not digest_cache_file().exists()
