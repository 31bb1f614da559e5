"""Reading the Linux DRM sysfs tree (/sys/class/drm/card*/device): shared by the AMD and Intel probes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DrmCard:
    """One /sys/class/drm/cardN with its PCI device directory."""

    index: int
    path: Path      # .../drm/cardN
    device: Path    # .../drm/cardN/device (the PCI device)
    vendor_id: str  # "0x1002" (AMD), "0x8086" (Intel), "0x10de" (NVIDIA)
    driver: str | None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def drm_cards(root: Path) -> list[DrmCard]:
    """cardN entries (not connectors like card0-DP-1), in index order."""
    drm = root / "sys" / "class" / "drm"
    cards = []
    try:
        entries = list(drm.iterdir())
    except OSError:
        return []
    for entry in entries:
        m = re.fullmatch(r"card(\d+)", entry.name)
        if not m:
            continue
        device = entry / "device"
        vendor = read_text(device / "vendor")
        if vendor is None:
            continue
        driver_link = device / "driver"
        try:
            driver = driver_link.resolve().name if driver_link.exists() else read_text(device / "driver_name")
        except OSError:
            driver = None
        cards.append(DrmCard(int(m.group(1)), entry, device, vendor.lower(), driver))
    return sorted(cards, key=lambda c: c.index)


def mem_total_bytes(root: Path) -> int | None:
    """MemTotal from /proc/meminfo (an integrated GPU's shared pool)."""
    text = read_text(root / "proc" / "meminfo")
    if not text:
        return None
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None
