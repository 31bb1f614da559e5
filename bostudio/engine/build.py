"""Build llama-server (and llama-quantize, llama-fit-params, rpc-server) from the pinned llama.cpp source.

One CMake build per (llama.cpp commit, backend, flags), cached under the XDG cache dir. It builds
shared libraries too, so the Python bindings load the engine's libllama (LLAMA_CPP_LIB_PATH)
instead of compiling llama.cpp a second time.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bostudio import paths
from bostudio.display import Progress
from bostudio.engine.amx import amx_flags, amx_problem
from bostudio.engine.source import LlamaSource, ensure_source
from bostudio.errors import BuildError
from bostudio.files import write_atomic

BACKENDS = ("cpu", "cuda", "hip", "sycl", "metal", "vulkan")

# What every build needs: shared libs (for the bindings), the server and tools, no downloads.
BASE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_BUILD_TESTS=ON",  # test-llama-archs writes random small models for tests
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # would fetch UI assets from a hub at build time
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_CCACHE=OFF",
    "-DGGML_RPC=ON",  # the RPC backend: llama-server --rpc, and rpc-server for worker machines
)

# The portable variant: ggml's default instruction set for the architecture (on x86-64: SSE4.2, AVX, AVX2,
# FMA, F16C, no AVX-512) instead of -march=native. It is cached under a key of its own, and `engine list`
# ranks it below the native build, so it runs only where it is asked for (LLAMA_SERVER=... or --engine).
PORTABLE_FLAGS = ("-DGGML_NATIVE=OFF",)
PORTABLE_ENV = "BOSTUDIO_ENGINE_PORTABLE"

TARGETS = ("llama-server", "llama-quantize", "llama-fit-params", "test-llama-archs", "ggml-rpc-server")

MANIFEST = "engine.json"
RPC_SERVER = "ggml-rpc-server"  # tools/rpc: exposes this machine's devices to another's llama-server --rpc

# Where toolkits install off PATH.
ROCM_DIRS: tuple[str, ...] = ("/opt/rocm/bin",)
VULKAN_HEADERS: tuple[Path, ...] = (Path("/usr/include/vulkan/vulkan.h"),)
# What a Vulkan build needs on Debian/Ubuntu (scripts/setup.sh installs them for BOSTUDIO_BACKEND=vulkan):
# headers and loader, the shader compiler, SPIR-V headers, and Mesa's drivers (lavapipe: a software
# device, so a machine without a GPU still has one to run on). Debian 12's versions build the pinned
# llama.cpp; glslc 2023.2 lacks the optional coopmat/int-dot/bf16 extensions, which CMake then skips.
# vulkan-tools: vulkaninfo, from which the planner reads a device's largest buffer (bostudio.hardware.vulkan).
VULKAN_DEBIAN_PACKAGES = ("libvulkan-dev", "glslc", "spirv-headers", "mesa-vulkan-drivers", "vulkan-tools")
# Headers older than 1.3.261 (Debian 12's 1.3.239) lack VK_EXT_layer_settings, whose types ggml-vulkan.cpp
# uses unconditionally: this directory's vulkan/vulkan.hpp declares them (see the header for why that is safe).
VULKAN_COMPAT_DIR = Path(__file__).with_name("vulkan_compat")
_COMPAT_PATH = re.compile(r"(?<=-I)\S*/bostudio/engine/vulkan_compat(?=\s|$)")
_COMPAT_KEY = "<vulkan-compat>"  # the compat dir in a cache key: the same build wherever bostudio is installed
# Measured cold builds (docs/vulkan.md): CPU 4.6-5.0 min, Vulkan 7.1 min (its shaders) on a quiet 2-core machine;
# slower CPUs and a busy machine take two to four times as long.
BUILD_TIME = {"cpu": "a CPU build takes about 5-10 minutes", "vulkan": "a Vulkan build takes about 7-15 minutes"}


def _which_any(names: tuple[str, ...], env: dict[str, str], extra_dirs: tuple[str, ...] = ()) -> str | None:
    """The first of `names` on env's PATH or in `extra_dirs` (toolkits that install off PATH)."""
    search = os.pathsep.join([env.get("PATH", ""), *extra_dirs])
    for name in names:
        found = shutil.which(name, path=search)
        if found:
            return found
    return None


