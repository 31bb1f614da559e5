"""Hardware probes against recorded real formats: a fake pynvml/amdsmi with the real API surface,
a sysfs tree, sysctl output, `llama-server --list-devices` text and xpu-smi JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from bostudio.cli import main
from bostudio.errors import ConfigError
from bostudio.engine.discover import parse_devices
from bostudio.hardware import Device, cross_check, discover_devices, load_devices_file
from bostudio.hardware.amd import probe_amd
from bostudio.hardware.apple import probe_apple
from bostudio.hardware.cpu import probe_cpu
from bostudio.hardware.device import GIB, MIB
from bostudio.hardware.intel import probe_intel
from bostudio.hardware.nvidia import probe_nvidia

DATA = Path(__file__).parent / "data" / "hardware"
SYSFS = DATA / "sysfs"


def load_fake(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def nvml() -> ModuleType:
    mod = load_fake("fake_pynvml")
    mod.install([
        {"name": "NVIDIA GeForce RTX 4090", "total": 24564 * MIB, "free": 24000 * MIB,
         "mem_clock": 10501, "bus_width": 384},
        {"name": "NVIDIA GeForce RTX 3060", "total": 12288 * MIB, "free": 12000 * MIB,
         "mem_clock": None, "bus_width": None},
    ])
    return mod


class FakePsutil:
    class _VM:
        total = 64 * GIB
        available = 50 * GIB

    @staticmethod
    def virtual_memory() -> "FakePsutil._VM":
        return FakePsutil._VM()


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def runner(outputs: dict[tuple[str, ...], str]):  # type: ignore[no-untyped-def]
    """A `run` seam that replays recorded tool output; a tool not recorded is not installed."""
    def run(argv: list[str]) -> str:
        if tuple(argv) not in outputs:
            raise FileNotFoundError(argv[0])
        return outputs[tuple(argv)]
    return run


# ---------------------------------------------------------------- NVIDIA

def test_nvidia_reads_every_gpu_with_bandwidth_when_known(nvml: ModuleType) -> None:
    r = probe_nvidia(nvml)
    assert [d.name for d in r.devices] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3060"]
    a, b = r.devices
    assert (a.vendor, a.backend, a.total_bytes, a.free_bytes, a.unified) == ("nvidia", "cuda", 24564 * MIB, 24000 * MIB, False)
    assert a.driver == "550.54.15" and a.source == "pynvml"
    assert a.bandwidth_gbs == pytest.approx(1008.0, abs=0.5)  # the RTX 4090 datasheet figure
    assert b.bandwidth_gbs is None  # NotSupported is "unknown", not an error
    assert r.problems == () and nvml._state["shutdowns"] == 1


def test_a_lost_nvidia_gpu_does_not_hide_the_others(nvml: ModuleType) -> None:
    gpus = nvml._state["gpus"]
    nvml.install([gpus[0], nvml.NVMLError_GpuIsLost(), gpus[1]])
    r = probe_nvidia(nvml)
    assert [d.index for d in r.devices] == [0, 2]
    assert r.problems == ("nvidia: GPU 1 unreadable (GPU is lost)",)


def test_no_nvml_library_is_a_note(nvml: ModuleType) -> None:
    nvml.install([], init_error=nvml.NVMLError_LibraryNotFound())
    r = probe_nvidia(nvml)
    assert r.devices == () and r.problems == ("nvidia: NVML unavailable (NVML Shared Library Not Found)",)


# ---------------------------------------------------------------- AMD

def test_amd_from_amdsmi() -> None:
    smi = load_fake("fake_amdsmi")
    smi.install([{"name": "AMD Instinct MI300X", "vram_total": 192 * GIB, "vram_used": 2 * GIB},
                 {"name": "broken", "broken": True}])
    r = probe_amd(smi, root=SYSFS)
    (d,) = r.devices
    assert (d.name, d.backend, d.total_bytes, d.free_bytes, d.source) == ("AMD Instinct MI300X", "hip", 192 * GIB, 190 * GIB, "amdsmi")
    assert d.driver == "amdgpu 6.8.5"
    assert r.problems and "GPU 1 unreadable" in r.problems[0]


def test_amd_falls_back_to_sysfs_when_amdsmi_fails() -> None:
    smi = load_fake("fake_amdsmi")
    smi.install([], init_error=smi.AmdSmiLibraryException("AMDSMI_STATUS_INIT_ERROR"))
    r = probe_amd(smi, root=SYSFS)
    (d,) = r.devices
    assert (d.name, d.total_bytes, d.free_bytes, d.source) == ("AMD Radeon RX 7900 XTX", 25753026560, 25753026560 - GIB, "sysfs")
    assert d.driver == "amdgpu 6.8.5"
    assert "reading sysfs" in r.problems[0]


# ---------------------------------------------------------------- Intel

def test_intel_sysfs_discrete_and_integrated() -> None:
    r = probe_intel(root=SYSFS, run=runner({}))
    arc, igpu = r.devices
    assert (arc.total_bytes, arc.unified, arc.driver, arc.backend) == (12 * GIB, False, "xe", "sycl")
    # no local memory region: an iGPU sharing system RAM (MemTotal from /proc/meminfo)
    assert (igpu.unified, igpu.total_bytes, igpu.driver) == (True, 32780264 * 1024, "i915")


def test_intel_xpu_smi_when_sysfs_has_none(tmp_path: Path) -> None:
    run = runner({("xpu-smi", "discovery", "-j"): recorded("xpu_smi_discovery.json"),
                  ("xpu-smi", "discovery", "-d", "0", "-j"): recorded("xpu_smi_discovery_d0.json")})
    (d,) = probe_intel(root=tmp_path, run=run).devices
    assert (d.name, d.total_bytes, d.free_bytes, d.source) == ("Intel(R) Data Center GPU Max 1100", 48 * GIB, 48 * GIB, "xpu-smi")
    assert probe_intel(root=tmp_path, run=runner({})).devices == ()  # neither: simply no Intel GPU


# ---------------------------------------------------------------- Apple

@pytest.mark.parametrize("fixture,total,name", [
    ("sysctl_m2max.txt", 64 * GIB * 3 // 4, "Apple M2 Max"),     # default wired limit: 3/4 above 36 GiB
    ("sysctl_m3_wired.txt", 120000 * MIB, "Apple M3 Ultra"),     # iogpu.wired_limit_mb raised by the user
])
def test_apple_unified_memory_from_sysctl(fixture: str, total: int, name: str) -> None:
    (d,) = probe_apple(lambda argv: recorded(fixture)).devices
    assert (d.vendor, d.backend, d.name, d.total_bytes, d.unified) == ("apple", "metal", name, total, True)


def test_intel_mac_has_no_metal_gpu() -> None:
    r = probe_apple(lambda argv: recorded("sysctl_intel_mac.txt"))
    assert r.devices == () and "not Apple Silicon" in r.problems[0]


# ---------------------------------------------------------------- CPU, list-devices, discovery

def test_cpu_ram_from_psutil() -> None:
    (d,) = probe_cpu(FakePsutil, cpu_name="Test CPU").devices  # type: ignore[arg-type]
    assert (d.vendor, d.total_bytes, d.free_bytes, d.label) == ("cpu", 64 * GIB, 50 * GIB, "CPU")


def test_cross_check_names_gpus_as_the_engine_does(nvml: ModuleType) -> None:
    r = discover_devices(nvml=nvml, ps=FakePsutil, root=SYSFS, run=runner({}), system="Linux",
                         engine_devices=parse_devices(recorded("list_devices_cuda2.txt")))
    by_name = {d.name: d for d in r.devices}
    assert by_name["NVIDIA GeForce RTX 4090"].engine_name == "CUDA0"
    assert by_name["NVIDIA GeForce RTX 3060"].engine_name == "CUDA1"
    # the AMD card in sysfs has no CUDA device: this engine build cannot use it
    assert any("cannot use amd GPU" in p for p in r.problems)


def test_cross_check_vulkan_and_engine_only_devices() -> None:
    amd = Device("amd", "hip", "AMD Radeon RX 7900 XTX", 0, 24 * GIB, 23 * GIB, source="sysfs")
    r = cross_check((amd,), parse_devices(recorded("list_devices_vulkan.txt")))
    assert r.devices[0].engine_name == "Vulkan0" and r.devices[0].backend == "vulkan"
    r = cross_check((), parse_devices(recorded("list_devices_metal.txt")))
    (d,) = r.devices
    assert (d.vendor, d.backend, d.unified, d.source, d.label) == ("apple", "metal", True, "list-devices", "MTL0")
    assert "found only by the engine" in r.problems[0]
    # a CPU-only build lists (none): every GPU the probes found is unusable with it
    r = cross_check((amd,), parse_devices(recorded("list_devices_none.txt")))
    assert r.devices == (amd,) and "cannot use amd GPU 0" in r.problems[0]


def test_one_vendor_failing_never_hides_the_others(nvml: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import bostudio.hardware.discover as disc

    def explode(*a: object, **k: object) -> None:
        raise RuntimeError("driver crashed")

    monkeypatch.setattr(disc, "probe_amd", explode)
    r = discover_devices(nvml=nvml, ps=FakePsutil, root=SYSFS, run=runner({}), system="Linux")
    vendors = [d.vendor for d in r.devices]
    assert vendors.count("nvidia") == 2 and "intel" in vendors and "cpu" in vendors
    assert "amd: probe failed (RuntimeError: driver crashed)" in r.problems


# ---------------------------------------------------------------- devices file and CLI

def test_devices_file_round_trip_and_errors(tmp_path: Path, nvml: ModuleType) -> None:
    devices = discover_devices(nvml=nvml, ps=FakePsutil, root=tmp_path, run=runner({}), system="Linux").devices
    f = tmp_path / "devices.json"
    f.write_text(json.dumps({"devices": [d.to_json() for d in devices]}))
    assert load_devices_file(f) == devices
    f.write_text(json.dumps([{"vendor": "nvidia", "backend": "cuda", "name": "RTX 4090", "total_gib": 24}]))
    assert load_devices_file(f)[0].total_bytes == 24 * GIB
    f.write_text(json.dumps([{"vendor": "nvidia", "backend": "cuda", "name": "x", "totl_gib": 24}]))
    with pytest.raises(ConfigError, match="unknown device key 'totl_gib'") as exc:
        load_devices_file(f)
    assert "total_gib" in exc.value.hint


def test_cli_devices_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--json", "--engine", str(DATA / "no-such-server")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any(d["vendor"] == "cpu" and d["total_bytes"] > 0 for d in out["devices"])
    assert any("file does not exist" in p for p in out["problems"]) and out["engine"] is None


def test_cli_devices_text_with_the_built_engine(llama_server: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--engine", str(llama_server)]) == 0
    text = capsys.readouterr().out
    assert "CPU" in text and "total" in text and "from psutil" in text
    assert "no llama-server" not in text


# ---------------------------------------------------------------- software devices (lavapipe) and caps

def test_lavapipe_is_a_software_device_on_host_ram() -> None:
    """Mesa's lavapipe, as the Vulkan engine lists it with GGML_VK_VISIBLE_DEVICES=0 (recorded on Debian 12)."""
    r = cross_check((), parse_devices(recorded("list_devices_lavapipe.txt")))
    (d,) = r.devices
    assert (d.label, d.backend, d.vendor, d.software, d.unified) == ("Vulkan0", "vulkan", "other", True, True)
    assert d.name.startswith("llvmpipe") and d.total_bytes > 0
    assert r.problems == ()  # no vendor probe could have seen it: nothing to remark


