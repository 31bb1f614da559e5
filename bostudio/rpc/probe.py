"""A worker's devices, seen through the engine: `llama-server --rpc HOST:PORT --list-devices`.

Each worker is probed alone, so one that does not answer is one line and the rest go on
(llama.cpp aborts the whole process when any --rpc endpoint fails its connect or handshake,
ggml-rpc.cpp rpc_dispatcher::start). A TCP connect first tells "nothing listens" apart from
"something listens but is no rpc-server" (or is busy: rpc-server serves one client at a time).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from bostudio.engine.discover import parse_devices
from bostudio.hardware.device import MIB, Device, EngineDevice
from bostudio.rpc.workers import Worker

if TYPE_CHECKING:
    from bostudio.engine.discover import Engine

CONNECT_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class WorkerProbe:
    """What one worker answered: its devices (as the engine lists them), or why it could not be used."""

    worker: Worker
    devices: tuple[EngineDevice, ...] = ()
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and bool(self.devices)


def _connects(w: Worker, timeout: float) -> str | None:
    try:
        with socket.create_connection((w.host, w.port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"host {w.host!r} is unknown"
    except ConnectionRefusedError:
        return "nothing listens there (connection refused)"
    except TimeoutError:
        return f"no answer within {timeout:.0f} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def probe_worker(server: Path, w: Worker, timeout: float = PROBE_TIMEOUT_S) -> WorkerProbe:
    """Ask the engine which devices `w` exposes. Never raises for a bad worker."""
    why = _connects(w, min(CONNECT_TIMEOUT_S, timeout))
    if why:
        return WorkerProbe(w, problem=f"rpc worker {w.endpoint} cannot be reached: {why}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    try:
        proc = subprocess.run([str(server), "--rpc", w.endpoint, "--list-devices"], capture_output=True,
                              text=True, errors="replace", timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return WorkerProbe(w, problem=f"rpc worker {w.endpoint} did not answer the RPC handshake within "
                                      f"{timeout:.0f} s (not an rpc-server, or busy serving another client)")
    except OSError as exc:
        return WorkerProbe(w, problem=f"cannot run {server}: {exc}")
    devices = tuple(d for d in parse_devices(proc.stdout) if d.backend == "rpc")
    if proc.returncode != 0 or not devices:
        err = proc.stderr + proc.stdout
        if "RPC not supported" in err or "failed to find RPC backend" in err:
            why = f"{server} was built without the RPC backend (rebuild: `bostudio engine build`)"
        elif "version mismatch" in err:
            why = "it runs another RPC protocol version (use the same llama.cpp build on both machines)"
        elif ("handshake failed" in err or "Failed to connect" in err
              or "malformed response" in err):  # RPC_STATUS_ASSERT during the hello
            why = "it is not an rpc-server (the RPC handshake failed)"
        else:
            # an abort appends a gdb backtrace: the reason is the first line that says error/failed
            lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
            lines = [ln for ln in lines if re.search(r"error|fail|abort", ln, re.I)] or lines
            why = f"the engine could not list its devices ({lines[-1][:160] if lines else f'exit {proc.returncode}'})"
        return WorkerProbe(w, problem=f"rpc worker {w.endpoint}: {why}")
    return WorkerProbe(w, devices)


def probe_workers(server: Path, workers: Iterable[Worker], timeout: float = PROBE_TIMEOUT_S) -> tuple[WorkerProbe, ...]:
    return tuple(probe_worker(server, w, timeout) for w in workers)


def pool_devices(probes: Iterable[WorkerProbe]) -> tuple[Device, ...]:
    """The reachable workers' devices as planner Devices, named as llama-server will name them when
    launched with `--rpc` listing exactly these workers in this order (RPC0, RPC1, ... counting
    every device of every worker, ggml_backend_rpc_add_server). A worker's budget_mib caps what
    the plan puts on it; split over its devices by their free memory."""
    out: list[Device] = []
    n = 0
    for p in probes:
        if not p.ok:
            continue
        free_all = sum(d.free_mib for d in p.devices) or 1
        for k, d in enumerate(p.devices):
            budget = None
            if p.worker.budget_mib is not None:
                budget = p.worker.budget_mib * MIB * d.free_mib // free_all
            out.append(Device(vendor="other", backend="rpc", name=f"rpc-server {p.worker.endpoint} #{k}",
                              index=n, total_bytes=d.total_mib * MIB, free_bytes=d.free_mib * MIB,
                              source=f"rpc {p.worker.endpoint}", engine_name=f"RPC{n}",
                              endpoint=p.worker.endpoint, budget_bytes=budget, link_mbit=p.worker.link_mbit))
            n += 1
    return tuple(out)


def buffer_labels(devices: Iterable[Device]) -> dict[str, str]:
    """llama.cpp's RPC buffer names ("RPC<index on its server>[HOST:PORT]") -> the plan's device
    labels (RPC0, RPC1, ... over all workers)."""
    out = {}
    for d in devices:
        if d.endpoint and " #" in d.name:
            out[f"RPC{d.name.rsplit(' #', 1)[1]}[{d.endpoint}]"] = d.label
    return out


def rpc_arg(probes: Iterable[WorkerProbe]) -> str:
    """The `--rpc` value for the reachable workers, in the order pool_devices numbered them."""
    return ",".join(p.worker.endpoint for p in probes if p.ok)


@dataclass(frozen=True)
class Pool:
    """The workers a launch uses: their devices (named as llama-server will name them), the
    `--rpc` value, and one line per worker that could not be used."""

    devices: tuple[Device, ...] = ()
    rpc: str | None = None
    problems: tuple[str, ...] = ()
    probes: tuple[WorkerProbe, ...] = ()


def discover_pool(engine: "Engine", workers: Iterable[Worker], timeout: float = PROBE_TIMEOUT_S) -> Pool:
    """Probe `workers` through `engine`; unreachable ones become problems and the pool goes on."""
    workers = tuple(workers)
    if not workers:
        return Pool()
    engine.require_rpc()
    probes = probe_workers(engine.path, workers, timeout)
    return Pool(pool_devices(probes), rpc_arg(probes) or None,
                tuple(p.problem or f"rpc worker {p.worker.endpoint}: no devices" for p in probes if not p.ok),
                probes)
