"""Caps on what a plan may put on a device, from config.toml:

    [devices.Vulkan0]
    budget_mib = 400     # plan at most 400 MiB on Vulkan0, whatever it reports free

A device is named as `bostudio devices` labels it (the engine's name, CPU for host RAM). The cap
becomes the device's `budget_bytes`, which the planner keeps to (as an RPC worker's budget_mib).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from bostudio import paths
from bostudio.config import config_table
from bostudio.errors import ConfigError
from bostudio.hardware.device import MIB, Device

_KEYS = ("budget_mib",)


def device_budgets(path: Path | None = None) -> dict[str, int]:
    """Label -> cap in bytes, from config.toml's [devices.LABEL] tables. Bad values are ConfigErrors."""
    where = path or paths.config_file()
    out: dict[str, int] = {}
    for label, table in config_table("devices", path).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [devices] {label} must be a table",
                              f"write it as [devices.{label}] with budget_mib = N")
        for key in table:
            if key not in _KEYS:
                near = difflib.get_close_matches(key, _KEYS, n=1)
                raise ConfigError(f"{where}: unknown key `{key}` in [devices.{label}]",
                                  f"did you mean `{near[0]}`?" if near else f"valid keys: {', '.join(_KEYS)}")
        mib = table.get("budget_mib")
        if mib is None:
            continue
        if isinstance(mib, bool) or not isinstance(mib, (int, float)) or mib <= 0:
            raise ConfigError(f"{where}: [devices.{label}] budget_mib must be a positive number of MiB, got {mib!r}",
                              "e.g. budget_mib = 4096")
        out[label] = int(mib * MIB)
    return out


def apply_budgets(devices: tuple[Device, ...], budgets: dict[str, int]) -> tuple[tuple[Device, ...], tuple[str, ...]]:
    """The devices with each cap applied (the smaller of a cap and a budget already set), and a note
    for each cap that names no device here."""
    labels = {d.label for d in devices}
    out = tuple(d.with_(budget_bytes=cap if d.budget_bytes is None else min(cap, d.budget_bytes))
                if (cap := budgets.get(d.label)) is not None else d for d in devices)
    notes = tuple(f"config: [devices.{label}] caps a device this machine does not list "
                  f"(devices: {', '.join(sorted(labels))})" for label in budgets if label not in labels)
    return out, notes
