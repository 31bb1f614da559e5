"""Coding agents finish real tasks through the daemon on the default model (Qwen2.5-Coder-1.5B-Instruct):
the real Claude Code, Codex and opencode CLIs (pinned, from npm, in .agents/), each in its own HOME,
configured only from `bostudio launch AGENT --print --json`, each asked to create a file and run it. A task
is done when its file exists and runs: the tests check the file and what it prints, never the agent's words.

Codex with its own instructions rarely finished on this 1.5B model (3 of 26 runs of `codex exec` on the hello
task: the model called write_stdin on sessions that did not exist, or tools Codex does not have, or described
the work); with the short page `launch codex` gives a small model it finished 11 of 18 (BENCHMARKS.md, "Coding
agents on this machine"): its test gives it three tries. test_agents_real.py runs Codex on the small fixture
for what the daemon guarantees it.

One session crosses Claude Code's compaction point (a command prints about 6k tokens into a 32k context
whose own prompt is about 12k): the CLI compacts, no request ends in a 400, and the task after it is done.

Not in the default run (pyproject: `-m 'not agent_tasks'`): whether a 1.5B Q4 model picks the right tool
and path is which token wins on this CPU. By hand Claude Code and opencode passed; on the first fresh-clone
run all three failed (Claude Code called its `Agent` tool with arguments its schema refuses, which the daemon rightly
left as text; opencode wrote hello.py under /tmp; the long session never ran the command). Run them with
`scripts/test.sh -m agent_tasks`, as a measurement.

These runs are the slow ones: the first turn of an agent prefills 5-12k tokens on one thread
(about 2-4 min on a quiet 2-core CPU, longer beside other work). The hang guards are generous; nothing here
asserts a time."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_util import agent_env, launch_print, recording_daemon
from tests.daemon_util import DaemonProc

HANG_GUARD_S = 2400
pytestmark = [pytest.mark.engine, pytest.mark.agent_tasks, pytest.mark.timeout(2 * HANG_GUARD_S)]

HELLO = "Create a file hello.py that prints hello, then run it with python3."


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, qwen_gguf: Path):
    yield from recording_daemon(tmp_path_factory.mktemp("tasks"), qwen_gguf)


def run_task(daemon: DaemonProc, agent: str, model: str, argv: list[str], work: Path,
             home: Path) -> subprocess.CompletedProcess:
    """The agent run as a user runs it, in `work`; the daemon must fail none of its requests."""
    cfg = launch_print(daemon, agent, model)
    errors = daemon.instance(model)["stats"]["errors"]
    out = subprocess.run([cfg["binary"], *argv], env=agent_env(cfg, home, work), cwd=work, capture_output=True,
                         text=True, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL)
    assert daemon.instance(model)["stats"]["errors"] == errors, "the daemon failed a request"
    return out


def runs(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, path.name, *args], cwd=path.parent, capture_output=True, text=True,
                          timeout=60)


def said(out: subprocess.CompletedProcess) -> str:
    return f"rc={out.returncode}\nstdout: {out.stdout[-3000:]}\nstderr: {out.stderr[-3000:]}"


def assert_hello(work: Path, out: subprocess.CompletedProcess) -> None:
    hello = work / "hello.py"
    assert hello.is_file(), f"no hello.py: {sorted(p.name for p in work.iterdir())}\n{said(out)}"
    ran = runs(hello)
    assert ran.returncode == 0 and "hello" in ran.stdout.lower(), f"{ran.stdout!r} {ran.stderr!r}\n{said(out)}"


@pytest.fixture(scope="module")
def claude_place(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One user's HOME and project directory for both Claude Code sessions, as a user works: the second
    session's prompt then starts with the first one's (its system prompt names the directory), and the
    daemon's prompt cache spares it the ~12k-token prefill."""
    root = tmp_path_factory.mktemp("claude")
    (root / "work").mkdir()
    return root / "home", root / "work"


