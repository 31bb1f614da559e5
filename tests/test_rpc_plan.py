"""The planner over a pool of devices (RPC workers + local GPU + host), from a devices file:
where each layer goes, per-device KV and compute, the draft on the fastest device, the network
estimate. Pure: no engine, no network."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bostudio.engine.argv import plan_args
from bostudio.gguf import ModelInfo
from bostudio.hardware import load_devices_file
from bostudio.hardware.device import GIB, MIB, Device
from bostudio.planner import Intent, NO_SPEC, kv_cache_bytes, plan
from bostudio.planner.fit import device_layers, fastest_device, layer_counts, llama_device_order
from bostudio.planner.memory import ContextSettings, logits_buffer_bytes
from bostudio.planner.pool import ROUND_TRIP_S, network_estimate, placement_lines
from bostudio.planner.render import plan_json, render_plan
from bostudio.speculation import Speculator
from tests.test_planner import base, shape  # noqa: F401  (the module fixture and the model shapes)

POOL = Path(__file__).parent / "data" / "pool-70b.json"


def llama70b(base: ModelInfo) -> ModelInfo:
    """Llama 3.1 70B at Q4_K_M: 80 layers of ~0.49 GiB, n_embd 8192, 64/8 heads, 128k vocab."""
    return shape(base, n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672, n_vocab=128256,
                 layer_bytes=500 * MIB, embd_bytes=550 * MIB, path="Llama-3.1-70B-Q4_K_M.gguf")


def llama1b(base: ModelInfo) -> ModelInfo:
    return shape(base, n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192,
                 layer_bytes=45 * MIB, embd_bytes=260 * MIB, path="Llama-3.2-1B-Q4_K_M.gguf")


def draft(info: ModelInfo) -> Speculator:
    return Speculator("draft", ("draft-simple",), draft=info.path, n_max=8)


INTENT = Intent(ctx=16384, cache_type_k="q8_0", cache_type_v="q8_0")


def test_70b_on_two_remote_24gb_and_a_local_16gb(base: ModelInfo) -> None:
    devs = load_devices_file(POOL)
    m, d = llama70b(base), llama1b(base)
    p = plan(m, devs, INTENT, draft(d), d)
    o = p.chosen
    assert o.fits and o is p.with_spec
    # RPC devices first (llama.cpp's order), then the local GPU; counts are -ts, the output last
    assert [name for name, _ in o.split] == ["RPC0", "RPC1", "CUDA0"]
    counts = [c for _, c in o.split]
    assert sum(counts) == o.n_gpu_layers and all(c > 0 for c in counts)
    # 39 GiB of weights, q8_0 KV at 16k and the draft fit 2 x 22.5 + 14.5 GiB: every layer is offloaded
    assert o.n_gpu_layers == m.n_block + 1
    # nothing over a device's budget (usable less the 1 GiB reserve)
    for dev in devs:
        assert o.device_bytes(dev.label) <= dev.usable_bytes - INTENT.reserve
    # weights per device are exactly the layers it holds; the output layer sits on the last one
    layers = device_layers(m, o.n_gpu_layers, counts)
    assert layers[-1][-1] == m.n_block
    for (name, _), ls in zip(o.split, layers):
        weights = sum(u.bytes for u in o.uses if u.device == name and u.component == "weights")
        out = (m.output_bytes + m.other_bytes) if m.n_block in ls else 0
        assert weights == sum(m.layer_bytes[il] for il in ls if il < m.n_layer) + out
        kv = sum(u.bytes for u in o.uses if u.device == name and u.component == "KV cache")
        s = ContextSettings(n_ctx=16384, cache_type_k="q8_0", cache_type_v="q8_0")
        assert kv == kv_cache_bytes(m, s, layers=[il for il in ls if il < m.n_layer]).total
        assert any(u.device == name and u.component == "compute buffer" for u in o.uses)
    # the draft is whole on the fastest device: the local GPU, never a remote one
    assert o.draft_device == "CUDA0"
    assert {u.device for u in o.uses if u.component in ("draft KV cache", "draft compute buffer")} == {"CUDA0"}
    assert sum(u.bytes for u in o.uses if u.component == "draft weights" and u.device == "CPU") == d.token_embd_bytes
    args = plan_args(p)
    assert args[args.index("-dev") + 1] == "RPC0,RPC1,CUDA0"
    assert args[args.index("-ts") + 1] == ",".join(map(str, counts))
    assert args[args.index("-devd") + 1] == "CUDA0"
    text = render_plan(p, plan_args(p))
    assert "target: RPC0 (192.168.1.20:50052)" in text and "CUDA0: " in text
    assert "draft: draft Llama-3.2-1B-Q4_K_M.gguf whole on CUDA0" in text
    # host (the input embedding) -> RPC0 -> RPC1 -> CUDA0: three crossings next to a remote device,
    # hidden states only
    net = network_estimate(m, o, devs)
    assert net.split_points == 3 and net.bytes_per_token == 3 * 8192 * 4
    assert not net.bottleneck  # ~40 GiB of weight reads per token dwarf 96 KiB of activations
    data = plan_json(p, plan_args(p))
    assert data["network"]["split_points"] == 3 and data["with_speculation"]["draft_device"] == "CUDA0"


def test_a_worker_budget_caps_its_share(base: ModelInfo) -> None:
    devs = tuple(d.with_(budget_bytes=6 * GIB) if d.label == "RPC1" else d for d in load_devices_file(POOL))
    m = llama70b(base)
    o = plan(m, devs, INTENT).chosen
    assert o.device_bytes("RPC1") <= 6 * GIB
    split = dict(o.split)
    assert split["RPC1"] < split["RPC0"]
    # what no longer fits the pool stays on the host, and the host is one more network crossing
    assert o.n_gpu_layers < m.n_block + 1
    assert "target: CPU: " in "\n".join(placement_lines(plan(m, devs, INTENT)))
    assert network_estimate(m, o, devs).split_points == 3


def test_no_local_gpu_keeps_the_draft_on_the_host(base: ModelInfo) -> None:
    devs = tuple(d for d in load_devices_file(POOL) if d.label != "CUDA0")
    m, d = llama70b(base), llama1b(base)
    o = plan(m, devs, INTENT, draft(d), d).chosen
    assert fastest_device(devs).label == "CPU"
    assert o.draft_device == "none"  # -devd none: the draft is not spread over the workers
    assert {u.device for u in o.uses if u.component == "draft weights"} == {"CPU"}
    assert "-devd" in plan_args(plan(m, devs, INTENT, draft(d), d))


def test_the_network_is_the_bottleneck_for_a_small_model_with_a_remote_output(base: ModelInfo) -> None:
    workers = (Device("other", "rpc", "w0", 0, 8 * GIB, engine_name="RPC0", endpoint="127.0.0.1:1", budget_bytes=GIB),
               Device("other", "rpc", "w1", 1, 8 * GIB, engine_name="RPC1", endpoint="127.0.0.1:2", budget_bytes=GIB),
               Device("cpu", "cpu", "host", 0, 16 * GIB))
    m = shape(base, n_layer=18, n_embd=640, n_vocab=262144, layer_bytes=8 * MIB, embd_bytes=160 * MIB)
    p = plan(m, workers, Intent(ctx=4096))
    net = network_estimate(m, p.chosen, workers)
    assert net.bottleneck and net.bytes_per_token >= 262144 * 4  # the logits come back over the network
    assert any("WARNING: the network is the bottleneck" in ln for ln in placement_lines(p))


def test_a_single_local_gpu_plan_is_unchanged(base: ModelInfo) -> None:
    devs = tuple(d for d in load_devices_file(POOL) if not d.remote)
    p = plan(llama70b(base), devs, INTENT, NO_SPEC)
    assert p.chosen.split == () and "-ts" not in plan_args(p) and "-dev" not in plan_args(p)


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _llama_cpp_device(j: int, ngl: int, ts: list[int]) -> int:
    """llama-model.cpp: splits = cumulative ts / sum in float; device = upper_bound(splits, j/ngl)."""
    total, cum = _f32(float(sum(ts))), 0.0
    splits = []
    for c in ts:
        cum = _f32(cum + c)
        splits.append(_f32(cum / total))
    v = _f32(_f32(float(j)) / _f32(float(ngl)))
    return next((k for k, s in enumerate(splits) if s > v), len(ts))


@settings(max_examples=300, deadline=None)
@given(ngl=st.integers(1, 161), budgets=st.lists(st.integers(1, 200), min_size=1, max_size=5))
def test_ts_counts_put_each_layer_where_the_plan_says(ngl: int, budgets: list[int]) -> None:
    gpus = [Device("other", "rpc", f"w{k}", k, GIB, engine_name=f"RPC{k}") for k in range(len(budgets))]
    counts = layer_counts(ngl, gpus, {g.label: b * GIB for g, b in zip(gpus, budgets)})
    assert sum(counts) == ngl
    j = 0
    for k, c in enumerate(counts):
        for _ in range(c):
            assert _llama_cpp_device(j, ngl, counts) == k
            j += 1


def test_llama_orders_rpc_devices_first() -> None:
    local = Device("nvidia", "cuda", "4090", 0, 24 * GIB, engine_name="CUDA0")
    remote = Device("other", "rpc", "w", 0, 24 * GIB, engine_name="RPC0", endpoint="h:1")
    assert [d.label for d in llama_device_order([local, remote])] == ["RPC0", "CUDA0"]


def test_a_self_draft_is_planned_before_it_exists(base: ModelInfo, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan --spec self-draft:Q2_K`: the copy's header is estimated from the target by bits per weight,
    then placed like any draft: whole on the fastest device while the target spreads."""
    from bostudio.pairing.edge.pair import self_draft_info

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    m = replace(llama70b(base), n_params=70_600_000_000)
    d = self_draft_info(m, "Q2_K")
    assert d.path.name == "Llama-3.1-70B-Q4_K_M.self-Q2_K.gguf" and d.quant == "Q2_K"
    total = lambda x: sum(x.layer_bytes) + x.token_embd_bytes + x.output_bytes  # noqa: E731
    assert 0.45 < total(d) / total(m) < 0.65  # 2.6 of ~4.8 bits per weight
    # ~23 GiB of Q2_K copy does not fit the 16 GiB local GPU: auto says so and falls back
    p = plan(m, load_devices_file(POOL), INTENT, draft(d), d)
    assert p.chosen is not p.with_spec and "drops the draft Llama-3.1-70B-Q4_K_M.self-Q2_K.gguf" in p.why
    # asked for (as `--spec self-draft:Q2_K` does) with a 32 GiB local GPU, the seeds' layout: the
    # copy whole on the GPU, the target over the workers, the GPU's remaining room and the host
    devs = tuple(x.with_(total_bytes=32 * GIB, free_bytes=31 * GIB) if x.label == "CUDA0" else x
                 for x in load_devices_file(POOL))
    p = plan(m, devs, replace(INTENT, speculation="on"), draft(d), d)
    o = p.chosen
    assert o is p.with_spec and o.draft_device == "CUDA0"
    assert o.n_gpu_layers < m.n_block + 1  # part of the target stays in host RAM
    assert sum(u.bytes for u in o.uses if u.device == "CUDA0" and u.component == "draft weights") > 20 * GIB
    assert dict(o.split)["RPC0"] > 0 and dict(o.split)["RPC1"] > 0


