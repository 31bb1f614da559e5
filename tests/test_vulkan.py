"""The GPU path on a machine without a GPU: llama.cpp's Vulkan backend on Mesa's software device
(lavapipe). The Vulkan engine build (scripts/setup.sh installs its Debian packages and builds it with
every scripts/test.sh run, so .ci/run too, where the machine can), `Vulkan0` in `engine list` and `devices`, plans
held against the buffers llama.cpp allocates on the device (KV within 1%, the total within 5%, as in
tests/test_planner_accuracy.py) for the embedded model and a target+draft pair, a capped device
budget that splits the layers between Vulkan0 and the host, and two lavapipe devices (-dev/-ts/-devd). A software device's speed and arithmetic say
nothing about a GPU: what is checked is the path (devices, memory, argv), not the output's tokens.

Two depths (BOSTUDIO_TEST_VULKAN, set by scripts/test.sh): `smoke`, the default and what CI runs, proves the
path: discovery (`engine list`, `devices`), the plans against llama.cpp's buffers (the embedded model offloaded
whole, a target and its draft, a capped split, two devices; each starts llama-server on lavapipe and reads
the buffers it reports), and one answer served from the device by `up` with speculation verified. `1` adds the daemon's
eviction and reload on the device (two models loaded and answering on lavapipe: 142 s on two quiet cores).
`0` skips the module.

llama.cpp lists lavapipe only when GGML_VK_VISIBLE_DEVICES names it: this module sets it to 0 for
itself and the processes it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bostudio.engine.argv import plan_args
from bostudio.engine.build import backend_flags, built_engines, is_current_default
from bostudio.engine.discover import VK_VISIBLE, Engine, probe_engine
from bostudio.errors import BuildError
from bostudio.gguf import ModelInfo, describe
from bostudio.hardware import discover_devices
from bostudio.hardware.device import Device
from bostudio.planner import NO_SPEC, Intent, Plan, plan
from bostudio.planner.fit import RUNTIME_OUTPUT
from bostudio.planner.memory import MIB
from bostudio.planner.reported import device_buffers, parse_reported_memory
from bostudio.speculation import Speculator
from tests.synth_models import with_fewer_layers, write_arch_models
from tests.test_planner_accuracy import run_server, within

pytestmark = [pytest.mark.engine, pytest.mark.vulkan]

TESTS = Path(__file__).resolve().parent
ICD_DIRS = (Path("/usr/share/vulkan/icd.d"), Path("/etc/vulkan/icd.d"))
# Not llama.cpp buffers: what a plan keeps as a margin for the driver's own memory.
NOT_REPORTED = (RUNTIME_OUTPUT, "platform overhead")


TIER = os.environ.get("BOSTUDIO_TEST_VULKAN", "0")
# The tests beyond the smoke check: run with BOSTUDIO_TEST_VULKAN=1.
whole_tier = pytest.mark.skipif(TIER != "1", reason="the whole Vulkan tier: BOSTUDIO_TEST_VULKAN=1 scripts/test.sh "
                                "(CI runs its smoke check)")


def why_no_vulkan() -> str | None:
    """Why this machine cannot run the tier: the tier turned off, or no Vulkan stack to build and run on."""
    if TIER == "0":
        return "the Vulkan tier is off (BOSTUDIO_TEST_VULKAN=0)"
    try:
        backend_flags("vulkan")
    except BuildError as exc:
        return f"{exc.message} ({exc.hint})"
    if not any(any(d.glob("lvp_icd*.json")) for d in ICD_DIRS if d.is_dir()):
        return "no lavapipe Vulkan driver (apt install mesa-vulkan-drivers)"
    return None


@pytest.fixture(scope="module", autouse=True)
def lavapipe_visible() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(VK_VISIBLE, "0")
        yield


@pytest.fixture(scope="module")
def vk_engine() -> Engine:
    """The Vulkan build, probed with lavapipe visible."""
    why = why_no_vulkan()
    if why:
        pytest.skip(f"this machine cannot run Vulkan: {why}")
    built = [b for b in built_engines() if b.backend == "vulkan" and is_current_default(b)]
    if not built:
        pytest.fail("no Vulkan engine built though this machine can build one: run "
                    "`bostudio engine build --backend vulkan` (BOSTUDIO_TEST_VULKAN=1 scripts/test.sh does)")
    eng = probe_engine(built[0].server, "explicit")
    assert eng.usable, eng.problem
    return eng


@pytest.fixture(scope="module")
def vk_devices(vk_engine: Engine) -> tuple[Device, ...]:
    return discover_devices(engine_devices=vk_engine.devices, budgets={}, host_amx=vk_engine.amx).devices


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env, PYTHONPATH=str(TESTS.parent))
    return subprocess.run([sys.executable, "-m", "bostudio", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------- the build and discovery

def test_the_vulkan_engine_sees_lavapipe_as_vulkan0(vk_engine: Engine) -> None:
    assert "vulkan" in vk_engine.backends and "rpc" in vk_engine.backends
    (dev,) = vk_engine.devices
    assert (dev.name, dev.backend, dev.software) == ("Vulkan0", "vulkan", True) and dev.total_mib > 0
    assert vk_engine.gpu_mib() == 0  # a software device is the host's RAM again


def test_engine_list_shows_both_builds_and_keeps_the_cpu_one(vk_engine: Engine) -> None:
    data = json.loads(cli("engine", "list", "--json").stdout)
    vk = next(e for e in data if e["path"] == str(vk_engine.path))
    assert "vulkan" in vk["backends"] and [d["name"] for d in vk["devices"]] == ["Vulkan0"]
    assert not vk["chosen"]  # lavapipe never displaces the CPU build: it runs where it is named
    assert "Vulkan0 (" in cli("engine", "list").stdout and "MiB, software)" in cli("engine", "list").stdout


def test_devices_lists_vulkan0_with_llama_cpps_memory(vk_engine: Engine) -> None:
    data = json.loads(cli("devices", "--engine", str(vk_engine.path), "--json").stdout)
    (vk,) = [d for d in data["devices"] if d["backend"] == "vulkan"]
    (listed,) = vk_engine.devices
    assert (vk["engine_name"], vk["software"], vk["unified"]) == ("Vulkan0", True, True)
    assert vk["total_bytes"] == listed.total_mib * MIB and vk["free_bytes"] == listed.free_mib * MIB
    text = cli("devices", "--engine", str(vk_engine.path)).stdout
    assert "Vulkan0" in text and "software, unified" in text


def test_without_the_switch_devices_says_how_to_show_lavapipe(vk_engine: Engine) -> None:
    env = {k: v for k, v in os.environ.items() if k != VK_VISIBLE}
    text = cli("devices", "--engine", str(vk_engine.path), env=env).stdout
    assert "Vulkan0" not in text and f"unless {VK_VISIBLE} names them" in text


# ---------------------------------------------------------------- plans against llama.cpp's buffers

@pytest.fixture(scope="module")
def pair(vk_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelInfo, ModelInfo]:
    """test-llama-archs' llama model and a one-layer copy of it: a target and a draft with the same vocab."""
    out = tmp_path_factory.mktemp("vk-archs")
    files = write_arch_models(vk_engine.path.parent / "test-llama-archs", out, ["llama"])
    draft = with_fewer_layers(files["llama-dense"], out / "llama-draft.gguf", 1)
    return describe(files["llama-dense"]), describe(draft)


