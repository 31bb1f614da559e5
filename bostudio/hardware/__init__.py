"""Hardware discovery: one probe per vendor, each returning the same Device data.

    discover_devices() -> ProbeResult(devices, problems)
    load_devices_file(path) -> tuple[Device, ...]   (plan for another machine)
"""

from __future__ import annotations

import json
from pathlib import Path

from bostudio.errors import ConfigError
from bostudio.hardware.device import GIB, MIB, Device, ProbeResult, device_from_json
from bostudio.hardware.discover import discover_devices
from bostudio.hardware.listdevices import ListedDevice, cross_check, parse_list_devices, run_list_devices

__all__ = ["Device", "ProbeResult", "GIB", "MIB", "discover_devices", "load_devices_file",
           "device_from_json", "parse_list_devices", "cross_check", "run_list_devices", "ListedDevice"]


def load_devices_file(path: Path) -> tuple[Device, ...]:
    """Devices from a JSON file: a list of device objects, or {"devices": [...]} as
    `bostudio devices --json` prints it."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read devices file {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
    if isinstance(data, dict):
        if "devices" not in data:
            raise ConfigError(f"{path}: expected a list of devices or an object with \"devices\"")
        data = data["devices"]
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path}: no devices in it", "give at least one device (and a cpu one for host RAM)")
    return tuple(device_from_json(d, where=f"{path} device {i}") for i, d in enumerate(data))
