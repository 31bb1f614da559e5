"""AMD GPUs: amdsmi where installed, else the amdgpu sysfs files."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from bostudio.hardware.device import Device, ProbeResult
from bostudio.hardware.sysfs import drm_cards, read_int, read_text

AMD_VENDOR_ID = "0x1002"


def probe_amd(amdsmi: ModuleType | None = None, root: Path = Path("/"),
              use_amdsmi: bool = True) -> ProbeResult:
    """List AMD GPUs. Tries amdsmi (the module may be passed in, a fake one in tests), then sysfs."""
    problems: tuple[str, ...] = ()
    if use_amdsmi:
        if amdsmi is None:
            try:
                import amdsmi  # type: ignore[no-redef]
            except ImportError:
                amdsmi = None
        if amdsmi is not None:
            result = _probe_amdsmi(amdsmi)
            if result.devices:
                return result
            problems = result.problems
    found = _probe_sysfs(root)
    return ProbeResult(found.devices, problems + found.problems)


def _probe_amdsmi(amdsmi: ModuleType) -> ProbeResult:
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:
        return ProbeResult(problems=(f"amd: amdsmi unavailable ({exc}); reading sysfs",))
    devices: list[Device] = []
    problems: list[str] = []
    try:
        for i, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            try:
                vram = amdsmi.AmdSmiMemoryType.VRAM
                total = int(amdsmi.amdsmi_get_gpu_memory_total(handle, vram))
                used = int(amdsmi.amdsmi_get_gpu_memory_usage(handle, vram))
            except Exception as exc:  # one GPU failing never hides the others
                problems.append(f"amd: GPU {i} unreadable ({exc})")
                continue
            asic = _safe(amdsmi.amdsmi_get_gpu_asic_info, handle) or {}
            drv = _safe(amdsmi.amdsmi_get_gpu_driver_info, handle) or {}
            devices.append(Device(
                vendor="amd", backend="rocm", name=str(asic.get("market_name") or "AMD GPU"), index=i,
                total_bytes=total, free_bytes=max(0, total - used), unified=False,
                driver=_join(drv.get("driver_name"), drv.get("driver_version")), source="amdsmi"))
    except Exception as exc:
        problems.append(f"amd: amdsmi failed ({exc}); reading sysfs")
    finally:
        _safe(amdsmi.amdsmi_shut_down)
    return ProbeResult(tuple(devices), tuple(problems))


def _probe_sysfs(root: Path) -> ProbeResult:
    devices: list[Device] = []
    problems: list[str] = []
    amd_cards = [c for c in drm_cards(root) if c.vendor_id == AMD_VENDOR_ID]
    for i, card in enumerate(amd_cards):
        total = read_int(card.device / "mem_info_vram_total")
        used = read_int(card.device / "mem_info_vram_used")
        if not total:
            problems.append(f"amd: card{card.index} has no mem_info_vram_total (driver {card.driver or 'unknown'})")
            continue
        name = read_text(card.device / "product_name") or f"AMD GPU {read_text(card.device / 'device') or ''}".strip()
        version = read_text(root / "sys" / "module" / "amdgpu" / "version")
        devices.append(Device(
            vendor="amd", backend="rocm", name=name, index=i, total_bytes=total,
            free_bytes=max(0, total - used) if used is not None else None, unified=False,
            driver=_join(card.driver or "amdgpu", version), source="sysfs"))
    return ProbeResult(tuple(devices), tuple(problems))


def _safe(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # an optional reading; unknown is fine
        return None


def _join(*parts: Any) -> str | None:
    text = " ".join(str(p) for p in parts if p)
    return text or None
