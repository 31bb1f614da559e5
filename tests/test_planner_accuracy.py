"""The plan against llama.cpp's own numbers.

Small synthetic GGUFs (llama.cpp's `test-llama-archs -o`, plus NextN and draft variants written with
gguf-py) and the real Gemma 270M file are loaded in the real llama-server with the flags the plan
itself emits (`plan_args(Plan)`); the server's `-lv 4` buffer lines are parsed and held against the
plan: within 5% of the total and within 1% of the KV / recurrent-state bytes.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bostudio.gguf import ModelInfo, describe
from bostudio.engine.argv import plan_args
from bostudio.engine.discover import has_amx
from bostudio.hardware.device import GIB, Device
from bostudio.planner import MTP_SPEC, NGRAM_SPEC, NO_SPEC, Intent, Plan, plan
from bostudio.planner.fit import RUNTIME_OUTPUT
from bostudio.planner.memory import (MIB, ContextSettings, amx_host_weights, context_shape, kv_cache_bytes,
                                     recurrent_state_bytes)
from bostudio.planner.reported import ReportedMemory, parse_reported_memory
from bostudio.speculation import Speculator
from tests.synth_models import with_fewer_layers, with_nextn_layer, write_arch_models

pytestmark = pytest.mark.engine

HOST = (Device(vendor="cpu", backend="cpu", name="test host", total_bytes=64 * GIB, free_bytes=64 * GIB),)


def on_engine(devices: tuple[Device, ...], server: Path) -> tuple[Device, ...]:
    """The host as the engine's CPU backend sees it: with its AMX buffer type when the engine has one (a
    native build on an AMX CPU repacks host weights into it; Engine.amx)."""
    amx = has_amx(server.parent)
    return tuple(d.with_(cpu_amx=amx) if not d.is_gpu else d for d in devices)
ARCHS = ["llama", "qwen3", "qwen3moe", "gemma3", "qwen35", "granitehybrid", "mamba2", "deepseek2"]
# The log prints sizes with two decimals in MiB: a figure is exact to half of 0.01 MiB.
PRINT_ROUNDING = 0.005 * MIB


@pytest.fixture(scope="module")
def models(llama_server: Path, gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    out = tmp_path_factory.mktemp("archs")
    files = write_arch_models(llama_server.parent / "test-llama-archs", out, ARCHS)
    files["deepseek2-mtp"] = with_nextn_layer(files["deepseek2-moe"], out / "deepseek2-mtp.gguf")
    files["llama-draft"] = with_fewer_layers(files["llama-dense"], out / "llama-draft.gguf", 1)
    files["gemma-real"] = gemma_gguf
    return {name: describe(path) for name, path in files.items()}


def run_server(server: Path, model: Path, args: list[str], timeout: float = 60.0) -> str:
    """Start llama-server until it listens (or exits), stop it, return its log."""
    fd, log_path = tempfile.mkstemp(suffix=".log")
    try:
        with os.fdopen(fd, "w") as log:
            proc = subprocess.Popen([str(server), "-m", str(model), "--port", "0", "-lv", "4", "-t", "1",
                                     "--no-warmup", *args], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if "listening on" in Path(log_path).read_text(errors="replace") or proc.poll() is not None:
                    break
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait(timeout=10)
        return Path(log_path).read_text(errors="replace")
    finally:
        os.unlink(log_path)


@dataclass(frozen=True)
class Case:
    id: str
    model: str
    ctx: int
    cache: str = "f16"
    spec: str = "none"          # none | draft | mtp | ngram
    draft_cache: str = "f16"
    n_parallel: int = 4
    flash_attn: str = "auto"  # auto: the plan's choice (off on this CPU-only HOST, on with a quantized V cache)


CASES = [
    Case("llama-4k", "llama-dense", 4096),
    # flash attention asked on with an f16 cache (what a GPU gets): its compute buffer and unpadded V rows
    Case("llama-4k-fa", "llama-dense", 4096, flash_attn="on"),
    Case("gemma3-swa-4k-fa", "gemma3-dense", 4096, flash_attn="on"),
    Case("deepseek2-mla-4k-fa", "deepseek2-moe", 4096, flash_attn="on"),
    Case("gemma-real-4k-fa", "gemma-real", 4096, flash_attn="on"),
    Case("llama-16k-q8", "llama-dense", 16384, cache="q8_0"),
    Case("qwen3-8k-q4", "qwen3-dense", 8192, cache="q4_0", n_parallel=2),
    Case("moe-4k", "qwen3moe-moe", 4096),
    Case("moe-16k-q8", "qwen3moe-moe", 16384, cache="q8_0"),
    Case("llama-moe-8k", "llama-moe", 8192),
    Case("gemma3-swa-4k", "gemma3-dense", 4096),
    Case("gemma3-swa-16k-q8", "gemma3-dense", 16384, cache="q8_0", n_parallel=2),
    Case("qwen35-hybrid-4k", "qwen35-dense", 4096),
    Case("qwen35-hybrid-16k-np1", "qwen35-dense", 16384, n_parallel=1),
    Case("granite-hybrid-16k", "granitehybrid-dense", 16384),
    Case("mamba2-recurrent-4k", "mamba2-dense", 4096),
    Case("deepseek2-mla-4k", "deepseek2-moe", 4096),
    Case("deepseek2-mla-8k-q8", "deepseek2-moe", 8192, cache="q8_0"),
    Case("deepseek2-mtp-4k", "deepseek2-mtp", 4096, spec="mtp"),
    Case("deepseek2-mtp-8k-q8", "deepseek2-mtp", 8192, cache="q8_0", spec="mtp", draft_cache="q8_0"),
    Case("llama-draft-4k", "llama-dense", 4096, spec="draft", draft_cache="q8_0"),
    Case("llama-draft-16k-q8", "llama-dense", 16384, cache="q8_0", spec="draft"),
    Case("gemma-real-4k", "gemma-real", 4096),
    Case("gemma-real-16k-q8", "gemma-real", 16384, cache="q8_0"),
    Case("gemma-real-8k-draft", "gemma-real", 8192, spec="draft", draft_cache="q8_0"),
    # n-gram speculation: outputs sized for 64-token drafts, 260 logit rows of a 262k vocabulary
    Case("gemma-real-4k-ngram", "gemma-real", 4096, spec="ngram"),
]


def case_plan(case: Case, models: dict[str, ModelInfo], server: Path) -> tuple[Plan, list[str]]:
    """The plan for a case, and the llama-server args for it: the plan's memory flags plus the
    speculator's own flags, as the launcher adds them."""
    m = models[case.model]
    draft = (models["llama-draft"] if case.model == "llama-dense" else m) if case.spec == "draft" else None
    spec = {"none": NO_SPEC, "mtp": MTP_SPEC, "ngram": NGRAM_SPEC,
            "draft": Speculator("draft", ("draft-simple",), draft=draft.path if draft else None, n_max=8)}[case.spec]
    intent = Intent(ctx=case.ctx, speculation="on" if case.spec != "none" else "off",
                    cache_type_k=case.cache, cache_type_v=case.cache, n_parallel=case.n_parallel,
                    draft_cache_type_k=case.draft_cache, draft_cache_type_v=case.draft_cache,
                    flash_attn=case.flash_attn)
    p = plan(m, on_engine(HOST, server), intent, spec, draft)
    quant_v = "q" in case.cache or (case.spec in ("draft", "mtp") and "q" in case.draft_cache)
    want = case.flash_attn if case.flash_attn != "auto" else "on" if quant_v else "off"
    assert plan_args(p)[plan_args(p).index("-fa") + 1] == want  # always explicit, never llama.cpp's auto
    spec_args = ["--spec-type", ",".join(spec.spec_types)] if spec.kind != "none" else []
    spec_args += ["--spec-draft-n-max", str(spec.n_max)] if spec.n_max is not None else []
    spec_args += ["-md", str(spec.draft)] if spec.draft else []
    return p, plan_args(p) + spec_args