def spec_args(spec: Speculator) -> list[str]:
    """The speculator's own flags, as bostudio.engine.argv adds them."""
    if spec.kind == "none":
        return []
    out = ["--spec-type", ",".join(spec.spec_types)]
    out += ["--spec-draft-n-max", str(spec.n_max)] if spec.n_max is not None else []
    return out + (["-md", str(spec.draft)] if spec.draft else [])


def planned_per_device(p: Plan) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for u in p.chosen.uses:
        out.setdefault(u.device, {})
        out[u.device][u.component] = out[u.device].get(u.component, 0) + u.bytes
    return out


def check_against_llama_cpp(p: Plan, spec: Speculator, model: Path, vk_engine: Engine) -> dict:
    """Run the plan's argv in the Vulkan llama-server and hold its buffers against the plan: KV (and the
    draft's) within 1%, the total within 5%, and each device's weights and KV within 5%."""
    log = run_server(vk_engine.path, model, plan_args(p) + spec_args(spec), timeout=240)
    rep = parse_reported_memory(log)
    assert rep.contexts, f"llama-server did not create a context:\n{log[-3000:]}"
    o = p.chosen
    kv = o.component_bytes("KV cache") + o.component_bytes("recurrent state")
    assert within(kv, rep.contexts[0].kv + rep.contexts[0].rs, 0.01), (kv, rep.contexts[0])
    if spec.kind == "draft":
        assert len(rep.contexts) == 2, "the draft's context is missing"
        assert within(o.component_bytes("draft KV cache"), rep.contexts[1].kv, 0.01)
    total = o.total - sum(o.component_bytes(c) for c in NOT_REPORTED)
    assert within(total, rep.total, 0.05), (total, rep.total)
    planned, reported = planned_per_device(p), device_buffers(log)
    for dev in ("Vulkan0", "CPU"):
        for comp in ("weights", "KV cache"):
            want, got = planned.get(dev, {}).get(comp, 0), reported.get(dev, {}).get(comp, 0)
            assert within(want, got, 0.05), (dev, comp, want, got, reported)
    return {"log": log, "reported": reported, "planned": planned}


