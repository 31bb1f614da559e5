"""A file's sha256, computed once: cached under the XDG cache dir by (real path, size, mtime), so a model's
digest (Ollama's /api/tags and /api/show) costs a stat after the first read of the file. A file that a
content-addressed store names by its sha256 (Ollama's `blobs/sha256-HEX`, the Hugging Face cache's
`blobs/HEX` of an LFS file) is not read: both stores write a blob under the digest of its content.
Blocking (it may read gigabytes): call file_digest off the event loop."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path

from bostudio import paths
from bostudio.files import write_atomic

BLOCK = 1 << 20
_BLOB_NAME = re.compile(r"(?:sha256-)?([0-9a-f]{64})")
_LOCK = threading.Lock()  # one writer of the cache file per process; hashing one file at a time is disk-bound


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_cache_file() -> Path:
    return paths.cache_dir() / "digests.json"


def _key(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}"


def _load() -> dict[str, dict[str, str]]:
    try:
        data = json.loads(digest_cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store(real: str, key: str, sha256: str) -> None:
    cache = _load()
    cache[real] = {"key": key, "sha256": sha256}
    # Entries of files that are gone are dropped as the cache is rewritten.
    cache = {p: v for p, v in cache.items() if p == real or os.path.exists(p)}
    write_atomic(digest_cache_file(), json.dumps(cache, indent=0, sort_keys=True), mode=0o644)


def record_digest(path: Path, sha256: str) -> None:
    """Remember a digest known otherwise (an embedded model checked against its expected sha256)."""
    real = os.path.realpath(path)
    with _LOCK:
        _store(real, _key(os.stat(real)), sha256)


def file_digest(path: Path) -> str:
    """The sha256 (64 hex characters) of the file at `path`, from the cache while the file's size and mtime
    are unchanged, else computed and cached. A file that changes while it is read is not cached."""
    real = os.path.realpath(path)
    named = _BLOB_NAME.fullmatch(os.path.basename(real))
    if named and os.path.basename(os.path.dirname(real)) == "blobs":
        return named.group(1)
    with _LOCK:
        before = os.stat(real)
        hit = _load().get(real)
        if isinstance(hit, dict) and hit.get("key") == _key(before) and isinstance(hit.get("sha256"), str):
            return hit["sha256"]
        sha256 = sha256_file(Path(real))
        if _key(os.stat(real)) == _key(before):
            _store(real, _key(before), sha256)
        return sha256
