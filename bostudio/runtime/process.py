"""Run one llama-server as a child: its own process group, dies with us, logs to a file,
ready when /health says 200, stopped as a group (SIGTERM, then SIGKILL after a grace time)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from bostudio.errors import ModelError, OutOfMemoryError, PortInUseError, ServerError
from bostudio.runtime.client import AsyncLlamaClient, LlamaClient

PR_SET_PDEATHSIG = 1
# The most a load may take in all, while its log keeps growing (a silent one is stopped at its stall timeout).
LOAD_TIMEOUT_S = 900.0


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
        return OutOfMemoryError(f"llama-server ran out of memory while loading: {detail}",
                           "use a smaller --ctx, a smaller quant, or turn speculation off")
    if re.search(r"gguf_init|failed to load model|error loading model|not within the file bounds|"
                 r"invalid magic|failed to read", text, re.I):
        return ModelError(f"llama-server could not load the model: {detail}",
                          "check that the file is a complete GGUF this llama.cpp supports")
    return ServerError(f"llama-server exited during start-up: {detail}", "see the full log for details")


class LoadWatch:
    """Progress versus stall while a server loads: a loader whose log keeps growing is making
    progress and is never killed for slowness; one silent for `stall_timeout` seconds is stalled."""

    def __init__(self, stall_timeout: float, now: float) -> None:
        self.stall_timeout = stall_timeout
        self.last_size = -1
        self.last_change = now

    def stalled(self, log_size: int, now: float) -> bool:
        if log_size != self.last_size:
            self.last_size, self.last_change = log_size, now
        return now - self.last_change > self.stall_timeout

    def silent_for(self, now: float) -> float:
        return now - self.last_change


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def process_matches(pid: int, create_time: float) -> psutil.Process | None:
    """The process `pid` if it is the one created at `create_time` (pids are reused; names lie)."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) < 0.05:
            return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass
    return None


def set_cpu_affinity(pid: int, cpus: set[int] | None) -> bool:
    """Every thread of process `pid` on `cpus` (None: every CPU this process may use). Threads the process
    starts later inherit it from the thread that starts them. False where the OS has no affinity (macOS) or the
    process is gone."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    target = cpus if cpus else os.sched_getaffinity(0)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    done = False
    for tid in tids:
        try:
            os.sched_setaffinity(tid, target)
            done = True
        except OSError:  # a thread that ended meanwhile
            continue
    return done


def reap_group(pid: int, create_time: float, grace: float = 3.0) -> bool:
    """Stop a server a previous daemon left behind, identified by pid + create time, as a group
    (SIGTERM, then SIGKILL). Returns True if such a process existed."""
    proc = process_matches(pid, create_time)
    if proc is None:
        return False
    members = [proc]
    try:
        pgid = os.getpgid(pid)
        members += [p for p in proc.children(recursive=True)]
    except (ProcessLookupError, psutil.Error):
        return False
    own_group = pgid == pid  # the server leads its own group (start_new_session)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            if own_group:
                os.killpg(pgid, sig)
            else:
                proc.send_signal(sig)
        except (ProcessLookupError, psutil.Error):
            pass
        _, alive = psutil.wait_procs(members, timeout=grace)
        if not alive:
            break
    return True


def listening_pid_ok(pid: int, port: int) -> bool:
    """Does process `pid` itself listen on `port`? (Another process answering /health on our
    planned port is a decoy, not our server.)"""
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


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

    @property
    def create_time(self) -> float | None:
        """The child's create time as the OS records it: with the pid, what identifies it later."""
        if self.proc is None:
            return None
        try:
            return psutil.Process(self.proc.pid).create_time()
        except psutil.Error:
            return None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Environment variables bound to removed llama.cpp options make llama-server exit (reference 0.2).
        env = {k: v for k, v in (self.env or os.environ).items() if k not in ("LLAMA_ARG_DRAFT_MAX", "LLAMA_ARG_DRAFT_MIN")}
        with open(self.log_path, "wb") as log:
            # The parent-death signal belongs to the thread that forks: start children from a
            # long-lived thread (the main thread here).
            # umask 077: what the server writes (saved prompt states: the prompts themselves) is owner-only.
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_die_with_parent, env=env, umask=0o077)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = LOAD_TIMEOUT_S, stall_timeout: float = 120.0,
                   on_wait: Callable[[float], None] | None = None) -> float:
        """Wait for /health 200. A loader whose log keeps growing is never killed for slowness;
        one silent for `stall_timeout` is. Returns seconds to ready."""
        assert self.proc is not None
        started = time.monotonic()
        watch = LoadWatch(stall_timeout, started)
        with LlamaClient(self.base_url, self.api_key) as client:
            while True:
                if self.proc.poll() is not None:
                    raise classify_failure(tail(self.log_path, 40), self.port)
                if client.health() == 200:
                    return time.monotonic() - started
                now = time.monotonic()
                if watch.stalled(log_size(self.log_path), now) or now - started > timeout:
                    self.stop()
                    raise self.not_ready_error(now - started, watch.silent_for(now))
                if on_wait:
                    on_wait(now - started)
                time.sleep(0.1)

    async def wait_ready_async(self, timeout: float = LOAD_TIMEOUT_S, stall_timeout: float = 120.0) -> float:
        """`wait_ready` for an event loop (the daemon): /health 200 from *our* child, since a decoy on the
        port is not us; progress vs. stall as there. The caller stops the process when this raises."""
        assert self.proc is not None
        started = time.monotonic()
        watch = LoadWatch(stall_timeout, started)
        async with AsyncLlamaClient(self.base_url, self.api_key) as client:
            while True:
                if self.proc.poll() is not None:
                    raise classify_failure(tail(self.log_path, 40), self.port)
                if await client.health() == 200:
                    if self.proc.poll() is None and listening_pid_ok(self.proc.pid, self.port):
                        return time.monotonic() - started
                    if self.proc.poll() is not None:
                        raise classify_failure(tail(self.log_path, 40), self.port)
                    raise PortInUseError(f"another process answers on port {self.port}, not the llama-server "
                                         f"bostudio started (pid {self.proc.pid}): not trusting it",
                                         "stop whatever listens on that port, or let bostudio pick the port")
                now = time.monotonic()
                if watch.stalled(log_size(self.log_path), now) or now - started > timeout:
                    raise self.not_ready_error(now - started, watch.silent_for(now))
                await asyncio.sleep(0.05)

    def not_ready_error(self, waited: float, silent: float) -> ServerError:
        return ServerError(f"llama-server did not become ready in {waited:.0f} s (silent for {silent:.0f} s)",
                           f"see the log: {self.log_path}")

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
