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


def data_dir() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share")


def drafts_dir() -> Path:
    """Draft models bostudio made (self-drafts from `bostudio pair --self-draft`)."""
    return data_dir() / "drafts"


def logs_dir() -> Path:
    return state_dir() / "logs"


def models_dir() -> Path:
    """The project's own models dir (`models/` at the top level); BOSTUDIO_MODELS_DIR overrides."""
    value = os.environ.get("BOSTUDIO_MODELS_DIR")
    return Path(value) if value else PROJECT_ROOT / "models"


def config_file() -> Path:
    """The user's config file (TOML)."""
    return config_dir() / "config.toml"


def catalog_index_file() -> Path:
    """The catalog's cache of described models, keyed by (path, size, mtime)."""
    return cache_dir() / "catalog.json"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, as huggingface-hub finds it (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/...)."""
    value = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if value:
        return Path(value).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def lmstudio_models_dirs() -> list[Path]:
    """LM Studio's models dirs: LMSTUDIO_MODELS_DIR, else ~/.lmstudio/models and the older ~/.cache/lm-studio/models."""
    value = os.environ.get("LMSTUDIO_MODELS_DIR")
    if value:
        return [Path(value).expanduser()]
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def ollama_models_dirs() -> list[Path]:
    """Ollama's store (manifests/ + blobs/): OLLAMA_MODELS, else the user's and the Linux service's."""
    value = os.environ.get("OLLAMA_MODELS")
    if value:
        return [Path(value).expanduser()]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def systemd_user_dir() -> Path:
    """Where systemd looks for user units: $XDG_CONFIG_HOME/systemd/user."""
    return config_dir().parent / "systemd" / "user"


def launch_agents_dir() -> Path:
    """Where launchd looks for a user's agents (macOS)."""
    return Path.home() / "Library" / "LaunchAgents"
