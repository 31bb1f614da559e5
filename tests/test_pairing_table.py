"""pairings.toml: the shipped table loads and matches the families it names; every way a user's table can be
wrong gives one error naming the file, the line and the key, with a hint (one bad file per case)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bostudio.gguf.synth import tiny_llama
from bostudio.pairing.core.table import (PairingTableError, load_pairings, load_table_file, shipped_table_path,
                                    user_table_path)

DATA = Path(__file__).parent / "data" / "pairings"

# file, line, what the message must name, what the hint must say
BAD_TABLES = [
    ("syntax.toml", 5, "not valid TOML", "syntax"),
    ("unknown_top_key.toml", 2, "pairings: unknown key", "`pairing`"),
    ("unknown_entry_key.toml", 5, "pairing[1].matches: unknown key", "`match`"),
    ("unknown_match_key.toml", 6, "pairing[1].match.archtecture: unknown key", "`architecture`"),
    ("unknown_candidate_key.toml", 12, "pairing[2].candidate[1].n_maks: unknown key", "`n_max`"),
    ("wrong_type_int.toml", 7, "n_max: must be an integer, not str '3'", "n_max = 16"),
    ("wrong_type_float.toml", 8, "p_min: must be a number, not str 'high'", "p_min = 0.75"),
    ("wrong_type_match.toml", 6, "match.name: must be a string or a list of strings", 'name = ["pattern"]'),
    ("unknown_kind.toml", 6, "kind: unknown kind 'dflsh'", "`dflash`"),
    ("unknown_variant.toml", 7, "variant: unknown n-gram variant 'ngram-mode'", "`ngram-mod`"),
    ("unknown_ngram_param.toml", 8, "params.n_mtch: unknown parameter for ngram-mod", "`n_match`"),
    ("bad_cache_type.toml", 8, "cache_type_k_draft: unknown cache type 'q8'", "q8_0"),
    ("p_min_out_of_range.toml", 8, "p_min: must be a probability in [0, 1], not 1.5", "p_min = 0.75"),
    ("missing_draft_file.toml", 7, "draft: no such file", "fix the path"),
    ("no_candidates.toml", 3, "candidate: an entry needs at least one candidate", "[[pairing.candidate]]"),
    ("no_name.toml", 3, "pairing[1].name: missing", "name ="),
    ("bad_version.toml", 1, "version: unsupported version 2", "version = 1"),
]


def test_every_bad_file_has_a_case() -> None:
    assert sorted(p.name for p in DATA.glob("*.toml")) == sorted(case[0] for case in BAD_TABLES)


@pytest.mark.parametrize("name, line, needle, hint", BAD_TABLES, ids=[c[0] for c in BAD_TABLES])
def test_bad_table(name: str, line: int, needle: str, hint: str) -> None:
    path = DATA / name
    with pytest.raises(PairingTableError) as err:
        load_table_file(path)
    e = err.value
    assert e.file == path
    assert e.line == line, str(e)
    assert str(e).startswith(f"{path}:{line}: "), str(e)
    assert needle in str(e)
    assert hint in e.hint


def test_missing_table_file(tmp_path: Path) -> None:
    with pytest.raises(PairingTableError, match="no such file"):
        load_table_file(tmp_path / "pairings.toml")


def test_cli_reports_a_bad_user_table_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config"
    (config / "bostudio").mkdir(parents=True)
    (config / "bostudio" / "pairings.toml").write_text((DATA / "unknown_candidate_key.toml").read_text())
    env = dict(os.environ, XDG_CONFIG_HOME=str(config))
    model = tiny_llama(tmp_path / "tiny.gguf")
    proc = subprocess.run([sys.executable, "-m", "bostudio", "pair", str(model), "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("bostudio: pairing table error: ")
    assert "pairings.toml:12: pairing[2].candidate[1].n_maks: unknown key (hint: did you mean `n_max`?)" in lines[0]


def test_shipped_table_covers_the_families() -> None:
    table = load_table_file(shipped_table_path())
    names = {e.name for e in table.entries}
    assert {"qwen3.6-35b-a3b", "gemma4-26b-a4b", "qwen3.6-27b", "glm-5.2", "hunyuan-v3", "qwen3-dense",
            "llama-3", "gemma-3", "n-gram"} <= names
    # a hub repo is named only with the public source it was seen in (tests/test_pairing_fetch.py checks more)
    assert all(c.evidence for e in table.entries for c in e.candidates if c.hub)

    def first_kinds(file: str, arch: str) -> list[str]:
        return [c.kind for e in table.matching(file, None, arch, "") for c in e.candidates]

    assert first_kinds("Qwen3.6-35B-A3B-Q4_K_M.gguf", "qwen35moe")[:2] == ["mtp", "dflash"]
    assert first_kinds("DeepSeek-V4-Flash-0731-MXFP4_MOE.gguf", "deepseek4")[0] == "dspark"
    assert first_kinds("gemma-4-26B-A4B-it-Q4_K_M.gguf", "gemma4")[0] == "dflash"
    assert first_kinds("Qwen3.6-27B-Q4_K_M.gguf", "qwen35")[0] == "mtp"
    assert first_kinds("GLM-5.2-Q2_K.gguf", "glm-dsa")[0] == "mtp"
    assert first_kinds("Hunyuan-V3-Q4_K_M.gguf", "hy_v3")[0] == "mtp"
    assert first_kinds("Qwen3-14B-Q4_K_M.gguf", "qwen3")[:2] == ["draft", "draft"]
    assert first_kinds("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "llama")[0] == "draft"
    assert first_kinds("gemma-3-4b-it-Q4_K_M.gguf", "gemma3")[0] == "draft"
    # every target ends with the n-gram fallback, and an unknown family gets only that
    assert first_kinds("whatever.gguf", "mamba") == ["ngram"]
    assert first_kinds("Qwen3-14B-Q4_K_M.gguf", "qwen3")[-1] == "ngram"


def test_user_table_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    user = user_table_path()
    user.parent.mkdir(parents=True)
    user.write_text('version = 1\n[[pairing]]\nname = "mine"\n[pairing.match]\narchitecture = ["gemma3"]\n'
                    '[[pairing.candidate]]\nkind = "ngram"\nvariant = "ngram-simple"\n'
                    'params = { size_n = 8, min_hits = 2 }\n')
    table = load_pairings()
    assert table.files == (user, shipped_table_path())
    entries = table.matching("gemma-3-4b.gguf", None, "gemma3", "")
    assert [e.name for e in entries] == ["mine", "gemma-3", "n-gram"]
    assert entries[0].candidates[0].params == (("size_n", 8), ("min_hits", 2))
