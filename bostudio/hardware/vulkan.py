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


def with_storage_limits(devices: Iterable[Device], run: Callable[[list[str]], str]) -> tuple[Device, ...]:
    """Vulkan devices with max_tensor_bytes from vulkaninfo; unchanged when vulkaninfo is missing or silent."""
    devs = tuple(devices)
    if not any(d.backend == "vulkan" for d in devs):
        return devs
    try:
        limits = parse_storage_limits(run(["vulkaninfo"]))
    except Exception:  # not installed, timed out, no driver: the limit stays unknown
        return devs
    return tuple(d.with_(max_tensor_bytes=limits[d.name]) if d.backend == "vulkan" and d.name in limits else d
                 for d in devs)
