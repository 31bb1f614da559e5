"""Which processes this test run started, found reliably on a machine where other test runs and
servers live: the suite puts a marker with a value of its own into its environment at start
(`install`), every process it starts inherits it, and /proc/PID/environ shows it. A name alone
(llama-server, bostudio) would also match other people's processes. Linux only (/proc); elsewhere
nothing is found, and nothing is killed."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

MARK = "BOSTUDIO_TEST_SUITE"
PROC = Path("/proc")


def install() -> str:
    """A fresh marker for this run (a nested run gets its own), set in os.environ."""
    value = f"{os.getpid()}-{secrets.token_hex(8)}"
    os.environ[MARK] = value
    return value


def suite_processes(value: str) -> dict[int, int]:
    """pid -> parent pid of every live process carrying the marker `value` (this process excluded)."""
    needle = f"\0{MARK}={value}\0".encode()
    out: dict[int, int] = {}
    if not PROC.is_dir():
        return out
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:  # gone, or not ours to read
            continue
        if needle not in b"\0" + env + b"\0":
            continue
        # stat: "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        if fields and fields[0] != "Z":
            out[int(entry.name)] = int(fields[1])
    return out


def describe(pid: int) -> str:
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        return " ".join(a.decode("utf-8", "replace") for a in argv if a)[:300]
    except OSError:
        return "?"


def is_server(pid: int) -> bool:
    """A llama-server (real or the tests' fake), an rpc-server, or a `bostudio` command."""
    try:
        argv = [a.decode("utf-8", "replace") for a in (PROC / str(pid) / "cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return False
    names = [os.path.basename(a) for a in argv[:3]]
    return (any(n in ("llama-server", "rpc-server", "bostudio", "fake_llama_server.py") for n in names)
            or any(argv[i:i + 2] == ["-m", "bostudio"] for i in range(len(argv) - 1)))


def new_since(value: str, before: set[int]) -> list[int]:
    """Live suite processes started since `before` was taken that do not descend from one of those
    (children of an older fixture's daemon belong to that fixture)."""
    procs = suite_processes(value)
    out = []
    for pid in procs:
        if pid in before:
            continue
        p, seen = procs.get(pid), {pid}
        while p is not None and p in procs and p not in before and p not in seen:
            seen.add(p)
            p = procs.get(p)
        if p not in before:
            out.append(pid)
    return out


def kill(pids: list[int]) -> None:
    """SIGKILL each of `pids` (and nothing else: never by name or group of someone else)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def left_servers(value: str, wait: float = 15.0) -> list[int]:
    """Suite servers still alive after `wait` seconds (processes in the middle of exiting get the time)."""
    deadline = time.monotonic() + wait
    while True:
        left = [pid for pid in suite_processes(value) if is_server(pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