def test_a_pooled_launch_runs_the_plans_placement_after_rpc(base: ModelInfo) -> None:
    """The pure launch decision over a pool: --rpc first (it registers RPC0.. that -dev/-devd name), then
    every memory and placement flag of the plan, each once."""
    from bostudio.engine.discover import Engine
    from bostudio.launch import LaunchInputs, LaunchIntent, decide
    from bostudio.rpc.probe import Pool

    devs = load_devices_file(POOL)
    m, d = llama70b(base), llama1b(base)
    flags = frozenset({"--rpc", "-m", "--alias", "--host", "--port", "-c", "--metrics", "-lv", "--spec-type", "-md",
                       "--spec-draft-n-max", "-ngl", "-np", "-kvu", "-ctk", "-ctv", "-fit", "-fa", "-dev", "-ts",
                       "-ot", "-ngld", "-devd", "-ctkd", "-ctvd", "--api-key", "--jinja", "--chat-template-file",
                       "--reverse-prompt", "--no-jinja", "--chat-template", "-t", "-tb"})
    engine = Engine(Path("/x/llama-server"), "explicit", flags=flags)
    pool = Pool(tuple(x for x in devs if x.remote), "192.168.1.20:50052,192.168.1.21:50052")
    sp = replace(draft(d), cache_type_k_draft="q8_0", cache_type_v_draft="q8_0")
    decision = decide(LaunchInputs(m, engine, tuple(devs), sp, d, pool,
                                   LaunchIntent(ctx=16384, cache_type="q8_0", spec="draft:x")))
    argv = decision.argv(port=9000, alias="big")
    assert argv[1:3] == ["--rpc", "192.168.1.20:50052,192.168.1.21:50052"]
    flags = plan_args(decision.plan)
    for flag in ("-ngl", "-np", "-ctk", "-ctv", "-fit", "-dev", "-ts", "-ngld", "-devd"):
        assert argv.count(flag) == 1 and argv[argv.index(flag) + 1] == flags[flags.index(flag) + 1]
    # the draft's cache type from the pairing is priced and run, once (llama.cpp keeps the last -ctkd)
    assert argv.count("-ctkd") == 1 and argv[argv.index("-ctkd") + 1] == "q8_0"
    assert decision.plan.intent.draft_cache_type_k == "q8_0"
    assert "-kvu" in argv and argv[argv.index("-c") + 1] == str(decision.ctx)


