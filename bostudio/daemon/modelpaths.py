"""What the control API accepts as a model or draft path: a regular GGUF file inside a directory the
catalog scans (the models dir, config.toml's [catalog] dirs, the Hugging Face, LM Studio and Ollama
stores), unless the daemon was started with --allow-any-model-path. A FIFO or device is refused before
anything opens it, `../` cannot leave the directories (it is resolved before the check), and no error ever
shows a byte of the file. Blocking (stat, one 4-byte read): call it off the event loop."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bostudio import paths
from bostudio.errors import BostudioError, ModelError, RequestError

GGUF_MAGIC = b"GGUF"
HINT = ("put the file in a model directory (`bostudio ls` scans them; config.toml [catalog] dirs adds more), "
        "or start the daemon with --allow-any-model-path")


def catalog_roots() -> list[Path]:
    """The directories a model path may lie in: the ones the catalog scans."""
    from bostudio.catalog.config import load_catalog_config

    roots = [paths.models_dir()]
    try:
        cfg = load_catalog_config()
    except BostudioError:
        return roots  # a broken config.toml adds no directory
    roots += list(cfg.dirs)
    if cfg.huggingface:
        roots.append(paths.hf_cache_dir())
    if cfg.lmstudio:
        roots += paths.lmstudio_models_dirs()
    if cfg.ollama:
        roots += paths.ollama_models_dirs()
    return roots


def _inside(path: Path, roots: list[Path]) -> bool:
    """Is `path` (already absolute and free of `..`) inside a root? Lexically (a symlink the owner put in a
    model dir is theirs to trust) or by its real path (a root that is itself a symlink)."""
    real = os.path.realpath(path)
    for root in roots:
        try:
            lexical = os.path.abspath(os.path.expanduser(root))
            base = os.path.realpath(lexical)
        except (OSError, ValueError):
            continue
        for p, r in ((str(path), lexical), (real, base)):
            if p.startswith(r.rstrip(os.sep) + os.sep):
                return True
    return False


def check_model_path(arg: str, allow_any: bool = False, roots: list[Path] | None = None,
                     what: str = "model") -> Path:
    """The absolute path of `arg` if it names a GGUF file the daemon may serve. Raises ModelError
    (missing) or RequestError (refused: not a regular file, not a GGUF, outside the model dirs)."""
    path = Path(os.path.abspath(os.path.expanduser(arg)))
    shown = repr(arg)  # repr: a control character in a name cannot reach a terminal or a log raw
    # First: outside the directories nothing is even looked at (no probing which files exist).
    if not allow_any and not _inside(path, catalog_roots() if roots is None else roots):
        raise RequestError(f"{what} path {shown} is outside the model directories", HINT)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelError(f"{what} file {shown} not found", "check the path, or name a model GET /v1/models lists")
    except OSError as exc:
        raise RequestError(f"{what} file {shown} cannot be read: {exc.strerror or exc}", HINT)
    if not stat.S_ISREG(st.st_mode):
        raise RequestError(f"{what} path {shown} is not a regular file", "give the path of a .gguf file")
    if not path.name.lower().endswith(".gguf"):
        raise RequestError(f"{what} path {shown} is not a .gguf file", "give the path of a .gguf file")
    from bostudio.gguf.reader import open_regular

    try:
        with open_regular(path) as f:
            magic = f.read(4)
    except OSError as exc:
        raise RequestError(f"{what} file {shown} cannot be read: {exc.strerror or exc}", HINT)
    if magic != GGUF_MAGIC:
        raise RequestError(f"{what} file {shown} is not a GGUF file", "give the path of a .gguf file")
    return path


def check_spec(spec: str | None, allow_any: bool = False) -> None:
    """A `draft:PATH` speculation names a GGUF file the daemon may read (check_model_path); other
    modes are checked by parse_spec."""
    if spec is not None and spec.startswith("draft:") and len(spec) > len("draft:"):
        check_model_path(spec[len("draft:"):], allow_any, what="draft")


__all__ = ["catalog_roots", "check_model_path", "check_spec"]