def predicted(p: Plan) -> dict[str, int]:
    o = p.chosen
    # The logits buffer grows only at the first drafted batch: the load log cannot show it.
    return {"total": o.total - o.component_bytes(RUNTIME_OUTPUT),
            "kv+rs": o.component_bytes("KV cache") + o.component_bytes("recurrent state"),
            "spec kv": o.component_bytes("draft KV cache") + o.component_bytes("MTP KV cache"),
            "weights": o.component_bytes("weights") + o.component_bytes("draft weights"),
            "compute": o.component_bytes("compute buffer") + o.component_bytes("draft compute buffer")
            + o.component_bytes("MTP compute buffer")}


def reported(rep: ReportedMemory) -> dict[str, int]:
    target = rep.contexts[0]
    spec = rep.contexts[1] if len(rep.contexts) > 1 else None
    return {"total": rep.total, "kv+rs": target.kv + target.rs,
            "spec kv": (spec.kv + spec.rs) if spec else 0,
            "weights": sum(sum(m.values()) for m in rep.models),
            "compute": sum(c.compute_total for c in rep.contexts)}


def measure(case: Case, models: dict[str, ModelInfo], server: Path) -> tuple[dict[str, int], dict[str, int], str]:
    p, args = case_plan(case, models, server)
    assert p.chosen.fits, p.chosen.reason
    log = run_server(server, models[case.model].path, args)
    rep = parse_reported_memory(log)
    assert rep.contexts, f"llama-server did not create a context:\n{log[-3000:]}"
    return predicted(p), reported(rep), log


