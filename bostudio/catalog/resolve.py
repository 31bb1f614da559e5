"""Turn the MODEL argument of a command into a GGUF path."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bostudio.catalog.embedded import DEFAULT, EMBEDDED, ensure_embedded
from bostudio.catalog.index import resolve_name
from bostudio.errors import ModelError


def model_name(path: Path) -> str:
    """The name clients send as `model`: the file name without .gguf."""
    name = path.name
    return name[:-5] if name.lower().endswith(".gguf") else name


def looks_like_path(arg: str) -> bool:
    """A .gguf name or an explicit path is a file the user means, never a catalog name."""
    return arg.lower().endswith(".gguf") or arg.startswith(("/", "./", "../", "~"))


def missing_file(arg: str) -> ModelError:
    return ModelError(f"model file {arg} not found", "check the path, or name a model `bostudio ls` lists")


def resolve_model(arg: str | None, log: Callable[[str], None] = print) -> Path:
    """None → the embedded default; an embedded model's name → it, assembled if needed; an existing path →
    itself; else a name from the catalog."""
    if arg is None:
        return ensure_embedded(DEFAULT, log=log)
    if arg in EMBEDDED:
        return ensure_embedded(EMBEDDED[arg], log=log)
    p = Path(arg).expanduser()
    if p.is_file():
        return p
    if p.exists():
        raise ModelError(f"{arg} is not a file", "pass a .gguf file or a model name")
    if looks_like_path(arg):
        raise missing_file(arg)
    # A name: models/, configured dirs, the HF cache, LM Studio and Ollama (bostudio ls).
    return resolve_name(arg)
