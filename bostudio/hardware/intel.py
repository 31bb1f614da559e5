"""Intel GPUs: the xe/i915 sysfs memory regions, else `xpu-smi`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from bostudio.hardware.device import Device, ProbeResult
from bostudio.hardware.sysfs import DrmCard, drm_cards, mem_total_bytes, read_int, read_text

INTEL_VENDOR_ID = "0x8086"

Runner = Callable[[list[str]], str]


def probe_intel(root: Path = Path("/"), run: Runner | None = None) -> ProbeResult:
    """List Intel GPUs from sysfs; if sysfs shows none, ask `xpu-smi` (through `run`)."""
    cards = [c for c in drm_cards(root) if c.vendor_id == INTEL_VENDOR_ID]
    devices = [_from_sysfs(root, i, card) for i, card in enumerate(cards)]
    if devices or run is None:
        return ProbeResult(tuple(devices))
    return probe_xpu_smi(run)


def _from_sysfs(root: Path, index: int, card: DrmCard) -> Device:
    # xe: one VRAM region per tile, device/tileN/physical_vram_size_bytes.
    tiles = sorted(card.device.glob("tile*/physical_vram_size_bytes"))
    vram = sum(read_int(t) or 0 for t in tiles)
    free: int | None = None
    if not vram:
        # i915 (and its DKMS backport, with the prelim_ prefix): local memory totals on the card.
        for prefix in ("", "prelim_"):
            total = read_int(card.path / f"{prefix}lmem_total_bytes")
            if total:
                vram = total
                free = read_int(card.path / f"{prefix}lmem_avail_bytes")
                break
    name = read_text(card.device / "label") or f"Intel GPU {read_text(card.device / 'device') or ''}".strip()
    if vram:
        return Device(vendor="intel", backend="sycl", name=name, index=index, total_bytes=vram,
                      free_bytes=free, unified=False, driver=card.driver, source="sysfs")
    # No local memory region: an integrated GPU sharing system RAM.
    return Device(vendor="intel", backend="sycl", name=name, index=index,
                  total_bytes=mem_total_bytes(root) or 0, free_bytes=None, unified=True,
                  driver=card.driver, source="sysfs")


def probe_xpu_smi(run: Runner) -> ProbeResult:
    """`xpu-smi discovery -j` lists devices; `xpu-smi discovery -d N -j` gives each one's memory."""
    try:
        listing = json.loads(run(["xpu-smi", "discovery", "-j"]))
    except FileNotFoundError:  # no Intel GPU in sysfs and no xpu-smi: simply none here
        return ProbeResult()
    except Exception as exc:
        return ProbeResult(problems=(f"intel: xpu-smi failed ({exc})",))
    devices: list[Device] = []
    problems: list[str] = []
    for i, entry in enumerate(listing.get("device_list", [])):
        dev_id = entry.get("device_id", i)
        try:
            detail = json.loads(run(["xpu-smi", "discovery", "-d", str(dev_id), "-j"]))
            total = int(detail["memory_physical_size_byte"])
        except Exception as exc:  # one device failing never hides the others
            problems.append(f"intel: xpu-smi device {dev_id} unreadable ({exc})")
            continue
        free = detail.get("memory_free_size_byte")
        devices.append(Device(
            vendor="intel", backend="sycl", name=str(entry.get("device_name") or detail.get("device_name")),
            index=i, total_bytes=total, free_bytes=int(free) if free not in (None, "") else None,
            unified=False, driver=detail.get("driver_version"), source="xpu-smi"))
    return ProbeResult(tuple(devices), tuple(problems))
