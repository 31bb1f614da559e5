"""The catalog's settings: the `[catalog]` table of the user's config.toml.

    [catalog]
    dirs = ["~/models", "/data/gguf"]   # extra dirs to scan for *.gguf
    huggingface = true                  # scan the Hugging Face hub cache
    lmstudio = true                     # scan LM Studio's models dir
    ollama = true                       # scan Ollama's blob store

Other tables belong to other parts of bostudio and are not checked here; an unknown key inside
`[catalog]` is an error naming the file, the key and the nearest valid key.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from bostudio import paths
from bostudio.config import config_table
from bostudio.errors import ConfigError

_KEYS = ("dirs", "huggingface", "lmstudio", "ollama")


@dataclass(frozen=True)
class CatalogConfig:
    """Where the catalog looks for models."""

    dirs: tuple[Path, ...] = ()
    huggingface: bool = True
    lmstudio: bool = True
    ollama: bool = True


def load_catalog_config(path: Path | None = None) -> CatalogConfig:
    """Read `[catalog]` from config.toml (default: paths.config_file()); a missing file means defaults."""
    path = path or paths.config_file()
    table = config_table("catalog", path)
    for key in table:
        if key not in _KEYS:
            near = difflib.get_close_matches(key, _KEYS, n=1)
            hint = f"did you mean `{near[0]}`?" if near else f"valid keys: {', '.join(_KEYS)}"
            raise ConfigError(f"{path}: unknown key `{key}` in [catalog]", hint)
    dirs = table.get("dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise ConfigError(f"{path}: [catalog] dirs must be a list of paths", 'e.g. dirs = ["~/models"]')
    flags = {}
    for key in ("huggingface", "lmstudio", "ollama"):
        value = table.get(key, True)
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: [catalog] {key} must be true or false", f"{key} = true")
        flags[key] = value
    return CatalogConfig(dirs=tuple(Path(d).expanduser() for d in dirs), **flags)
