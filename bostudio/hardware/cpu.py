"""Host RAM through psutil: where the CPU backend and any layers not offloaded live."""

from __future__ import annotations

import os
import platform
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
