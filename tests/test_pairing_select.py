"""select(): which speculator a target gets and why, on synthetic GGUFs; `bostudio pair` explaining it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.engine.discover import KNOWN_SPEC_TYPES
from bostudio.errors import ConfigError
from bostudio.gguf import describe
from bostudio.pairing.core.compat import check_compatibility
from bostudio.pairing.core.cost import speculator_memory_bytes
from bostudio.pairing.core.select import DraftFile, select
from bostudio.pairing.core.table import load_table_file, parse_table, shipped_table_path
from bostudio.speculation import SpecRequest, Speculator
from bostudio.gguf.synth import BYTE_VOCAB, BYTE_VOCAB_TYPES, VOCAB, tiny_drafter, tiny_glm4moe_mtp, tiny_llama, vocab_model

ALL = KNOWN_SPEC_TYPES
SHIPPED = load_table_file(shipped_table_path())
AUTO = SpecRequest("auto")


def drafts_for(target, *paths: Path) -> list[DraftFile]:
    return [DraftFile(describe(p), check_compatibility(target, describe(p))) for p in paths]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pairs")
    return {
        "target": tiny_llama(d / "target.gguf", n_layer=8),
        "small": tiny_llama(d / "small.gguf", n_layer=1),
        "other-vocab": vocab_model(d / "other-vocab.gguf", tokens=VOCAB[:7] + ["changed"] + VOCAB[8:]),
        "dflash": tiny_drafter(d / "dflash-target.gguf", "dflash", [1, 4, 6]),
        "dspark": tiny_drafter(d / "dspark-target.gguf", "dflash", [1, 4, 6], dspark=True),
        "dflash-foreign": tiny_drafter(d / "dflash-bigger.gguf", "dflash", [10, 20, 30]),
        "eagle3": tiny_drafter(d / "eagle3-target.gguf", "eagle3", [1, 4, 6]),
        "mtp": tiny_glm4moe_mtp(d / "mtp.gguf"),
    }


def test_mtp_head_is_detected_and_chosen(files) -> None:
    target = describe(files["mtp"])
    sel = select(target, SHIPPED, AUTO, engine_spec_types=ALL)
    assert sel.speculator.kind == "mtp" and sel.speculator.spec_types == ("draft-mtp",)
    assert sel.speculator.draft is None and sel.speculator.n_max == 3
    assert "MTP head" in sel.speculator.reason
    # an engine without draft-mtp passes it over and says so
    sel = select(target, SHIPPED, AUTO, engine_spec_types=("none", "ngram-mod"))
    assert sel.speculator.spec_types == ("ngram-mod",)
    assert "does not support --spec-type draft-mtp" in sel.considered[0].why


@pytest.mark.parametrize("name, kind, spec_type, n_max", [
    ("dflash", "dflash", "draft-dflash", 15), ("dspark", "dspark", "draft-dspark", 16)])
def test_drafter_kind_comes_from_metadata(files, name: str, kind: str, spec_type: str, n_max: int) -> None:
    target = describe(files["target"])
    sel = select(target, SHIPPED, AUTO, engine_spec_types=ALL, drafts=drafts_for(target, files[name]))
    assert sel.speculator.kind == kind
    assert sel.speculator.spec_types == (spec_type,)
    assert sel.speculator.draft == files[name]
    assert sel.speculator.n_max == n_max  # the trained block size bounds it


def test_drafter_made_for_another_model_is_passed_over(files) -> None:
    target = describe(files["target"])
    sel = select(target, SHIPPED, AUTO, engine_spec_types=ALL, drafts=drafts_for(target, files["dflash-foreign"]))
    # llama-server would abort on it (reference 1.6): auto-detection finds it and passes it over
    assert sel.speculator.kind == "ngram"
    assert "reads target layer 10" in sel.considered[0].why
    table = parse_table(f'[[pairing]]\nname = "t"\n[[pairing.candidate]]\nkind = "dflash"\n'
                        f'draft = "{files["dflash-foreign"]}"\n', Path("/tmp/t.toml"))
    sel = select(target, table, AUTO, engine_spec_types=ALL, drafts=drafts_for(target, files["dflash-foreign"]))
    assert sel.speculator.kind == "none"
    assert "reads target layer 10, but the target has only 8 layers" in sel.considered[0].why


def test_eagle3_from_the_table(files) -> None:
    target = describe(files["target"])
    table = parse_table(f'[[pairing]]\nname = "t"\n[[pairing.candidate]]\nkind = "eagle3"\n'
                        f'draft = "{files["eagle3"]}"\nn_max = 5\n', Path("/tmp/t.toml"))
    sel = select(target, table, AUTO, engine_spec_types=ALL, drafts=drafts_for(target, files["eagle3"]))
    assert sel.speculator.spec_types == ("draft-eagle3",) and sel.speculator.n_max == 5


def test_small_local_draft_found_by_fingerprint_and_size(files) -> None:
    target = describe(files["target"])
    sel = select(target, SHIPPED, AUTO, engine_spec_types=ALL, drafts=drafts_for(target, files["small"]))
    assert sel.speculator.kind == "draft" and sel.speculator.draft == files["small"]
    assert sel.speculator.spec_types == ("draft-simple",)
    assert sel.considered[sel.chosen].origin == "auto-detected"
    # the other way round, the 8-layer model is no draft for the 1-layer one
    small = describe(files["small"])
    sel = select(small, SHIPPED, AUTO, engine_spec_types=ALL, drafts=drafts_for(small, files["target"]))
    assert sel.speculator.kind == "ngram"


def test_incompatible_table_draft_is_passed_over_with_the_reason(files) -> None:
    target = describe(files["target"])
    table = parse_table(f'[[pairing]]\nname = "t"\n[[pairing.candidate]]\nkind = "draft"\n'
                        f'draft = "{files["other-vocab"]}"\n', Path("/tmp/t.toml"))
    table = type(table)(table.entries + SHIPPED.entries)
    sel = select(target, table, AUTO, engine_spec_types=ALL, drafts=drafts_for(target, files["other-vocab"]))
    assert sel.speculator.kind == "ngram"
    assert sel.considered[0].usable is False
    assert "token 7 differs" in sel.considered[0].why


def test_explicit_incompatible_draft_is_refused(files) -> None:
    target = describe(files["target"])
    with pytest.raises(ConfigError, match="token 7 differs") as err:
        select(target, SHIPPED, SpecRequest("draft", files["other-vocab"]), engine_spec_types=ALL,
               drafts=drafts_for(target, files["other-vocab"]))
    assert "silently run without speculation" in err.value.hint


def test_combined_ngram_and_draft_follow_llama_cpp_order(files) -> None:
    target = describe(files["target"])
    table = parse_table(f'[[pairing]]\nname = "t"\n[[pairing.candidate]]\nkind = "draft"\n'
                        f'draft = "{files["small"]}"\nwith_ngram = "ngram-simple"\nparams = {{ size_n = 8 }}\n'
                        'cache_type_k_draft = "q8_0"\ncache_type_v_draft = "q8_0"\np_min = 0.5\n', Path("/tmp/t.toml"))
    sel = select(target, table, AUTO, engine_spec_types=ALL, drafts=drafts_for(target, files["small"]))
    sp = sel.speculator
    assert sp.spec_types == ("ngram-simple", "draft-simple")
    flags = frozenset({"-m", "--alias", "--host", "--port", "-c", "--metrics", "--spec-type", "-md",
                       "--spec-draft-n-max", "--spec-draft-p-min", "-ctkd", "-ctvd", "--spec-ngram-simple-size-n"})
    argv = build_argv(Path("/x/llama-server"), flags, LaunchSpec(files["target"], "t", 1, speculator=sp))
    joined = " ".join(argv)
    assert "--spec-type ngram-simple,draft-simple" in joined
    assert "-ctkd q8_0 -ctvd q8_0" in joined and "--spec-ngram-simple-size-n 8" in joined
    assert "--spec-draft-p-min 0.5" in joined


def test_costs_come_from_the_planner(files) -> None:
    from bostudio.pairing.core.cost import speculator_memory_bytes

    target, small = describe(files["target"]), describe(files["small"])
    draft = Speculator("draft", ("draft-simple",), draft=small.path, n_max=8)
    short, long = (speculator_memory_bytes(target, draft, small, ctx) for ctx in (1024, 8192))
    assert small.tensor_bytes < short < long  # weights, then a KV cache that grows with the context
    mtp = describe(files["mtp"])
    assert 0 < speculator_memory_bytes(mtp, Speculator("mtp", ("draft-mtp",), n_max=3), None, 4096) < long


# ------------------------------------------------------------------ `bostudio pair`, end to end

def run_pair(*args: str, tmp: Path, **more_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp / "config"), XDG_DATA_HOME=str(tmp / "data"), **more_env)
    return subprocess.run([sys.executable, "-m", "bostudio", "pair", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_pair_explains_gemma(gemma_gguf: Path, tmp_path: Path) -> None:
    proc = run_pair(str(gemma_gguf), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "speculator : ngram-mod" in out
    assert "passed over: the only local model matching '*gemma-3-270m*' is the target itself" in out
    # n-gram costs its 16 MiB table plus output buffers sized for 64-token drafts over a 262k vocabulary.
    # priced at the context `up` plans (the training context), as `pair` prices it by default
    info = describe(gemma_gguf)
    cost = speculator_memory_bytes(info, Speculator("ngram", ("ngram-mod",)), None, info.n_ctx_train)
    assert cost > 16 * 2**20
    assert f"{cost / 2**20:.1f} MiB  chosen" in out


def test_pair_json_for_mtp_and_dflash(tmp_path: Path) -> None:
    mtp = tiny_glm4moe_mtp(tmp_path / "mtp.gguf")
    data = json.loads(run_pair(str(mtp), "--json", tmp=tmp_path).stdout)
    chosen = data["candidates"][data["chosen"]]
    assert data["speculator"]["spec_types"] == ["draft-mtp"] and chosen["memory_bytes"] > 0
    pair_dir = tmp_path / "pair"
    pair_dir.mkdir()
    target = tiny_llama(pair_dir / "target.gguf", n_layer=4)
    tiny_drafter(pair_dir / "dflash-target.gguf", "dflash", [0, 2])
    data = json.loads(run_pair(str(target), "--json", tmp=tmp_path).stdout)
    assert data["speculator"]["kind"] == "dflash"
    assert data["speculator"]["draft"].endswith("dflash-target.gguf")
    assert [c["usable"] for c in data["candidates"]] == [True, True]  # dflash chosen, n-gram ranked below


def test_pair_finds_a_small_draft_in_the_catalog(tmp_path: Path) -> None:
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    models.mkdir()
    elsewhere.mkdir()
    small = tiny_llama(models / "small.gguf", n_layer=1)
    vocab_model(models / "other-family.gguf", tokens=VOCAB + ["x"] * 300)  # filtered out by its tokenizer
    target = tiny_llama(elsewhere / "target.gguf", n_layer=8)
    proc = run_pair(str(target), "--json", "--no-probe", tmp=tmp_path, BOSTUDIO_MODELS_DIR=str(models))
    data = json.loads(proc.stdout)
    assert data["speculator"]["kind"] == "draft" and data["speculator"]["draft"] == str(small)
    chosen = data["candidates"][data["chosen"]]
    assert chosen["origin"] == "auto-detected" and "same tokenizer" in chosen["note"]
    assert all("other-family" not in (c["draft"] or "") for c in data["candidates"])


def test_pair_refuses_an_incompatible_pair(tmp_path: Path) -> None:
    target = tiny_llama(tmp_path / "target.gguf")
    bad = vocab_model(tmp_path / "bad.gguf", tokens=VOCAB + [f"x{i}" for i in range(200)])
    proc = run_pair(str(target), "--spec", f"draft:{bad}", tmp=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "bad.gguf cannot draft for target.gguf: incompatible: vocabulary sizes differ by 200" in proc.stderr


def test_pairing_core_is_pure() -> None:
    """The table, the compatibility rules and select() start no process and open no connection."""
    code = ("import sys, bostudio.pairing, bostudio.pairing.core.cost; "
            "bad = {'httpx', 'subprocess', 'psutil', 'pynvml', 'llama_cpp', 'textual'} & set(sys.modules); "
            "print(sorted(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_up_refuses_an_incompatible_draft_before_launch(tmp_path: Path) -> None:
    from tests.netutil import free_port

    target = tiny_llama(tmp_path / "target.gguf")
    bad = vocab_model(tmp_path / "bad.gguf", tokens=VOCAB[:7] + ["changed"] + VOCAB[8:])
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    proc = subprocess.run([sys.executable, "-m", "bostudio", "up", str(target), "--spec", f"draft:{bad}",
                           "--port", str(free_port())], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "token 7 differs: the target has 'tok4', the draft 'changed'" in proc.stderr
    assert "starting llama-server" not in proc.stderr  # refused before anything was launched
    assert not (tmp_path / "state" / "bostudio" / "logs").exists()


def test_pair_self_draft_makes_records_and_chooses_the_copy(engine, tmp_path: Path) -> None:
    # a vocabulary with byte tokens, so the tokenization probe can spell its corpus
    target = vocab_model(tmp_path / "target.gguf", tokens=BYTE_VOCAB, token_types=BYTE_VOCAB_TYPES, n_layer=2)
    proc = run_pair(str(target), "--self-draft", "Q8_0", "--json", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    copy = tmp_path / "data" / "bostudio" / "drafts" / "target.self-Q8_0.gguf"
    assert copy.is_file() and describe(copy).quant == "Q8_0"
    table = (tmp_path / "config" / "bostudio" / "pairings.toml").read_text()
    assert f'draft = "{copy}"' in table and "self_draft = true" in table
    data = json.loads(proc.stdout)
    assert data["speculator"]["kind"] == "draft" and data["speculator"]["draft"] == str(copy)
    assert "low-bit copy of the target itself" in data["speculator"]["reason"]
    assert data["probe"]["differing"] == 0 and not data["probe"]["error"]
    # a second run reuses the copy and does not record it twice
    again = run_pair(str(target), "--self-draft", "Q8_0", tmp=tmp_path)
    assert again.returncode == 0 and "already recorded" in again.stderr
    assert (tmp_path / "config" / "bostudio" / "pairings.toml").read_text() == table


def test_pair_self_draft_with_an_unknown_type_says_which_exist(engine, tmp_path: Path) -> None:
    target = tiny_llama(tmp_path / "target.gguf")
    proc = run_pair(str(target), "--self-draft", "Q1_NOPE", tmp=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("bostudio: config error: llama-quantize could not make a Q1_NOPE copy")
    assert "(hint: use a type llama-quantize lists" in line
    assert not (tmp_path / "config" / "bostudio" / "pairings.toml").exists()
