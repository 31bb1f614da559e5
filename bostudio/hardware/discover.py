"""Run every probe; one vendor failing never hides the others."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterable

from bostudio.hardware.amd import probe_amd
from bostudio.hardware.apple import probe_apple
from bostudio.hardware.budget import apply_budgets, device_budgets
from bostudio.hardware.cpu import probe_cpu
from bostudio.hardware.device import EngineDevice, ProbeResult
from bostudio.hardware.intel import probe_intel
from bostudio.hardware.crosscheck import cross_check
from bostudio.hardware.nvidia import probe_nvidia
from bostudio.hardware.vulkan import with_storage_limits

Runner = Callable[[list[str]], str]


def run_tool(argv: list[str], timeout: float = 10.0) -> str:
    """Run a vendor tool and return its stdout; FileNotFoundError when it is not installed."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False).stdout


def discover_devices(*, nvml: ModuleType | None = None, amdsmi: ModuleType | None = None,
                     ps: ModuleType | None = None, root: Path = Path("/"), run: Runner = run_tool,
                     system: str | None = None,
                     engine_devices: Iterable[EngineDevice] | None = None,
                     budgets: dict[str, int] | None = None, host_amx: bool = False) -> ProbeResult:
    """Every device on this machine: GPUs per vendor, then host RAM, cross-checked with the
    devices the engine lists (`Engine.devices`, from `llama-server --list-devices`) when given.
    `budgets` caps devices by label (default: config.toml's [devices.LABEL] budget_mib). `host_amx`: the
    engine's CPU backend has the AMX buffer type (Engine.amx); the host device carries it to the planner.
    Each argument is a seam the tests fill with recorded output; the defaults read the real machine."""
    system = system or platform.system()
    probes: list[tuple[str, Callable[[], ProbeResult]]] = [("nvidia", lambda: probe_nvidia(nvml))]
    if system == "Linux":
        probes += [("amd", lambda: probe_amd(amdsmi, root)), ("intel", lambda: probe_intel(root, run))]
    if system == "Darwin":
        probes.append(("apple", lambda: probe_apple(run)))
    probes.append(("cpu", lambda: probe_cpu(ps)))
    result = ProbeResult()
    for vendor, probe in probes:
        try:
            result = result + probe()
        except Exception as exc:  # a bug or surprise in one probe is a note, not a crash
            result = result + ProbeResult(problems=(f"{vendor}: probe failed ({type(exc).__name__}: {exc})",))
    if engine_devices is not None:
        checked = cross_check(result.devices, engine_devices)
        limited, notes = with_storage_limits(checked.devices, run)
        result = ProbeResult(limited, result.problems + checked.problems + notes)
    capped, notes = apply_budgets(result.devices, device_budgets() if budgets is None else budgets)
    if host_amx:
        capped = tuple(d.with_(cpu_amx=True) if not d.is_gpu else d for d in capped)
    return ProbeResult(capped, result.problems + notes)
