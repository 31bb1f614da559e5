"""Split GGUFs (`name-00001-of-00003.gguf`, written by llama-gguf-split) read as one model.

The first part holds all the metadata and some tensors; the others hold `split.*` keys and the rest of the
tensors. `read_header` finds every part from any one of them and merges their headers; a missing part is an
error that names it.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from bostudio.errors import GGUFFormatError
from bostudio.gguf.reader import Header, LocalFile, parse_header

SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_part_names(name: str) -> list[str] | None:
    """All part names of the split model `name` belongs to (in order), or None if it is not a split name."""
    m = SPLIT_RE.match(name)
    if not m:
        return None
    count = int(m["count"])
    if count < 1 or not 1 <= int(m["no"]) <= count:
        return None
    return [f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _int_field(h: Header, key: str) -> int | None:
    v = h.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def merge_parts(headers: list[Header]) -> Header:
    """Merge the headers of a split model's parts (in order) into one Header."""
    first = headers[0]
    if len(headers) == 1:
        return first
    count = _int_field(first, "split.count")
    if count is not None and count != len(headers):
        raise GGUFFormatError(f"{first.path}: split.count says {count} parts, the file names say "
                              f"{len(headers)}", "the parts do not belong together; download them again")
    tensors = []
    seen: set[str] = set()
    for i, h in enumerate(headers):
        no = _int_field(h, "split.no")
        if no is not None and no != i:
            raise GGUFFormatError(f"{h.path}: split.no is {no}, expected {i} from its name",
                                  "the parts were renamed or mixed up; download them again")
        for t in h.tensors:
            if t.name in seen:
                raise GGUFFormatError(f"{h.path}: tensor {t.name!r} appears in two split parts",
                                      "the parts do not belong together; download them again")
            seen.add(t.name)
            tensors.append(replace(t, part=i))
    declared = _int_field(first, "split.tensors.count")
    if declared is not None and declared != len(tensors):
        raise GGUFFormatError(f"{first.path}: split.tensors.count is {declared} but the parts hold "
                              f"{len(tensors)} tensors", "a part is damaged or from another model")
    return replace(first,
                   parts=tuple(h.path for h in headers),
                   part_sizes=tuple(h.part_sizes[0] for h in headers),
                   data_offsets=tuple(h.data_offsets[0] for h in headers),
                   tensors=tuple(tensors))


# Headers of whole (unsplit) files by (path, size, mtime): a server reads the same few models' headers on
# every catalog listing; a changed file has another key. Bounded, least recently used dropped first.
_CACHE: "OrderedDict[tuple[str, int, int], Header]" = OrderedDict()
_CACHE_MAX = 64
_CACHE_LOCK = threading.Lock()


def read_header(path: str | Path) -> Header:
    """Read the header of the GGUF at `path`; for a split model (any of its parts), of all parts merged.
    A whole file's header is cached by (path, size, mtime)."""
    path = Path(path)
    names = split_part_names(path.name)
    if names is None:
        try:
            st = os.stat(path)
            key: tuple[str, int, int] | None = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        if key is not None:
            with _CACHE_LOCK:
                if key in _CACHE:
                    _CACHE.move_to_end(key)
                    return _CACHE[key]
        header = _read_whole(path)
        if key is not None:
            with _CACHE_LOCK:
                _CACHE[key] = header
                while len(_CACHE) > _CACHE_MAX:
                    _CACHE.popitem(last=False)
        return header
    return _read_split(path, names)


def _read_whole(path: Path) -> Header:
    with LocalFile(path) as src:
        header = parse_header(src)
    count = _int_field(header, "split.count")
    if count is not None and count > 1:
        raise GGUFFormatError(f"{path}: this is one part of a {count}-part split model, but its name "
                              f"does not say where the other parts are",
                              "keep the names llama-gguf-split gave the parts (NAME-00001-of-0000N.gguf)")
    return header


def _read_split(path: Path, names: list[str]) -> Header:
    paths = [path.with_name(n) for n in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise GGUFFormatError(f"{path}: split model is missing part(s) {', '.join(missing)}",
                              f"download all {len(paths)} parts into {path.parent}")
    headers = []
    for p in paths:
        with LocalFile(p) as src:
            headers.append(parse_header(src))
    return merge_parts(headers)