def test_gemma_is_offloaded_whole_and_its_buffers_match_the_plan(vk_engine: Engine, vk_devices: tuple[Device, ...],
                                                                gemma_gguf: Path) -> None:
    info = describe(gemma_gguf)
    p = plan(info, vk_devices, Intent(ctx=4096, speculation="off"))
    assert p.chosen.fits and p.chosen.n_gpu_layers == info.n_block + 1  # every layer and the output
    run = check_against_llama_cpp(p, NO_SPEC, gemma_gguf, vk_engine)
    assert f"offloaded {info.n_block + 1}/{info.n_block + 1} layers to GPU" in run["log"]
    # lavapipe binds at most 128 MiB per buffer: the 170 MiB tied output projection stays on the host, as
    # llama.cpp decides by itself; the plan knows (vulkaninfo) and pins it there with -ot
    (vk,) = [d for d in vk_devices if d.backend == "vulkan"]
    assert vk.max_tensor_bytes == 128 * MIB and p.chosen.output_on_host and "-ot" in plan_args(p)
    assert run["reported"]["Vulkan0"]["weights"] > 0


def test_a_target_and_its_draft_on_vulkan0_match_the_plan(vk_engine: Engine, vk_devices: tuple[Device, ...],
                                                          pair: tuple[ModelInfo, ModelInfo]) -> None:
    target, draft = pair
    spec = Speculator("draft", ("draft-simple",), draft=draft.path, n_max=8)
    p = plan(target, vk_devices, Intent(ctx=4096, speculation="on"), spec, draft)
    assert p.chosen.speculator.kind == "draft" and p.chosen.n_gpu_layers == target.n_block + 1
    assert p.chosen.n_gpu_layers_draft == draft.n_block + 1
    check_against_llama_cpp(p, spec, target.path, vk_engine)


def capped(devices: tuple[Device, ...], label: str, cap: int) -> tuple[Device, ...]:
    return tuple(d.with_(budget_bytes=cap) if d.label == label else d for d in devices)


def test_a_capped_budget_splits_the_layers_and_llama_cpp_follows(vk_engine: Engine, vk_devices: tuple[Device, ...],
                                                                  gemma_gguf: Path) -> None:
    info = describe(gemma_gguf)
    intent = Intent(ctx=4096, speculation="off")
    whole = plan(info, vk_devices, intent).chosen.device_bytes("Vulkan0")
    p = plan(info, capped(vk_devices, "Vulkan0", int(whole * 0.75)), intent)
    assert p.chosen.fits and 0 < p.chosen.n_gpu_layers < info.n_block + 1, p.chosen.n_gpu_layers
    assert p.chosen.device_bytes("Vulkan0") <= int(whole * 0.75)
    run = check_against_llama_cpp(p, NO_SPEC, gemma_gguf, vk_engine)
    assert f"offloaded {p.chosen.n_gpu_layers}/{info.n_block + 1} layers to GPU" in run["log"]


