"""Hardware discovery: one probe per vendor, each returning the same Device data.

    discover_devices() -> ProbeResult(devices, problems)
    load_devices_file(path) -> tuple[Device, ...]   (plan for another machine)

Importing this package is cheap and pure (the planner imports Device from it); the probes, which
load vendor libraries and run tools, are imported on first use.
"""

from __future__ import annotations

from typing import Any

from bostudio.hardware.device import GIB, MIB, Device, ProbeResult, device_from_json

__all__ = ["Device", "ProbeResult", "GIB", "MIB", "device_from_json", "discover_devices",
           "load_devices_file", "parse_list_devices", "cross_check", "run_list_devices", "ListedDevice"]

_LAZY = {"discover_devices": "bostudio.hardware.discover", "load_devices_file": "bostudio.hardware.files",
         "parse_list_devices": "bostudio.hardware.listdevices", "cross_check": "bostudio.hardware.listdevices",
         "run_list_devices": "bostudio.hardware.listdevices", "ListedDevice": "bostudio.hardware.listdevices"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