def within(pred: int, rep: int, rel: float) -> bool:
    return abs(pred - rep) <= max(rel * rep, PRINT_ROUNDING)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_matches_llama_cpp(case: Case, models: dict[str, ModelInfo], llama_server: Path) -> None:
    pred, rep, log = measure(case, models, llama_server)
    expected_contexts = 2 if case.spec in ("draft", "mtp") else 1
    assert len(parse_reported_memory(log).contexts) == expected_contexts, "speculative context missing"
    assert within(pred["kv+rs"], rep["kv+rs"], 0.01), (pred, rep)
    assert within(pred["spec kv"], rep["spec kv"], 0.01), (pred, rep)
    assert within(pred["total"], rep["total"], 0.05), (pred, rep)


@dataclass(frozen=True)
class FormulaCase:
    id: str
    model: str
    args: tuple[str, ...]
    settings: ContextSettings


# Memory-level cases for settings the plan itself never emits: per-slot (non-unified) streams,
# --swa-full, and the recurrent state copies an EAGLE3/MTP/DFlash target keeps per draft position.
FORMULA_CASES = [
    FormulaCase("gemma3-np2-streams", "gemma3-dense", ("-c", "8192", "-np", "2"),
                ContextSettings(n_ctx=8192, n_parallel=2, kv_unified=False)),
    FormulaCase("gemma3-swa-full", "gemma3-dense", ("-c", "4096", "--swa-full"),
                ContextSettings(n_ctx=4096, swa_full=True)),
    FormulaCase("llama-fa-off-q8k", "llama-dense", ("-c", "4096", "-fa", "off", "-ctk", "q8_0"),
                ContextSettings(n_ctx=4096, flash_attn=False, cache_type_k="q8_0")),
    FormulaCase("qwen35-rs-per-draft-slot", "qwen35-dense",
                ("-c", "4096", "-np", "2", "--spec-type", "draft-eagle3", "--spec-draft-n-max", "3"),
                ContextSettings(n_ctx=4096, n_parallel=2, kv_unified=False, n_rs_seq=3)),
    FormulaCase("granite-rs-np1", "granitehybrid-dense", ("-c", "4096", "-np", "1"),
                ContextSettings(n_ctx=4096, n_parallel=1, kv_unified=False)),
]


@pytest.mark.parametrize("case", FORMULA_CASES, ids=[c.id for c in FORMULA_CASES])
def test_cache_formulas_match_llama_cpp(case: FormulaCase, models: dict[str, ModelInfo], llama_server: Path) -> None:
    m = models[case.model]
    rep = parse_reported_memory(run_server(llama_server, m.path, ["-fit", "off", *case.args]))
    target = rep.contexts[0]
    kv = kv_cache_bytes(m, case.settings)
    assert within(kv.total, target.kv, 0.01), (kv, target)
    assert within(recurrent_state_bytes(m, case.settings), target.rs, 0.01), target
    if target.kv_cells:  # the log counts cells per stream
        n_stream = context_shape(case.settings).n_stream
        assert sorted(target.kv_cells) == sorted(c // n_stream for c in (kv.cells_full, kv.cells_swa) if c)


def test_a_tight_plan_holds_in_llama_server(models: dict[str, ModelInfo], llama_server: Path) -> None:
    """Gemma on a host with 420 MiB to spare: the planner shrinks the context to fit, refuses the
    draft (and n-gram, whose 64-token drafts need 260 logit rows), and llama-server's own figures
    for the launched plan stay inside the budget."""
    gemma = models["gemma-real"]
    budget = 420 * MIB
    if has_amx(llama_server.parent):  # the AMX copies of its weights come on top: 214 MiB
        budget += amx_host_weights(gemma, 0)[1]
    host = on_engine((Device(vendor="cpu", backend="cpu", name="small host", total_bytes=budget + 100 * MIB,
                              free_bytes=budget + 100 * MIB),), llama_server)
    draft = Speculator("draft", ("draft-simple",), draft=gemma.path, n_max=8)
    p = plan(gemma, host, Intent(reserve=100 * MIB), draft, gemma)
    assert p.chosen is p.without_spec and "drops the draft" in p.why and "n-gram speculation does not fit" in p.why
    assert 4096 < p.chosen.n_ctx < gemma.n_ctx_train
    rep = parse_reported_memory(run_server(llama_server, gemma.path, plan_args(p)))
    assert rep.total <= budget
    assert within(p.chosen.total, rep.total, 0.05)
