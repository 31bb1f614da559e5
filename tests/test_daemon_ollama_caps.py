"""What the daemon's Ollama face says a model can do, and its digest, through the official `ollama` client
against a real daemon: `tools` among the capabilities when the template served renders tools, and a digest
that is the file's sha256 (64 hex characters), computed once and cached by path, size and mtime."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import ollama
import pytest

from bostudio.catalog.embedded import DEFAULT
from tests.daemon_util import DaemonProc
from bostudio.gguf.synth import tiny_llama

GEMMA = "gemma-3-270m-q4_k_m"
NO_TOOLS = "tiny-no-tools"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, gemma_gguf: Path, qwen_gguf: Path):
    root = tmp_path_factory.mktemp("ollama-caps")
    models = root / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    (models / qwen_gguf.name).symlink_to(qwen_gguf)
    # A template that renders no tools and is no format bostudio has a tool template for.
    tiny_llama(models / f"{NO_TOOLS}.gguf", chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    d = DaemonProc(root, models, ["--idle-ttl", "0"])
    d.env["XDG_CACHE_HOME"] = str(root / "cache")  # its digest cache, where this test can read it
    yield d.start()
    assert d.stop() == 0


@pytest.fixture(scope="module")
def olla(daemon: DaemonProc) -> ollama.Client:
    return ollama.Client(host=daemon.url, timeout=300)


def test_show_lists_tools_when_the_served_template_renders_them(olla: ollama.Client) -> None:
    qwen = olla.show(DEFAULT.name)
    # Qwen2.5-Coder's own template has a tools section, and it has fill-in-the-middle tokens.
    assert qwen.capabilities == ["completion", "tools", "insert"]
    assert "<tool_call>" in (qwen.template or "")
    # The Gemma base model has no template: it is served with bostudio's ChatML-with-tools one, shown as such.
    gemma = olla.show(GEMMA)
    assert "tools" in gemma.capabilities and "<tool_call>" in (gemma.template or "")
    assert olla.show(NO_TOOLS).capabilities == ["completion"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_digest_is_the_files_sha256_computed_once(olla: ollama.Client, daemon: DaemonProc) -> None:
    models = daemon.root / "models"
    tiny = models / f"{NO_TOOLS}.gguf"
    listed = {m.model: m.digest for m in olla.list().models}
    assert listed == {DEFAULT.name: DEFAULT.sha256, GEMMA: _sha256(models / f"{GEMMA}.gguf"),
                      NO_TOOLS: _sha256(tiny)}
    # /api/show carries it too (the ollama client's ShowResponse has no field for it: read the JSON).
    with daemon.http() as http:
        assert http.post("/api/show", json={"model": NO_TOOLS}).json()["digest"] == _sha256(tiny)

    cache = json.loads((daemon.root / "cache" / "bostudio" / "digests.json").read_text())
    entry = cache[os.path.realpath(tiny)]
    st = tiny.stat()
    assert entry == {"key": f"{st.st_size}:{st.st_mtime_ns}", "sha256": _sha256(tiny)}
    # The cache is what answers while the file is unchanged: a forged entry is served as it stands...
    cache[os.path.realpath(tiny)]["sha256"] = "f" * 64
    (daemon.root / "cache" / "bostudio" / "digests.json").write_text(json.dumps(cache))
    assert {m.model: m.digest for m in olla.list().models}[NO_TOOLS] == "f" * 64
    # ... and a change of the file (its mtime) computes it again.
    os.utime(tiny, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert {m.model: m.digest for m in olla.list().models}[NO_TOOLS] == _sha256(tiny)
