"""Fixture stores laid out the way other apps lay them out: a Hugging Face cache, an LM Studio models dir and
an Ollama store (manifests + blobs), each holding small GGUFs."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gguf_raw import ARCH, STRING, UINT32, gguf, kv, tensor_info

COMMIT = "a" * 40


def small_gguf(name: str, n_block: int = 1, arch: str = "llama") -> bytes:
    """A valid GGUF of a few hundred bytes, distinguishable by its general.name."""
    arch_kv = ARCH if arch == "llama" else kv("general.architecture", STRING, arch)
    return gguf([arch_kv, kv("general.name", STRING, name), kv(f"{arch}.block_count", UINT32, n_block),
                 kv(f"{arch}.context_length", UINT32, 4096)],
                [tensor_info(f"blk.{i}.attn_norm.weight", (8,), offset=32 * i) for i in range(n_block)],
                data=b"\0" * (32 * n_block))


def add_hf_file(cache: Path, repo: str, filename: str, data: bytes, commit: str = COMMIT) -> Path:
    """Put a file into a hub cache as huggingface-hub does: blob by hash, snapshot symlink, refs/main."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    pointer = storage / "snapshots" / commit / filename
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return pointer


def add_ollama_model(root: Path, name: str, tag: str, data: bytes, namespace: str = "library",
                     registry: str = "registry.ollama.ai") -> Path:
    """An Ollama model: the GGUF as blobs/sha256-<hex>, a manifest naming it and a template layer."""
    digest = hashlib.sha256(data).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    template = b"{{ .Prompt }}"
    tdigest = hashlib.sha256(template).hexdigest()
    (root / "blobs" / f"sha256-{tdigest}").write_bytes(template)
    manifest = root / "manifests" / registry / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2,
        "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
                    "size": len(data)},
                   {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{tdigest}",
                    "size": len(template)}]}))
    return blob


@dataclass
class Stores:
    root: Path
    models: Path
    extra: Path
    hf: Path
    lmstudio: Path
    ollama: Path


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Stores:
    """Empty stores in tmp_path, wired into bostudio.paths through the environment."""
    s = Stores(tmp_path, tmp_path / "models", tmp_path / "extra", tmp_path / "hf", tmp_path / "lmstudio",
               tmp_path / "ollama")
    for d in (s.models, s.extra, s.hf, s.lmstudio, s.ollama):
        d.mkdir()
    monkeypatch.setenv("BOSTUDIO_MODELS_DIR", str(s.models))
    monkeypatch.setenv("HF_HUB_CACHE", str(s.hf))
    monkeypatch.setenv("LMSTUDIO_MODELS_DIR", str(s.lmstudio))
    monkeypatch.setenv("OLLAMA_MODELS", str(s.ollama))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "config" / "bostudio").mkdir(parents=True)
    (tmp_path / "config" / "bostudio" / "config.toml").write_text(f'[catalog]\ndirs = ["{s.extra}"]\n')
    return s
