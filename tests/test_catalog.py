"""The catalog: one listing over models/, configured dirs, the HF cache, LM Studio and Ollama; names that
resolve; a read-only scan; an index cache that makes rescans cheap."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from bostudio.catalog import index
from bostudio.catalog.config import CatalogConfig, load_catalog_config
from bostudio.catalog.index import resolve_name, scan_catalog
from bostudio.cli import main
from bostudio.errors import ConfigError, ModelError
from bostudio.gguf.names import quant_tag
from tests.catalog_fixtures import Stores, add_hf_file, add_ollama_model, small_gguf, stores  # noqa: F401


def _fill(s: Stores) -> None:
    (s.models / "local-model.gguf").write_bytes(small_gguf("local"))
    (s.extra / "sub").mkdir()
    (s.extra / "sub" / "extra-model-Q5_K_M.gguf").write_bytes(small_gguf("extra"))
    add_hf_file(s.hf, "org/Tiny-GGUF", "Tiny-Q8_0.gguf", small_gguf("hf q8"))
    add_hf_file(s.hf, "org/Tiny-GGUF", "Tiny-Q4_K_M.gguf", small_gguf("hf q4"))
    for i in (1, 2):  # a split model: listed once, by its first part
        add_hf_file(s.hf, "org/Big-GGUF", f"Q6_K/Big-Q6_K-0000{i}-of-00002.gguf",
                    small_gguf("big") if i == 1 else b"")
    lm = s.lmstudio / "lmstudio-community" / "Phi-GGUF"
    lm.mkdir(parents=True)
    (lm / "Phi-Q4_K_M.gguf").write_bytes(small_gguf("phi", arch="phi3"))
    add_ollama_model(s.ollama, "tinyllama", "latest", small_gguf("ollama tiny"))
    add_ollama_model(s.ollama, "coder", "7b", small_gguf("ollama coder", n_block=2), namespace="someone")


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry under root with what a write would change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = os.lstat(p)
            content = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, content,
                                             os.readlink(p) if p.is_symlink() else "")
    return out


def test_ls_lists_every_store_in_one_listing(stores: Stores, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(stores)
    assert main(["ls", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    by_name = {e["name"]: e for e in listing}
    assert {n: e["source"] for n, e in by_name.items()} == {
        "local-model": "models",
        "sub/extra-model-Q5_K_M": "dir",
        "org/Tiny-GGUF:Q8_0": "huggingface",
        "org/Tiny-GGUF:Q4_K_M": "huggingface",
        "org/Big-GGUF:Q6_K": "huggingface",
        "lmstudio-community/Phi-GGUF:Q4_K_M": "lmstudio",
        "tinyllama:latest": "ollama",
        "someone/coder:7b": "ollama",
    }
    assert by_name["org/Tiny-GGUF:Q8_0"]["info"]["name"] == "hf q8"
    assert by_name["someone/coder:7b"]["info"]["n_block"] == 2
    assert by_name["lmstudio-community/Phi-GGUF:Q4_K_M"]["info"]["architecture"] == "phi3"
    big = by_name["org/Big-GGUF:Q6_K"]  # its part 2 is an empty file: listed, with the reason
    assert big["info"] is None and "Big-Q6_K-00002-of-00002.gguf" in big["error"]
    assert main(["ls"]) == 0
    table = capsys.readouterr().out
    for name in by_name:
        assert name in table


def test_scan_is_read_only(stores: Stores) -> None:
    _fill(stores)
    before = {d: _tree(getattr(stores, d)) for d in ("models", "extra", "hf", "lmstudio", "ollama")}
    scan_catalog()
    scan_catalog()
    after = {d: _tree(getattr(stores, d)) for d in ("models", "extra", "hf", "lmstudio", "ollama")}
    assert before == after


def test_names_resolve_and_ambiguity_lists_candidates(stores: Stores) -> None:
    _fill(stores)
    entries = scan_catalog()
    assert resolve_name("tinyllama", entries).name.startswith("sha256-")  # the Ollama alias of :latest
    assert resolve_name("org/Tiny-GGUF:Q8_0", entries).name == "Tiny-Q8_0.gguf"
    assert resolve_name("Tiny-Q8_0", entries).name == "Tiny-Q8_0.gguf"  # the file stem alias
    assert resolve_name("phi", entries).name == "Phi-Q4_K_M.gguf"  # a unique substring
    with pytest.raises(ModelError) as err:
        resolve_name("tiny", entries)
    for candidate in ("org/Tiny-GGUF:Q8_0 (huggingface)", "org/Tiny-GGUF:Q4_K_M (huggingface)",
                      "tinyllama:latest (ollama)"):
        assert candidate in err.value.message
    with pytest.raises(ModelError, match="no model named 'nothing'"):
        resolve_name("nothing", entries)


def test_hostile_ollama_manifest_cannot_point_outside_blobs(stores: Stores) -> None:
    secret = stores.root / "secret.gguf"
    secret.write_bytes(small_gguf("secret"))
    manifest = stores.ollama / "manifests" / "registry.ollama.ai" / "library" / "evil" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": "sha256:../../secret.gguf"}]}))
    (manifest.parent / "broken").write_text("{not json")
    assert [e.name for e in scan_catalog()] == []


def test_rescan_of_200_unchanged_files_describes_none_again(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(200):
        (stores.models / f"m{i:03d}.gguf").write_bytes(small_gguf(f"model {i}", n_block=4))
    first = scan_catalog()
    assert len(first) == 200 and all(e.info for e in first)

    def no_describe(path: object) -> None:
        raise AssertionError(f"{path} described again although unchanged")

    with monkeypatch.context() as patch:
        patch.setattr(index, "describe", no_describe)
        second = scan_catalog()  # no_describe proves the index served every unchanged file
    assert [e.info for e in second] == [e.info for e in first]

    changed = stores.models / "m007.gguf"
    changed.write_bytes(small_gguf("model 7 changed", n_block=4))
    os.utime(changed, ns=(time.time_ns(), time.time_ns() + 10**9))
    third = {e.path.name: e.info for e in scan_catalog()}
    assert third["m007.gguf"].name == "model 7 changed"


def test_unreadable_file_is_listed_with_its_error(stores: Stores) -> None:
    (stores.models / "broken.gguf").write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 16)
    [entry] = scan_catalog()
    assert entry.info is None and "metadata count" in (entry.error or "")


@pytest.mark.parametrize("text, error", [
    ("[catalog]\ndirz = []\n", "unknown key `dirz` in [catalog]"),
    ("[catalog]\ndirs = \"/x\"\n", "dirs must be a list"),
    ("[catalog]\nollama = 1\n", "ollama must be true or false"),
    ("[catalog\n", "cannot read config"),
])
def test_bad_config_is_an_error_naming_file_and_key(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_catalog_config(path)
    assert str(path) in err.value.message and error in err.value.message


def test_config_defaults_and_values(tmp_path: Path) -> None:
    assert load_catalog_config(tmp_path / "missing.toml") == CatalogConfig()
    path = tmp_path / "config.toml"
    path.write_text('[engine]\nwhatever = 1\n[catalog]\ndirs = ["~/m"]\nollama = false\n')
    assert load_catalog_config(path) == CatalogConfig(dirs=(Path("~/m").expanduser(),), ollama=False)


@pytest.mark.parametrize("filename, tag", [
    ("gemma-3-270m-q4_k_m.gguf", "Q4_K_M"),
    ("Qwen3-8B-Q4_K_M-00001-of-00002.gguf", "Q4_K_M"),
    ("model.Q8_0.gguf", "Q8_0"),
    ("Llama-3.1-8B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("phi-4-IQ2_XXS.gguf", "IQ2_XXS"),
    ("model-bf16.gguf", "BF16"),
    ("gpt-oss-20b-mxfp4.gguf", "MXFP4"),
    ("mistral-7b.gguf", None),
])
def test_quant_tag(filename: str, tag: str | None) -> None:
    assert quant_tag(filename) == tag