# ---------------------------------------------------------------- the output projection pinned to the host (-ot)

def _big_vocab(base: ModelInfo, tied: bool) -> ModelInfo:
    """A Gemma-3-like shape: 24 small layers (40 MiB) and a 262k vocabulary whose output projection
    (1.2 GiB) is larger than any offload device's budget below."""
    m = shape(base, n_layer=24, n_embd=2048, n_head=8, n_head_kv=4, head_dim=256, n_ff=8192, n_vocab=262144,
              layer_bytes=40 * MIB, embd_bytes=1228 * MIB, path="big-vocab.gguf")
    return replace(m, output_bytes=0) if tied else m


def _weights(o, device: str) -> int:  # type: ignore[no-untyped-def]
    return sum(u.bytes for u in o.uses if u.device == device and u.component == "weights")


@pytest.mark.parametrize("tied", [True, False])
def test_an_output_that_fits_no_worker_is_pinned_to_the_host(base: ModelInfo, tied: bool) -> None:
    from bostudio.planner.fit import OUTPUT_ON_HOST_OT

    workers = (Device("other", "rpc", "w0", 0, 8 * GIB, engine_name="RPC0", endpoint="127.0.0.1:1", budget_bytes=GIB),
               Device("other", "rpc", "w1", 1, 8 * GIB, engine_name="RPC1", endpoint="127.0.0.1:2", budget_bytes=GIB),
               Device("cpu", "cpu", "host", 0, 32 * GIB))
    m = _big_vocab(base, tied)
    p = plan(m, workers, Intent(ctx=4096))
    o = p.chosen
    # every repeating layer goes to the workers; the output layer's slot (last, on RPC1) keeps the norm only
    assert o.fits and o.output_on_host and o.n_gpu_layers == m.n_block + 1
    assert [c for _, c in o.split] == [12, 13]
    assert _weights(o, "RPC0") == 12 * 40 * MIB
    assert _weights(o, "RPC1") == 12 * 40 * MIB + m.other_bytes
    # on the host: the input embedding, plus an untied output (a tied one is the same mapped tensor)
    assert _weights(o, "CPU") == m.token_embd_bytes + m.output_bytes
    # the logits are computed on the host: its compute buffer has room for them
    comp = {u.device: u.bytes for u in o.uses if u.component == "compute buffer"}
    assert comp["CPU"] >= logits_buffer_bytes(m, ContextSettings(n_ctx=4096))
    args = plan_args(p)
    assert args[args.index("-ot") + 1] == OUTPUT_ON_HOST_OT
    assert args[args.index("-dev") + 1] == "RPC0,RPC1" and args[args.index("-ngl") + 1] == str(m.n_block + 1)
    # the network carries hidden states only (host -> RPC0 -> RPC1 -> host), no logits
    net = network_estimate(m, o, workers)
    assert net.split_points == 3 and net.bytes_per_token == 3 * m.n_embd * 4
    lines = placement_lines(p)
    assert any("output projection: on CPU, pinned with -ot" in ln for ln in lines)
    assert any("it fits no offload device" in ln for ln in lines)
    # the same pool with room for the output: nothing is pinned
    roomy = tuple(replace(d, budget_bytes=4 * GIB) if d.remote else d for d in workers)
    q = plan(m, roomy, Intent(ctx=4096))
    assert not q.chosen.output_on_host and "-ot" not in plan_args(q)
    assert q.chosen.n_gpu_layers == m.n_block + 1


