"""The one shape every hardware probe returns: a Device, plus the problems a probe met.

Unknown is a value, not an exception: a field a source cannot tell is None and prints as "unknown".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bostudio.errors import ConfigError

VENDORS = ("nvidia", "amd", "intel", "apple", "cpu", "other")
# Backends as llama.cpp names its devices: CUDA0, ROCm0, SYCL0, Vulkan0, MTL0; "cpu" is host RAM.
# The same names as `bostudio engine build --backend` and the engine probe (ROCm builds are "hip").
BACKENDS = ("cuda", "hip", "sycl", "vulkan", "metal", "musa", "rpc", "cpu", "unknown")

MIB = 1024 * 1024
GIB = 1024 * MIB

# Software Vulkan devices: the CPU behind a GPU API (Mesa's lavapipe names itself "llvmpipe (LLVM ...)",
# Google's SwiftShader). llama.cpp lists them only when GGML_VK_VISIBLE_DEVICES names them; their memory
# is host RAM and their speed the CPU's, so they are planned as unified and never preferred to a real GPU.
SOFTWARE_DEVICE_WORDS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")


def is_software_device(description: str) -> bool:
    """Whether a device name is a software rasterizer's (lavapipe, SwiftShader), not a GPU's."""
    d = description.lower()
    return any(w in d for w in SOFTWARE_DEVICE_WORDS)


@dataclass(frozen=True)
class Device:
    """One memory pool llama.cpp can put weights and caches in.

    total/free are bytes; free None = unknown (plan against total then). unified = the GPU shares
    system RAM (Apple Silicon, iGPUs); such a device and the host RAM are one budget, not two.
    """

    vendor: str
    backend: str
    name: str
    index: int = 0
    total_bytes: int = 0
    free_bytes: int | None = None
    unified: bool = False
    driver: str | None = None
    bandwidth_gbs: float | None = None
    source: str = "unknown"
    engine_name: str | None = None  # the engine's name for it ("CUDA0"), once cross-checked
    endpoint: str | None = None  # an RPC worker's HOST:PORT (backend "rpc"): a device on another machine
    budget_bytes: int | None = None  # a cap the planner keeps to (an RPC worker's budget_mib)
    link_mbit: int | None = None  # an RPC worker's network link (None: the estimate's 1 Gbit/s default)
    cores: int | None = None  # the host's CPU cores this process may use (physical; None: unknown)
    software: bool = False  # a software device (lavapipe): a GPU API over the CPU and host RAM
    # The largest weight the backend takes on the device (ggml-vulkan: maxStorageBufferRange, 128 MiB on
    # lavapipe): a larger one, such as a big vocabulary's output projection, stays on the host. None: unknown.
    max_tensor_bytes: int | None = None
    # The host only: the engine's CPU backend repacks weights into ggml's AMX buffer type (Engine.amx).
    cpu_amx: bool = False

    @property
    def remote(self) -> bool:
        return self.backend == "rpc"

    @property
    def is_gpu(self) -> bool:
        return self.vendor != "cpu"

    @property
    def usable_bytes(self) -> int:
        """What a plan may count on: free memory when known, else the total."""
        return self.free_bytes if self.free_bytes is not None else self.total_bytes

    @property
    def label(self) -> str:
        """Short stable name: the engine's device name when known, else vendor+index."""
        if self.engine_name:
            return self.engine_name
        return "CPU" if self.vendor == "cpu" else f"{self.vendor}{self.index}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> "Device":
        return replace(self, **changes)


@dataclass(frozen=True)
class ProbeResult:
    """What a probe (or all of them) found: devices, and why some source said nothing."""

    devices: tuple[Device, ...] = ()
    problems: tuple[str, ...] = field(default=())

    def __add__(self, other: "ProbeResult") -> "ProbeResult":
        return ProbeResult(self.devices + other.devices, self.problems + other.problems)


@dataclass(frozen=True)
class EngineDevice:
    """A device as the engine lists it (`llama-server --list-devices`, parsed by engine.discover):
    `CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23000 MiB free)`."""

    name: str  # e.g. CUDA0
    description: str
    total_mib: int
    free_mib: int
    backend: str

    @property
    def software(self) -> bool:
        return is_software_device(self.description)