def test_a_real_gpu_is_preferred_to_lavapipe() -> None:
    amd = Device("amd", "hip", "AMD Radeon RX 7900 XTX", 0, 24 * GIB, 23 * GIB, source="sysfs")
    both = parse_devices(recorded("list_devices_vulkan.txt")) + parse_devices(recorded("list_devices_lavapipe.txt"))
    both = tuple(d if d.software else d.__class__("Vulkan1", d.description, d.total_mib, d.free_mib, d.backend)
                 for d in both)[::-1]  # lavapipe first, as GGML_VK_VISIBLE_DEVICES may order it
    r = cross_check((amd,), both)
    assert [d.label for d in r.devices] == ["Vulkan1"] and not r.devices[0].software
    assert any("software device, left out while a real GPU is present" in p for p in r.problems)


def test_device_budgets_from_config(tmp_path: Path) -> None:
    from bostudio.hardware.budget import apply_budgets, device_budgets

    cfg = tmp_path / "config.toml"
    cfg.write_text("[devices.Vulkan0]\nbudget_mib = 300\n\n[devices.CPU]\nbudget_mib = 1024.5\n")
    caps = device_budgets(cfg)
    assert caps == {"Vulkan0": 300 * MIB, "CPU": int(1024.5 * MIB)}
    devs = cross_check((), parse_devices(recorded("list_devices_lavapipe.txt"))).devices
    (vk,), notes = apply_budgets(devs, caps)
    assert vk.budget_bytes == 300 * MIB and "caps a device this machine does not list" in notes[0]
    # an existing, smaller budget (an RPC worker's) stays
    (vk2,), _ = apply_budgets((vk.with_(budget_bytes=100 * MIB),), caps)
    assert vk2.budget_bytes == 100 * MIB