def test_claude_code_creates_a_file_and_runs_it(daemon: DaemonProc, qwen_gguf: Path,
                                                claude_place: tuple[Path, Path]) -> None:
    home, work = claude_place
    out = run_task(daemon, "claude", qwen_gguf.stem,
                   ["-p", HELLO, "--output-format", "json", "--allowedTools", "Bash,Write,Edit,Read"], work, home)
    assert out.returncode == 0, said(out)
    assert_hello(work, out)


NOTES = "\n".join(f"note {i}: the build of module {i} passed its checks in {i % 7 + 1} seconds" for i in range(420))


def test_a_claude_code_session_that_crosses_its_context_compacts_and_finishes(
        daemon: DaemonProc, qwen_gguf: Path, claude_place: tuple[Path, Path]) -> None:
    """A command prints ~6k tokens: with Claude Code's ~12k-token prompt that passes its compaction point in a
    32k context (launch --print says where). The CLI compacts (a request that asks for a summary reaches the
    daemon, and the conversation after it is shorter), nothing ends in a 400, and the file is written."""
    home, work = claude_place
    (work / "hello.py").unlink(missing_ok=True)  # the first session's
    (work / "notes.py").write_text(f"print({NOTES!r})\n")
    cfg = launch_print(daemon, "claude", qwen_gguf.stem)
    at = int(re.search(r"compacts the conversation at about ([\d,]+)", cfg["context_notes"][0])[1].replace(",", ""))
    before = {p.name for p in daemon.record.iterdir()} if daemon.record.exists() else set()  # type: ignore[attr-defined]
    out = run_task(daemon, "claude", qwen_gguf.stem,
                   ["-p", "First run the command `python3 notes.py` and read its output. Then " + HELLO,
                    "--output-format", "json", "--allowedTools", "Bash,Write,Edit,Read"], work, home)
    assert out.returncode == 0 and "API Error: 400" not in out.stdout, said(out)
    bodies = [json.loads(p.read_text()) for p in sorted(daemon.record.iterdir())  # type: ignore[attr-defined]
              if p.name not in before and p.suffix == ".json"]
    sizes = [len(json.dumps(b["body"].get("messages", []))) for b in bodies if b["route"] == "/v1/messages"]
    assert any(s > 20_000 for s in sizes), f"the notes never reached the model: {sizes}"
    first_big = next(i for i, s in enumerate(sizes) if s > 20_000)
    assert any(s < sizes[first_big] // 2 for s in sizes[first_big + 1:]), \
        f"Claude Code never compacted past {at} tokens: message sizes {sizes}\n{said(out)}"
    assert_hello(work, out)


CODEX_TRIES = 3


def test_codex_creates_a_file_and_runs_it(daemon: DaemonProc, qwen_gguf: Path, tmp_path: Path) -> None:
    """`codex exec` runs in a read-only sandbox unless told otherwise; --full-auto's sandbox needs user
    namespaces that a container may not give, so the test lifts it, as `--dangerously-skip-permissions` does
    for Claude Code (the agent works in the test's own directory).

    With bostudio's short instructions page Codex finished 11 of 18 runs on this model (session 19), so the
    test gives it up to CODEX_TRIES whole sessions, each in a fresh directory and HOME, and passes when one
    finishes; every try's outcome is in the failure message."""
    outcomes = []
    for i in range(CODEX_TRIES):
        work = tmp_path / f"work{i}"
        work.mkdir()
        out = run_task(daemon, "codex", qwen_gguf.stem,
                       ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", HELLO], work,
                       tmp_path / f"home{i}")
        try:
            assert out.returncode == 0, said(out)
            assert_hello(work, out)
            return
        except AssertionError as e:
            outcomes.append(f"try {i + 1}: {e}")
    pytest.fail("\n\n".join(outcomes))


def test_opencode_creates_a_file_and_runs_it(daemon: DaemonProc, qwen_gguf: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = run_task(daemon, "opencode", qwen_gguf.stem, ["run", "--auto", HELLO], work, tmp_path / "home")
    assert out.returncode == 0, said(out)
    assert_hello(work, out)
