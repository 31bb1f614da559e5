"""Engine discovery and build cache, against the real built llama-server and recorded tool output."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bostudio.engine import amx as amx_module
from bostudio.engine import build as build_module
from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.engine.build import (PORTABLE_ENV, PORTABLE_FLAGS, BuiltEngine, backend_flags, build_engine, build_step,
                                   cache_key, is_current_default, portable_requested)
from bostudio.engine.discover import Engine, choose_engine, parse_devices, parse_help, parse_version
from bostudio.hardware.device import EngineDevice
from bostudio.errors import BuildError
from bostudio.speculation import Speculator

CUDA_LIST_DEVICES = """\
ggml_cuda_init: found 2 CUDA devices:
  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes
Available devices:
  CUDA0: NVIDIA GeForce RTX 4090 (24076 MiB, 23565 MiB free)
  CUDA1: NVIDIA GeForce RTX 3060 (12044 MiB, 11800 MiB free)
  Vulkan0: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 24000 MiB free)
"""


def test_parse_version_and_devices() -> None:
    info = parse_version("version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n")
    assert info == {"version": "0.5.0-dev", "build": 1, "commit": "0c1e570",
                    "compiler": "GNU 12.2.0", "target": "Linux x86_64"}
    devs = parse_devices(CUDA_LIST_DEVICES)
    assert [(d.name, d.backend, d.total_mib, d.free_mib) for d in devs] == [
        ("CUDA0", "cuda", 24076, 23565), ("CUDA1", "cuda", 12044, 11800), ("Vulkan0", "vulkan", 24560, 24000)]
    assert devs[2].description == "AMD Radeon RX 7900 XTX (RADV NAVI31)"
    assert parse_devices("Available devices:\n  (none)\n") == ()


def test_probe_the_built_engine(engine: Engine) -> None:
    assert engine.usable
    assert engine.version != "unknown" and engine.commit != "unknown"
    assert "cpu" in engine.backends
    for t in ("draft-simple", "draft-mtp", "ngram-mod", "draft-dflash", "draft-eagle3"):
        assert t in engine.spec_types
    assert engine.supports("--spec-draft-n-max") and not engine.supports("--draft-max")
    for tool in ("llama-quantize", "llama-fit-params"):
        assert engine.tool(tool) is not None


def test_engine_list_json(engine: Engine) -> None:
    out = subprocess.run([sys.executable, "-m", "bostudio", "engine", "list", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    data = json.loads(out)
    chosen = [e for e in data if e["chosen"]]
    assert len(chosen) == 1
    assert chosen[0]["path"] == str(engine.path)
    assert "ngram-mod" in chosen[0]["spec_types"]


def test_llama_server_env_is_listed_and_preferred(engine: Engine, tmp_path: Path) -> None:
    # A copy of the binary named by LLAMA_SERVER (its libs found through the build's RPATH) is
    # listed beside the built one, and on equal devices the user's explicit choice wins.
    copy = tmp_path / "llama-server"
    shutil.copy2(engine.path, copy)
    env = dict(os.environ, LLAMA_SERVER=str(copy))
    out = subprocess.run([sys.executable, "-m", "bostudio", "engine", "list", "--json"],
                         capture_output=True, text=True, timeout=60, env=env, check=True).stdout
    data = {e["path"]: e for e in json.loads(out)}
    assert data[str(copy)]["source"] == "env" and data[str(copy)]["chosen"]
    assert data[str(engine.path)]["source"] == "built"


def test_portable_variant_is_cached_apart_and_ranked_below_the_default_build() -> None:
    commit = "0c1e57098bba0000"
    native = BuiltEngine(cache_key(commit, "cpu", []), Path("/e/a"), "cpu", commit, "0.3.36", (), 0.0)
    flags = list(PORTABLE_FLAGS)
    portable = BuiltEngine(cache_key(commit, "cpu", flags), Path("/e/b"), "cpu", commit, "0.3.36", tuple(flags), 0.0)
    stale = BuiltEngine("0c1e57098bba-cpu-0000000000", Path("/e/c"), "cpu", commit, "0.3.36", (), 0.0)
    assert portable.key != native.key
    assert is_current_default(native)
    assert not is_current_default(portable)  # a variant
    assert not is_current_default(stale)  # built with other base flags
    assert portable_requested({PORTABLE_ENV: "1"}) and not portable_requested({PORTABLE_ENV: "0"})
    assert not portable_requested({})
    default = Engine(Path("/a"), "built", flags=frozenset({"--spec-type"}))
    other = Engine(Path("/b"), "built-other", flags=frozenset({"--spec-type"}))
    on_path = Engine(Path("/c"), "path", flags=frozenset({"--spec-type"}))
    assert choose_engine([other, on_path, default]) is default
    assert choose_engine([on_path, other]) is other


def test_choose_prefers_gpu_then_explicit() -> None:
    cpu_built = Engine(Path("/a"), "built", flags=frozenset({"--spec-type"}))
    cpu_env = Engine(Path("/b"), "env", flags=frozenset({"--spec-type"}))
    gpu_path = Engine(Path("/c"), "path", devices=(EngineDevice("CUDA0", "x", 24000, 23000, "cuda"),))
    broken = Engine(Path("/d"), "env", problem="no --spec-type")
    assert choose_engine([cpu_built, cpu_env]) is cpu_env
    assert choose_engine([cpu_built, cpu_env, gpu_path, broken]) is gpu_path


def test_a_software_device_counts_as_no_gpu_when_choosing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Vulkan build that sees only lavapipe (GGML_VK_VISIBLE_DEVICES=0) or nothing never displaces the CPU
    build: it runs where it is named (--engine, LLAMA_SERVER). One that sees a real GPU is chosen."""
    spec = frozenset({"--spec-type", "--rpc"})
    cpu = Engine(Path("/cpu"), "built", backends=("cpu", "rpc"), flags=spec)
    lavapipe = EngineDevice("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 7940, 7940, "vulkan")
    vk_soft = Engine(Path("/vk"), "built", backends=("cpu", "rpc", "vulkan"), devices=(lavapipe,), flags=spec)
    vk_none = Engine(Path("/vk2"), "built", backends=("cpu", "rpc", "vulkan"), flags=spec)
    radv = EngineDevice("Vulkan0", "AMD Radeon RX 7900 XTX (RADV NAVI31)", 24560, 23512, "vulkan")
    vk_gpu = Engine(Path("/vk3"), "built", backends=("cpu", "rpc", "vulkan"), devices=(radv,), flags=spec)
    assert lavapipe.software and not radv.software
    for order in ([vk_soft, vk_none, cpu], [cpu, vk_soft, vk_none]):
        assert choose_engine(order) is cpu
    assert choose_engine([cpu, vk_soft, vk_gpu]) is vk_gpu
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES", raising=False)
    assert any("GGML_VK_VISIBLE_DEVICES" in n for n in vk_none.notes())
    assert any("software device" in n for n in vk_soft.notes()) and vk_gpu.notes() == ()


def test_llama_server_on_a_software_device_runs_without_vulkan_graph_optimisation() -> None:
    """lavapipe crashed in a queue submission on batches of ~9-32 tokens with ggml-vulkan's graph optimisation
    (every chat request's first prompt): an engine that sees a software device starts llama-server with it off,
    a user's own value is kept, a real GPU keeps it on, and the base environment is copied, not changed."""
    lavapipe = EngineDevice("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 7940, 7940, "vulkan")
    radv = EngineDevice("Vulkan0", "AMD Radeon RX 7900 XTX (RADV NAVI31)", 24560, 23512, "vulkan")
    base = {"PATH": "/bin", "LLAMA_API_KEY": "k"}
    soft = Engine(Path("/vk"), "built", backends=("cpu", "vulkan"), devices=(lavapipe,)).server_env(base)
    assert soft == {**base, "GGML_VK_DISABLE_GRAPH_OPTIMIZE": "1"} and "GGML_VK_DISABLE_GRAPH_OPTIMIZE" not in base
    mixed = Engine(Path("/vk"), "built", devices=(radv, lavapipe)).server_env(
        {**base, "GGML_VK_DISABLE_GRAPH_OPTIMIZE": "0"})
    assert mixed["GGML_VK_DISABLE_GRAPH_OPTIMIZE"] == "0"
    assert Engine(Path("/vk3"), "built", devices=(radv,)).server_env(base) == base
    assert Engine(Path("/cpu"), "built").server_env(base) == base


def test_second_build_returns_the_cached_engine_without_compiling(engine: Engine, monkeypatch) -> None:
    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a cached engine was built again: {args[0] if args else kwargs}")

    problem = build_module.amx_problem()  # the AMX probe compiles and runs before any cmake
    monkeypatch.setattr(build_module, "amx_problem", lambda: problem)
    monkeypatch.setattr(build_module.subprocess, "run", no_build)  # cmake configure
    monkeypatch.setattr(build_module.subprocess, "Popen", no_build)  # cmake --build
    built = build_engine("cpu", log=lambda m: None)
    assert built.server.exists()
    assert built.key == cache_key(built.commit, "cpu", list(built.flags))


def test_build_progress_follows_the_outer_build_not_a_nested_one() -> None:
    """The Vulkan build runs vulkan-shaders-gen's own ninja ([1/2], [2/2]) inside the outer [28/552]: the
    progress stays on the outer count, so a log does not say 100% with most of the build to go."""
    lines = ["[27/552] Building C object ggml/src/ggml.c.o", "[28/552] Performing build step for 'vulkan-shaders-gen'",
             "[1/2] Building CXX object CMakeFiles/vulkan-shaders-gen.dir/vulkan-shaders-gen.cpp.o",
             "[2/2] Linking CXX executable vulkan-shaders-gen", "ggml_vulkan: Generating and compiling shaders to SPIR-V",
             "[29/552] Building CXX object src/llama.cpp.o", "[552/552] Linking CXX executable bin/llama-server"]
    steps, total = [], 0
    for line in lines:
        step = build_step(line, total)
        if step is not None:
            total = step[1]
            steps.append(step)
    assert steps == [(27, 552), (28, 552), (29, 552), (552, 552)]
    assert build_step("[ 42%] Building CXX object x.o", 0) == (42, 100)  # make


def test_cpu_reports_amx_reads_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Xeon\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n")
    assert amx_module.cpu_reports_amx(info)
    info.write_text("model name\t: EPYC\nflags\t\t: fpu avx2 avx512f\n")
    assert not amx_module.cpu_reports_amx(info)
    assert not amx_module.cpu_reports_amx(tmp_path / "missing")


def test_the_amx_probe_names_a_compiler_that_fails_and_passes_without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(amx_module, "cpu_reports_amx", lambda: True)
    why = amx_module.amx_problem(env={"CXX": "/bin/false", "PATH": os.environ["PATH"]})
    assert why.startswith("/bin/false could not compile"), why
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    assert build_module.with_compiler_flags([], amx_module.amx_flags(why)) == [
        f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    # into the Vulkan compat header's CMAKE_CXX_FLAGS, not beside it (a second -D would drop the -I)
    assert build_module.with_compiler_flags(["-DGGML_VULKAN=ON", "-DCMAKE_CXX_FLAGS=-I/c"], amx_module.amx_flags(why)) \
        == ["-DGGML_VULKAN=ON", f"-DCMAKE_CXX_FLAGS=-I/c {no_amx}", f"-DCMAKE_C_FLAGS={no_amx}"]
    monkeypatch.setattr(amx_module, "cpu_reports_amx", lambda: False)
    assert amx_module.amx_problem() == "" and amx_module.amx_flags("") == ()


def test_the_no_amx_flags_win_over_march_native() -> None:
    """Explicit -mno-amx-* flags leave __AMX_INT8__ undefined even before -march=native, as CMake orders them
    (CMAKE_CXX_FLAGS, then ggml's -march=native): ggml-cpu compiles its AMX kernels only with it. (The engine
    build needs c++, so the suite has one; off x86 there is no AMX and the flags are never added.)"""
    if platform.machine() not in ("x86_64", "AMD64"):
        assert not amx_module.cpu_reports_amx()
        return
    out = subprocess.run(["c++", *amx_module.NO_AMX_FLAGS, "-march=native", "-dM", "-E", "-x", "c++", "-"],
                         input="", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "__AMX_INT8__" not in out.stdout and "__AMX_TILE__" not in out.stdout


def test_the_built_engine_carries_no_amx_kernels_that_crash_here(engine: Engine) -> None:
    """Where the CPU reports AMX and the compiler drops ggml's tile configuration (GCC 12), the engine that
    `engine build` made has no AMX kernels; elsewhere this holds because there is nothing to leave out."""
    assert not (engine.amx and amx_module.amx_problem()), engine.path


def test_a_built_engine_with_amx_kernels_that_die_here_is_not_used(engine: Engine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from bostudio.engine import discover
    monkeypatch.setattr(discover, "cpu_reports_amx", lambda: True)  # an AMX CPU, on any CPU
    monkeypatch.setattr(discover, "has_amx", lambda bin_dir: True)
    monkeypatch.setattr(discover, "cached_amx_problem", lambda cache: "SIGILL in the probe")
    ours = discover.probe_engine(engine.path, "built")
    assert not ours.usable and "SIGILL in the probe" in (ours.problem or "")
    assert "bostudio engine build" in (ours.problem or "")
    assert discover.probe_engine(engine.path, "env").usable  # someone else's build: its compiler is unknown


def test_cache_key_depends_on_commit_backend_flags() -> None:
    keys = {cache_key("abc", "cpu", []), cache_key("abd", "cpu", []), cache_key("abc", "cuda", []),
            cache_key("abc", "cuda", ["-DGGML_CUDA=ON"])}
    assert len(keys) == 4


def test_argv_spec_types() -> None:
    _, flags = parse_help(Path(__file__).with_name("data").joinpath("llama-server-help.txt").read_text())
    m = Path("/m/x.gguf")
    off = build_argv(Path("/bin/llama-server"), flags, LaunchSpec(m, "x", 8080))
    assert off[off.index("--spec-type") + 1] == "none"
    draft = build_argv(Path("/bin/llama-server"), flags, LaunchSpec(
        m, "x", 8080, speculator=Speculator("draft", ("draft-simple",), draft=Path("/d.gguf"), n_max=8)))
    # -md alone would not turn speculation on: the type must be explicit.
    assert draft[draft.index("--spec-type") + 1] == "draft-simple"
    assert draft[draft.index("-md") + 1] == "/d.gguf"
    assert draft[draft.index("--spec-draft-n-max") + 1] == "8"
    assert "--host" in draft and draft[draft.index("--host") + 1] == "127.0.0.1"


@pytest.mark.parametrize("backend, needle", [
    ("cuda", "CUDA Toolkit"),
    ("hip", "ROCm"),
    ("sycl", "oneAPI"),
    ("vulkan", "Vulkan SDK"),
    ("metal", "macOS"),
])
def test_missing_toolchain_is_named(backend: str, needle: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bostudio.engine.build.ROCM_DIRS", ())
    monkeypatch.setattr("bostudio.engine.build.VULKAN_HEADERS", ())
    with pytest.raises(BuildError) as err:
        backend_flags(backend, env={"PATH": "/nonexistent"})
    assert needle in err.value.hint or needle in err.value.message


def test_old_vulkan_headers_get_the_compat_header_and_one_cache_key(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian 12's Vulkan headers (1.3.239) lack VK_EXT_layer_settings, which the pinned ggml-vulkan uses:
    the build puts bostudio's compat header first on the include path; newer headers build as they are."""
    (tmp_path / "bin").mkdir()
    glslc = tmp_path / "bin" / "glslc"
    glslc.write_text("#!/bin/sh\n")
    glslc.chmod(0o755)
    inc = tmp_path / "include" / "vulkan"
    inc.mkdir(parents=True)
    (inc / "vulkan.h").write_text("")
    monkeypatch.setattr("bostudio.engine.build.VULKAN_HEADERS", (inc / "vulkan.h",))
    env = {"PATH": str(tmp_path / "bin")}
    (inc / "vulkan_core.h").write_text("#define VK_HEADER_VERSION 239\n")
    old, _ = backend_flags("vulkan", env=env)
    assert old == ["-DGGML_VULKAN=ON", f"-DCMAKE_CXX_FLAGS=-I{build_module.VULKAN_COMPAT_DIR}"]
    assert (build_module.VULKAN_COMPAT_DIR / "vulkan" / "vulkan.hpp").is_file()
    (inc / "vulkan_core.h").write_text("#define VK_HEADER_VERSION 290\n#define VK_EXT_layer_settings 1\n")
    assert backend_flags("vulkan", env=env)[0] == ["-DGGML_VULKAN=ON"]
    # the compat dir's place on disk (a venv, a checkout) is not part of the build's identity
    here = cache_key("abc", "vulkan", old)
    moved = [f.replace(str(build_module.VULKAN_COMPAT_DIR), "/elsewhere/vulkan_compat") for f in old]
    monkeypatch.setattr(build_module, "VULKAN_COMPAT_DIR", Path("/elsewhere/vulkan_compat"))
    assert cache_key("abc", "vulkan", moved) == here != cache_key("abc", "vulkan", ["-DGGML_VULKAN=ON"])
    # an engine built from another checkout records that checkout's path in its flags: still the same build
    other = [f.replace("/elsewhere/vulkan_compat", "/work/wt-other/bostudio/engine/vulkan_compat") for f in moved]
    assert cache_key("abc", "vulkan", other) == here


def test_backend_flags_with_toolchain(tmp_path: Path) -> None:
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text("#!/bin/sh\n")
    fake_nvcc.chmod(0o755)
    flags, _ = backend_flags("cuda", env={"PATH": str(tmp_path)})
    assert "-DGGML_CUDA=ON" in flags and f"-DCMAKE_CUDA_COMPILER={fake_nvcc}" in flags
    # No nvidia-smi: no GPU to detect, so the architectures are named instead of "native".
    assert any(f.startswith("-DCMAKE_CUDA_ARCHITECTURES=") for f in flags)
    assert backend_flags("cpu", env={})[0] == []
