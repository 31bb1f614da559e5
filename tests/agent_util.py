"""What the agent tests share: how a test runs a real coding-agent CLI as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.daemon_util import DaemonProc

ROOT = Path(__file__).resolve().parent.parent
AGENT_BIN = ROOT / ".agents" / "node_modules" / ".bin"


def launch_print(daemon: DaemonProc, agent: str, model: str, *options: str) -> dict:
    """`bostudio launch AGENT MODEL --print --json` against the test's daemon (found through its state file)."""
    out = subprocess.run([sys.executable, "-m", "bostudio", "launch", agent, model, "--print", "--json", *options],
                         env=daemon.env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def agent_env(cfg: dict, home: Path, work: Path) -> dict[str, str]:
    """A fresh HOME, the agents' bin dir on PATH, the launcher's environment and files, nothing else. PWD is
    the directory the agent runs in, as a shell sets it: opencode takes its project directory from PWD, and
    with the test runner's PWD it told the model to work in the checkout (hello.py written there)."""
    home.mkdir(parents=True, exist_ok=True)
    for path, content in cfg["files"].items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "OPENCODE"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"),
               XDG_CACHE_HOME=str(home / ".cache"), XDG_STATE_HOME=str(home / ".local/state"),
               PATH=f"{AGENT_BIN}:{env.get('PATH', '')}", IS_SANDBOX="1", CI="1", NO_COLOR="1", PWD=str(work))
    env.update(cfg["env"])
    return env


def recording_daemon(root: Path, model: Path):  # type: ignore[no-untyped-def]
    """A daemon serving `model` alone that records every request body it reads under root/record (its
    `record` attribute); yields it and stops it, its children with it."""
    models = root / "models"
    models.mkdir()
    (models / model.name).symlink_to(model)
    d = DaemonProc(root, models, ["--idle-ttl", "0", "--record", str(root / "record")]).start()
    d.record = root / "record"  # type: ignore[attr-defined]
    yield d
    assert d.stop() == 0
    assert not d.children()
