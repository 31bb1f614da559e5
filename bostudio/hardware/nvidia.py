"""NVIDIA GPUs through NVML (the nvidia-ml-py `pynvml` module)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from bostudio.hardware.device import Device, ProbeResult


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _optional(call: Any, *args: Any) -> Any:
    """NVML calls that some GPUs/drivers do not support: unknown is None, not an error."""
    try:
        return call(*args)
    except Exception:  # NVMLError_NotSupported and friends; the reading is simply unknown
        return None


def probe_nvidia(nvml: ModuleType | None = None) -> ProbeResult:
    """List NVIDIA GPUs. `nvml` is the pynvml module (a fake one in tests)."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return ProbeResult(problems=("nvidia: nvidia-ml-py is not installed",))
    try:
        nvml.nvmlInit()
    except Exception as exc:  # no driver / no library: no NVIDIA GPU here, say why
        return ProbeResult(problems=(f"nvidia: NVML unavailable ({_text(exc) or type(exc).__name__})",))
    devices: list[Device] = []
    problems: list[str] = []
    try:
        driver = _optional(nvml.nvmlSystemGetDriverVersion)
        count = nvml.nvmlDeviceGetCount()
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                name = _text(nvml.nvmlDeviceGetName(handle))
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:  # one lost GPU never hides the others
                problems.append(f"nvidia: GPU {i} unreadable ({_text(exc) or type(exc).__name__})")
                continue
            devices.append(Device(
                vendor="nvidia", backend="cuda", name=name, index=i,
                total_bytes=int(mem.total), free_bytes=int(mem.free), unified=False,
                driver=_text(driver) if driver is not None else None,
                bandwidth_gbs=_bandwidth_gbs(nvml, handle), source="pynvml"))
    except Exception as exc:
        problems.append(f"nvidia: {_text(exc) or type(exc).__name__}")
    finally:
        _optional(nvml.nvmlShutdown)
    return ProbeResult(tuple(devices), tuple(problems))


def _bandwidth_gbs(nvml: ModuleType, handle: Any) -> float | None:
    """Peak memory bandwidth = memory clock x 2 (double data rate) x bus width; GB/s.

    Matches the datasheets for GDDR6X (RTX 4090: 10501 MHz x 384 bit -> 1008 GB/s) and HBM
    (H100 SXM: 2619 MHz x 5120 bit -> 3352 GB/s).
    """
    clock_mhz = _optional(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM)
    bus_bits = _optional(nvml.nvmlDeviceGetMemoryBusWidth, handle)
    if not clock_mhz or not bus_bits:
        return None
    return round(clock_mhz * 1e6 * 2 * bus_bits / 8 / 1e9, 1)