def test_the_cap_from_config_reaches_plan(vk_engine: Engine, gemma_gguf: Path, tmp_path: Path) -> None:
    """[devices.Vulkan0] budget_mib in config.toml caps the device in `devices` and `plan`."""
    (tmp_path / "bostudio").mkdir()
    (tmp_path / "bostudio" / "config.toml").write_text("[devices.Vulkan0]\nbudget_mib = 300\n")
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path))
    data = json.loads(cli("devices", "--engine", str(vk_engine.path), "--json", env=env).stdout)
    assert next(d for d in data["devices"] if d["engine_name"] == "Vulkan0")["budget_bytes"] == 300 * MIB
    proc = cli("plan", str(gemma_gguf), "--engine", str(vk_engine.path), "--ctx", "4096", "--spec", "off", "--json",
               env=env)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    chosen = p["with_speculation"] or p["without_speculation"]
    assert chosen["devices"]["Vulkan0"] <= 300 * MIB < sum(chosen["devices"].values())
    ngl = p["argv"][p["argv"].index("-ngl") + 1]
    assert 0 < int(ngl) < describe(gemma_gguf).n_block + 1



# ---------------------------------------------------------------- two devices

def test_two_lavapipe_devices_split_the_target_and_the_draft_goes_to_one(
        vk_engine: Engine, pair: tuple[ModelInfo, ModelInfo], monkeypatch: pytest.MonkeyPatch) -> None:
    """GGML_VK_VISIBLE_DEVICES=0,0 lists lavapipe twice (Vulkan0, Vulkan1): the plan splits the layers with
    -dev/-ts, puts the draft on one device with -devd, and llama.cpp's buffers per device follow it."""
    monkeypatch.setenv(VK_VISIBLE, "0,0")
    eng = probe_engine(vk_engine.path, "explicit")
    assert [d.name for d in eng.devices] == ["Vulkan0", "Vulkan1"]
    devices = discover_devices(engine_devices=eng.devices, budgets={}, host_amx=eng.amx).devices
    target, draft = pair
    spec = Speculator("draft", ("draft-simple",), draft=draft.path, n_max=8)
    p = plan(target, devices, Intent(ctx=4096, speculation="on"), spec, draft)
    args = plan_args(p)
    assert args[args.index("-dev") + 1] == "Vulkan0,Vulkan1" and "-ts" in args
    assert p.chosen.draft_device in ("Vulkan0", "Vulkan1") and args[args.index("-devd") + 1] == p.chosen.draft_device
    split = dict(p.chosen.split)
    assert split["Vulkan0"] > 0 and split["Vulkan1"] > 0
    log = run_server(eng.path, target.path, args + spec_args(spec), timeout=240)
    rep = parse_reported_memory(log)
    assert len(rep.contexts) == 2, log[-3000:]
    planned = planned_per_device(p)
    reported = device_buffers(log)
    for dev in ("Vulkan0", "Vulkan1"):
        for comp in ("weights", "KV cache"):
            want, got = planned[dev].get(comp, 0), reported.get(dev, {}).get(comp, 0)
            assert within(want, got, 0.05), (dev, comp, want, got, reported)
    # the draft's weights land on the device the plan names
    assert rep.models[1].get(p.chosen.draft_device, 0) > 0, rep.models


# ---------------------------------------------------------------- serving on the device: up and the daemon

# lavapipe compiles its pipelines at a server's first requests, silently, for minutes on two cores: the stall
# timeout of `up` and the daemon is raised for it (docs/vulkan.md). A hang guard, not a speed verdict.
VK_STALL_S = "900"


