"""Whole-file writes (bostudio.files) and local ports (bostudio.runtime.net): the helpers every part shares."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from bostudio.errors import ConfigError, PortInUseError
from bostudio.files import write_atomic
from bostudio.runtime.net import check_port_free, free_loopback_port, is_loopback


def test_write_atomic_makes_the_folder_and_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "state.json"
    write_atomic(path, "first ü\n")
    assert path.read_text(encoding="utf-8") == "first ü\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the owner's only, unless asked
    write_atomic(path, "second", mode=0o644)
    assert path.read_text(encoding="utf-8") == "second" and stat.S_IMODE(path.stat().st_mode) == 0o644
    write_atomic(path, "third")  # a file keeps its mode
    assert path.read_text(encoding="utf-8") == "third" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]  # no temporary file left


def test_write_atomic_leaves_the_old_file_when_the_write_fails(tmp_path: Path) -> None:
    path = tmp_path / "table.toml"
    write_atomic(path, "old")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "half \udc80 written")  # a lone surrogate cannot be encoded: fails mid-write
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.toml"]


def test_ports() -> None:
    assert 0 < free_loopback_port() < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # a port that stays taken while the check runs (no race with other tests)
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is already in use"):
            check_port_free("127.0.0.1", port)
    with pytest.raises(ConfigError, match="out of range"):
        check_port_free("127.0.0.1", 70000)
    assert is_loopback("127.0.0.2") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
