"""What llama.cpp itself reports about memory (`-lv 4` log lines), parsed into bytes.

Pure text parsing: used by the accuracy tests, and by anything that wants to hold a launched
server against its plan. The lines (src/llama-model.cpp, llama-context.cpp, llama-kv-cache.cpp,
llama-memory-recurrent.cpp):

    load_tensors:   CPU_Mapped model buffer size =     4.52 MiB
    llama_context:        CPU  output buffer size =     0.00 MiB
    llama_kv_cache: size =    8.00 MiB (  4096 cells,   2 layers,  4/1 seqs), K (f16): ..., V (f16): ...
    llama_memory_recurrent: size =    0.27 MiB (     4 cells,   1 layers,  4 seqs ...), R (f32): ...
    sched_reserve:        CPU compute buffer size =     7.51 MiB
    spec common_specu: - mod size=4194304 (16.000 MB)              (ngram-mod's table)

A draft or MTP context logs the same lines again, after the target's; `contexts` keeps them apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1024 * 1024

_MODEL = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
_OUTPUT = re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB")
_KV = re.compile(r"llama_kv_cache: size =\s+([\d.]+) MiB \(\s*(\d+) cells,\s+(\d+) layers")
_RS = re.compile(r"llama_memory_recurrent: size =\s+([\d.]+) MiB \(\s*(\d+) cells,\s+(\d+) layers")
_COMPUTE = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
_CTX_START = re.compile(r"llama_context: constructing llama_context")
_NGRAM_MOD = re.compile(r"- mod size=\d+ \(([\d.]+) MB\)")  # common/speculative.cpp, MB = 2^20 bytes


def _mib(text: str) -> int:
    return round(float(text) * MIB)


@dataclass
class ContextReport:
    """One llama_context's buffers (the target's, or a draft/MTP context's)."""

    output: int = 0
    kv: int = 0
    kv_cells: list[int] = field(default_factory=list)
    rs: int = 0
    compute: dict[str, int] = field(default_factory=dict)

    @property
    def compute_total(self) -> int:
        return sum(self.compute.values())

    @property
    def total(self) -> int:
        return self.output + self.kv + self.rs + self.compute_total


@dataclass
class ReportedMemory:
    """Buffers in log order: `models[i]` is the i-th model loaded (target first, then draft),
    `contexts[i]` the i-th context created (target first, then draft/MTP)."""

    models: list[dict[str, int]] = field(default_factory=list)
    contexts: list[ContextReport] = field(default_factory=list)
    ngram_table: int = 0  # ngram-mod's hash table, host RAM

    @property
    def total(self) -> int:
        return sum(sum(m.values()) for m in self.models) + sum(c.total for c in self.contexts) + self.ngram_table


def parse_reported_memory(log: str) -> ReportedMemory:
    """Parse a `llama-server -lv 4` (or llama-cli) log. Sizes are printed rounded to 0.01 MiB,
    so each figure is exact to +-5 KiB."""
    rep = ReportedMemory()
    last_model_line = -2
    for n, line in enumerate(log.splitlines()):
        if m := _MODEL.search(line):
            if last_model_line != n - 1 or not rep.models:
                rep.models.append({})  # consecutive buffer lines belong to one model load
            rep.models[-1][m.group(1)] = rep.models[-1].get(m.group(1), 0) + _mib(m.group(2))
            last_model_line = n
        elif m := _NGRAM_MOD.search(line):
            rep.ngram_table = _mib(m.group(1))
        elif _CTX_START.search(line):
            rep.contexts.append(ContextReport())
        elif rep.contexts and (m := _OUTPUT.search(line)):
            rep.contexts[-1].output += _mib(m.group(2))
        elif rep.contexts and (m := _KV.search(line)):
            rep.contexts[-1].kv += _mib(m.group(1))
            rep.contexts[-1].kv_cells.append(int(m.group(2)))
        elif rep.contexts and (m := _RS.search(line)):
            rep.contexts[-1].rs += _mib(m.group(1))
        elif rep.contexts and (m := _COMPUTE.search(line)):
            # reserve runs more than once on some paths; the last figure per buffer type is the one kept
            rep.contexts[-1].compute[m.group(1)] = _mib(m.group(2))
    return rep


_KV_BUF = re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")


def device_of_buffer(name: str, labels: dict[str, str] | None = None) -> str:
    """The device a buffer name belongs to, as the plan labels devices. An RPC buffer is named by the
    device's index on its own server and the server ("RPC0[127.0.0.1:50052]", ggml-rpc.cpp), not
    by the RPCn name llama-server gives the device: `labels` maps the one to the other
    (bostudio.rpc.probe.buffer_labels). "CPU_Mapped"/"CPU_REPACK"/"CPU" are the host, and so is a GPU
    backend's pinned host memory ("Vulkan_Host", "CUDA_Host"), and the CPU backend's AMX buffer ("AMX")."""
    if labels and name in labels:
        return labels[name]
    base = name.split("[", 1)[0]
    return "CPU" if base.startswith("CPU") or base.endswith("_Host") or base == "AMX" else base


def device_buffers(log: str, labels: dict[str, str] | None = None) -> dict[str, dict[str, int]]:
    """Per device, the target's model (weights) and KV buffers as llama-server reports them:
    {"RPC0": {"weights": bytes, "KV cache": bytes}, "CPU": {...}}. The first model load and the
    first context only (a draft's come after)."""
    rep = parse_reported_memory(log)
    out: dict[str, dict[str, int]] = {}
    if rep.models:
        for buf, n in rep.models[0].items():
            key = ("weights (CPU repack)" if buf.startswith("CPU_REPACK") else
                   "weights (CPU AMX)" if buf == "AMX" else "weights")
            dev = out.setdefault(device_of_buffer(buf, labels), {})
            dev[key] = dev.get(key, 0) + n
    contexts = 0
    for line in log.splitlines():
        if _CTX_START.search(line):
            contexts += 1
        elif contexts == 1 and (m := _KV_BUF.search(line)):
            dev = out.setdefault(device_of_buffer(m.group(1), labels), {})
            dev["KV cache"] = dev.get("KV cache", 0) + _mib(m.group(2))
    return out
