"""The pinned llama.cpp source: the tree vendored in the llama-cpp-python sdist of the version
this project depends on, fetched from PyPI with pip and unpacked once into the cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bostudio import paths
from bostudio.errors import BuildError
from bostudio.files import write_atomic

DIST = "llama-cpp-python"
# Fallback when the bindings are not installed (the project pins this version in pyproject.toml).
PINNED_VERSION = "0.3.36"


@dataclass(frozen=True)
class LlamaSource:
    version: str  # llama-cpp-python version
    root: Path  # vendor/llama.cpp
    commit: str  # full llama.cpp commit hash, or "unknown"

    @property
    def short_commit(self) -> str:
        return self.commit[:7] if self.commit != "unknown" else "unknown"


def pinned_version() -> str:
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return PINNED_VERSION


def _read_commit(sdist_root: Path) -> str:
    """The sdist keeps the llama.cpp submodule's git dir; read HEAD without needing git."""
    head = sdist_root / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    try:
        text = head.read_text().strip()
    except OSError:
        return "unknown"
    if text.startswith("ref:"):
        ref = text.split(None, 1)[1]
        ref_file = head.parent / ref
        if ref_file.exists():
            return ref_file.read_text().strip()
        return "unknown"
    return text if all(c in "0123456789abcdef" for c in text) and len(text) >= 7 else "unknown"


def _safe_extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")


def ensure_source(version: str | None = None, log=print) -> LlamaSource:
    """Return the unpacked llama.cpp tree for `version`, downloading the sdist with pip if needed."""
    version = version or pinned_version()
    base = paths.source_dir()
    sdist_root = base / f"llama_cpp_python-{version}"
    root = sdist_root / "vendor" / "llama.cpp"
    if (root / "CMakeLists.txt").exists() and (sdist_root / ".bostudio-complete").exists():
        return LlamaSource(version, root, _read_commit(sdist_root))

    base.mkdir(parents=True, exist_ok=True)
    archive = base / f"llama_cpp_python-{version}.tar.gz"
    if not archive.exists():
        log(f"fetching llama-cpp-python {version} source from PyPI (about 75 MB) ...")
        tmp = base / f".download-{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-q", "-d", str(tmp), f"{DIST}=={version}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError("pip download of the llama.cpp source timed out",
                             "check access to PyPI and run `bostudio engine build` again") from exc
        got = list(tmp.glob("llama_cpp_python-*.tar.gz"))
        if proc.returncode != 0 or not got:
            shutil.rmtree(tmp, ignore_errors=True)
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise BuildError(f"could not download {DIST}=={version} with pip: {last}",
                             "check that PyPI is reachable (pip config, proxy) and try again")
        got[0].replace(archive)  # atomic: never a half file under the final name
        shutil.rmtree(tmp, ignore_errors=True)

    log(f"unpacking {archive.name} ...")
    tmp_dir = base / f".unpack-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        _safe_extract(archive, tmp_dir)
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        archive.unlink(missing_ok=True)
        raise BuildError(f"the llama.cpp source archive is damaged: {exc}",
                         "it was removed; run `bostudio engine build` again to download it anew") from exc
    inner = tmp_dir / f"llama_cpp_python-{version}"
    if not (inner / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise BuildError(f"{archive.name} holds no vendor/llama.cpp tree",
                         "this llama-cpp-python version does not vendor llama.cpp; pin another version")
    shutil.rmtree(sdist_root, ignore_errors=True)
    inner.replace(sdist_root)
    shutil.rmtree(tmp_dir, ignore_errors=True)
    write_atomic(sdist_root / ".bostudio-complete", version, mode=0o644)
    return LlamaSource(version, root, _read_commit(sdist_root))
