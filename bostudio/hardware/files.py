"""Devices from a JSON file: plan for another machine ("a 24 GiB GPU")."""

from __future__ import annotations

import json
from pathlib import Path

from bostudio.errors import ConfigError
from bostudio.hardware.device import Device, device_from_json


def load_devices_file(path: Path) -> tuple[Device, ...]:
    """A list of device objects, or {"devices": [...]} as `bostudio devices --json` prints it."""
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
