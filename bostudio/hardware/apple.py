"""Apple Silicon through sysctl: one unified pool, of which the GPU may wire a part."""

from __future__ import annotations

import re
from typing import Callable

from bostudio.hardware.device import MIB, Device, ProbeResult

Runner = Callable[[list[str]], str]

SYSCTL_KEYS = ["hw.memsize", "iogpu.wired_limit_mb", "machdep.cpu.brand_string", "kern.osproductversion"]


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl a b c` prints `name: value` per line."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([\w.]+):\s*(.*)$", line.strip())
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def default_gpu_limit(memsize: int) -> int:
    """macOS lets the GPU wire about 2/3 of RAM up to 36 GiB and about 3/4 above, unless
    `iogpu.wired_limit_mb` raises it (Metal's recommendedMaxWorkingSetSize follows the same rule)."""
    return memsize * 2 // 3 if memsize <= 36 * 1024 * MIB else memsize * 3 // 4


def probe_apple(run: Runner) -> ProbeResult:
    try:
        # sysctl exits non-zero for an unknown key (iogpu.* on Intel Macs) but still prints the rest.
        values = parse_sysctl(run(["sysctl", *SYSCTL_KEYS]))
    except Exception as exc:
        return ProbeResult(problems=(f"apple: sysctl failed ({exc})",))
    try:
        memsize = int(values["hw.memsize"])
    except (KeyError, ValueError):
        return ProbeResult(problems=("apple: sysctl gave no hw.memsize",))
    brand = values.get("machdep.cpu.brand_string", "")
    if not brand.startswith("Apple"):
        return ProbeResult(problems=(f"apple: {brand or 'this Mac'} is not Apple Silicon; no Metal GPU",))
    wired_mb = int(values.get("iogpu.wired_limit_mb", "0") or 0)
    limit = wired_mb * MIB if wired_mb > 0 else default_gpu_limit(memsize)
    macos = values.get("kern.osproductversion")
    return ProbeResult((Device(vendor="apple", backend="metal", name=brand, index=0,
                               total_bytes=min(limit, memsize), free_bytes=None, unified=True,
                               driver=f"macOS {macos}" if macos else None, source="sysctl"),))