def backend_flags(backend: str, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """CMake flags and extra environment for `backend`. Raises BuildError naming what to install."""
    env = dict(os.environ if env is None else env)
    extra_env: dict[str, str] = {}
    system = platform.system()
    if backend == "cpu":
        return [], extra_env
    if backend == "cuda":
        cuda_home = [f"{env[v]}/bin" for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)]
        nvcc = env.get("CUDACXX") or _which_any(("nvcc",), env, tuple(cuda_home))
        if not nvcc:
            raise BuildError("the CUDA backend needs nvcc, the CUDA compiler, and none was found",
                             "install the NVIDIA CUDA Toolkit (e.g. `apt install nvidia-cuda-toolkit`) "
                             "or put its bin/ on PATH, then run again")
        flags = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
        archs = env.get("CMAKE_CUDA_ARCHITECTURES")
        if archs:
            flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={archs}")
        elif not _which_any(("nvidia-smi",), env):
            # No GPU to detect ("native" would fail): cover Turing..Hopper and Blackwell.
            flags.append("-DCMAKE_CUDA_ARCHITECTURES=75-virtual;80-virtual;86-real;89-real;90-real")
        return flags, extra_env
    if backend == "hip":
        rocm = tuple(f"{env[v]}/bin" for v in ("ROCM_PATH",) if env.get(v)) + ROCM_DIRS
        hipconfig = _which_any(("hipconfig",), env, rocm)
        if not hipconfig or not _which_any(("hipcc",), env, rocm):
            raise BuildError("the HIP (ROCm) backend needs hipcc and hipconfig, and they were not found",
                             "install ROCm (https://rocm.docs.amd.com, packages `rocm-hip-sdk`) "
                             "and put /opt/rocm/bin on PATH")
        llvm = subprocess.run([hipconfig, "-l"], capture_output=True, text=True).stdout.strip()
        rocm_root = subprocess.run([hipconfig, "-R"], capture_output=True, text=True).stdout.strip()
        extra_env = {"HIPCXX": f"{llvm}/clang", "HIP_PATH": rocm_root}
        flags = ["-DGGML_HIP=ON"]
        if env.get("GPU_TARGETS"):
            flags.append(f"-DGPU_TARGETS={env['GPU_TARGETS']}")
        return flags, extra_env
    if backend == "sycl":
        if not (_which_any(("icx",), env) and _which_any(("icpx",), env)):
            raise BuildError("the SYCL backend needs the oneAPI compilers icx/icpx, and they were not found",
                             "install the Intel oneAPI Base Toolkit and run "
                             "`source /opt/intel/oneapi/setvars.sh` in this shell first")
        return ["-DGGML_SYCL=ON", "-DCMAKE_C_COMPILER=icx", "-DCMAKE_CXX_COMPILER=icpx"], extra_env
    if backend == "metal":
        if system != "Darwin":
            raise BuildError(f"the Metal backend only builds on macOS (this is {system})",
                             "use --backend cpu, cuda, hip, sycl or vulkan on this machine")
        if not _which_any(("xcrun",), env):
            raise BuildError("the Metal backend needs the Xcode command line tools",
                             "run `xcode-select --install`")
        return ["-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"], extra_env
    if backend == "vulkan":
        missing = []
        if not _which_any(("glslc",), env):
            missing.append("glslc (shader compiler)")
        headers = list(VULKAN_HEADERS)
        if env.get("VULKAN_SDK"):
            headers.append(Path(env["VULKAN_SDK"]) / "include" / "vulkan" / "vulkan.h")
        if not any(h.exists() for h in headers):
            missing.append("the Vulkan headers and loader")
        if missing:
            raise BuildError("the Vulkan backend needs " + " and ".join(missing) + ", not found",
                             "install the Vulkan SDK (LunarG) or on Debian/Ubuntu "
                             f"`apt install {' '.join(VULKAN_DEBIAN_PACKAGES)}`")
        found = next(h for h in headers if h.exists())
        flags = ["-DGGML_VULKAN=ON"]
        if "VK_EXT_layer_settings" not in _read(found.with_name("vulkan_core.h")):
            flags.append(f"-DCMAKE_CXX_FLAGS=-I{VULKAN_COMPAT_DIR}")
        return flags, extra_env
    raise BuildError(f"unknown backend {backend!r}", "choose one of: " + ", ".join(BACKENDS))


def detect_backend(env: dict[str, str] | None = None) -> str:
    """The backend for this machine's GPU, when its toolkit is installed too; else cpu."""
    env = dict(os.environ if env is None else env)
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "metal"
    smi = _which_any(("nvidia-smi",), env)
    if smi:
        try:
            gpus = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            gpus = ""
        if "GPU" in gpus and (env.get("CUDACXX") or _which_any(("nvcc",), env)):
            return "cuda"
    if Path("/dev/kfd").exists() and _which_any(("hipcc",), env, ROCM_DIRS):
        return "hip"
    return "cpu"


