"""Where things live: XDG config/cache/state dirs and the models dir. The one place that knows."""

from __future__ import annotations

import os
from pathlib import Path

APP = "bostudio"

# The repository (or installed package) root: pairings.toml and models/ sit here.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var, "")
    base = Path(value) if value and os.path.isabs(value) else Path.home() / default
    return base / APP


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config")


def cache_dir() -> Path:
    return _xdg("XDG_CACHE_HOME", ".cache")


def state_dir() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state")


def engines_dir() -> Path:
    """Built llama.cpp engines, one folder per (commit, backend, flags)."""
    return cache_dir() / "engines"


def source_dir() -> Path:
    """Downloaded llama-cpp-python sdists and their unpacked llama.cpp trees."""
    return cache_dir() / "src"


def logs_dir() -> Path:
    return state_dir() / "logs"


def models_dir() -> Path:
    """The project's own models dir (`models/` at the top level); BOSTUDIO_MODELS_DIR overrides."""
    value = os.environ.get("BOSTUDIO_MODELS_DIR")
    return Path(value) if value else PROJECT_ROOT / "models"


def systemd_user_dir() -> Path:
    """Where systemd looks for user units: $XDG_CONFIG_HOME/systemd/user."""
    return config_dir().parent / "systemd" / "user"


def launch_agents_dir() -> Path:
    """Where launchd looks for a user's agents (macOS)."""
    return Path.home() / "Library" / "LaunchAgents"
