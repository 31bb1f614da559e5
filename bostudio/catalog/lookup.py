"""Find the model a command's MODEL argument means, on disk or on the hub, and describe it."""

from __future__ import annotations

from pathlib import Path

from bostudio.catalog.index import ambiguous, match_entries, not_found, scan_catalog
from bostudio.gguf import ModelInfo, describe


def describe_model(arg: str, revision: str = "main", remote: bool = True) -> tuple[str, ModelInfo]:
    """(name, ModelInfo) for a path, a catalog name, or — when nothing local matches and `remote` — a hub
    reference REPO[:QUANT|:FILE], read from its header with range requests."""
    path = Path(arg).expanduser()
    if path.is_file():
        return path.name, describe(path)
    entries = scan_catalog()
    matches = match_entries(arg, entries)
    if len(matches) == 1:
        return matches[0].name, describe(matches[0].path)
    if matches:
        raise ambiguous(arg, matches)
    if remote and "/" in arg and not path.is_absolute():
        from bostudio.catalog.remote import describe_remote

        return arg, describe_remote(arg, revision)
    raise not_found(arg, entries)
