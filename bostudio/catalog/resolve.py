"""Turn the MODEL argument of a command into a GGUF path."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bostudio import paths
from bostudio.catalog.embedded import DEFAULT_NAME, ensure_default_model
from bostudio.errors import ModelError


def model_name(path: Path) -> str:
    """The name clients send as `model`: the file name without .gguf."""
    name = path.name
    return name[:-5] if name.lower().endswith(".gguf") else name


def resolve_model(arg: str | None, log: Callable[[str], None] = print) -> Path:
    """None → the embedded default; an existing path → itself; else a name in models/."""
    if arg is None or arg == DEFAULT_NAME:
        return ensure_default_model(log=log)
    p = Path(arg).expanduser()
    if p.is_file():
        return p
    if p.exists():
        raise ModelError(f"{arg} is not a file", "pass a .gguf file or a model name")
    models = paths.models_dir()
    candidates = sorted(q for q in models.glob("*.gguf") if arg.lower() in (q.stem.lower(), q.name.lower()))
    if not candidates:
        candidates = sorted(q for q in models.glob("*.gguf") if arg.lower() in q.stem.lower())
    if len(candidates) == 1:
        return candidates[0]
    if len(candidates) > 1:
        names = ", ".join(model_name(c) for c in candidates)
        raise ModelError(f"model name {arg!r} is ambiguous: {names}", "use one of the full names or a path")
    known = ", ".join(sorted(model_name(q) for q in models.glob("*.gguf"))) or "none"
    raise ModelError(f"model {arg!r} not found (no such file, and no such name in {models})",
                     f"pass a path to a .gguf file; names in models/: {known}")
