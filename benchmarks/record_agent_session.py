#!/usr/bin/env python3
"""Record a real Claude Code session for `bostudio bench --workload DIR` (the recorded session of BENCHMARKS.md).

    .venv/bin/python -m benchmarks.record_agent_session OUT_DIR [MODEL] [--turns 8] [--max-output 512]

What it does, all of it in a scratch directory that is removed afterwards (OUT_DIR is kept):
- a project for the agent to work in: a git-initialised copy of bostudio's own package and README;
- its own daemon (`bostudio daemon --record OUT_DIR`, its own state dir and a free port), so nothing of
  yours is touched and only this session's requests are recorded;
- Claude Code (the pinned version `scripts/setup_agents.sh` installs into .agents/) through
  `bostudio launch claude`, in a fresh HOME: a first `-p` turn, then `-c -p` turns continuing the same
  conversation, each a question about the project's code (Read, Grep, Glob and LS allowed).

--max-output bounds each answer (default 512 tokens). A base model (the Gemma 3 270M the recordings so far
were made on) can repeat itself until the output limit with the launch default (a quarter of the context):
the conversation then outgrows the context and Claude Code's own compaction fails. Without MODEL, the
default (Qwen2.5-Coder-1.5B-Instruct) is recorded. Every request body lands in OUT_DIR as
NNNNNN.json; replay it with `bostudio bench --workload OUT_DIR` or `benchmarks/bench_agent_goal.py --recorded
OUT_DIR`. Prints each turn's wall time and the number of requests recorded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bostudio.runtime.net import free_loopback_port

ROOT = Path(__file__).resolve().parent.parent
AGENT_BIN = ROOT / ".agents" / "node_modules" / ".bin"
QUESTIONS = [
    "Read bostudio/daemon/http/record.py and tell me in two sentences what it does.",
    "Now grep for start_recording and tell me where it is called.",
    "Which headers does the Recorder leave out, and why?",
    "Read bostudio/bench/sessions.py and say how a recorded session is replayed.",
    "Suggest one test for the Recorder's numbering when the directory already holds files.",
    "Write that test as a pytest function.",
    "What would break if two daemons recorded into the same directory?",
    "Summarise what we discussed in three bullet points.",
    "Read bostudio/daemon/http/limits.py and list the limits it enforces.",
    "Which of those limits would a slow client hit first?",
    "Grep for BodyLimits and say where it is built.",
    "Summarise the whole conversation in one paragraph.",
]
TURN_TIMEOUT_S = 1800  # a cold 15k-token prefill beside other work can take minutes; this is a hang guard


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"the daemon exited (code {proc.returncode}) before it listened; see its log")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"the daemon did not listen on port {port} within {timeout_s:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="directory the request bodies are recorded into")
    ap.add_argument("model", nargs="?", default=None, help="model (default: the embedded one)")
    ap.add_argument("--turns", type=int, default=8, help=f"turns, 1 to {len(QUESTIONS)} (default 8)")
    ap.add_argument("--max-output", type=int, default=512, help="the output limit Claude Code asks for")
    a = ap.parse_args()
    if not 1 <= a.turns <= len(QUESTIONS):
        ap.error(f"--turns must be 1 to {len(QUESTIONS)}")
    if not (AGENT_BIN / "claude").exists():
        sys.exit(f"Claude Code is not in {AGENT_BIN}: run `bash scripts/setup_agents.sh` first")
    out = Path(a.out).expanduser().resolve()
    bostudio = [sys.executable, "-P", "-m", "bostudio"]  # -P: not the project's copy of the package in the cwd
    with tempfile.TemporaryDirectory(prefix="bostudio-record-") as tmp:
        scratch = Path(tmp)
        project, home, state = scratch / "project", scratch / "home", scratch / "state"
        home.mkdir()
        shutil.copytree(ROOT / "bostudio", project / "bostudio", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "README.md", project / "README.md")
        git = ["git", "-c", "user.name=bostudio", "-c", "user.email=bostudio@localhost"]
        for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "project"]):
            subprocess.run([*git, *cmd], cwd=project, check=True)
        # the daemon: your engine cache and models, its own state; the agent: a fresh HOME as well
        daemon_env = dict(os.environ, XDG_STATE_HOME=str(state))
        env = dict(daemon_env, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
                   XDG_DATA_HOME=str(home / ".local/share"), PATH=f"{AGENT_BIN}:{os.environ.get('PATH', '')}",
                   IS_SANDBOX="1", DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                   NO_COLOR="1")
        port = free_loopback_port()
        log = open(scratch / "daemon.out", "w")
        daemon = subprocess.Popen([*bostudio, "daemon", "--port", str(port), "--record", str(out)], env=daemon_env,
                                  stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            wait_for_port(port, daemon)
            print(f"recording into {out} (daemon on port {port})", flush=True)
            model = [a.model] if a.model else []
            failed = 0
            for i, question in enumerate(QUESTIONS[:a.turns]):
                agent = (["-c"] if i else []) + ["-p", question, "--allowedTools", "Read", "Grep", "Glob", "LS"]
                t0 = time.monotonic()
                r = subprocess.run([*bostudio, "launch", "claude", *model, "--max-output", str(a.max_output), "--",
                                    *agent], env=env, cwd=project, capture_output=True, text=True,
                                   timeout=TURN_TIMEOUT_S)
                n = len(list(out.glob("*.json")))
                print(f"turn {i + 1}/{a.turns}: {time.monotonic() - t0:.1f} s, exit {r.returncode}, "
                      f"{n} request(s) recorded so far", flush=True)
                if r.returncode != 0:
                    print("  " + (r.stderr or r.stdout).strip()[-400:], flush=True)
                    failed += 1
        finally:
            subprocess.run([*bostudio, "daemon", "stop"], env=daemon_env, cwd=ROOT, capture_output=True, timeout=120)
            if daemon.poll() is None:
                daemon.terminate()
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
            log.close()
    if failed:
        print(f"{failed} turn(s) failed (Claude Code's own exit code; the requests it sent are recorded)")
    print(f"done: replay it with `bostudio bench --workload {out}`")
    return 1 if failed == a.turns else 0


if __name__ == "__main__":
    sys.exit(main())
