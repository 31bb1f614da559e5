"""A Claude Code session that outgrows the model's context ends in no 400 and loses nothing: the real CLI
(pinned, from npm), configured only from `bostudio launch claude --print --json`, against the daemon on the
embedded Gemma 3 270M (32k context), with each request body the daemon reads recorded.

What crosses the context is the user's own input, not what the model chooses to do, so the verdict does not
depend on which token a small Q4 model picks: one session pastes a long log and asks a question; a second
session (`--continue`, the same conversation) pastes another log that, with the history, no longer fits the
context. The CLI must compact the conversation (it sends a summary request) and answer the second question in
a request that fits; the daemon answers every request, and nothing ends in a 400. The base model's words are
not asserted, only what reached the daemon and how the CLI ended.

Slow: three long prompts (~20k, ~20k and ~25k tokens) on one thread take minutes; the hang guard is 40 min."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.agent_util import agent_env, launch_print, recording_daemon
from tests.daemon_util import DaemonProc

GEMMA = "gemma-3-270m-q4_k_m"
MAX_OUTPUT = 200
HANG_GUARD_S = 2400
pytestmark = [pytest.mark.engine, pytest.mark.agent_tasks, pytest.mark.timeout(2 * HANG_GUARD_S + 600)]


def log_lines(tag: str, n: int) -> str:
    """A build log the user pastes: n distinct lines, ~17 tokens each."""
    return "\n".join(f"[{tag} {i:04d}] module {tag}{i} built, {i % 7 + 1} checks passed in {i % 13 + 2}.{i % 10}s"
                     for i in range(n))


FIRST = f"Here is the log of my first build:\n{log_lines('alpha', 420)}\nHow many modules did it build?"
SECOND = f"Here is the log of my second build:\n{log_lines('beta', 560)}\nWhich build was longer?"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path):
    yield from recording_daemon(tmp_path_factory.mktemp("context"), gemma_gguf)


def messages_requests(record: Path) -> list[dict]:
    bodies = [json.loads(p.read_text()) for p in sorted(record.iterdir()) if p.suffix == ".json"]
    return [b["body"] for b in bodies if b["route"] == "/v1/messages"]


def text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") if b.get("type") == "text" else json.dumps(b.get("content", ""))
                     for b in content or [])


def run_claude(daemon: DaemonProc, argv: list[str], home: Path, work: Path) -> subprocess.CompletedProcess:
    cfg = launch_print(daemon, "claude", GEMMA, "--max-output", str(MAX_OUTPUT))
    return subprocess.run([cfg["binary"], *argv], env=agent_env(cfg, home), cwd=work, capture_output=True,
                          text=True, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL)


def ended_well(out: subprocess.CompletedProcess) -> str | None:
    """None when the CLI finished its turn with no API error; otherwise what it said. A base model may run to
    the output limit (the CLI then says the reply exceeded it): that is the model, not a failure."""
    said = f"rc={out.returncode}\nstdout: {out.stdout[-3000:]}\nstderr: {out.stderr[-3000:]}"
    if "API Error" in out.stdout or "prompt is too long" in out.stdout.lower():
        return said
    if out.returncode == 0:
        return None
    try:
        result = json.loads(out.stdout.strip().splitlines()[-1]).get("result", "")
    except (ValueError, IndexError):
        return said
    return None if "output token maximum" in result else said


def test_a_claude_code_conversation_that_outgrows_the_context_is_compacted_not_refused(
        daemon: DaemonProc, tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    cfg = launch_print(daemon, "claude", GEMMA, "--max-output", str(MAX_OUTPUT))
    ctx = cfg["ctx"]
    assert ctx == 32768, cfg  # the sizes below are chosen for Gemma's trained context
    errors = daemon.instance(GEMMA)["stats"]["errors"]

    first = run_claude(daemon, ["-p", FIRST, "--output-format", "json"], home, work)
    assert ended_well(first) is None, ended_well(first)
    n_first = len(messages_requests(daemon.record))  # type: ignore[attr-defined]
    assert n_first >= 1

    second = run_claude(daemon, ["-p", SECOND, "--continue", "--output-format", "json"], home, work)
    assert ended_well(second) is None, ended_well(second)
    assert daemon.instance(GEMMA)["stats"]["errors"] == errors, "the daemon failed a request"

    later = messages_requests(daemon.record)[n_first:]  # type: ignore[attr-defined]
    summary = [b for b in later if "summary" in text_of(b["messages"][-1]).lower()
               and "alpha" in json.dumps(b["messages"])]
    assert summary, ("Claude Code never asked for a summary of the conversation: last messages "
                     f"{[text_of(b['messages'][-1])[:200] for b in later]}")
    # The question after the compaction reached the model, in a conversation without the first log.
    answered = [b for b in later[later.index(summary[0]) + 1:]
                if "Which build was longer?" in json.dumps(b["messages"])]
    assert answered, "the second question never reached the model after the compaction"
    assert "[alpha 0419]" not in json.dumps(answered[-1]["messages"]), "the first log is still in the conversation"
    assert "[beta 0559]" in json.dumps(answered[-1]["messages"]), "the second log was lost"