@pytest.mark.parametrize("text, needle, hint", [
    ("[devices.Vulkan0]\nbudget_mb = 3\n", "unknown key `budget_mb` in [devices.Vulkan0]", "budget_mib"),
    ("[devices.Vulkan0]\nbudget_mib = -3\n", "budget_mib must be a positive number", "budget_mib = 4096"),
    ("[devices.Vulkan0]\nbudget_mib = \"4G\"\n", "budget_mib must be a positive number", "budget_mib = 4096"),
    ("[devices]\nVulkan0 = 300\n", "[devices] Vulkan0 must be a table", "[devices.Vulkan0]"),
    ("devices = 3\n", "`devices` must be a table", "[devices]"),
])
def test_bad_device_budgets_are_config_errors(tmp_path: Path, text: str, needle: str, hint: str) -> None:
    from bostudio.hardware.budget import device_budgets

    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as exc:
        device_budgets(cfg)
    assert needle in exc.value.message and str(cfg) in exc.value.message and hint in exc.value.hint


def test_vulkaninfo_gives_the_largest_tensor_a_vulkan_device_takes(tmp_path: Path) -> None:
    """lavapipe binds at most 128 MiB per buffer (recorded vulkaninfo, Mesa 22.3.6): ggml-vulkan keeps a
    larger weight on the host, so the plan must know the limit."""
    listed = parse_devices(recorded("list_devices_lavapipe.txt"))
    r = discover_devices(ps=FakePsutil, root=tmp_path, system="Linux", engine_devices=listed, budgets={},
                         run=runner({("vulkaninfo",): recorded("vulkaninfo_lavapipe.txt")}))
    vk = next(d for d in r.devices if d.backend == "vulkan")
    assert vk.max_tensor_bytes == 128 * MIB and not any("vulkaninfo" in p for p in r.problems)
    # without vulkaninfo the limit is unknown, not an error, and `devices` says what to install
    r = discover_devices(ps=FakePsutil, root=tmp_path, system="Linux", engine_devices=listed, budgets={},
                         run=runner({}))
    assert next(d for d in r.devices if d.backend == "vulkan").max_tensor_bytes is None
    assert any("Vulkan0" in p and "vulkan-tools" in p for p in r.problems), r.problems


def test_an_amx_engine_marks_the_host_and_only_the_host(tmp_path: Path) -> None:
    listed = parse_devices(recorded("list_devices_lavapipe.txt"))
    r = discover_devices(ps=FakePsutil, root=tmp_path, system="Linux", engine_devices=listed, budgets={},
                         run=runner({}), host_amx=True)
    assert [d.cpu_amx for d in r.devices if not d.is_gpu] == [True]
    assert not any(d.cpu_amx for d in r.devices if d.is_gpu)
    r = discover_devices(ps=FakePsutil, root=tmp_path, system="Linux", engine_devices=listed, budgets={},
                         run=runner({}))
    assert not any(d.cpu_amx for d in r.devices)
