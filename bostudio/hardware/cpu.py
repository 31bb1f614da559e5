"""Host RAM through psutil: where the CPU backend and any layers not offloaded live; and the cores a process
may use (affinity, SMT siblings)."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Sequence
from types import ModuleType

from bostudio.hardware.device import Device, ProbeResult


def probe_cpu(ps: ModuleType | None = None, cpu_name: str | None = None) -> ProbeResult:
    """The host's RAM as one CPU device. `ps` is the psutil module (a fake one in tests)."""
    if ps is None:
        try:
            import psutil as ps  # type: ignore[no-redef]
        except ImportError:
            return ProbeResult(problems=("cpu: psutil is not installed",))
    try:
        vm = ps.virtual_memory()
    except Exception as exc:
        return ProbeResult(problems=(f"cpu: cannot read memory ({exc})",))
    name = cpu_name or _cpu_model() or platform.processor() or platform.machine() or "CPU"
    return ProbeResult((Device(vendor="cpu", backend="cpu", name=name, index=0,
                               total_bytes=int(vm.total), free_bytes=int(vm.available),
                               unified=False, source="psutil", cores=usable_cores(ps)),))


def usable_cores(ps: ModuleType) -> int | None:
    """Physical cores this process may run on: psutil's physical count, capped by the CPU affinity
    (taskset, cgroup cpusets) when it allows fewer logical CPUs; None when nothing can tell."""
    try:
        physical = ps.cpu_count(logical=False) or ps.cpu_count()
    except Exception:
        physical = None
    allowed = None
    if hasattr(os, "sched_getaffinity"):
        try:
            allowed = len(os.sched_getaffinity(0))
        except OSError:
            allowed = None
    found = [n for n in (physical, allowed) if n]
    return min(found) if found else None


def _cpu_model() -> str | None:
    """The CPU's marketing name from /proc/cpuinfo (Linux); None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def one_cpu_per_core(allowed: Sequence[int], siblings: Callable[[int], frozenset[int] | None], n: int) -> list[int]:
    """`n` logical CPUs from `allowed`, at most one per physical core where `siblings` (a CPU's SMT siblings,
    itself included; None: unknown) tells, taken from the end of the list (CPU 0 takes most interrupts).
    Fewer when there are fewer cores; pure (the topology is passed in)."""
    out: list[int] = []
    seen: set[int] = set()
    for cpu in sorted(allowed, reverse=True):
        if len(out) == n:
            break
        if cpu in seen:
            continue
        out.append(cpu)
        seen |= siblings(cpu) or {cpu}
    return sorted(out)


def smt_siblings(cpu: int) -> frozenset[int] | None:
    """The logical CPUs sharing `cpu`'s physical core (Linux sysfs); None where it cannot be read."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None
    return frozenset(cpus)
