"""The planner as a specification: KV formulas as a table, the laws as property tests, the choice
and its reasons, the CLI, and the planner's purity."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bostudio.cli import main
from bostudio.errors import ConfigError, PlanError
from bostudio.engine.argv import plan_args
from bostudio.gguf import ModelInfo, describe
from bostudio.hardware.device import GIB, MIB, Device
from bostudio.planner import (CACHE_TYPES, MTP_SPEC, NO_SPEC, ContextSettings, Intent, kv_cache_bytes,
                              largest_ctx, memory_uses, plan, recurrent_state_bytes)
from bostudio.planner.memory import cache_type, context_shape, weight_split
from bostudio.speculation import NGRAM, Speculator
from bostudio.gguf.synth import tiny_llama


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    return describe(tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", n_layer=2))


def shape(base: ModelInfo, *, n_layer: int = 32, n_embd: int = 4096, n_head: int = 32, n_head_kv: int = 8,
          head_dim: int = 128, n_ff: int = 14336, n_vocab: int = 128256, layer_bytes: int = 200 * MIB,
          embd_bytes: int = 500 * MIB, n_ctx_train: int = 131072, swa: tuple[bool, ...] = (), window: int = 0,
          recurrent: tuple[bool, ...] = (), mla: bool = False, n_nextn: int = 0, path: str = "model.gguf",
          **extra: object) -> ModelInfo:
    """A model shape for the formulas: a described tiny llama with its numbers replaced."""
    n_block = n_layer + n_nextn
    return replace(
        base, path=Path(path), n_block=n_block, n_layer=n_layer, n_nextn=n_nextn, n_embd=n_embd,
        n_head=(n_head,) * n_block, n_head_kv=(n_head_kv,) * n_block, n_ff=(n_ff,) * n_block,
        head_dim_k=head_dim, head_dim_v=head_dim, head_dim_k_swa=head_dim, head_dim_v_swa=head_dim,
        n_vocab=n_vocab, layer_bytes=(layer_bytes,) * n_block, token_embd_bytes=embd_bytes,
        output_bytes=embd_bytes, other_bytes=MIB, n_ctx_train=n_ctx_train,
        swa_layers=swa or (False,) * n_block, sliding_window=window,
        recurrent_layers=recurrent or (False,) * n_block,
        key_length_mla=192 if mla else None, value_length_mla=128 if mla else None,
        kv_lora_rank=512 if mla else None, has_mtp=bool(n_nextn), matmul_bytes_by_type=(), **extra)


# ---------------------------------------------------------------- formulas as a table

@pytest.mark.parametrize("name,block,size", [
    ("f32", 1, 4), ("f16", 1, 2), ("bf16", 1, 2), ("q8_0", 32, 34), ("q4_0", 32, 18), ("q4_1", 32, 20),
    ("iq4_nl", 32, 18), ("q5_0", 32, 22), ("q5_1", 32, 24)])
def test_cache_types_have_ggml_block_sizes(name: str, block: int, size: int) -> None:
    t = CACHE_TYPES[name]
    assert (t.block_size, t.type_size) == (block, size)
    assert t.row_bytes(4096) == 4096 // block * size


def test_unknown_cache_type_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="q3_0") as exc:
        cache_type("q3_0")
    assert "q8_0" in exc.value.hint


KV_TABLE = [
    # (case, model overrides, settings, K bytes, V bytes)
    ("llama-8B f16 8k", {}, ContextSettings(n_ctx=8192), 32 * 8192 * 1024 * 2, 32 * 8192 * 1024 * 2),
    ("q8_0 K / q4_0 V", {}, ContextSettings(n_ctx=8192, cache_type_k="q8_0", cache_type_v="q4_0"),
     32 * 8192 * 1024 * 34 // 32, 32 * 8192 * 1024 * 18 // 32),
    ("ctx padded to 256", {}, ContextSettings(n_ctx=1000), 32 * 1024 * 1024 * 2, 32 * 1024 * 1024 * 2),
    ("3 slots, own streams", {}, ContextSettings(n_ctx=10000, n_parallel=3, kv_unified=False),
     32 * 3 * 3584 * 1024 * 2, 32 * 3 * 3584 * 1024 * 2),
    ("MLA keeps K only", {"mla": True, "n_head_kv": 1, "head_dim": 576, "n_layer": 61},
     ContextSettings(n_ctx=32768), 61 * 32768 * 576 * 2, 0),
    ("SWA 5:1, window 512, 4 unified slots", {"n_layer": 6, "n_head_kv": 1, "head_dim": 256, "window": 512,
                                              "swa": (True,) * 5 + (False,)},
     ContextSettings(n_ctx=32768), (32768 + 5 * 2560) * 256 * 2, (32768 + 5 * 2560) * 256 * 2),
    ("SWA with --swa-full", {"n_layer": 6, "n_head_kv": 1, "head_dim": 256, "window": 512,
                             "swa": (True,) * 5 + (False,)},
     ContextSettings(n_ctx=32768, swa_full=True), 6 * 32768 * 512, 6 * 32768 * 512),
    ("hybrid: recurrent layers have no KV", {"n_layer": 4, "recurrent": (True, True, True, False)},
     ContextSettings(n_ctx=4096), 4096 * 1024 * 2, 4096 * 1024 * 2),
]


@pytest.mark.parametrize("case,over,s,k,v", KV_TABLE, ids=[c[0] for c in KV_TABLE])
def test_kv_cache_formula(base: ModelInfo, case: str, over: dict, s: ContextSettings, k: int, v: int) -> None:
    kv = kv_cache_bytes(shape(base, **over), s)
    assert (kv.k, kv.v) == (k, v)


def test_recurrent_state_matches_the_reference_example(base: ModelInfo) -> None:
    # Qwen3-Next-80B-like: d_conv 4, 16 K heads x 128, 32 V heads x 128 -> n_embd_r 24576, n_embd_s 524288
    m = shape(base, n_layer=4, recurrent=(True, True, True, False), ssm_d_conv=4, ssm_d_inner=4096,
              ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=32, architecture="qwen3next")
    per_row = (24576 + 524288) * 4  # 2.19 MB per recurrent layer per sequence
    assert recurrent_state_bytes(m, ContextSettings(n_ctx=4096, n_parallel=1)) == 3 * per_row
    # MTP/EAGLE3/DFlash keep one copy per draft position: rows = n_seq x (1 + n_rs_seq)
    assert recurrent_state_bytes(m, ContextSettings(n_ctx=4096, n_parallel=2, n_rs_seq=3)) == 3 * per_row * 8
    assert recurrent_state_bytes(m, ContextSettings(n_ctx=4096)) == recurrent_state_bytes(m, ContextSettings(n_ctx=65536))


def test_weight_split_follows_ngl(base: ModelInfo) -> None:
    m = shape(base, n_layer=4, layer_bytes=100, embd_bytes=1000)
    assert weight_split(m, 0).gpu == 0
    assert weight_split(m, 1).gpu == 1000 + MIB  # -ngl 1: only the output layer
    full = weight_split(m, 5)
    assert (full.gpu, full.cpu, full.gpu_layers) == (4 * 100 + 1000 + MIB, 1000, 4)  # embeddings stay home


# ---------------------------------------------------------------- laws (property tests)

model_params = st.fixed_dictionaries({
    "n_layer": st.integers(1, 48), "n_head_kv": st.integers(1, 16), "head_dim": st.sampled_from([64, 128, 256]),
    "n_embd": st.sampled_from([512, 2048, 4096]), "n_ff": st.sampled_from([1024, 8192, 14336]),
    "n_vocab": st.sampled_from([32000, 151936, 262144]), "layer_bytes": st.integers(1 * MIB, 800 * MIB),
    "window": st.sampled_from([0, 512, 4096]),
})
cache_names = st.sampled_from(["f16", "q8_0", "q4_0", "bf16"])
spec_kinds = st.sampled_from(["none", "ngram", "draft", "mtp"])
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def build(base: ModelInfo, p: dict) -> ModelInfo:
    swa = tuple((il % 6) != 5 for il in range(p["n_layer"] + 1)) if p["window"] else ()
    return shape(base, swa=swa, n_nextn=1, **p)


def draft_spec(info: ModelInfo, n_max: int = 8) -> Speculator:
    return Speculator("draft", ("draft-simple",), draft=info.path, n_max=n_max)


def speculator(kind: str, base: ModelInfo) -> tuple[Speculator, ModelInfo | None]:
    """A speculator of this kind, and the draft's header for a draft."""
    if kind == "draft":
        info = shape(base, n_layer=2, layer_bytes=20 * MIB, path="draft.gguf")
        return draft_spec(info), info
    types = {"none": (), "ngram": NGRAM, "mtp": ("draft-mtp",)}[kind]
    return Speculator(kind, types, n_max=3 if kind == "mtp" else None), None


