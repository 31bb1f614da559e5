"""Cross-check the probes with the engine's own view (`llama-server --list-devices`, as parsed by
bostudio.engine.discover): name each GPU as the engine does (CUDA0, Vulkan0, MTL0...), add what only
the engine sees, and say which GPUs this engine build cannot use."""

from __future__ import annotations

from typing import Iterable

from bostudio.hardware.device import MIB, Device, EngineDevice, ProbeResult, prefer_real_gpus

# Engine backend -> the vendors whose GPUs it drives (Vulkan drives any).
_VENDORS = {"cuda": ("nvidia",), "hip": ("amd",), "musa": ("other",), "sycl": ("intel",),
            "metal": ("apple",), "vulkan": ("nvidia", "amd", "intel", "apple", "other")}


def _vendor_of(description: str) -> str:
    d = description.lower()
    for vendor, words in (("nvidia", ("nvidia", "geforce", "quadro", "tesla")),
                          ("amd", ("amd", "radeon", "instinct")),
                          ("intel", ("intel", "arc")), ("apple", ("apple",))):
        if any(w in d for w in words):
            return vendor
    return "other"


def _score(g: Device, ed: EngineDevice) -> tuple[bool, bool]:
    """Same name, same size: CUDA numbers GPUs fastest-first, NVML by PCI bus, so order alone lies."""
    desc = ed.description.lower()
    same_name = g.name.lower() in desc or desc in g.name.lower()
    same_size = abs(g.total_bytes - ed.total_mib * MIB) <= 0.05 * max(g.total_bytes, 1)
    return same_name, same_size


def cross_check(devices: tuple[Device, ...], engine_devices: Iterable[EngineDevice]) -> ProbeResult:
    gpus = [d for d in devices if d.is_gpu]
    matched: dict[int, EngineDevice] = {}
    extra: list[Device] = []
    problems: list[str] = []
    for ed in engine_devices:
        vendors = _VENDORS.get(ed.backend, ("other",))
        candidates = [i for i, g in enumerate(gpus) if i not in matched and g.vendor in vendors]
        if candidates:
            best = max(candidates, key=lambda i: _score(gpus[i], ed))
            if ed.backend != "vulkan" or any(_score(gpus[best], ed)):
                matched[best] = ed
                continue
        extra.append(Device(vendor=_vendor_of(ed.description), backend=ed.backend, name=ed.description,
                            index=len(extra), total_bytes=ed.total_mib * MIB, free_bytes=ed.free_mib * MIB,
                            unified=(ed.backend == "metal" or ed.software), source="list-devices",
                            engine_name=ed.name, software=ed.software))
        if not ed.software:  # no vendor probe can see a software device: nothing to remark
            problems.append(f"engine: {ed.name} ({ed.description}) was found only by the engine")
    out: list[Device] = []
    for d in devices:
        i = gpus.index(d) if d.is_gpu else -1
        if i < 0:
            out.append(d)
        elif i in matched:
            ed = matched[i]
            out.append(d.with_(engine_name=ed.name, backend=ed.backend,
                               free_bytes=d.free_bytes if d.free_bytes is not None else ed.free_mib * MIB))
        else:
            out.append(d)
            problems.append(f"engine: this llama-server build cannot use {d.vendor} GPU {d.index} "
                            f"({d.name}); build one for its backend")
    found = tuple(out) + tuple(extra)
    kept = prefer_real_gpus(found)
    problems += [f"engine: {d.label} ({d.name}) is a software device, left out while a real GPU is present "
                 "(leave it out of GGML_VK_VISIBLE_DEVICES so llama-server does not use it either)"
                 for d in found if d not in kept]
    return ProbeResult(kept, tuple(problems))