def test_a_small_local_gpu_takes_the_layers_and_leaves_the_output_on_the_host(base: ModelInfo) -> None:
    # 1.5 GiB to plan with (2.5 less the reserve): the output (1.2 GiB) and CUDA's 400 MiB overhead
    # leave no room for a layer, so without the pin nothing could be offloaded
    gpu = Device("nvidia", "cuda", "small", 0, 2 * GIB + 512 * MIB, engine_name="CUDA0")
    devs = (gpu, Device("cpu", "cpu", "host", 0, 32 * GIB))
    m = _big_vocab(base, tied=True)
    p = plan(m, devs, Intent(ctx=4096))
    o = p.chosen
    assert o.output_on_host and o.split == () and 2 <= o.n_gpu_layers <= m.n_block
    # the last n_gpu_layers - 1 repeating layers and the output norm on the GPU, nothing else
    assert _weights(o, "CUDA0") == (o.n_gpu_layers - 1) * 40 * MIB + m.other_bytes
    assert _weights(o, "CPU") == (m.n_block + 1 - o.n_gpu_layers) * 40 * MIB + m.token_embd_bytes
    assert o.device_bytes("CUDA0") <= gpu.usable_bytes - GIB
    # one more layer would not fit
    from bostudio.planner.fit import memory_uses
    more = memory_uses(m, devs, Intent(ctx=4096), NO_SPEC, 4096, o.n_gpu_layers + 1, None, True)[0]
    assert sum(u.bytes for u in more if u.device == "CUDA0") > gpu.usable_bytes - GIB
    comp = {u.device: u.bytes for u in o.uses if u.component == "compute buffer"}
    assert comp["CPU"] >= logits_buffer_bytes(m, ContextSettings(n_ctx=4096))  # the logits run on the host
    assert "-ot" in plan_args(p) and "-dev" not in plan_args(p)
    assert o.device_bytes("CUDA0") <= gpu.usable_bytes - GIB


