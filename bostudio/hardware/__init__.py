"""Hardware discovery: one probe per vendor, each returning the same Device data.

    discover_devices(engine_devices=engine.devices) -> ProbeResult(devices, problems)
    load_devices_file(path) -> tuple[Device, ...]   (plan for another machine)

Importing this package is cheap and pure (the planner imports Device from it); the probes, which
load vendor libraries and run tools, are imported on first use.
"""

from __future__ import annotations

from typing import Any

from bostudio.hardware.device import GIB, MIB, Device, ProbeResult, device_from_json

__all__ = ["Device", "ProbeResult", "GIB", "MIB", "device_from_json", "discover_devices",
           "load_devices_file", "cross_check"]


def __getattr__(name: str) -> Any:
    # Plain imports (not importlib with a name in a string), so that tests/test_layering.py sees them.
    if name == "discover_devices":
        from bostudio.hardware.discover import discover_devices

        return discover_devices
    if name == "load_devices_file":
        from bostudio.hardware.files import load_devices_file

        return load_devices_file
    if name == "cross_check":
        from bostudio.hardware.crosscheck import cross_check

        return cross_check
    raise AttributeError(name)
