"""User mistakes get one line saying what is wrong and what to do, a non-zero exit, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netutil import free_port

GEMMA = "gemma-3-270m-q4_k_m"  # the small fixture, named: the default model is the larger Qwen2.5-Coder-1.5B


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bostudio", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or dict(os.environ))


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("bostudio: ")
    assert "(hint: " in line
    for needle in needles:
        assert needle in line, line
    return line


def test_missing_model(tmp_state: Path) -> None:
    proc = run_cli("up", str(tmp_state / "nope.gguf"), "--port", str(free_port()))
    assert_one_line_error(proc, "not found")


def test_unknown_name_lists_what_exists(tmp_state: Path, gemma_gguf: Path) -> None:
    proc = run_cli("up", "no-such-model", "--port", str(free_port()))
    assert_one_line_error(proc, "no-such-model", "gemma-3-270m-q4_k_m")


@pytest.mark.parametrize("keep_bytes", [5_000_000, 150_000_000])  # in the vocab; in the tensor data
def test_truncated_gguf(tmp_state: Path, gemma_gguf: Path, keep_bytes: int) -> None:
    bad = tmp_state / "truncated.gguf"
    with open(gemma_gguf, "rb") as src, open(bad, "wb") as dst:
        dst.write(src.read(keep_bytes))
    proc = run_cli("up", str(bad), "--port", str(free_port()))
    assert_one_line_error(proc, "truncated.gguf")


def test_not_a_gguf(tmp_state: Path) -> None:
    bad = tmp_state / "notes.gguf"
    bad.write_text("just some text, not a model\n")
    proc = run_cli("up", str(bad), "--port", str(free_port()))
    assert_one_line_error(proc, "notes.gguf")


def test_busy_port(tmp_state: Path, gemma_gguf: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_cli("up", GEMMA, "--port", str(port))
    assert_one_line_error(proc, f"port {port}", "--port")


@pytest.mark.parametrize("value", ["turbo", "draft:", "ngram-mod,,x"])
def test_unknown_spec_value(tmp_state: Path, gemma_gguf: Path, value: str) -> None:
    proc = run_cli("up", GEMMA, "--spec", value, "--port", str(free_port()))
    assert_one_line_error(proc, "--spec")


def test_missing_draft_file(tmp_state: Path, gemma_gguf: Path) -> None:
    proc = run_cli("up", GEMMA, "--spec", f"draft:{tmp_state / 'nodraft.gguf'}", "--port", str(free_port()))
    assert_one_line_error(proc, "nodraft.gguf")


def test_missing_toolchain_names_what_to_install(tmp_state: Path) -> None:
    # A PATH without nvcc: the CUDA build must say to install the CUDA toolkit, before any download.
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + "/nonexistent"
    env["XDG_CACHE_HOME"] = str(tmp_state / "cache")
    proc = run_cli("engine", "build", "--backend", "cuda", env=env)
    assert_one_line_error(proc, "nvcc", "CUDA Toolkit")
    assert not (tmp_state / "cache" / "bostudio" / "src").exists()


def test_help_lists_commands_and_each_has_help() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    for cmd in ("up", "engine", "default-model"):
        assert cmd in proc.stdout
    for args in (("up", "--help"), ("engine", "build", "--help"), ("engine", "list", "--help")):
        sub = run_cli(*args)
        assert sub.returncode == 0 and "usage:" in sub.stdout
