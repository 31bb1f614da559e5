"""Copies of a GGUF at another precision, made with the engine's own llama-quantize.

Two uses: a low-bit self-draft (pairing), and a full-precision copy (F32/F16) on which greedy output with
speculation on must equal the output with it off, token for token: on quantized weights the batched and
one-token kernels take different arithmetic paths, which differ from one CPU to the next.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

from bostudio.engine.discover import Engine
from bostudio.errors import ConfigError, EngineError
from bostudio.files import write_atomic

QUANTIZE_TIMEOUT_S = 1800.0
FULL_PRECISION = ("F32", "F16", "BF16")


def quantize(engine: Engine, source: Path, out: Path, qtype: str,
             timeout: float = QUANTIZE_TIMEOUT_S) -> Path:
    """Write `source` re-quantized to `qtype` at `out` (atomically: never a half file under that name)."""
    tool = engine.tool("llama-quantize")
    if tool is None:
        raise EngineError(f"no llama-quantize beside {engine.path}",
                          "build the engine with `bostudio engine build` (it builds llama-quantize too)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        proc = subprocess.run([str(tool), "--allow-requantize", str(source), str(tmp), qtype],
                              capture_output=True, text=True, errors="replace", timeout=timeout)
        if proc.returncode != 0 or not tmp.exists():
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            detail = next((ln for ln in reversed(lines) if "invalid" in ln.lower() or "error" in ln.lower()),
                          lines[-1] if lines else "no output")
            raise ConfigError(f"llama-quantize could not make a {qtype} copy: {detail.strip()}",
                              "use a type llama-quantize lists, e.g. F32, F16, Q8_0, Q4_K_M, Q2_K (IQ types "
                              "need an importance matrix)")
        tmp.replace(out)
    except subprocess.TimeoutExpired as exc:
        raise EngineError(f"llama-quantize took over {timeout:.0f} s", "try again on a quieter machine") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return out


COPIES_DIR = ".full-precision"  # hidden: catalogs, the daemon and pairing do not list these copies as models


def precision_copy_path(source: Path, qtype: str) -> Path:
    """Where the `qtype` copy of `source` lives: beside it, in a hidden folder, `NAME.QTYPE.gguf`."""
    stem = source.name[:-5] if source.name.lower().endswith(".gguf") else source.name
    return source.parent / COPIES_DIR / f"{stem}.{qtype.upper()}.gguf"


def _source_stamp(source: Path) -> str:
    st = source.stat()
    return f"{source.name}:{st.st_size}:{st.st_mtime_ns}"


def precision_copy(source: Path, engine: Engine, qtype: str = "F32",
                   log: Callable[[str], None] = print) -> Path:
    """`source` at `qtype` (F32 by default), beside it; made once, and again when the source changes.

    A stamp file beside the copy records the source's name, size and mtime; a copy whose stamp does not
    match the source as it is now is re-made, never used.
    """
    out = precision_copy_path(source, qtype)
    stamp = out.with_name(f".{out.name}.source")
    want = _source_stamp(source)
    if out.exists() and stamp.exists() and stamp.read_text() == want:
        return out
    log(f"making a {qtype} copy of {source.name} with llama-quantize ...")
    stamp.unlink(missing_ok=True)
    quantize(engine, source, out, qtype)
    write_atomic(stamp, want, mode=0o644)
    return out