def test_pinning_is_not_used_when_nothing_can_be_offloaded(base: ModelInfo) -> None:
    # a worker too small even for one layer: the plan stays on the host, with no -ot
    tiny = (Device("other", "rpc", "w0", 0, 8 * GIB, engine_name="RPC0", endpoint="127.0.0.1:1", budget_bytes=16 * MIB),
            Device("cpu", "cpu", "host", 0, 32 * GIB))
    p = plan(_big_vocab(base, tied=True), tiny, Intent(ctx=4096))
    assert p.chosen.n_gpu_layers == 0 and not p.chosen.output_on_host and "-ot" not in plan_args(p)


def test_the_network_estimate_uses_the_slowest_link_a_token_crosses(base: ModelInfo) -> None:
    m = llama70b(base)
    devs = load_devices_file(POOL)
    p = plan(m, devs, INTENT, NO_SPEC)
    gigabit = network_estimate(m, p.chosen, devs)
    assert gigabit.link_mbit == 1000 and "at 1 Gbit/s" in gigabit.line()
    # one worker on Wi-Fi (100 Mbit/s): the bytes take ten times as long; the round trips do not change
    slow = tuple(replace(d, link_mbit=100) if d.label == "RPC1" else d for d in devs)
    wifi = network_estimate(m, p.chosen, slow)
    rtt_ms = wifi.split_points * ROUND_TRIP_S * 1e3
    assert wifi.link_mbit == 100 and "at 100 Mbit/s" in wifi.line()
    assert wifi.network_ms - rtt_ms == pytest.approx(10 * (gigabit.network_ms - rtt_ms))
    slow_plan = replace(p, devices=slow)
    assert plan_json(slow_plan, plan_args(slow_plan))["network"]["link_mbit"] == 100


def test_a_devices_file_link_must_be_positive(tmp_path: Path) -> None:
    from bostudio.errors import ConfigError

    f = tmp_path / "pool.json"
    f.write_text('{"devices": [{"vendor": "other", "backend": "rpc", "name": "w", "total_gib": 8, "link_mbit": -1}]}')
    with pytest.raises(ConfigError, match="link_mbit"):
        load_devices_file(f)