def test_up_serves_gemma_offloaded_to_vulkan0_with_speculation_verified(vk_engine: Engine, gemma_gguf: Path,
                                                                        tmp_path: Path) -> None:
    import signal

    from tests.netutil import free_port, port_is_free

    info = describe(gemma_gguf)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(TESTS.parent), XDG_STATE_HOME=str(tmp_path / "state"),
               XDG_CONFIG_HOME=str(tmp_path / "config"))
    proc = subprocess.Popen([sys.executable, "-m", "bostudio", "up", str(gemma_gguf), "--engine", str(vk_engine.path),
                             "--ctx", "4096", "--stall-timeout", VK_STALL_S, "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while not lines or not lines[-1].startswith("Press Ctrl-C"):
            line = proc.stdout.readline()
            assert line, f"up exited before it was ready: {''.join(lines)}{proc.stderr.read() if proc.stderr else ''}"
            lines.append(line)
        text = "".join(lines)
        assert "speculation     : ngram-mod - active" in text, text
        assert "Vulkan0)" in next(ln for ln in lines if ln.lstrip().startswith("engine")), text
        (server,) = [p for p in psutil_children(proc.pid) if "llama-server" in p.name()]
        argv = server.cmdline()
        assert argv[argv.index("-ngl") + 1] == str(info.n_block + 1)  # every layer and the output, as planned
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=600, trust_env=False,
                       json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert port_is_free(port)


def psutil_children(pid: int):  # type: ignore[no-untyped-def]
    import psutil

    return psutil.Process(pid).children(recursive=True)


@whole_tier
def test_the_daemon_evicts_by_the_device_budget_and_reloads(vk_engine: Engine, gemma_gguf: Path,
                                                            tmp_path: Path) -> None:
    """Two copies of Gemma, each offloaded whole, and a Vulkan0 capped at one and a half of them in
    config.toml: loading the second evicts the first (the host's budget would hold both), and a request for
    the first reloads it, evicting the second."""
    from bostudio.gguf import describe as read
    from tests.daemon_util import DaemonProc

    one = plan(read(gemma_gguf), discover_devices(engine_devices=vk_engine.devices, budgets={}, host_amx=vk_engine.amx).devices,
               Intent(ctx=4096)).chosen.device_bytes("Vulkan0")
    models = tmp_path / "models"
    models.mkdir()
    (models / "gemma-a.gguf").symlink_to(gemma_gguf)
    (models / "gemma-b.gguf").symlink_to(gemma_gguf)
    (tmp_path / "config" / "bostudio").mkdir(parents=True)
    (tmp_path / "config" / "bostudio" / "config.toml").write_text(
        f"[devices.Vulkan0]\nbudget_mib = {int(one * 1.5) // MIB}\n")
    d = DaemonProc(tmp_path, models, ["--engine", str(vk_engine.path), "--stall-timeout", VK_STALL_S,
                                      "--idle-ttl", "0", "--no-prompt-reuse"]).start()
    try:
        with d.http(1800) as http:
            def load(name: str) -> dict:
                r = http.post("/bostudio/instances", json={"model": name, "ctx": 4096})
                assert r.status_code == 200, r.text
                return r.json()

            a = load("gemma-a")
            assert a["state"] == "ready" and a["plan"]["uses"] and \
                {u["device"] for u in a["plan"]["uses"] if u["component"] == "weights"} >= {"Vulkan0"}
            load("gemma-b")
            assert d.instance("gemma-a")["state"] == "stopped", "gemma-a still holds Vulkan0"
            r = http.post("/v1/completions", json={"model": "gemma-a", "prompt": "1 + 1 =", "max_tokens": 2})
            assert r.status_code == 200, r.text
            a = d.instance("gemma-a")
            assert a["state"] == "ready" and a["loads"] == 2
            assert d.instance("gemma-b")["state"] == "stopped"
        log = (tmp_path / "state" / "bostudio" / "logs" / "daemon.log").read_text()
        assert "gemma-a: evicted to make room for gemma-b" in log and "gemma-b: evicted to make room for gemma-a" in log
    finally:
        assert d.stop() == 0
    assert not d.children()
