"""Run one llama-server as a child: its own process group, dies with us, logs to a file,
ready when /health says 200, stopped as a group (SIGTERM, then SIGKILL after a grace time)."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bostudio.errors import ModelError, PortInUseError, ServerError
from bostudio.runtime.client import LlamaClient

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass


def tail(path: Path, n: int = 20) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return lines[-n:]


_LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [IWE] ")


def _strip(line: str) -> str:
    return _LOG_PREFIX.sub("", line).strip()


def classify_failure(lines: list[str], port: int) -> ServerError | ModelError:
    """Turn llama-server's last log lines into an error that says what happened."""
    text = "\n".join(lines)
    errors = [_strip(x) for x in lines if " E " in x[:20] or "error" in x.lower() or "failed" in x.lower()]
    detail = errors[-1] if errors else (_strip(lines[-1]) if lines else "no output")
    if re.search(r"couldn't bind|address already in use|bind.*failed", text, re.I):
        return PortInUseError(f"port {port} is already in use", "pick another one with --port P")
    if re.search(r"out of memory|failed to allocate|cudaMalloc failed|ErrorOutOfDeviceMemory", text, re.I):
        return ServerError(f"llama-server ran out of memory while loading: {detail}",
                           "use a smaller --ctx, a smaller quant, or turn speculation off")
    if re.search(r"gguf_init|failed to load model|error loading model|not within the file bounds|"
                 r"invalid magic|failed to read", text, re.I):
        return ModelError(f"llama-server could not load the model: {detail}",
                          "check that the file is a complete GGUF this llama.cpp supports")
    return ServerError(f"llama-server exited during start-up: {detail}", "see the full log for details")


class ServerProcess:
    """One llama-server child process."""

    def __init__(self, argv: list[str], port: int, log_path: Path, host: str = "127.0.0.1",
                 api_key: str | None = None, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.port = port
        self.host = host
        self.log_path = log_path
        self.api_key = api_key
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Environment variables bound to removed llama.cpp options make llama-server exit (reference 0.2).
        env = {k: v for k, v in (self.env or os.environ).items() if k not in ("LLAMA_ARG_DRAFT_MAX", "LLAMA_ARG_DRAFT_MIN")}
        with open(self.log_path, "wb") as log:
            # The parent-death signal belongs to the thread that forks: start children from a
            # long-lived thread (the main thread here).
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_die_with_parent, env=env)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 300.0, stall_timeout: float = 120.0,
                   on_wait: Callable[[float], None] | None = None) -> float:
        """Wait for /health 200. A loader whose log keeps growing is never killed for slowness;
        one silent for `stall_timeout` is. Returns seconds to ready."""
        assert self.proc is not None
        started = time.monotonic()
        last_size, last_change = -1, started
        with LlamaClient(self.base_url, self.api_key) as client:
            while True:
                if self.proc.poll() is not None:
                    raise classify_failure(tail(self.log_path, 40), self.port)
                try:
                    if client.health() == 200:
                        return time.monotonic() - started
                except httpx.HTTPError:
                    pass
                now = time.monotonic()
                size = self.log_path.stat().st_size if self.log_path.exists() else 0
                if size != last_size:
                    last_size, last_change = size, now
                if now - last_change > stall_timeout or now - started > timeout:
                    self.stop()
                    raise ServerError(f"llama-server did not become ready in {now - started:.0f} s "
                                      f"(silent for {now - last_change:.0f} s)",
                                      f"see the log: {self.log_path}")
                if on_wait:
                    on_wait(now - started)
                time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM to the whole group, SIGKILL after `grace` seconds. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of the group (the server or anything it spawned) goes now.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None
