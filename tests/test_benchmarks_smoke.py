"""Every program in benchmarks/ runs: a real short run of each on the smallest model and settings it takes
(Gemma 3 270M, or a tiny GGUF written here), as `python -m benchmarks.NAME` from the repository root, the way
BENCHMARKS.md tells a reader to run it. What is checked is that the program ends with exit 0 and prints the
figure it exists to print, not the figure's value: this machine's speed is nobody's measurement.

The package imports bostudio and never tests/ (DESIGN.md: "benchmarks/ ... import bostudio, never tests/"),
checked on the source of every module, functions included.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bostudio.gguf.synth import tiny_llama
from tests.agent_util import AGENT_BIN

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "benchmarks"
# The programs (modules with a main); the other modules are what they share with the tests.
SHARED = {"__init__", "commands", "hubserver", "lossless"}
PROGRAMS = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in SHARED)
RUN_TIMEOUT_S = 600  # a loaded 2-core machine; each run takes well under that when it is quiet


def run(program: str, *args: str, timeout: float = RUN_TIMEOUT_S, env: dict | None = None,
        exits: tuple[int, ...] = (0,)) -> str:
    """Run `python -m benchmarks.PROGRAM ARGS` in the repository root; its stdout and stderr, or fail with them."""
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{program}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode in exits, f"benchmarks.{program} exited {proc.returncode}:\n{out[-3000:]}"
    return out


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_package_imports_nothing_from_tests() -> None:
    offenders = {p.name: sorted(m for m in imported_modules(p) if m == "tests" or m.startswith("tests."))
                 for p in PACKAGE.glob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}
    assert not any("sys.path" in p.read_text() for p in PACKAGE.glob("*.py")), "no sys.path edits: run with -m"


def test_every_program_has_a_smoke_run() -> None:
    """A new program in benchmarks/ needs its test here (the names of this module's tests say which)."""
    tested = {name.removeprefix("test_").removesuffix("_runs") for name in globals() if name.startswith("test_")}
    assert set(PROGRAMS) <= tested, f"no smoke run for {sorted(set(PROGRAMS) - tested)}"
    assert len(PROGRAMS) == 11


# ----------------------------------------------------------------- without the engine

def test_bench_describe_runs(tmp_path: Path) -> None:
    out = run("bench_describe", str(tiny_llama(tmp_path / "tiny.gguf")))
    assert "describe()" in out and "GGUFReader" in out


def test_bench_drafter_header_runs() -> None:
    out = run("bench_drafter_header")
    assert "bytes" in out


# ----------------------------------------------------------------- with the engine, on Gemma 3 270M

@pytest.mark.engine
def test_bench_spec_runs(engine, gemma_gguf: Path, tmp_state) -> None:
    out = run("bench_spec", str(gemma_gguf), "--tokens", "8", "--repeats", "1", "--spec", "ngram")
    assert "tok/s" in out


@pytest.mark.engine
def test_bench_draft_round_runs(engine, gemma_gguf: Path) -> None:
    out = run("bench_draft_round", str(gemma_gguf), str(gemma_gguf), "--reps", "1")
    assert "round" in out


@pytest.mark.engine
def test_bench_daemon_runs(engine, gemma_gguf: Path, tmp_state) -> None:
    # by name, as a user runs it: the daemon serves paths only inside the directories its catalog scans
    out = run("bench_daemon", "--model", gemma_gguf.stem, "--runs", "1", "--tokens", "8", "--ttft-runs", "2")
    assert "time to first token" in out and "% of direct" in out


@pytest.mark.engine
def test_bench_prompt_reuse_runs(engine, gemma_gguf: Path, tmp_state) -> None:
    out = run("bench_prompt_reuse", "--model", gemma_gguf.stem, "--prefix-tokens", "400", "--conv-tokens", "200",
              "--ctx", "4096")
    assert "after reload" in out


@pytest.mark.engine
def test_bench_rpc_runs(engine, gemma_gguf: Path, tmp_state) -> None:
    out = run("bench_rpc", str(gemma_gguf), "--tokens", "8", "--rounds", "1")
    assert "tok/s" in out


@pytest.mark.engine
def test_check_precision_runs(engine, gemma_gguf: Path) -> None:
    out = run("check_precision", "--types", "Q4_K_M", "--tokens", "8")
    assert "Q4_K_M" in out


@pytest.mark.engine
def test_bench_tune_goal_runs(engine, gemma_gguf: Path, tmp_path: Path) -> None:
    out = run("bench_tune_goal", str(gemma_gguf), "--out", str(tmp_path / "out"), "--budget", "chat=10",
              "--runs", "chat=1", "--tokens", "8")
    assert "tune chat" in out


@pytest.mark.engine
@pytest.mark.agent_tasks  # minutes of agent prefill: opt-in with the agent runs
def test_bench_agent_goal_runs(engine, gemma_gguf: Path, tmp_path: Path) -> None:
    out = run("bench_agent_goal", str(gemma_gguf), "--out", str(tmp_path / "out"), "--quick", "--skip-tune",
              "--skip-threads", "--spec", "ngram-mod")
    assert "verdicts" in out and (tmp_path / "out" / "report.md").exists()


@pytest.mark.engine
@pytest.mark.agent_tasks  # minutes of agent prefill: opt-in with the agent runs
def test_record_agent_session_runs(engine, gemma_gguf: Path, tmp_path: Path) -> None:
    """The one slow run: Claude Code's first request is its ~12k-token system prompt and tools, prefilled once
    (about a minute on a quiet 2-core CPU, 5.5 min on a loaded one). The base model's answer may end Claude
    Code's turn with an error (exit 1 when every turn did): that is the agent's verdict on a 270M model, not
    the program's; what the program must do is record the requests."""
    if not (AGENT_BIN / "claude").exists():
        pytest.fail(f"Claude Code is not in {AGENT_BIN}: run scripts/setup_agents.sh (scripts/test.sh does)")
    out = run("record_agent_session", str(tmp_path / "rec"), gemma_gguf.stem, "--turns", "1", "--max-output", "16",
              timeout=1200, exits=(0, 1))
    assert "recording into" in out and "done: replay it with" in out
    assert list((tmp_path / "rec").glob("*.json")), "no request recorded"
