"""A plan over a pool of devices: where each part lives and why, and what the network costs. Pure.

The network estimate: a decoded token crosses the network once at each split point next to a
remote (RPC) device, carrying the hidden state (n_embd f32 values), and once more with the logits
(n_vocab f32) when the output layer itself sits on a remote device. Each crossing is also a round
trip (ggml-rpc sends the graph and waits). A plan warns when that time is a sizeable share of the
time the devices spend reading their weights for the token (decode is memory-bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from bostudio.hardware.device import Device
from bostudio.planner.fit import Plan, PlanOption, fastest_device, llama_device_order, plan_kind, spec_label
from bostudio.planner.memory import GIB, MIB

if TYPE_CHECKING:
    from bostudio.gguf.describe import ModelInfo

DEFAULT_LINK_MBIT = 1000  # 1 Gbit/s Ethernet: what a desktop LAN gives unless told otherwise ([[rpc]] link_mbit)
ROUND_TRIP_S = 0.5e-3  # one request/response on a LAN, ggml-rpc's graph_compute included
# Memory bandwidth when a probe does not know it (decode reads every weight once per token).
DEFAULT_BANDWIDTH_GBS = {"cpu": 50.0, "rpc": 100.0, "gpu": 300.0}
BOTTLENECK_SHARE = 0.25  # warn when the network takes more than this share of a token's time


@dataclass(frozen=True)
class NetworkEstimate:
    split_points: int  # crossings to or from a remote device per token
    bytes_per_token: int
    network_ms: float
    compute_ms: float
    link_mbit: int = DEFAULT_LINK_MBIT  # the slowest link a token crosses

    @property
    def bottleneck(self) -> bool:
        return self.split_points > 0 and self.network_ms > BOTTLENECK_SHARE * self.compute_ms

    def line(self) -> str:
        if not self.split_points:
            return "network: no remote device holds layers"
        share = self.network_ms / max(1e-9, self.network_ms + self.compute_ms)
        text = (f"network: {self.split_points} split point(s) cross the network per token, "
                f"{self.bytes_per_token / 1024:.0f} KiB, ~{self.network_ms:.2f} ms at {_speed(self.link_mbit)} with "
                f"{ROUND_TRIP_S * 1e3:.1f} ms round trips, against ~{self.compute_ms:.2f} ms of weight "
                f"reads ({100 * share:.0f}% of a token's time)")
        if self.bottleneck:
            text += ("; WARNING: the network is the bottleneck: use fewer workers, put the output layer "
                     "on a local device, or a faster link")
        return text


def _speed(mbit: int) -> str:
    return f"{mbit / 1000:g} Gbit/s" if mbit >= 1000 else f"{mbit} Mbit/s"


def _bandwidth(d: Device) -> float:
    if d.bandwidth_gbs:
        return d.bandwidth_gbs
    return DEFAULT_BANDWIDTH_GBS["cpu" if not d.is_gpu else "rpc" if d.remote else "gpu"]


def network_estimate(model: "ModelInfo", option: PlanOption, devices: Iterable[Device]) -> NetworkEstimate:
    """Per decoded token: the bytes and round trips the split costs, and the weight-read time."""
    devs = list(devices)
    by_label = {d.label: d for d in devs}
    host = next((d for d in devs if not d.is_gpu), None)
    chain: list[Device] = []  # the devices a token passes through, in layer order
    if option.split:
        if host is not None:  # the input embedding always runs on the host (llama-model.cpp: dev_input)
            chain.append(host)
        chain += [by_label[name] for name, c in option.split if c]
        if option.output_on_host and host is not None:
            chain.append(host)  # the output projection runs on the host: the last hidden state comes back
    crossings = sum(1 for a, b in zip(chain, chain[1:]) if a.remote or b.remote)
    link = min((d.link_mbit or DEFAULT_LINK_MBIT for d in chain if d.remote), default=DEFAULT_LINK_MBIT)
    per_token = crossings * model.n_embd * 4
    if chain and chain[-1].remote:
        crossings += 1
        per_token += model.n_vocab * 4  # the logits come back from the device holding the output
    network_s = per_token / (link * 1e6 / 8) + crossings * ROUND_TRIP_S
    compute_s = 0.0
    for d in devs:
        w = sum(u.bytes for u in option.uses if u.device == d.label and u.component == "weights")
        compute_s += w / (_bandwidth(d) * 1e9)
    return NetworkEstimate(crossings, per_token, network_s * 1e3, compute_s * 1e3, link)


def placement_lines(p: Plan) -> list[str]:
    """Where each part lives, and why (for `bostudio plan` and `up`)."""
    o = p.chosen
    devs = list(p.devices)
    by_label = {d.label: d for d in devs}
    lines: list[str] = []
    host = next((d.label for d in devs if not d.is_gpu), "CPU")
    if o.split:
        ngl = sum(c for _, c in o.split)
        on_host = p.model.n_block + 1 - ngl
        parts = [f"{name}{' (' + by_label[name].endpoint + ')' if by_label[name].endpoint else ''}: {c} layers"
                 for name, c in o.split]
        if on_host:
            parts.insert(0, f"{host}: {on_host} layers")
        lines.append("target: " + ", ".join(parts) + " (the output layer counts as one, on the last device)")
        lines.append("  why: layers fill the offload devices in proportion to their budgets (RPC devices "
                     "come first in llama.cpp's order); what does not fit stays on the host")
    elif o.n_gpu_layers and any(d.is_gpu for d in devs):
        gpu = llama_device_order(devs)[0].label
        lines.append(f"target: {o.n_gpu_layers} layers on {gpu}, the rest on {host}")
    else:
        lines.append(f"target: all layers on {host}")
    if o.output_on_host and o.n_gpu_layers:
        out = p.model.output_bytes or p.model.token_embd_bytes
        lines.append(f"output projection: on {host}, pinned with -ot ({out / MIB:.0f} MiB; only its norm stays "
                     f"in the output layer's slot)")
        lines.append("  why: it fits no offload device, and llama.cpp would put it on the last one, "
                     "leaving no room for any layer")
    kind = plan_kind(o.speculator)
    if kind == "draft":
        fast = fastest_device(devs)
        where = o.draft_device or (fast.label if fast.is_gpu else host)
        where = host if where == "none" else where
        lines.append(f"draft: {spec_label(o.speculator)} whole on {where}")
        lines.append("  why: the draft decodes token by token, so it belongs on the fastest local device "
                     "(a remote device would add a network round trip per drafted token)")
    elif kind == "mtp":
        last = next((name for name, c in reversed(o.split) if c), None) if o.split else None
        lines.append(f"MTP head: with the last layers on {last or host}")
    if any(d.remote for d in devs):
        lines.append(network_estimate(p.model, o, devs).line())
    return lines


__all__ = ["NetworkEstimate", "network_estimate", "placement_lines", "GIB", "MIB"]
