"""A competing load for `bench --load N`: N CPU-bound processes beside the servers under test, as an agent's
own tests, builds and language server make the machine busy. Each runs in its own process group, is paused
(SIGSTOP) for the samples taken alone and resumed (SIGCONT) for the samples taken beside it, and is killed on
exit, so both figures come from one run, interleaved like every other comparison of the bench."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from bostudio.errors import ConfigError
from bostudio.runtime.process import _die_with_parent  # a bench killed with SIGKILL takes its load along

MAX_LOAD = 64
BUSY_LOOP = "while True:\n    pass\n"


class CompetingLoad:
    """N busy processes; a context manager (every one is killed on exit, whatever happened)."""

    def __init__(self, n: int) -> None:
        if not 0 <= n <= MAX_LOAD:
            raise ConfigError(f"--load {n} is out of range", f"use 0 to {MAX_LOAD} busy processes")
        self.n = n
        self.procs: list[subprocess.Popen] = []
        self.running = False

    def __enter__(self) -> "CompetingLoad":
        try:
            for _ in range(self.n):
                self.procs.append(subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL,
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                   start_new_session=True, preexec_fn=_die_with_parent))
            self.running = True
            self.pause()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _signal(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def pause(self) -> None:
        """The load stops competing (the samples taken alone)."""
        self._signal(signal.SIGSTOP)
        self.running = False

    def resume(self) -> None:
        """The load competes for the CPU again."""
        self._signal(signal.SIGCONT)
        self.running = True

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __exit__(self, *exc: object) -> None:
        self._signal(signal.SIGKILL)
        self._signal(signal.SIGCONT)  # a stopped process dies of SIGKILL too; CONT is harmless
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        self.running = False


def loaded_name(workload: str, n: int) -> str:
    """The workload name of the samples taken beside the load."""
    return f"{workload}+load{n}"
