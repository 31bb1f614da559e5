"""A stand-in for nvidia-ml-py's `pynvml` with the API surface bostudio's probe uses.

State is set per test with `install(gpus, driver=...)`; a GPU given as an exception instance raises
it from nvmlDeviceGetHandleByIndex, the way a GPU that has fallen off the bus does.
"""

from __future__ import annotations

from collections import namedtuple

NVML_CLOCK_MEM = 2


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_GpuIsLost(NVMLError):
    def __str__(self) -> str:
        return "GPU is lost"


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


c_nvmlMemory_t = namedtuple("c_nvmlMemory_t", "total free used")

_state: dict = {"gpus": [], "driver": "550.54.15", "init_error": None, "shutdowns": 0}


def install(gpus: list, driver: str = "550.54.15", init_error: Exception | None = None) -> None:
    _state.update(gpus=gpus, driver=driver, init_error=init_error, shutdowns=0)


def nvmlInit() -> None:
    if _state["init_error"] is not None:
        raise _state["init_error"]


def nvmlShutdown() -> None:
    _state["shutdowns"] += 1


def nvmlSystemGetDriverVersion() -> str:
    return _state["driver"]


def nvmlDeviceGetCount() -> int:
    return len(_state["gpus"])


def nvmlDeviceGetHandleByIndex(i: int) -> dict:
    gpu = _state["gpus"][i]
    if isinstance(gpu, Exception):
        raise gpu
    return gpu


def nvmlDeviceGetName(h: dict) -> bytes:
    return h["name"].encode()  # older nvidia-ml-py returns bytes


def nvmlDeviceGetMemoryInfo(h: dict) -> c_nvmlMemory_t:
    return c_nvmlMemory_t(h["total"], h["free"], h["total"] - h["free"])


def nvmlDeviceGetMaxClockInfo(h: dict, clock: int) -> int:
    if h.get("mem_clock") is None:
        raise NVMLError_NotSupported()
    return h["mem_clock"]


def nvmlDeviceGetMemoryBusWidth(h: dict) -> int:
    if h.get("bus_width") is None:
        raise NVMLError_NotSupported()
    return h["bus_width"]
