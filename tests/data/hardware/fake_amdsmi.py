"""A stand-in for the `amdsmi` Python module (ROCm) with the calls bostudio's probe makes."""

from __future__ import annotations

import enum


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    pass


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


_state: dict = {"gpus": [], "init_error": None}


def install(gpus: list, init_error: Exception | None = None) -> None:
    _state.update(gpus=gpus, init_error=init_error)


def amdsmi_init(flags: int = 0) -> None:
    if _state["init_error"] is not None:
        raise _state["init_error"]


def amdsmi_shut_down() -> None:
    pass


def amdsmi_get_processor_handles() -> list:
    return list(_state["gpus"])


def amdsmi_get_gpu_memory_total(h: dict, mem_type: AmdSmiMemoryType) -> int:
    if h.get("broken"):
        raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")
    return h["vram_total"]


def amdsmi_get_gpu_memory_usage(h: dict, mem_type: AmdSmiMemoryType) -> int:
    return h["vram_used"]


def amdsmi_get_gpu_asic_info(h: dict) -> dict:
    return {"market_name": h["name"], "vendor_id": "0x1002"}


def amdsmi_get_gpu_driver_info(h: dict) -> dict:
    return {"driver_name": "amdgpu", "driver_version": "6.8.5"}
