"""The daemon's pid/state file under the XDG state dir, written atomically, and the reaping of
children a killed daemon left behind (identified by pid + create time, never by name)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bostudio import paths
from bostudio.files import write_atomic
from bostudio.runtime.process import process_matches, reap_group


@dataclass(frozen=True)
class ChildRecord:
    name: str
    pid: int
    create_time: float
    port: int


@dataclass(frozen=True)
class DaemonRecord:
    pid: int
    create_time: float
    host: str
    port: int
    started: float  # wall clock
    version: str
    children: tuple[ChildRecord, ...] = field(default=())

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else ("::1" if self.host == "::" else self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


def state_path() -> Path:
    return paths.state_dir() / "daemon.json"


def daemon_log_path() -> Path:
    return paths.logs_dir() / "daemon.log"


def instance_log_path(name: str) -> Path:
    return paths.logs_dir() / "instances" / f"{name}.log"


def save(record: DaemonRecord, path: Path | None = None) -> None:
    write_atomic(path or state_path(), json.dumps(asdict(record), indent=2) + "\n")


def load(path: Path | None = None) -> DaemonRecord | None:
    """The recorded daemon, or None when there is no (readable) state file."""
    try:
        data = json.loads((path or state_path()).read_text())
        children = tuple(ChildRecord(**c) for c in data.pop("children", ()))
        return DaemonRecord(**data, children=children)
    except (OSError, ValueError, TypeError):
        return None


def running(path: Path | None = None) -> DaemonRecord | None:
    """The recorded daemon if that very process (pid + create time) is still alive."""
    rec = load(path)
    if rec is not None and process_matches(rec.pid, rec.create_time) is not None:
        return rec
    return None


def reap_leftovers(rec: DaemonRecord) -> list[ChildRecord]:
    """Stop every child a dead daemon recorded that is still the same process. Returns those reaped."""
    return [c for c in rec.children if reap_group(c.pid, c.create_time)]


def remove(path: Path | None = None) -> None:
    try:
        (path or state_path()).unlink()
    except FileNotFoundError:
        pass
