"""The user's config.toml, read for any part of bostudio: each part reads its own `[table]` and checks its
own keys (`[catalog]` in catalog.config, `[pull]` in pairing.edge.fetch, `[guardrails]`, `[workload]`, `[[rpc]]`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from bostudio import paths
from bostudio.errors import ConfigError


def read_config(path: Path | None = None) -> dict:
    """The parsed config.toml (default: paths.config_file()); {} when there is none."""
    path = path or paths.config_file()
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}", "fix the TOML syntax or remove the file") from exc


def config_table(name: str, path: Path | None = None) -> dict:
    """The `[name]` table of config.toml (default: paths.config_file()); {} when the file or table is missing.
    Bad TOML or a `name` that is not a table is a ConfigError naming the file."""
    path = path or paths.config_file()
    table = read_config(path).get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: `{name}` must be a table", f"write it as [{name}]")
    return table
