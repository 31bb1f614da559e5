"""Real drafters from the hub: the shipped table's verified refs, the pull policy, header-first format checks,
sha256-checked and resumable pulls, fallbacks that say why. Against the fake hub on 127.0.0.1 (benchmarks/hubserver.py)
serving synthetic drafters (bostudio/gguf/synth.py) under the shipped table's repo names."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from bostudio.catalog.hubfiles import parse_ref
from bostudio.engine.discover import Engine
from bostudio.errors import ConfigError
from bostudio.gguf import describe
from bostudio.pairing.edge.fetch import (DrafterOffer, choose_and_fetch, interactive_ask, resolve_pull_policy,
                                    table_hub_report)
from bostudio.pairing.core.table import (CANDIDATE_KINDS, PairingTableError, hub_ref_problem, load_table_file,
                                    parse_table, shipped_table_path)
from bostudio.speculation import SPEC_TYPE_ORDER, SpecRequest
from bostudio.gguf.synth import tiny_drafter, tiny_glm4moe_mtp, tiny_llama, write_model
from benchmarks.hubserver import FakeHub, HubServer, use_hub
from tests.netutil import free_port

DFLASH_REPO = "abhinand/Qwen3.6-35B-A3B-DFlash-GGUF"  # the shipped table's ref for Qwen3.6-35B-A3B
DFLASH_FILE = "Qwen3.6-35B-A3B-DFlash-Q8_0.gguf"
FORK_REPO, WRONG_REPO = "fork/Qwen3.6-35B-A3B-DFlash-GGUF", "other/Qwen3.6-35B-A3B-DFlash-GGUF"
# The spec types of the pinned build (`llama-server --help`): the pairing choice reads nothing else of it.
ENGINE = Engine(Path("llama-server"), "built", spec_types=("none",) + SPEC_TYPE_ORDER[:5] + (
    "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"))


# ------------------------------------------------------------------------------------------ the shipped table

def test_shipped_table_kinds_quant_tags_sources_and_unique_names() -> None:
    table = load_table_file(shipped_table_path())
    names = [e.name for e in table.entries]
    assert len(names) == len(set(names)), "duplicate entry names"
    refs = [c.hub for e in table.entries for c in e.candidates if c.hub]
    assert len(refs) == len(set(refs)), "a hub ref appears twice"
    assert len(refs) >= 6
    for e in table.entries:
        for c in e.candidates:
            assert c.kind in CANDIDATE_KINDS
            if c.hub:
                assert hub_ref_problem(c.hub) == "", c.hub
                assert c.evidence and "#" in c.evidence, f"{c.hub}: a filled ref names its public source"
                repo, selector = parse_ref(c.hub)
                assert selector is None or selector.endswith(".gguf") or selector.isupper()
            elif c.kind in ("draft", "dflash", "dspark", "eagle3") and c.draft is None:
                assert c.note, f"{e.name}: an empty hub ref says why in its note"
    kinds = {c.kind for e in table.entries for c in e.candidates if c.hub}
    assert {"dflash", "dspark", "mtp", "draft"} <= kinds


@pytest.mark.parametrize("hub,problem", [
    ("qwen", "is not owner/repo"),
    ("org/repo:Q9_ZZ", "neither a quant tag"),
    ("org/repo:latest", "neither a quant tag"),
    ("../x/y", "is not owner/repo"),
])
def test_a_bad_hub_ref_is_a_table_error(tmp_path: Path, hub: str, problem: str) -> None:
    text = f'version = 1\n[[pairing]]\nname = "x"\n[[pairing.candidate]]\nkind = "draft"\nhub = "{hub}"\n'
    with pytest.raises(PairingTableError) as err:
        parse_table(text, tmp_path / "pairings.toml")
    assert problem in str(err.value) and ":6: " in str(err.value)


def test_good_hub_refs_pass() -> None:
    for ref in ("Qwen/Qwen3-8B-GGUF", "Qwen/Qwen3-8B-GGUF:Q4_K_M", "u/r:IQ4_XS", "u/r:BF16", "u/r:UD-Q4_K_XL",
                "u/r:File-Q8_0.gguf"):
        assert hub_ref_problem(ref) == "", ref


def test_table_report_says_what_each_seed_would_fetch_and_from_where() -> None:
    report = {e["entry"]: e for e in table_hub_report(load_table_file(shipped_table_path()))}
    dflash = next(c for c in report["qwen3.6-35b-a3b"]["candidates"] if c["kind"] == "dflash")
    assert dflash["what"].startswith(f"would fetch {DFLASH_REPO}:Q8_0 from ")
    assert "buun-llama-cpp#46" in dflash["source"]
    for seed in ("qwen3.6-35b-a3b", "qwen3.6-27b", "gemma4-26b-a4b", "glm-5.2", "hunyuan-v3",
                 "deepseek-v4-flash-0731"):
        assert report[seed]["candidates"], seed


# ------------------------------------------------------------------------------------------ the fake hub

def _fork_drafter(path: Path) -> Path:
    """A DFlash drafter as llama.cpp forks write it: architecture `dflash-draft`, nested keys (llama.cpp#25116)."""
    kv: dict[str, object] = {".block_count": 1, ".embedding_length": 64, ".attention.head_count": 4,
                             ".dflash.target_layer_ids": [1, 4, 6], ".dflash.block_size": 16,
                             "general.name": path.stem}
    return write_model(path, "dflash-draft", kv, {"fc.weight": (3 * 64, 64), "blk.0.attn_norm.weight": (64,)})


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The shipped table's DFlash repo with a good synthetic drafter, plus a fork-format one and one built for
    another target (hidden size 128, the target's is 64) under other names."""
    src = tmp_path / "src"
    src.mkdir()
    fake = FakeHub()
    fake.add_file(DFLASH_REPO, DFLASH_FILE, tiny_drafter(src / "good.gguf", "dflash", [1, 4, 6]))
    fake.add_file(DFLASH_REPO, "README.md", b"# drafter")
    fake.add_file(FORK_REPO, DFLASH_FILE, _fork_drafter(src / "fork.gguf"))
    fake.add_file(WRONG_REPO, DFLASH_FILE, tiny_drafter(src / "wrong.gguf", "dflash", [1, 4, 6], target_hidden=128))
    with HubServer(fake) as served:
        use_hub(served, tmp_path, monkeypatch)
        yield served
    assert all(not r.path.startswith("http") for r in fake.requests)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A synthetic target named like Qwen3.6-35B-A3B (8 layers, hidden size 64, no MTP layers)."""
    (tmp_path / "models").mkdir(exist_ok=True)
    return tiny_llama(tmp_path / "models" / "Qwen3.6-35B-A3B-Q4_K_M.gguf", n_layer=8)


def _full_gets(hub: FakeHub, repo: str) -> list[str]:
    """Whole-file downloads from `repo` (a header read always sends a Range header)."""
    return [r.path for r in hub.requests if f"/{repo}/resolve/" in r.path and r.range is None]


def _user_table(tmp_path: Path, refs: list[str]) -> None:
    cands = "".join(f'[[pairing.candidate]]\nkind = "dflash"\nhub = "{r}:Q8_0"\nsource = "test"\n' for r in refs)
    path = tmp_path / "config" / "bostudio" / "pairings.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'version = 1\n[[pairing]]\nname = "drafters"\n[pairing.match]\n'
                    f'name = ["*qwen3.6-35b-a3b*"]\n{cands}')


# ------------------------------------------------------------------------------------------ choose_and_fetch

def test_pull_always_fetches_the_shipped_drafter_after_reading_its_header(hub: FakeHub, target: Path,
                                                                          tmp_path: Path) -> None:
    logs: list[str] = []
    sel = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="always", log=logs.append)
    sp = sel.speculator
    assert sp.kind == "dflash" and sp.spec_types == ("draft-dflash",) and sp.n_max == 15
    assert sp.draft is not None and sp.draft.name == DFLASH_FILE
    assert sp.draft.is_relative_to(tmp_path / "hf" / f"models--{DFLASH_REPO.replace('/', '--')}" / "snapshots")
    want = hashlib.sha256(hub.repos[DFLASH_REPO][DFLASH_FILE]).hexdigest()
    assert hashlib.sha256(sp.draft.read_bytes()).hexdigest() == want
    offer = next(m for m in logs if "would draft with" in m)
    size = len(hub.repos[DFLASH_REPO][DFLASH_FILE])
    assert f"{DFLASH_REPO}:Q8_0" in offer and "KiB to download" in offer and "tokens of context" in offer
    assert "why: dflash drafter" in offer and "source: spiritbuun/buun-llama-cpp#46" in offer
    chosen = sel.considered[sel.chosen]
    assert not chosen.fetch and chosen.memory_bytes and chosen.memory_bytes > 0
    # the header was read with range requests first, then the file was downloaded once
    file_reqs = [r for r in hub.requests if r.path.endswith(DFLASH_FILE)]
    assert file_reqs[0].range is not None and len(_full_gets(hub, DFLASH_REPO)) == 1
    assert size > 0
    # a second run finds it in the hub cache: no network at all
    before = len(hub.requests)
    again = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="never")
    assert again.speculator.draft == sp.draft and len(hub.requests) == before


def test_fork_format_and_wrong_target_drafters_are_refused_before_download(hub: FakeHub, target: Path,
                                                                           tmp_path: Path) -> None:
    _user_table(tmp_path, [FORK_REPO, WRONG_REPO, DFLASH_REPO])
    sel = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="always")
    assert sel.speculator.kind == "dflash" and sel.speculator.draft is not None
    assert sel.speculator.draft.is_relative_to(tmp_path / "hf" / f"models--{DFLASH_REPO.replace('/', '--')}")
    fork, wrong = sel.considered[0], sel.considered[1]
    assert not fork.usable and "fork-only DFlash layout" in fork.why and "'dflash-draft'" in fork.why
    assert "dflash-draft.dflash.target_layer_ids" in fork.why and "convert_hf_to_gguf.py" in fork.why
    assert not wrong.usable and "hidden size 128" in wrong.why and "this target has 64" in wrong.why
    assert sel.chosen == 2
    assert _full_gets(hub, FORK_REPO) == [] and _full_gets(hub, WRONG_REPO) == []


def test_pull_never_reads_nothing_and_says_why(hub: FakeHub, target: Path) -> None:
    sel = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="never")
    assert sel.speculator.kind == "ngram"
    dflash = next(c for c in sel.considered if c.hub.startswith(DFLASH_REPO))
    assert not dflash.usable and "pull policy is never" in dflash.why and f"bostudio pull {DFLASH_REPO}" in dflash.why
    assert hub.requests == []


def test_ask_declined_downloads_nothing_and_falls_back(hub: FakeHub, target: Path) -> None:
    offers: list[DrafterOffer] = []
    sel = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="ask",
                           ask=lambda o: offers.append(o) or False)
    assert sel.speculator.kind == "ngram"
    [offer] = offers
    assert offer.ref == f"{DFLASH_REPO}:Q8_0" and offer.size == len(hub.repos[DFLASH_REPO][DFLASH_FILE])
    assert offer.memory_bytes and offer.context_tokens and offer.reason.startswith("dflash drafter")
    assert "declined" in next(c for c in sel.considered if c.hub.startswith(DFLASH_REPO)).why
    assert _full_gets(hub, DFLASH_REPO) == []


def test_the_terminal_prompt_reads_yes_or_no() -> None:
    offer = DrafterOffer("a/b:Q8_0", "", "t.gguf", 5 << 20, 1 << 20, 100, "why")
    out = io.StringIO()
    assert interactive_ask(io.StringIO("y\n"), out)(offer) is True
    assert "Download a/b:Q8_0 (5.0 MiB)" in out.getvalue()
    assert interactive_ask(io.StringIO("\n"), io.StringIO())(offer) is False
    assert interactive_ask(io.StringIO(""), io.StringIO())(offer) is False  # no one there: no


def test_an_interrupted_pull_falls_back_then_resumes(hub: FakeHub, target: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # http_get writes in DOWNLOAD_CHUNK_SIZE chunks (10 MB); small chunks let a small file be cut midway.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 8 * 1024)
    data = hub.repos[DFLASH_REPO][DFLASH_FILE]
    hub.cut_after[DFLASH_FILE] = len(data) // 2
    logs: list[str] = []
    sel = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="always", log=logs.append)
    assert sel.speculator.kind == "ngram"
    failed = next(c for c in sel.considered if c.hub.startswith(DFLASH_REPO))
    assert "the pull failed" in failed.why and "download stopped at" in failed.why
    assert any("falling back to the next candidate" in m for m in logs)
    [partial] = (tmp_path / "hf").rglob("*.incomplete")
    have = partial.stat().st_size
    assert 0 < have < len(data)
    hub.failing.discard(DFLASH_FILE)
    sel = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="always", log=logs.append)
    assert sel.speculator.kind == "dflash" and sel.speculator.draft is not None
    assert sel.speculator.draft.read_bytes() == data
    assert any(f"resuming at {have:,}" in m for m in logs), "\n".join(logs)
    assert hub.requests[-1].range == f"bytes={have}-" and hub.requests[-1].sent == len(data) - have


def test_a_corrupted_pull_is_rejected_by_sha256(hub: FakeHub, target: Path, tmp_path: Path) -> None:
    hub.corrupt_tail.add(DFLASH_FILE)  # the header reads clean; the downloaded bytes do not match the hub's sha256
    sel = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="always")
    assert sel.speculator.kind == "ngram"
    why = next(c for c in sel.considered if c.hub.startswith(DFLASH_REPO)).why
    assert "the pull failed" in why and "sha256" in why and "does not match" in why
    storage = tmp_path / "hf" / f"models--{DFLASH_REPO.replace('/', '--')}"
    assert not list(storage.rglob("*.gguf")) and not list(storage.rglob("*.incomplete"))


# ------------------------------------------------------------------------------------------ format checks

def test_an_mtp_stripped_gguf_is_pointed_to_its_mtp_variant(hub: FakeHub, target: Path) -> None:
    sel = choose_and_fetch(describe(target), SpecRequest("auto"), ENGINE, 4096, policy="never")
    mtp = sel.considered[0]
    assert mtp.label.startswith("mtp") and not mtp.usable
    assert "unsloth/Qwen3.6-35B-A3B-MTP-GGUF" in mtp.why and "lmstudio-bug-tracker#1934" in mtp.evidence
    assert "bostudio pull unsloth/Qwen3.6-35B-A3B-MTP-GGUF" in mtp.why


def test_an_mtp_gguf_of_an_arch_without_an_mtp_graph_is_refused(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("BOSTUDIO_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    info = describe(tiny_glm4moe_mtp(tmp_path / "glm4-mtp.gguf", arch="glm4"))  # glm4 only preserves NextN
    assert info.has_mtp and not info.mtp_usable
    sel = choose_and_fetch(info, SpecRequest("auto"), ENGINE, 2048, policy="never")
    assert sel.speculator.kind == "ngram"
    mtp = next(c for c in sel.considered if c.label.startswith("mtp"))
    assert "no MTP graph for glm4" in mtp.why
    with pytest.raises(ConfigError, match="no MTP graph for glm4"):
        choose_and_fetch(info, SpecRequest("mtp"), ENGINE, 2048)


def test_a_fork_format_drafter_on_disk_is_described_as_such(tmp_path: Path) -> None:
    info = describe(_fork_drafter(tmp_path / "fork.gguf"))
    assert info.kind == "drafter" and info.drafter == "dflash"
    assert "fork-only DFlash layout" in info.drafter_format_problem
    plain = describe(write_model(tmp_path / "nolayers.gguf", "dflash", {".block_count": 1, ".embedding_length": 64,
                                                                        ".attention.head_count": 4},
                                 {"fc.weight": (192, 64)}))
    assert "DFlash model requires 'target_layers'" in plain.drafter_format_problem
    good = describe(tiny_drafter(tmp_path / "good.gguf", "dflash", [1, 4, 6]))
    assert good.drafter_format_problem == "" and good.drafter_target_hidden == 64


# ------------------------------------------------------------------------------------------ policy

def test_pull_policy_flag_then_config_then_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert resolve_pull_policy(None, interactive=True) == "ask"
    assert resolve_pull_policy(None, interactive=False) == "never"
    assert resolve_pull_policy("always", interactive=False) == "always"
    cfg = tmp_path / "config" / "bostudio" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('[pull]\npolicy = "always"\n')
    assert resolve_pull_policy(None, interactive=False) == "always"
    assert resolve_pull_policy("never", interactive=True) == "never"
    cfg.write_text('[pull]\npolicy = "sometimes"\n')
    with pytest.raises(ConfigError, match="policy must be one of"):
        resolve_pull_policy(None, interactive=True)
    cfg.write_text('[pull]\npolicey = "ask"\n')
    with pytest.raises(ConfigError, match="unknown key `policey`"):
        resolve_pull_policy(None, interactive=True)


# ------------------------------------------------------------------------------------------ up, pair (CLI)

def _cli_env(tmp_path: Path, hub: FakeHub) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("HF_ENDPOINT", "HF_HUB_CACHE", "HF_HUB_DISABLE_TELEMETRY", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
              "BOSTUDIO_MODELS_DIR", "LMSTUDIO_MODELS_DIR", "OLLAMA_MODELS"):
        env[k] = os.environ[k]
    return env


def test_up_pull_always_plans_and_builds_argv_with_the_fetched_drafter(hub: FakeHub, target: Path,
                                                                       engine: Engine, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthetic drafter has no real weights, so llama-server cannot run it: the plan and argv are checked."""
    from bostudio.up import UpOptions, prepare_launch

    monkeypatch.setenv("LLAMA_SERVER", str(engine.path))
    notes: list[str] = []
    prep = prepare_launch(UpOptions(model=str(target), spec="auto", pull="always", port=free_port(),
                                    engine=str(engine.path)), note=notes.append)
    sp = prep.plan.chosen.speculator
    assert sp.kind == "dflash" and sp.draft is not None and sp.draft.name == DFLASH_FILE
    argv = prep.argv
    assert argv[argv.index("--spec-type") + 1] == "draft-dflash"
    assert argv[argv.index("-md") + 1] == str(sp.draft)
    assert prep.plan.chosen.total > 0
    assert any("would draft with" in n for n in notes)


def test_up_pull_never_and_pair_say_why_nothing_was_downloaded(hub: FakeHub, target: Path, engine: Engine,
                                                               tmp_path: Path) -> None:
    env = _cli_env(tmp_path, hub)
    env["LLAMA_SERVER"] = str(engine.path)
    proc = subprocess.run([sys.executable, "-m", "bostudio", "pair", str(target), "--no-probe"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"{DFLASH_REPO}:Q8_0" in proc.stdout and "pull policy is never" in proc.stdout
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "bostudio", "pair", "--table"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0 and f"would fetch {DFLASH_REPO}:Q8_0 from {hub.url}" in proc.stdout
    assert "source: spiritbuun/buun-llama-cpp#46" in proc.stdout
    assert hub.requests == []


def test_the_daemon_never_asks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bostudio.cli import build_parser
    from bostudio.cli.daemon import _daemon_args, _daemon_options

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    args = build_parser().parse_args(["daemon"])
    assert _daemon_options(args).supervisor.pull == "never"
    args = build_parser().parse_args(["daemon", "--pull", "always"])
    assert _daemon_options(args).supervisor.pull == "always"
    # The TUI's launches run in the daemon it starts: its --pull becomes that daemon's.
    from bostudio.cli.daemon import tui_daemon_args

    assert tui_daemon_args(build_parser().parse_args(["tui", "--pull", "always"])) == ["--pull", "always"]
    assert tui_daemon_args(build_parser().parse_args(["tui"])) == []
    passed = _daemon_args(args)  # to a background daemon
    assert passed[passed.index("--pull") + 1] == "always"
    cfg = tmp_path / "config" / "bostudio" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('[pull]\npolicy = "ask"\n')  # no one answers in a daemon: ask counts as never
    assert _daemon_options(build_parser().parse_args(["daemon"])).supervisor.pull == "never"


def test_up_pull_ask_declined_at_the_prompt_prints_why_and_falls_back(hub: FakeHub, target: Path, engine: Engine,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from bostudio.up import UpOptions, prepare_launch

    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    notes: list[str] = []
    prep = prepare_launch(UpOptions(model=str(target), spec="auto", pull="ask", port=free_port(),
                                    engine=str(engine.path)), note=notes.append)
    assert prep.plan.chosen.speculator.kind == "ngram"
    assert "--spec-type" in prep.argv and "-md" not in prep.argv
    assert any(f"{DFLASH_REPO}:Q8_0: declined: not downloaded; falling back" in n for n in notes), notes
    assert "Download abhinand/Qwen3.6-35B-A3B-DFlash-GGUF:Q8_0" in capsys.readouterr().err
    assert _full_gets(hub, DFLASH_REPO) == []
