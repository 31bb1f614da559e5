"""Which files of a Hugging Face repo `REPO[:QUANT|:FILE]` means (pure: works on a file listing).

    Qwen/Qwen3-8B-GGUF:Q4_K_M            the Q4_K_M model, all its split parts
    Qwen/Qwen3-8B-GGUF:Qwen3-8B-Q8_0.gguf  that file (and its sibling parts if it is a split part)
    Qwen/Qwen3-8B-GGUF                   Q4_K_M if the repo has it, else its only model
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bostudio.errors import ModelError
from bostudio.gguf.names import quant_tag
from bostudio.gguf.split import SPLIT_RE, split_part_names

DEFAULT_QUANT = "Q4_K_M"
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class RemoteFile:
    """A file in a hub repo, with what the hub says about it."""

    path: str  # relative to the repo root
    size: int
    sha256: str | None  # from the LFS metadata


def parse_ref(ref: str) -> tuple[str, str | None]:
    """'ORG/NAME[:SELECTOR]' -> (repo, selector)."""
    repo, _, selector = ref.partition(":")
    if not _REPO_RE.match(repo):
        raise ModelError(f"{ref!r} is not a hub repo reference",
                         "write ORG/NAME, ORG/NAME:QUANT (e.g. Qwen/Qwen3-8B-GGUF:Q4_K_M) or ORG/NAME:FILE.gguf")
    return repo, selector or None


def _model_key(path: str) -> str:
    """Files of one model share this key: a split model's parts, or a single file by itself."""
    name = path.rsplit("/", 1)[-1]
    m = SPLIT_RE.match(name)
    return path[: len(path) - len(name)] + (m["prefix"] if m else name)


def _is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and "mmproj" not in name and not name.startswith(("imatrix", "."))


def _with_parts(ref: str, chosen: RemoteFile, files: dict[str, RemoteFile]) -> list[RemoteFile]:
    name = chosen.path.rsplit("/", 1)[-1]
    names = split_part_names(name)
    if names is None:
        return [chosen]
    prefix = chosen.path[: len(chosen.path) - len(name)]
    missing = [prefix + n for n in names if prefix + n not in files]
    if missing:
        raise ModelError(f"{ref}: the repo lacks split part(s) {', '.join(missing)}",
                         "the upload is incomplete; pick another quant or file")
    return [files[prefix + n] for n in names]


def select_files(ref: str, listing: list[RemoteFile]) -> list[RemoteFile]:
    """The file(s) of the one model `ref` names, in part order. Raises ModelError naming what exists."""
    repo, selector = parse_ref(ref)
    files = {f.path: f for f in listing}
    models = [f for f in listing if _is_model_file(f.path)]
    if not models:
        raise ModelError(f"{repo} has no GGUF model files", "pick a repo with GGUF files (names often end in -GGUF)")
    if selector and selector.lower().endswith(".gguf"):
        hits = [f for f in listing if f.path == selector] or \
               [f for f in listing if f.path.rsplit("/", 1)[-1] == selector]
        if len(hits) != 1:
            raise ModelError(f"{repo} has {'no' if not hits else 'several'} file(s) named {selector!r}",
                             "files: " + ", ".join(f.path for f in models[:20]))
        return _with_parts(ref, hits[0], files)
    tag = (selector or DEFAULT_QUANT).upper()
    groups: dict[str, list[RemoteFile]] = {}
    for f in models:
        if quant_tag(f.path.rsplit("/", 1)[-1]) == tag:
            groups.setdefault(_model_key(f.path), []).append(f)
    if not groups and selector is None:
        keys = {_model_key(f.path) for f in models}
        if len(keys) == 1:
            return _with_parts(ref, models[0], files)
    if len(groups) == 1:
        return _with_parts(ref, next(iter(groups.values()))[0], files)
    available = sorted({t for f in models if (t := quant_tag(f.path.rsplit("/", 1)[-1]))})
    if not groups:
        raise ModelError(f"{repo} has no {tag} file", f"quants there: {', '.join(available) or 'none'}; "
                                                      f"or name a file: {repo}:FILE.gguf")
    raise ModelError(f"{repo}:{tag} is ambiguous: " + ", ".join(sorted(groups)),
                     f"name the file instead: {repo}:FILE.gguf")
