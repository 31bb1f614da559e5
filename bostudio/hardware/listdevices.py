"""The engine's own view: parse `llama-server --list-devices` and cross-check the probes with it.

Format (common/arg.cpp, common_print_available_devices), on stdout:
    Available devices:
      CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23664 MiB free)
or `  (none)` when the build has no GPU backend or sees no device.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bostudio.hardware.device import MIB, Device, ProbeResult

_LINE = re.compile(r"^\s+(?P<name>[A-Za-z]+\d*(?:\[[^\]]*\])?\d*):\s*(?P<desc>.*?)\s*"
                   r"\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")

# Device-name prefix -> (backend, vendors it can be). Vulkan can drive any GPU.
_PREFIXES = {
    "CUDA": ("cuda", ("nvidia",)),
    "ROCm": ("rocm", ("amd",)),
    "MUSA": ("musa", ("other",)),
    "SYCL": ("sycl", ("intel",)),
    "MTL": ("metal", ("apple",)),
    "Vulkan": ("vulkan", ("nvidia", "amd", "intel", "apple", "other")),
}


@dataclass(frozen=True)
class ListedDevice:
    """One line of `--list-devices`."""

    name: str
    description: str
    total_bytes: int
    free_bytes: int

    @property
    def prefix(self) -> str:
        return re.sub(r"[\d\[].*$", "", self.name)


def parse_list_devices(text: str) -> list[ListedDevice] | None:
    """The devices listed, [] for `(none)`, None when the text is not a device listing at all."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Available devices:")
    except StopIteration:
        return None
    out = []
    for line in lines[start + 1:]:
        m = _LINE.match(line)
        if m:
            out.append(ListedDevice(m["name"], m["desc"], int(m["total"]) * MIB, int(m["free"]) * MIB))
    return out


def run_list_devices(server: Path, timeout: float = 20.0) -> str:
    """Run `<server> --list-devices` (loads the GPU backends, so it can take a few seconds)."""
    proc = subprocess.run([str(server), "--list-devices"], capture_output=True, text=True,
                          timeout=timeout, check=False)
    return proc.stdout


def _vendor_of(description: str) -> str:
    d = description.lower()
    for vendor, words in (("nvidia", ("nvidia", "geforce", "quadro", "tesla")),
                          ("amd", ("amd", "radeon", "instinct")),
                          ("intel", ("intel", "arc")), ("apple", ("apple",))):
        if any(w in d for w in words):
            return vendor
    return "other"


def cross_check(devices: tuple[Device, ...], listed: list[ListedDevice]) -> ProbeResult:
    """Attach the engine's device names to probed GPUs, add what only the engine sees, and say
    which GPUs this engine build cannot use."""
    gpus = [d for d in devices if d.is_gpu]
    matched: dict[int, ListedDevice] = {}
    extra: list[Device] = []
    problems: list[str] = []
    for ld in listed:
        backend, vendors = _PREFIXES.get(ld.prefix, ("unknown", ("other",)))
        candidates = [i for i, g in enumerate(gpus) if i not in matched and g.vendor in vendors]
        # Prefer the same name and size (CUDA orders fastest-first, NVML by PCI bus).
        def score(i: int) -> tuple[bool, bool]:
            g = gpus[i]
            same_name = g.name.lower() in ld.description.lower() or ld.description.lower() in g.name.lower()
            same_size = abs(g.total_bytes - ld.total_bytes) <= 0.05 * max(g.total_bytes, 1)
            return (same_name, same_size)
        if candidates:
            best = max(candidates, key=score)
            if ld.prefix == "Vulkan" and score(best) == (False, False):
                candidates = []
            else:
                matched[best] = ld
                continue
        vendor = _vendor_of(ld.description)
        extra.append(Device(vendor=vendor, backend=backend, name=ld.description, index=len(extra),
                            total_bytes=ld.total_bytes, free_bytes=ld.free_bytes,
                            unified=(backend == "metal"), source="list-devices", engine_name=ld.name))
        problems.append(f"engine: {ld.name} ({ld.description}) was found only by the engine")
    out: list[Device] = []
    for d in devices:
        if not d.is_gpu:
            out.append(d)
            continue
        i = gpus.index(d)
        if i in matched:
            ld = matched[i]
            out.append(d.with_(engine_name=ld.name, backend=_PREFIXES.get(ld.prefix, (d.backend,))[0],
                               free_bytes=d.free_bytes if d.free_bytes is not None else ld.free_bytes))
        else:
            out.append(d)
            problems.append(f"engine: this llama-server build cannot use {d.vendor} GPU {d.index} "
                            f"({d.name}); build one for its backend")
    return ProbeResult(tuple(out) + tuple(extra), tuple(problems))