@SETTINGS
@given(p=model_params, cache=cache_names, kind=spec_kinds, np_=st.integers(1, 8), fa=st.booleans(),
       c1=st.integers(1, 512), c2=st.integers(1, 512))
def test_memory_never_decreases_as_context_grows(base: ModelInfo, p: dict, cache: str, kind: str, np_: int,
                                                  fa: bool, c1: int, c2: int) -> None:
    m = build(base, p)
    lo, hi = sorted((c1 * 256, c2 * 256))
    devs = (Device("nvidia", "cuda", "gpu", 0, 24 * GIB), Device("cpu", "cpu", "host", 0, 64 * GIB))
    intent = Intent(cache_type_k=cache, cache_type_v=cache, n_parallel=np_, flash_attn="on" if fa or cache != "f16" else "off")
    spec, draft = speculator(kind, base)
    for ngl in (0, m.n_layer // 2, m.n_block + 1):
        small, _ = memory_uses(m, devs, intent, spec, lo, ngl, draft)
        large, _ = memory_uses(m, devs, intent, spec, hi, ngl, draft)
        for key in {(u.device, u.component) for u in small + large}:
            a = sum(u.bytes for u in small if (u.device, u.component) == key)
            b = sum(u.bytes for u in large if (u.device, u.component) == key)
            assert a <= b, (key, lo, hi)


gpus = st.lists(st.integers(2, 96), min_size=0, max_size=3)


@SETTINGS
@given(p=model_params, gpu_gib=gpus, host_gib=st.integers(4, 256), reserve_mib=st.integers(0, 4096),
       kind=spec_kinds, cache=cache_names, ctx=st.one_of(st.none(), st.integers(1, 256).map(lambda k: k * 512)),
       unified=st.booleans())
def test_a_plan_never_exceeds_budget_minus_reserve(base: ModelInfo, p: dict, gpu_gib: list[int], host_gib: int,
                                                    reserve_mib: int, kind: str, cache: str, ctx: int | None,
                                                    unified: bool) -> None:
    m = build(base, p)
    # unified: an Apple-style GPU whose memory is the host's RAM
    devs = tuple(Device("apple" if unified else "nvidia", "metal" if unified else "cuda", f"gpu{i}", i, g * GIB,
                        unified=unified) for i, g in enumerate(gpu_gib)) + (
        Device("cpu", "cpu", "host", 0, host_gib * GIB),)
    intent = Intent(ctx=ctx, reserve=reserve_mib * MIB, cache_type_k=cache, cache_type_v=cache)
    pl = plan(m, devs, intent, *speculator(kind, base))
    for option in (pl.chosen, pl.without_spec, pl.with_spec):
        if option is None or not option.fits:
            continue
        for d in devs:
            assert option.device_bytes(d.label) <= max(0, d.usable_bytes - reserve_mib * MIB)
        if unified and gpu_gib:
            shared = sum(option.device_bytes(d.label) for d in devs)
            assert shared <= max(0, host_gib * GIB - reserve_mib * MIB)
        if ctx is not None:
            assert option.n_ctx == ctx


@SETTINGS
@given(p=model_params, gpu_gib=gpus, host_gib=st.integers(4, 128), cache=cache_names,
       draft_cache=cache_names)
def test_dropping_the_draft_never_lowers_the_largest_context(base: ModelInfo, p: dict, gpu_gib: list[int],
                                                              host_gib: int, cache: str, draft_cache: str) -> None:
    m = build(base, p)
    devs = tuple(Device("nvidia", "cuda", f"gpu{i}", i, g * GIB) for i, g in enumerate(gpu_gib)) + (
        Device("cpu", "cpu", "host", 0, host_gib * GIB),)
    intent = Intent(cache_type_k=cache, cache_type_v=cache, draft_cache_type_k=draft_cache,
                    draft_cache_type_v=draft_cache)
    spec, draft = speculator("draft", base)
    for ngl in (0, m.n_layer // 2, m.n_layer + 1):
        assert largest_ctx(m, list(devs), intent, NO_SPEC, ngl) >= largest_ctx(m, list(devs), intent, spec, ngl, draft)
    pl = plan(m, devs, intent, spec, draft)
    assert pl.with_spec is not None
    if pl.with_spec.fits:
        assert pl.without_spec.fits
        if pl.with_spec.n_gpu_layers == pl.without_spec.n_gpu_layers:
            assert pl.without_spec.n_ctx >= pl.with_spec.n_ctx


# ---------------------------------------------------------------- the choice

GPU24 = (Device("nvidia", "cuda", "RTX 4090", 0, 24 * GIB, engine_name="CUDA0"), Device("cpu", "cpu", "host", 0, 64 * GIB))


def test_auto_keeps_a_draft_that_leaves_the_minimum_context(base: ModelInfo) -> None:
    target = shape(base, n_layer=32, layer_bytes=140 * MIB)  # an 8B at ~4.5 bits: ~5 GiB
    info = shape(base, n_layer=16, n_embd=2048, layer_bytes=25 * MIB, path="d.gguf")
    p = plan(target, GPU24, Intent(), draft_spec(info), info)
    assert p.chosen is p.with_spec and p.chosen.n_ctx >= 32768
    assert p.chosen.n_gpu_layers == 33 and p.chosen.n_gpu_layers_draft == 17
    assert "keeps the draft" in p.why
    # the cost is what the draft adds at the context it runs with (16 layers x 8 KV heads x 128 x f16)
    spec_total = sum(u.bytes for u in memory_uses(target, GPU24, Intent(), draft_spec(info), p.chosen.n_ctx, 33, info)[0])
    base_total = sum(u.bytes for u in memory_uses(target, GPU24, Intent(), NO_SPEC, p.chosen.n_ctx, 33)[0])
    assert p.spec_cost_bytes == spec_total - base_total
    assert p.spec_cost_bytes > 16 * 8 * 128 * 2 * 2 * p.chosen.n_ctx  # at least the draft's KV cache
    assert p.spec_cost_tokens > 0 and p.without_spec.n_ctx > p.with_spec.n_ctx
    assert p.cost_line.startswith("the draft d.gguf costs ") and "tokens of context" in p.cost_line
    assert p.chosen.speculator == draft_spec(info)  # what to launch
    args = plan_args(p)
    assert args[args.index("-c") + 1] == str(p.chosen.n_ctx)
    assert args[args.index("-ngld") + 1] == "17"
    for flag in ("-ngl", "-ctk", "-ctv", "-ctkd", "-ctvd", "-kvu", "-np"):
        assert flag in args


def test_auto_falls_back_when_the_draft_eats_the_context(base: ModelInfo) -> None:
    target = shape(base, n_layer=48, layer_bytes=380 * MIB)  # ~18 GiB of weights on a 24 GiB card
    info = shape(base, n_layer=24, layer_bytes=60 * MIB, path="d.gguf")
    p = plan(target, GPU24, Intent(), draft_spec(info), info)
    assert p.with_spec is not None and p.chosen is not p.with_spec
    assert p.chosen.speculator.kind == "ngram"
    assert "drops the draft d.gguf" in p.why and "GiB" in p.why and "tokens of context" in p.why
    assert p.without_spec.n_ctx >= 32768
    # with the model's own MTP head, the fallback is MTP
    mtp_model = replace(target, n_block=49, n_nextn=1, has_mtp=True, layer_bytes=(380 * MIB,) * 49,
                        n_head=(32,) * 49, n_head_kv=(8,) * 49, n_ff=(14336,) * 49,
                        swa_layers=(False,) * 49, recurrent_layers=(False,) * 49)
    assert plan(mtp_model, GPU24, Intent(), draft_spec(info), info).chosen.speculator == MTP_SPEC


def test_spec_on_that_does_not_fit_is_a_plan_error(base: ModelInfo) -> None:
    target = shape(base, n_layer=48, layer_bytes=380 * MIB)
    info = shape(base, n_layer=24, layer_bytes=200 * MIB, path="d.gguf")
    with pytest.raises(PlanError, match="does not fit"):
        plan(target, (Device("cpu", "cpu", "host", 0, 24 * GIB),), Intent(ctx=131072, speculation="on"),
             draft_spec(info), info)


def test_mtp_needs_nextn_layers(base: ModelInfo) -> None:
    with pytest.raises(PlanError, match="no MTP"):
        plan(shape(base, n_layer=8), GPU24, Intent(), MTP_SPEC)


def _fa(p) -> str:  # type: ignore[no-untyped-def]
    args = plan_args(p)
    return args[args.index("-fa") + 1]


def test_flash_attention_is_always_chosen_off_on_a_cpu_alone_on_with_a_gpu(base: ModelInfo) -> None:
    """llama-server's own auto is on for a CPU, where it is slower: the plan always passes -fa."""
    m = shape(base, n_layer=8, n_ctx_train=32768)
    cpu = plan(m, (Device("cpu", "cpu", "host", 0, 64 * GIB),), Intent(), NO_SPEC)
    assert (cpu.intent.flash_attn, _fa(cpu)) == ("off", "off") and "CPU only" in cpu.flash_attn_why
    gpu = plan(m, GPU24, Intent(), NO_SPEC)
    assert (gpu.intent.flash_attn, _fa(gpu)) == ("on", "on") and "GPU" in gpu.flash_attn_why
    quant = plan(m, (Device("cpu", "cpu", "host", 0, 64 * GIB),), Intent(cache_type_k="q8_0", cache_type_v="q8_0"))
    assert _fa(quant) == "on" and "q8_0 V cache needs it" in quant.flash_attn_why
    asked = plan(m, GPU24, Intent(flash_attn="off"), NO_SPEC)
    assert _fa(asked) == "off" and asked.flash_attn_why == "off as asked"
    with pytest.raises(PlanError, match="needs flash attention"):
        plan(m, GPU24, Intent(cache_type_k="q4_0", cache_type_v="q4_0", flash_attn="off"))
    with pytest.raises(PlanError, match="flash attention must be"):
        Intent(flash_attn="yes")


def test_flash_attention_stays_on_a_cpu_when_its_memory_would_cost_context(base: ModelInfo) -> None:
    """Without flash attention the KQ scores take n_ubatch x context x heads f32: on a CPU that is just big
    enough for the training context with it, off would shrink the context, so auto keeps it on."""
    m = shape(base, n_layer=8, n_ctx_train=32768)
    big = (Device("cpu", "cpu", "host", 0, 64 * GIB),)
    with_fa = plan(m, big, Intent(flash_attn="on"), NO_SPEC).chosen
    without = plan(m, big, Intent(flash_attn="off"), NO_SPEC).chosen
    assert without.total > with_fa.total  # the scores' buffer
    tight = (Device("cpu", "cpu", "host", 0, with_fa.total + Intent().reserve + 64 * MIB),)
    p = plan(m, tight, Intent(), NO_SPEC)
    off = plan(m, tight, Intent(flash_attn="off"), NO_SPEC)
    assert off.chosen.n_ctx < p.chosen.n_ctx == 32768
    assert _fa(p) == "on" and f"only {off.chosen.n_ctx} tokens fit" in p.flash_attn_why


def test_the_launch_decision_gives_the_plans_flags(base: ModelInfo) -> None:
    from bostudio.engine.discover import Engine
    from bostudio.launch import LaunchInputs, LaunchIntent, decide

    engine = Engine(Path("/x"), "explicit")
    m = shape(base, n_layer=8, layer_bytes=10 * MIB, n_nextn=1)
    p = decide(LaunchInputs(m, engine, GPU24, MTP_SPEC, intent=LaunchIntent(ctx=8192, cache_type="q8_0"))).plan
    args = plan_args(p)
    assert args[:4] == ["-c", "8192", "-ngl", "10"]  # 8 trunk + 1 NextN layer + output
    assert ["-ctk", "q8_0", "-ctv", "q8_0"] == args[args.index("-ctk"):args.index("-ctk") + 4]
    assert args[args.index("-fa") + 1] == "on"  # a quantized V cache needs flash attention
    with pytest.raises(PlanError, match="does not fit"):
        decide(LaunchInputs(shape(base, n_layer=80, layer_bytes=2 * GIB), engine,
                            (Device("cpu", "cpu", "h", 0, 16 * GIB),), NO_SPEC))


def test_context_shape_non_unified() -> None:
    s = context_shape(ContextSettings(n_ctx=10000, n_parallel=3, kv_unified=False))
    assert (s.n_ctx_seq, s.n_stream, s.n_ctx) == (3584, 3, 10752)


# ---------------------------------------------------------------- purity and CLI

def test_planner_imports_no_io_modules() -> None:
    code = ("import sys, bostudio.planner, bostudio.planner.render\n"
            "bad = [m for m in ('httpx', 'psutil', 'pynvml', 'subprocess', 'socket', 'gguf', 'numpy',"
            " 'bostudio.hardware.discover', 'bostudio.gguf.reader') if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""


def test_cli_plan_on_a_24gib_gpu_from_a_devices_file(gemma_gguf: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "devices.json"
    f.write_text(json.dumps([{"vendor": "nvidia", "backend": "cuda", "name": "RTX 4090", "total_gib": 24},
                             {"vendor": "cpu", "backend": "cpu", "name": "host", "total_gib": 64}]))
    assert main(["plan", str(gemma_gguf), "--spec", f"draft:{gemma_gguf}", "--devices-file", str(f)]) == 0
    text = capsys.readouterr().out
    assert "with speculation: draft" in text and "without speculation" in text
    assert "[#" in text and "GiB" in text and "tokens of context" in text and "choice:" in text
    assert main(["plan", str(gemma_gguf), "--spec", f"draft:{gemma_gguf}", "--devices-file", str(f),
                 "--cache-type", "q8_0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["with_speculation"]["fits"] and out["without_speculation"]["n_ctx"] == 32768
    assert out["chosen"] == "draft" and out["spec_cost_bytes"] > 0
    assert out["with_speculation"]["spec_types"] == ["draft-simple"]
    assert "-ctk" in out["llama_args"] and "q8_0" in out["llama_args"] and "-ngld" in out["llama_args"]


def test_cli_plan_errors_are_for_users(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path / "missing.gguf")]) == 1
    assert "not found" in capsys.readouterr().err


def test_reported_memory_parser_on_a_recorded_log() -> None:
    """A recorded `llama-server -lv 4` log: target + draft (q8_0 KV) + ngram-mod."""
    from bostudio.planner.reported import parse_reported_memory

    rep = parse_reported_memory((Path(__file__).parent / "data" / "planner" / "llama_server_draft_ngram.log").read_text())
    assert [sum(m.values()) for m in rep.models] == [round(4.52 * MIB), round(2.39 * MIB)]
    target, draft = rep.contexts
    assert (target.kv, target.kv_cells, target.compute) == (8 * MIB, [4096], {"CPU": round(7.51 * MIB)})
    assert (draft.kv, draft.compute_total) == (round(2.12 * MIB), round(7.09 * MIB))
    assert rep.ngram_table == 16 * MIB
    assert rep.total == sum(sum(m.values()) for m in rep.models) + target.total + draft.total + 16 * MIB


# What llama-server reported (its "model buffer size" lines) from a native build on an AMX Xeon whose CPU backend
# had the AMX buffer type (measured 2026-12-06, before the build left AMX out there): MiB (mapped, AMX).
AMX_REPORTED = {"gemma CPU": (235.16, 213.91), "gemma on Vulkan0, output on the host": (170.00, 190.00),
                "qwen 0.5B CPU": (325.02, 225.48)}


def test_the_amx_host_weights_match_what_an_amx_engine_reported(gemma_gguf: Path, qwen_pair: tuple[Path, Path]) -> None:
    from bostudio.planner.memory import amx_host_weights

    gemma, qwen = describe(gemma_gguf), describe(qwen_pair[1])
    figures = {"gemma CPU": amx_host_weights(gemma, 0),
               "gemma on Vulkan0, output on the host": amx_host_weights(gemma, gemma.n_block + 1, output_on_host=True),
               "qwen 0.5B CPU": amx_host_weights(qwen, 0)}
    for case, (mapped, amx) in AMX_REPORTED.items():
        got_mapped, got_amx, repack = figures[case]
        assert abs(got_mapped / MIB - mapped) < 0.01 and abs(got_amx / MIB - amx) < 0.01, (case, figures[case])
        assert repack == 0  # every Q4_K matmul weight went to AMX, none is left for CPU_REPACK


def test_an_amx_host_plans_the_amx_buffer_in_place_of_the_repacked_copy(gemma_gguf: Path) -> None:
    m = describe(gemma_gguf)
    host = Device(vendor="cpu", backend="cpu", name="host", total_bytes=64 * GIB, free_bytes=64 * GIB)
    plain, _ = memory_uses(m, (host,), Intent(ctx=4096), NO_SPEC, 4096, 0)
    amx, _ = memory_uses(m, (host.with_(cpu_amx=True),), Intent(ctx=4096), NO_SPEC, 4096, 0)
    by = {u.component: u.bytes for u in amx}
    assert "weights (CPU AMX)" not in {u.component for u in plain}
    assert abs(by["weights (CPU AMX)"] / MIB - 213.91) < 0.01 and abs(by["weights"] / MIB - 235.16) < 0.01
    assert not by.get("weights (CPU repack)")
    assert {u.component for u in plain} - {"weights (CPU repack)"} <= set(by)