def _check_base_toolchain(env: dict[str, str]) -> None:
    missing = [p for p in ("cmake",) if not _which_any((p,), env)]
    if not _which_any(("c++", "g++", "clang++"), env):
        missing.append("a C++ compiler")
    if missing:
        raise BuildError("building llama.cpp needs " + " and ".join(missing),
                         "install them, e.g. `apt install cmake build-essential` (Debian/Ubuntu) "
                         "or `xcode-select --install` (macOS)")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def cache_key(commit: str, backend: str, flags: list[str]) -> str:
    # The compat dir wherever it was (this install, or the checkout an engine was built from: its flags record
    # that path) is one identity, so an engine built from another checkout is still the default build.
    flags = [_COMPAT_PATH.sub(_COMPAT_KEY, f.replace(str(VULKAN_COMPAT_DIR), _COMPAT_KEY)) for f in flags]
    digest = hashlib.sha256("\n".join([backend, *BASE_FLAGS, *flags]).encode()).hexdigest()[:10]
    return f"{commit[:12]}-{backend}-{digest}"


@dataclass(frozen=True)
class BuiltEngine:
    key: str
    dir: Path
    backend: str
    commit: str
    version: str  # llama-cpp-python version whose source was built
    flags: tuple[str, ...]
    build_seconds: float

    @property
    def bin_dir(self) -> Path:
        return self.dir / "build" / "bin"

    @property
    def server(self) -> Path:
        return self.bin_dir / "llama-server"

    def tool(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def has_rpc(self) -> bool:
        """Built with the RPC backend (GGML_RPC=ON): its ggml-rpc-server is there."""
        return self.tool(RPC_SERVER).exists()


def read_manifest(engine_dir: Path) -> BuiltEngine | None:
    try:
        data = json.loads((engine_dir / MANIFEST).read_text())
        eng = BuiltEngine(key=data["key"], dir=engine_dir, backend=data["backend"],
                          commit=data["commit"], version=data["version"], flags=tuple(data["flags"]),
                          build_seconds=float(data.get("build_seconds", 0.0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return eng if eng.server.exists() else None


def built_engines() -> list[BuiltEngine]:
    root = paths.engines_dir()
    if not root.is_dir():
        return []
    found = [read_manifest(d) for d in sorted(root.iterdir()) if d.is_dir()]
    return [e for e in found if e is not None]


_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")  # ninja
_PROGRESS_MAKE = re.compile(r"^\[\s*(\d+)%\]")  # make


def build_step(line: str, total: int) -> tuple[int, int] | None:
    """(done, total) of the build from one line of its output, or None. `total`: the largest total seen so far.
    A step count with a smaller total is a nested build's (the Vulkan backend builds vulkan-shaders-gen as
    an ExternalProject with its own ninja, [1/2] [2/2], in the middle of the outer [28/552]): following it
    would show 100% with ten minutes to go and, in a log, nothing more until the end."""
    m = _PROGRESS.match(line)
    if m:
        done, of = int(m.group(1)), int(m.group(2))
        return (done, of) if of >= total else None
    m = _PROGRESS_MAKE.match(line)
    return (int(m.group(1)), 100) if m else None


def with_compiler_flags(flags: list[str], extra: tuple[str, ...]) -> list[str]:
    """`flags` with `extra` added to CMAKE_C_FLAGS and CMAKE_CXX_FLAGS, into the ones already there (the Vulkan
    compat header's -I) rather than beside them, where the later -D would win."""
    out = list(flags)
    for var in ("CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"):
        prefix = f"-D{var}="
        i = next((k for k, f in enumerate(out) if f.startswith(prefix)), None)
        if i is None:
            out.append(prefix + " ".join(extra))
        else:
            out[i] = " ".join([out[i], *extra])
    return out


def portable_requested(env: dict[str, str] | None = None) -> bool:
    """Whether $BOSTUDIO_ENGINE_PORTABLE asks for the portable variant (1/yes/true/on)."""
    value = (os.environ if env is None else env).get(PORTABLE_ENV, "")
    return value.strip().lower() in ("1", "yes", "true", "on")


def is_current_default(eng: BuiltEngine) -> bool:
    """Built with today's base flags and not as a variant: what `engine build` makes by default."""
    return (cache_key(eng.commit, eng.backend, list(eng.flags)) == eng.key
            and not any(f in PORTABLE_FLAGS for f in eng.flags))


def build_engine(backend: str = "cpu", jobs: int | None = None, source: LlamaSource | None = None,
                 log: Callable[[str], None] = print, force: bool = False,
                 portable: bool | None = None) -> BuiltEngine:
    """Build (or return the cached) engine for `backend`; `portable` (default: $BOSTUDIO_ENGINE_PORTABLE)
    builds without -march=native."""
    if backend not in BACKENDS and backend != "auto":
        raise BuildError(f"unknown backend {backend!r}", "choose one of: " + ", ".join(BACKENDS))
    if backend == "auto":
        backend = detect_backend()
        log(f"auto-detected backend: {backend}")
    flags, extra_env = backend_flags(backend)
    if portable_requested() if portable is None else portable:
        flags = [*flags, *PORTABLE_FLAGS]
    elif backend != "metal" and (problem := amx_problem()):
        log(f"leaving ggml's AMX kernels out of this build: {problem}")
        flags = with_compiler_flags(flags, amx_flags(problem))
    _check_base_toolchain(dict(os.environ))
    src = source or ensure_source(log=log)
    key = cache_key(src.commit, backend, flags)
    engine_dir = paths.engines_dir() / key
    if not force:
        cached = read_manifest(engine_dir)
        if cached is not None:
            return cached

    engine_dir.mkdir(parents=True, exist_ok=True)
    (engine_dir / MANIFEST).unlink(missing_ok=True)
    build_dir = engine_dir / "build"
    log_path = engine_dir / "build.log"
    env = dict(os.environ, **extra_env)
    # The source tree sits inside the sdist's own git metadata, so build-info reads the right commit.
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(src.root), "-B", str(build_dir), *generator, *BASE_FLAGS, *flags]
    jobs = jobs or os.cpu_count() or 2
    compile_cmd = ["cmake", "--build", str(build_dir), "--parallel", str(jobs),
                   "--target", *TARGETS]
    variant = " (portable: no -march=native)" if any(f in PORTABLE_FLAGS for f in flags) else ""
    if any(str(VULKAN_COMPAT_DIR) in f for f in flags):
        log("the Vulkan headers here lack VK_EXT_layer_settings (older than 1.3.261, as Debian 12's 1.3.239): "
            f"building with bostudio's compat header ({VULKAN_COMPAT_DIR})")
    log(f"building llama.cpp {src.short_commit} for {backend}{variant} with {jobs} jobs "
        f"(log: {log_path}); {BUILD_TIME.get(backend, f'a {backend} build (its kernels) takes 15 minutes or more')} on 2 quiet cores, longer when busy")
    started = time.monotonic()
    with open(log_path, "w") as logf:
        logf.write("$ " + " ".join(configure) + "\n")
        logf.flush()
        proc = subprocess.run(configure, stdout=logf, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            raise BuildError(f"CMake configure failed for the {backend} backend: "
                             f"{_last_error(log_path)}", f"see the full log: {log_path}")
        logf.write("$ " + " ".join(compile_cmd) + "\n")
        logf.flush()
        progress = Progress("building llama.cpp")
        total = 0
        with subprocess.Popen(compile_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env, text=True, bufsize=1) as p:
            assert p.stdout is not None
            for line in p.stdout:
                logf.write(line)
                step = build_step(line, total)
                if step is not None:
                    total = step[1]
                    progress.update(step[0], step[1], line.split()[-1])
            rc = p.wait()
        progress.finish()
        if rc != 0:
            raise BuildError(f"compiling llama.cpp failed: {_last_error(log_path)}",
                             f"see the full log: {log_path}")
    seconds = time.monotonic() - started
    manifest = {"key": key, "backend": backend, "commit": src.commit, "version": src.version,
                "flags": flags, "base_flags": list(BASE_FLAGS), "build_seconds": round(seconds, 1), "source": str(src.root)}
    write_atomic(engine_dir / MANIFEST, json.dumps(manifest, indent=2))
    eng = read_manifest(engine_dir)
    if eng is None:
        raise BuildError("the build finished but llama-server is missing", f"see {log_path}")
    log(f"built {eng.server} in {seconds / 60:.1f} min")
    return eng


def _last_error(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    for line in reversed(lines):
        if "error" in line.lower():
            return line.strip()[:300]
    return (lines[-1].strip() if lines else "no output")[:300]