CPU_ONLY = (Device(vendor="cpu", backend="cpu", name="CPU"),)


def devices_from_engine(engine_devices: Iterable[EngineDevice]) -> tuple[Device, ...]:
    """The devices as the engine alone sees them, without running the vendor probes: host RAM (CPU_ONLY),
    then each device the engine lists, named as the engine names it."""
    gpus = tuple(Device(vendor=d.backend, backend=d.backend, name=d.description, index=i,
                        total_bytes=d.total_mib * MIB, free_bytes=d.free_mib * MIB, engine_name=d.name,
                        unified=d.software, software=d.software)
                 for i, d in enumerate(engine_devices))
    return CPU_ONLY + prefer_real_gpus(gpus)


def prefer_real_gpus(devices: Iterable[Device]) -> tuple[Device, ...]:
    """The devices a plan may use: a software device only when no real GPU is there (a real GPU beside
    lavapipe takes the layers; lavapipe would only slow it down and share the host's RAM)."""
    devs = tuple(devices)
    if any(d.is_gpu and not d.software for d in devs):
        return tuple(d for d in devs if not d.software)
    return devs


def reading(call: Any, *args: Any) -> Any:
    """A vendor-library reading some devices or drivers do not support: unknown (None), not an error."""
    try:
        return call(*args)
    except Exception:  # NotSupported and friends from NVML/amdsmi
        return None


_FIELDS = {f for f in Device.__dataclass_fields__}


def device_from_json(data: dict[str, Any], where: str = "devices file") -> Device:
    """Build a Device from a JSON object (as `bostudio devices --json` prints, or hand-written).

    Accepts `total_gib`/`free_gib` (and `budget_mib`) as a convenience for planning another machine
    ("a 24 GiB GPU": {"vendor": "nvidia", "backend": "cuda", "name": "RTX 4090", "total_gib": 24}; an
    RPC worker's GPU: {"vendor": "other", "backend": "rpc", "name": "4090 on pc2", "total_gib": 24,
    "engine_name": "RPC0", "endpoint": "192.168.1.20:50052"}).
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: each device must be a JSON object, got {type(data).__name__}")
    known = _FIELDS | {"total_gib", "free_gib", "budget_mib", "usable_bytes", "is_gpu", "label", "remote"}
    unknown = sorted(set(data) - known)
    if unknown:
        import difflib

        near = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise ConfigError(f"{where}: unknown device key {unknown[0]!r}",
                          f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(sorted(known))}")
    values = {k: v for k, v in data.items() if k in _FIELDS}
    if "total_gib" in data:
        values["total_bytes"] = int(float(data["total_gib"]) * GIB)
    if "free_gib" in data:
        values["free_bytes"] = int(float(data["free_gib"]) * GIB)
    if "budget_mib" in data:
        values["budget_bytes"] = int(float(data["budget_mib"]) * MIB)
    for key in ("vendor", "backend", "name"):
        if key not in values:
            raise ConfigError(f"{where}: a device needs {key!r}", "e.g. {\"vendor\": \"nvidia\", "
                              "\"backend\": \"cuda\", \"name\": \"RTX 4090\", \"total_gib\": 24}")
    if values["vendor"] not in VENDORS:
        raise ConfigError(f"{where}: unknown vendor {values['vendor']!r}", f"one of {', '.join(VENDORS)}")
    if values["backend"] not in BACKENDS:
        raise ConfigError(f"{where}: unknown backend {values['backend']!r}", f"one of {', '.join(BACKENDS)}")
    cores = values.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores <= 0):
        raise ConfigError(f"{where}: cores of {values['name']!r} must be a positive whole number",
                          "e.g. \"cores\": 16 (the physical cores of the host)")
    link = values.get("link_mbit")
    if link is not None and (isinstance(link, bool) or not isinstance(link, int) or link <= 0):
        raise ConfigError(f"{where}: link_mbit of {values['name']!r} must be a positive whole number of Mbit/s",
                          "e.g. \"link_mbit\": 1000 for Gigabit Ethernet")
    if int(values.get("total_bytes", 0)) <= 0:
        raise ConfigError(f"{where}: device {values['name']!r} has no memory size",
                          "give total_bytes or total_gib")
    return Device(**values)
