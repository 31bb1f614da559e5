"""Find GGUF files where people keep them: models/, configured dirs, the Hugging Face cache, LM Studio's
models dir and Ollama's blob store. Read-only: these functions list and stat, they never write.

Each finder yields `Found(path, source, name, aliases)`; a split model is found once, by its first part.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from bostudio.gguf.names import model_stem, quant_tag
from bostudio.gguf.split import SPLIT_RE

_OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"
_DIGEST_RE = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
MAX_MANIFEST_BYTES = 1 << 20


@dataclass(frozen=True)
class Found:
    """A GGUF file found in a store, with the names it can be asked for by."""

    path: Path
    source: str  # models | dir | huggingface | lmstudio | ollama
    name: str
    aliases: tuple[str, ...] = ()


def _is_later_split_part(name: str) -> bool:
    m = SPLIT_RE.match(name)
    return m is not None and int(m["no"]) != 1


def _gguf_files(root: Path) -> Iterator[Path]:
    """*.gguf under root (hidden dirs and later split parts skipped), in a stable order."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in sorted(filenames):
            if fn.lower().endswith(".gguf") and not fn.startswith(".") and not _is_later_split_part(fn):
                yield Path(dirpath) / fn


def scan_dir(root: Path, source: str) -> list[Found]:
    """Every GGUF under a plain directory, named by its path relative to root (without .gguf)."""
    found = []
    for p in _gguf_files(root):
        rel = p.relative_to(root)
        name = str(rel.parent / model_stem(p.name)) if rel.parent != Path(".") else model_stem(p.name)
        found.append(Found(p, source, name, (model_stem(p.name),)))
    return found


def _repo_style(files: list[tuple[str, Path]], repo: str, source: str) -> list[Found]:
    """Name files of one repo `repo:QUANT` when the quant tag is unique in it, else `repo:relative/file`."""
    tags = [quant_tag(Path(rel).name) for rel, _ in files]
    out = []
    for (rel, path), tag in zip(files, tags):
        by_file = f"{repo}:{rel[:-5] if rel.lower().endswith('.gguf') else rel}"
        if tag and tags.count(tag) == 1:
            out.append(Found(path, source, f"{repo}:{tag}", (by_file, model_stem(path.name))))
        else:
            out.append(Found(path, source, by_file, (model_stem(path.name),)))
    return out


def scan_hf_cache(cache: Path) -> list[Found]:
    """GGUFs in the Hugging Face hub cache (models--ORG--NAME/snapshots/REV/...), main revision first."""
    found: list[Found] = []
    if not cache.is_dir():
        return found
    for repo_dir in sorted(cache.glob("models--*")):
        repo = repo_dir.name[len("models--"):].replace("--", "/")
        snapshots = repo_dir / "snapshots"
        if not snapshots.is_dir():
            continue
        order = sorted(s for s in snapshots.iterdir() if s.is_dir())
        try:
            main = (repo_dir / "refs" / "main").read_text().strip()
            order.sort(key=lambda s: s.name != main)
        except OSError:
            pass
        files: dict[str, Path] = {}
        seen_blobs: set[str] = set()
        for snap in order:
            for p in _gguf_files(snap):
                rel = p.relative_to(snap).as_posix()
                blob = os.path.realpath(p)
                if rel in files or blob in seen_blobs or not os.path.isfile(blob):
                    continue
                files[rel] = p
                seen_blobs.add(blob)
        found.extend(_repo_style(sorted(files.items()), repo, "huggingface"))
    return found


def scan_lmstudio(root: Path) -> list[Found]:
    """GGUFs in LM Studio's models dir (PUBLISHER/REPO/file.gguf)."""
    found: list[Found] = []
    if not root.is_dir():
        return found
    by_repo: dict[str, list[tuple[str, Path]]] = {}
    for p in _gguf_files(root):
        parts = p.relative_to(root).parts
        if len(parts) >= 3:
            repo, rel = f"{parts[0]}/{parts[1]}", "/".join(parts[2:])
        else:
            repo, rel = parts[0] if len(parts) > 1 else "", parts[-1]
        by_repo.setdefault(repo, []).append((rel, p))
    for repo, files in sorted(by_repo.items()):
        if repo:
            found.extend(_repo_style(files, repo, "lmstudio"))
        else:
            found.extend(Found(p, "lmstudio", model_stem(p.name)) for _, p in files)
    return found


def _ollama_name(parts: tuple[str, ...]) -> str:
    """registry/namespace/model/tag -> the name `ollama run` takes."""
    registry, namespace, model, tag = parts[-4:]
    if registry == "registry.ollama.ai":
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def scan_ollama(root: Path) -> list[Found]:
    """GGUF blobs of Ollama's store, found through its manifests and named as Ollama names them."""
    found: list[Found] = []
    manifests = root / "manifests"
    if not manifests.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(manifests):
        dirnames.sort()
        for fn in sorted(filenames):
            mpath = Path(dirpath) / fn
            parts = mpath.relative_to(manifests).parts
            if len(parts) != 4:
                continue
            blob = _ollama_model_blob(mpath, root)
            if blob is None:
                continue
            name = _ollama_name(parts)
            aliases = (name[:-len(":latest")],) if name.endswith(":latest") else ()
            found.append(Found(blob, "ollama", name, aliases))
    return found


def _ollama_model_blob(manifest: Path, root: Path) -> Path | None:
    """The model layer's blob path named by a manifest, or None if the manifest is unusable."""
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        data = json.loads(manifest.read_bytes())
    except (OSError, ValueError):
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        return None
    for layer in layers:
        if isinstance(layer, dict) and layer.get("mediaType") == _OLLAMA_MODEL_MEDIA:
            # The digest comes from another app's file: accept only the exact sha256 form, so it can
            # never name a path outside blobs/.
            m = _DIGEST_RE.match(str(layer.get("digest", "")))
            if m:
                blob = root / "blobs" / f"sha256-{m.group(1)}"
                return blob if blob.is_file() else None
    return None
