"""Text and JSON views of a Plan: a per-device table with bars, both options and the choice."""

from __future__ import annotations

from typing import Any

from bostudio.planner.fit import Plan, PlanOption, spec_label
from bostudio.planner.memory import GIB, MIB
from bostudio.planner.pool import network_estimate, placement_lines

BAR = 30


def _size(n: int) -> str:
    return f"{n / GIB:7.2f} GiB" if n >= GIB else f"{n / MIB:7.1f} MiB"


def _bar(used: int, budget: int) -> str:
    if budget <= 0:
        return "[" + "?" * BAR + "]"
    filled = min(BAR, round(BAR * used / budget))
    return "[" + "#" * filled + "." * (BAR - filled) + "]" + (" OVER" if used > budget else "")


def render_option(title: str, o: PlanOption) -> list[str]:
    head = (f"{title}: {spec_label(o.speculator)} -> -c {o.n_ctx} -ngl {o.n_gpu_layers}"
            + (f" -ngld {o.n_gpu_layers_draft}" if o.speculator.kind == "draft" else "")
            + ("" if o.fits else "  (DOES NOT FIT)"))
    lines = [head]
    if o.reason:
        lines.append(f"  {o.reason}")
    for device, budget in o.budgets:
        used = o.device_bytes(device)
        lines.append(f"  {device:<10} {_size(used)} of {_size(budget)} {_bar(used, budget)}")
        parts: dict[str, int] = {}
        for u in o.uses:
            if u.device == device:
                parts[u.component] = parts.get(u.component, 0) + u.bytes
        for comp, n in sorted(parts.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {comp:<34} {_size(n)}")
    return lines


# The stacked memory bar's segments, in order; every planner component belongs to one.
BAR_GROUPS = ("weights", "KV", "draft", "draft KV", "compute", "prompt cache")


def bar_group(component: str) -> str:
    """The bar segment of a planner component ("draft KV cache" -> "draft KV", "MTP compute buffer" -> "compute")."""
    c = component.lower()
    if c.startswith(("draft kv", "mtp kv")):
        return "draft KV"
    if c.startswith("draft weights"):
        return "draft"
    if c.startswith("weights"):
        return "weights"
    if c.startswith(("kv cache", "recurrent state")):
        return "KV"
    if c.startswith("prompt cache"):
        return "prompt cache"
    return "compute"  # compute/output buffers, their growth when drafting, n-gram table, platform overhead


def option_bars(o: PlanOption) -> list[dict[str, Any]]:
    """Per device: its budget and the bytes of each bar segment (the TUI's stacked bar)."""
    out = []
    for device, budget in o.budgets:
        groups = dict.fromkeys(BAR_GROUPS, 0)
        for u in o.uses:
            if u.device == device:
                groups[bar_group(u.component)] += u.bytes
        used = sum(groups.values())
        out.append({"device": device, "budget": budget, "used": used, "free": max(0, budget - used),
                    "groups": groups})
    return out


def render_plan(p: Plan, flags: list[str]) -> str:
    """The plan for a terminal; `flags`: its memory and thread flags (bostudio.engine.argv.plan_args)."""
    m = p.model
    lines = [f"{m.path.name}: {m.architecture}, {m.n_layer} layers"
             + (f" (+{m.n_nextn} MTP)" if m.n_nextn else "")
             + f", {m.quant}, trained context {m.n_ctx_train}",
             f"KV cache {p.intent.cache_type_k}/{p.intent.cache_type_v}, {p.intent.n_parallel} slots, "
             f"reserve {_size(p.intent.reserve).strip()} per device", ""]
    if p.with_spec is not None:
        lines += render_option("with speculation", p.with_spec) + [""]
    lines += render_option("without speculation", p.without_spec) + [""]
    if p.cost_line:
        lines.append(p.cost_line)
    lines.append(f"choice: {spec_label(p.chosen.speculator)} at {p.chosen.n_ctx} tokens, -ngl {p.chosen.n_gpu_layers}")
    lines.append(f"why: {p.why}")
    lines += placement_lines(p)
    if p.flash_attn_why:
        lines.append(f"flash attention: {p.flash_attn_why}")
    t = p.threads
    if t is not None:
        lines.append(f"threads: -t {t.threads} -tb {t.threads_batch}: {t.why}")
    lines.append("memory and thread flags: " + " ".join(flags))
    return "\n".join(lines)


def option_json(o: PlanOption) -> dict[str, Any]:
    return {"speculator": o.speculator.kind, "spec_types": list(o.speculator.spec_types),
            "label": spec_label(o.speculator), "fits": o.fits,
            "n_ctx": o.n_ctx, "n_gpu_layers": o.n_gpu_layers, "n_gpu_layers_draft": o.n_gpu_layers_draft,
            "reason": o.reason, "budgets": dict(o.budgets),
            "split": [{"device": d, "layers": c} for d, c in o.split], "draft_device": o.draft_device,
            "output_on_host": o.output_on_host,
            "devices": {d: o.device_bytes(d) for d, _ in o.budgets},
            "uses": [{"device": u.device, "component": u.component, "bytes": u.bytes} for u in o.uses]}


def plan_json(p: Plan, flags: list[str]) -> dict[str, Any]:
    """The plan as JSON; `flags`: its memory and thread flags (bostudio.engine.argv.plan_args)."""
    return {"model": str(p.model.path), "architecture": p.model.architecture,
            "devices": [d.to_json() for d in p.devices],
            "with_speculation": option_json(p.with_spec) if p.with_spec else None,
            "without_speculation": option_json(p.without_spec),
            "chosen": p.chosen.speculator.kind, "why": p.why,
            "spec_cost_bytes": p.spec_cost_bytes, "spec_cost_tokens": p.spec_cost_tokens,
            "llama_args": flags, "placement": placement_lines(p),
            "threads": p.threads.to_json() if p.threads is not None else None,
            "flash_attn": p.flash_attn_json(),
            "network": _network_json(p)}


def _network_json(p: Plan) -> dict[str, Any] | None:
    if not any(d.remote for d in p.devices):
        return None
    n = network_estimate(p.model, p.chosen, p.devices)
    return {"split_points": n.split_points, "bytes_per_token": n.bytes_per_token, "network_ms": n.network_ms,
            "compute_ms": n.compute_ms, "link_mbit": n.link_mbit, "bottleneck": n.bottleneck}
