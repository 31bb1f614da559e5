"""Whether a native build may keep ggml's AMX kernels on this machine.

ggml-cpu/amx/mmq.cpp (the pinned llama.cpp) configures the AMX tiles from a local struct that it passes to
`_tile_loadconfig`. GCC 12 (Debian 12's 12.2.0) treats that struct's stores as dead at -O3: the built
code loads a configuration with palette 1 and no rows, so the first AMX matmul stops at `tilezero` with
SIGILL. Seen on a 2-core Xeon that reports amx_tile/amx_int8: llama-server died at its first decode, CPU
and Vulkan builds alike (objdump shows only the palette byte stored before `ldtilecfg`). So before a
native build on a CPU that reports AMX, the build's compiler compiles and runs that set-up the way ggml
writes it (PROBE_SOURCE); when it does not run cleanly, the build leaves AMX out (NO_AMX_FLAGS: explicit
-mno-* flags win over -march=native) and says why. A compiler that keeps the stores keeps AMX.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bostudio.files import write_atomic

AMX_PROBE_CACHE = "amx-probe.json"  # beside the engines: what cached_amx_problem found
NO_AMX_FLAGS = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")

# ggml-cpu/amx/mmq.cpp's tile_config_t and ggml_tile_config_init, then one tile instruction.
PROBE_SOURCE = r"""
#include <cstdint>
#include <immintrin.h>
#include <unistd.h>
#include <sys/syscall.h>
struct tile_config_t {
    uint8_t palette_id = 0;
    uint8_t start_row = 0;
    uint8_t reserved_0[14] = {0};
    uint16_t colsb[16] = {0};
    uint8_t rows[16] = {0};
};
static inline void tile_config_init() {
    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    for (int i = 0; i < 8; i++) { tc.rows[i] = 16; tc.colsb[i] = 64; }
    _tile_loadconfig(&tc);
}
int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) return 2;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    tile_config_init();
    _tile_zero(4);
    _tile_release();
    return 0;
}
"""


def cpu_reports_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU reports AMX tiles and AMX-INT8 (what ggml's AMX kernels use); False off Linux."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return "amx_tile" in flags and "amx_int8" in flags


def _compiler(env: dict[str, str]) -> str:
    """The C++ compiler CMake would take: $CXX, else c++ on PATH."""
    return env.get("CXX") or shutil.which("c++", path=env.get("PATH")) or "c++"


def amx_problem(env: dict[str, str] | None = None, timeout: float = 60.0) -> str:
    """Why ggml's AMX kernels would not run from a native build here ('' when they would, or when the CPU
    has no AMX and a native build leaves them out anyway)."""
    env = dict(os.environ if env is None else env)
    if not cpu_reports_amx():
        return ""
    cxx = _compiler(env)
    with tempfile.TemporaryDirectory(prefix="bostudio-amx-") as tmp:
        src, exe = Path(tmp, "probe.cpp"), Path(tmp, "probe")
        src.write_text(PROBE_SOURCE)
        try:
            built = subprocess.run([cxx, "-O3", "-march=native", str(src), "-o", str(exe)],
                                   capture_output=True, text=True, timeout=timeout)
            if built.returncode != 0:
                return f"{cxx} could not compile ggml's AMX tile set-up: {built.stderr.strip()[-300:]}"
            ran = subprocess.run([str(exe)], capture_output=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"the AMX probe did not run: {e}"
    if ran.returncode < 0:
        return (f"ggml's AMX tile set-up, compiled by {cxx} -O3, dies with signal {-ran.returncode} here "
                "(GCC 12 drops the tile configuration's stores)")
    if ran.returncode != 0:
        return f"the kernel refused AMX tile data to the probe (exit {ran.returncode})"
    return ""


def cached_amx_problem(cache: Path) -> str:
    """amx_problem, remembered in `cache` (JSON) for this compiler (path, size, mtime) and CPU, so that
    discovery, which asks it of every AMX engine that bostudio built, compiles the probe once per machine."""
    if not cpu_reports_amx():
        return ""
    cxx = _compiler(dict(os.environ))
    try:
        st = Path(cxx).stat()
        cpu = next((ln for ln in Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
                    if ln.startswith("model name")), "")
    except OSError:
        return amx_problem()
    ident = f"{cxx} {st.st_size} {st.st_mtime_ns} {cpu}"
    try:
        saved = json.loads(cache.read_text())
        if isinstance(saved, dict) and saved.get("ident") == ident and isinstance(saved.get("problem"), str):
            return saved["problem"]
    except (OSError, ValueError):
        pass
    problem = amx_problem()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps({"ident": ident, "problem": problem}))
    except OSError:
        pass
    return problem


def amx_flags(problem: str) -> tuple[str, ...]:
    """Compiler flags that leave ggml's AMX kernels out of a native build, given amx_problem's answer."""
    return NO_AMX_FLAGS if problem else ()
