"""The daemon's plans route (GET /bostudio/plans/MODEL, the TUI's plan view): the launch decision a
load of the model would make now, through the same call as the load itself (supervise.launching.child_inputs,
fed what EffectsRunner.launch_once feeds it: the children resident beside it, the draft length the acceptance
check settled on), so the argv shown is the argv that runs, apart from port, key and paths."""

from __future__ import annotations

from typing import Any

from bostudio.gguf.capabilities import model_caps
from bostudio.daemon.supervise.launching import child_inputs
from bostudio.daemon.supervise.supervisor import Supervisor
from bostudio.gguf import describe
from bostudio.launch import view
from bostudio.planner import what_would_fit
from bostudio.planner.memory import cache_type as check_cache_type
from bostudio.planner.pool import placement_lines
from bostudio.planner.render import option_bars
from bostudio.speculation import parse_spec

PLAN_PORT = 0  # the argv shown has port 0: a load picks a free port (or the pinned one)


def plan_for(sup: Supervisor, model: str, ctx: int | None = None, cache_type: str | None = None,
             spec: str | None = None) -> dict[str, Any]:
    """What a load of `model` would run, with `ctx`, `cache_type` and `spec` asked what-if (None: the
    model's config; its ctx None is the largest that fits, up to the training context)."""
    cfg = sup.config_for(model)
    ctx = ctx or cfg.ctx
    ctype = cache_type or cfg.cache_type
    check_cache_type(ctype)
    mode = spec or cfg.spec
    parse_spec("auto" if mode == "on" else mode)
    eng = sup.engine
    info = describe(cfg.path)
    caps = model_caps(cfg.path)
    workload = cfg.resolved_workload()
    pool = sup.view_pool(cfg.name)
    # As the load: CPU threads split with the other resident children, the settled draft length under auto.
    inputs = child_inputs(info, eng, mode, ctx, ctype, workload=workload,
                          fallback=cfg.fallback(workload) if mode == cfg.spec else None,
                          prompt_reuse=sup.slot_store is not None, pool=pool,
                          devices=sup.planning_devices(eng, cfg.name, running=True),
                          children=1 + sup.children_beside(cfg.name), draft_len=cfg.settled_draft_len(mode))
    decision, refused = view(inputs)
    planned = decision.plan
    o = planned.chosen
    sp = o.speculator
    argv = decision.argv(port=cfg.port or PLAN_PORT, alias=cfg.name,
                         slot_dir=sup.slot_store.root if sup.slot_store else None)
    out: dict[str, Any] = {
        "model": cfg.name, "kind": caps.kind, "ctx": o.n_ctx, "ctx_asked": ctx, "cache_type": ctype,
        "spec_mode": mode, "speculation": sp.label,
        "reason": sp.reason, "bytes": o.total, "fits": refused is None,
        "not_fit_reason": refused or "", "why": planned.why,
        "flash_attn": planned.flash_attn_json(),
        "cost_line": planned.cost_line, "spec_cost_bytes": planned.spec_cost_bytes,
        "spec_cost_tokens": planned.spec_cost_tokens, "n_ctx_train": info.n_ctx_train,
        "layout": decision.layout.to_json(), "layout_line": decision.layout.line(),
        "bars": option_bars(o),
        "uses": [{"device": u.device, "component": u.component, "bytes": u.bytes} for u in o.uses],
        "budget_bytes": sup.budget(), "argv": argv, "would_fit": [],
        "chat_template": decision.template_json(),  # the template it is served with (gguf/template.py)
        # with RPC workers: where each part lives and why, and the workers that could not be used
        "placement": placement_lines(planned) if pool.devices else [], "rpc_problems": list(pool.problems)}
    if refused is not None:  # what would make it fit, one change at a time (the planner's answer)
        out["would_fit"] = [{"change": f.change, "ctx": f.option.n_ctx, "cache_type": f.intent.cache_type_k,
                             "speculation": f.option.speculator.label, "bytes": f.option.total}
                            for f in what_would_fit(info, planned.devices, planned.intent, sp, inputs.draft)]
    return out
