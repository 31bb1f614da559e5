"""What `llama-server --list-devices` does not say about a Vulkan device: the largest buffer a shader may
bind (maxStorageBufferRange), read from `vulkaninfo` (Debian: vulkan-tools). ggml-vulkan keeps a weight
larger than that on the host (ggml_backend_vk_device_supports_op), so the planner must too. On lavapipe
(Mesa 22.3) it is 128 MiB: a 262k-token vocabulary's output projection stays on the host."""

from __future__ import annotations

import re
from typing import Callable, Iterable

from bostudio.hardware.device import Device

_NAME = re.compile(r"^\s*deviceName\s*=\s*(.+?)\s*$")
_RANGE = re.compile(r"^\s*maxStorageBufferRange\s*=\s*(\d+)\s*$")


def parse_storage_limits(text: str) -> dict[str, int]:
    """deviceName -> maxStorageBufferRange from `vulkaninfo` output (the first figure after each name)."""
    out: dict[str, int] = {}
    name = None
    for line in text.splitlines():
        if m := _NAME.match(line):
            name = m.group(1)
        elif name is not None and (m := _RANGE.match(line)):
            out.setdefault(name, int(m.group(1)))
            name = None
    return out


def with_storage_limits(devices: Iterable[Device], run: Callable[[list[str]], str]) -> tuple[tuple[Device, ...],
                                                                                          tuple[str, ...]]:
    """Vulkan devices with max_tensor_bytes from vulkaninfo, and a note when that limit stays unknown (vulkaninfo
    missing, timed out, or silent about a device): the plan may then place a weight the device cannot bind."""
    devs = tuple(devices)
    vulkan = [d for d in devs if d.backend == "vulkan"]
    if not vulkan:
        return devs, ()
    try:
        limits = parse_storage_limits(run(["vulkaninfo"]))
    except Exception:  # not installed, timed out, no driver: the limit stays unknown
        limits = {}
    unknown = [d.engine_name or d.name for d in vulkan if d.name not in limits]
    note = (f"vulkan: no buffer limit known for {', '.join(unknown)} (vulkaninfo missing or silent: install "
            "vulkan-tools); a weight larger than the device can bind may be planned onto it",) if unknown else ()
    return tuple(d.with_(max_tensor_bytes=limits[d.name]) if d.backend == "vulkan" and d.name in limits else d
                 for d in devs), note
