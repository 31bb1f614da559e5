"""The model catalog: every GGUF on the machine, described, and found again by name.

`scan_catalog()` gathers files from all stores (stores.py), describes each with bostudio.gguf and caches the
result under the XDG cache dir keyed by (path, size, mtime), so a rescan of unchanged files costs a stat each.
`resolve_name()` turns what a user typed into one path, or an error listing the candidates.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from bostudio import paths
from bostudio.catalog.config import CatalogConfig, load_catalog_config
from bostudio.catalog.stores import Found, scan_dir, scan_hf_cache, scan_lmstudio, scan_ollama
from bostudio.errors import GGUFFormatError, ModelError
from bostudio.files import write_atomic
from bostudio.gguf import ModelInfo, RopeInfo, TokenizerInfo, describe, split_part_names

# The cache is dropped whenever ModelInfo's fields change, so a newer bostudio never misreads an older cache.
CACHE_VERSION = "2:" + hashlib.sha256(",".join(
    f.name for cls in (ModelInfo, RopeInfo, TokenizerInfo) for f in fields(cls)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CatalogEntry:
    """One model in the catalog. `info` is None when the file could not be read; `error` says why."""

    name: str
    source: str
    path: Path
    aliases: tuple[str, ...]
    size: int
    info: ModelInfo | None
    error: str | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "path": str(self.path), "aliases": list(self.aliases),
                "size": self.size, "error": self.error,
                "info": self.info.to_json() if self.info else None}


def find_models(config: CatalogConfig) -> list[Found]:
    """Every GGUF in every configured store (duplicates included)."""
    found: list[Found] = []
    if paths.models_dir().is_dir():
        found += scan_dir(paths.models_dir(), "models")
    for d in config.dirs:
        if d.is_dir():
            found += scan_dir(d, "dir")
    if config.huggingface:
        found += scan_hf_cache(paths.hf_cache_dir())
    if config.lmstudio:
        for d in paths.lmstudio_models_dirs():
            found += scan_lmstudio(d)
    if config.ollama:
        for d in paths.ollama_models_dirs():
            found += scan_ollama(d)
    return found


def _parts(path: Path) -> list[Path]:
    names = split_part_names(path.name)
    return [path.with_name(n) for n in names] if names else [path]


def _stat_key(path: Path) -> tuple[str, int] | None:
    """(cache key, total size) of a model's file(s), or None if a part cannot be stat'ed."""
    sizes, stamps = [], []
    for p in _parts(path):
        try:
            st = os.stat(p)
        except OSError:
            return None
        sizes.append(st.st_size)
        stamps.append(st.st_mtime_ns)
    return f"{sum(sizes)}:{max(stamps)}:{len(sizes)}", sum(sizes)


class _IndexCache:
    """(realpath -> key, described info) in one JSON file, written atomically when something changed."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.entries: dict[str, dict] = {}
        self.dirty = False
        try:
            data = json.loads(file.read_text())
            if data.get("version") == CACHE_VERSION and isinstance(data.get("entries"), dict):
                self.entries = data["entries"]
        except (OSError, ValueError, AttributeError):
            pass  # no cache or an unreadable one: start afresh

    def lookup(self, real: str, key: str) -> dict | None:
        e = self.entries.get(real)
        return e if e and e.get("key") == key else None

    def store(self, real: str, key: str, info: ModelInfo | None, error: str | None) -> None:
        self.entries[real] = {"key": key, "info": info.to_json() if info else None, "error": error}
        self.dirty = True

    def save(self, keep: set[str]) -> None:
        stale = set(self.entries) - keep
        if not self.dirty and not stale:
            return
        for real in stale:
            del self.entries[real]
        write_atomic(self.file, json.dumps({"version": CACHE_VERSION, "entries": self.entries}))


def scan_catalog(config: CatalogConfig | None = None) -> list[CatalogEntry]:
    """Describe every model in every store (from the cache when unchanged); one entry per distinct file."""
    config = config or load_catalog_config()
    cache = _IndexCache(paths.catalog_index_file())
    entries: list[CatalogEntry] = []
    seen: set[str] = set()
    for f in find_models(config):
        real = os.path.realpath(f.path)
        if real in seen:
            continue
        seen.add(real)
        stat = _stat_key(f.path)
        if stat is None:
            entries.append(CatalogEntry(f.name, f.source, f.path, f.aliases, 0, None, "a split part is missing"))
            continue
        key, size = stat
        hit = cache.lookup(real, key)
        if hit is not None:
            info = ModelInfo.from_json(hit["info"]) if hit["info"] else None
            error = hit["error"]
        else:
            try:
                info, error = describe(f.path), None
            except GGUFFormatError as exc:
                info, error = None, exc.message
            cache.store(real, key, info, error)
        entries.append(CatalogEntry(f.name, f.source, f.path, f.aliases, size, info, error))
    try:
        cache.save(seen)
    except OSError:
        pass  # a read-only cache dir costs speed, not correctness
    return entries


def match_entries(name: str, entries: list[CatalogEntry]) -> list[CatalogEntry]:
    """The distinct models `name` could mean: exact names/aliases (case-insensitive) if any, else substrings."""
    want = name.lower()
    hits = [e for e in entries if want == e.name.lower() or want in (a.lower() for a in e.aliases)]
    if not hits:
        hits = [e for e in entries if want in e.name.lower()]
    return list({os.path.realpath(e.path): e for e in hits}.values())


def ambiguous(name: str, matches: list[CatalogEntry]) -> ModelError:
    listing = "; ".join(f"{e.name} ({e.source})" for e in matches)
    return ModelError(f"model name {name!r} is ambiguous: {listing}", "use one of the full names, or a path")


def not_found(name: str, entries: list[CatalogEntry]) -> ModelError:
    known = ", ".join(sorted(e.name for e in entries)[:20]) or "none"
    return ModelError(f"no model named {name!r} in the catalog",
                      f"`bostudio ls` lists what is there (e.g. {known}); `bostudio pull REPO:QUANT` fetches one")


def resolve_name(name: str, entries: list[CatalogEntry] | None = None) -> Path:
    """The path of the one model `name` means: an exact name or alias first, then a unique substring.

    Raises ModelError listing the candidates when the name is ambiguous, and the known names when nothing
    matches."""
    entries = scan_catalog() if entries is None else entries
    matches = match_entries(name, entries)
    if len(matches) == 1:
        return matches[0].path
    raise ambiguous(name, matches) if matches else not_found(name, entries)
