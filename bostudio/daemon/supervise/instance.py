"""What the daemon keeps per model: its config (changed by the control API, survives restarts)
and its instance (the running child, its lifecycle state, stats and the launch decision it runs)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from bostudio.gguf.capabilities import model_caps
from bostudio.daemon.state import instance_log_path
from bostudio.daemon.supervise.admission import Admission
from bostudio.daemon.supervise.lifecycle import FAILED, READY, RESIDENT_STATES, STOPPING, Life
from bostudio.daemon.supervise.prefill import PrefillTracker
from bostudio.daemon.supervise.slots import StateKey
from bostudio.daemon.supervise.stats import InstanceStats
from bostudio.errors import BostudioError
from bostudio.launch import Decision, Layout
from bostudio.planner.fit import PROMPT_CACHE
from bostudio.profiles import DEFAULT_BREAK_EVEN, default_workload
from bostudio.rpc.probe import Pool
from bostudio.runtime.client import AsyncLlamaClient
from bostudio.runtime.process import ServerProcess
from bostudio.speculation import Speculator, draft_length

MIB = 1 << 20


@dataclass
class ModelConfig:
    """What to launch for one model name (changed by the control API; survives restarts)."""

    name: str
    path: Path
    ctx: int | None  # None: the largest that fits, up to the training context
    spec: str
    port: int | None = None  # pinned child port (else a free one per launch)
    cache_type: str = "f16"  # -ctk/-ctv of the target's KV cache
    workload: str | None = None  # whose tuned profile auto uses (None: config.toml's [workload], else "code")
    # Under auto, speculation that fell below break-even on a workload stays off until the workload changes.
    auto_off: str | None = None  # that workload
    auto_off_reason: str = ""
    # Under auto, the draft length the acceptance check settled on (None: the plan's), and the length that
    # last fell below break-even (lengthening stays below half of it). Cleared when the workload changes.
    draft_len: int | None = None
    draft_len_failed: int | None = None
    draft_len_reason: str = ""

    def resolved_workload(self) -> str:
        return self.workload or default_workload(self.name)

    def fallback(self, workload: str) -> str | None:
        """Why auto gave up on speculation for `workload` (None: it did not)."""
        return self.auto_off_reason if self.spec == "auto" and self.auto_off == workload else None

    def settled_draft_len(self, spec: str | None = None) -> tuple[int, str] | None:
        """(n, why): the draft length the acceptance check settled on, which a launch under `spec` (None: this
        config's own) runs; None where none settled, or where that launch is not this config's auto."""
        spec = self.spec if spec is None else spec
        return (self.draft_len, self.draft_len_reason) if self.draft_len is not None and spec == self.spec == "auto" \
            else None


def _template_json(path: Path) -> dict | None:
    """The chat template the model is served with (gguf/template.py), None when unreadable."""
    try:
        return model_caps(path).template.to_json()
    except (OSError, BostudioError):
        return None



@dataclass
class Instance:
    """One model's instance: its lifecycle (`life`, moved only by lifecycle.step), the child that runs, the
    launch decision it runs (`decision`) and what is measured of it."""

    cfg: ModelConfig
    life: Life | None = None  # None: a new Life for cfg.name
    proc: ServerProcess | None = None
    port: int | None = None
    api_key: str = ""
    http: AsyncLlamaClient | None = None  # for /metrics, /slots and prompt counts; proxied requests take passthrough
    speculator: Speculator | None = None
    spec_status: dict | None = None
    decision: Decision | None = None  # what the running (or last) child was launched with
    kind: str = "chat"  # what the model serves (capabilities): chat, embedding or rerank
    budget_bytes: int = 0  # the memory budget when it was planned
    error: dict | None = None
    loads: int = 0
    ready_s: float | None = None
    ready_since: float | None = None
    last_used: float = field(default_factory=time.monotonic)
    active: int = 0
    stats: InstanceStats = field(default_factory=InstanceStats)
    ready: asyncio.Future | None = None
    task: asyncio.Task | None = None
    break_even: float = DEFAULT_BREAK_EVEN  # acceptance below which speculation stops paying
    break_even_source: str = "default"
    spec_base: tuple[int, int, int] = (0, 0, 0)  # (drafted, accepted, requests) at the last launch
    spec_check: dict | None = None  # the last policy.SpecVerdict
    tune_refused: list = field(default_factory=list)  # what the workload's profile refused (profiles.tune_refusals)
    draft_advice: dict | None = None  # the last policy.DraftAdvice (under auto)
    scraped: tuple[int, int] = (0, 0)  # (requests, tokens) at the last /metrics scrape
    cfg_cooldown: float = 0.0
    state_key: StateKey | None = None  # what this child's saved slot states are valid for
    prompts: dict = field(default_factory=dict)  # restored/saved slot states, for ps
    pool: Pool = field(default_factory=Pool)  # the RPC workers of the running child
    admission: Admission = field(default_factory=Admission)  # requests in the KV pool, and those queued
    stop_task: asyncio.Future | None = None  # the stop in progress: a concurrent stop or start waits for it
    # Per launch (`loads`): requests in flight, counted by the router from their first byte to the child
    # until they end, and those whose connection broke with the request in it (router._ended).
    in_flight: dict[int, int] = field(default_factory=dict)
    died_with: dict[int, int] = field(default_factory=dict)
    prefill: PrefillTracker = field(default_factory=PrefillTracker)  # the prompts the child is processing now

    def __post_init__(self) -> None:
        if self.life is None:
            self.life = Life(self.cfg.name, str(self.log_path))

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def state(self) -> str:
        assert self.life is not None
        return self.life.state

    @property
    def failed_at(self) -> float | None:
        assert self.life is not None
        return self.life.failed_at

    @property
    def lost_workers(self) -> tuple[str, ...]:
        """Workers that died under this model: later launches go without them."""
        assert self.life is not None
        return self.life.lost_workers

    @property
    def layout(self) -> Layout | None:
        """The running child's slots and KV pool (admission reserves in it)."""
        return self.decision.layout if self.decision is not None else None

    @property
    def bytes(self) -> int:
        """What the child takes on all devices, by its plan (eviction counts this)."""
        return self.decision.bytes if self.decision is not None else 0

    @property
    def n_ctx_train(self) -> int | None:
        return self.decision.inputs.info.n_ctx_train if self.decision is not None else None

    def device_bytes(self) -> dict[str, int]:
        """Bytes the child takes per device label, by its plan."""
        out: dict[str, int] = {}
        for u in self.decision.plan.chosen.uses if self.decision is not None else ():
            out[u.device] = out.get(u.device, 0) + u.bytes
        return out

    def plan_json(self) -> dict:
        """The launch decision as ps and the events show it ({} before the first plan)."""
        d = self.decision
        if d is None:
            return {}
        planned = d.plan
        return {"bytes": d.bytes, "weights_bytes": d.inputs.info.file_size, "ctx": d.ctx, "ctx_asked": self.cfg.ctx,
                "n_ctx_train": d.inputs.info.n_ctx_train, "n_params": d.inputs.info.n_params,
                "cache_type": self.cfg.cache_type, "layout": d.layout.to_json(),
                "kind": self.kind, "prompt_cache_bytes": planned.chosen.component_bytes(PROMPT_CACHE),
                "budget_bytes": self.budget_bytes, "why": planned.why,
                "threads": planned.threads.to_json() if planned.threads is not None else None,
                "flash_attn": planned.flash_attn_json(),
                "uses": [{"device": u.device, "component": u.component, "bytes": u.bytes}
                         for u in planned.chosen.uses],
                "summary": f"{d.bytes / MIB:.0f} MiB for {self.cfg.name} at ctx {d.ctx} with "
                           f"speculation {d.speculator.label}, budget {self.budget_bytes / MIB:.0f} MiB"}

    @property
    def log_path(self) -> Path:
        return instance_log_path(self.name)

    def to_json(self) -> dict:
        plan = self.plan_json()
        assert self.life is not None
        return {
            "model": self.name, "path": str(self.cfg.path), "state": self.state,
            "pid": self.proc.pid if self.proc and self.state in RESIDENT_STATES + (STOPPING,) else None,
            "port": self.port if self.state in RESIDENT_STATES else None,
            "ctx": plan.get("ctx", self.cfg.ctx), "ctx_asked": self.cfg.ctx, "cache_type": self.cfg.cache_type, "spec_mode": self.cfg.spec,
            "speculation": self.speculator.label if self.speculator else None,
            "speculation_reason": self.speculator.reason if self.speculator else None,
            "spec_status": self.spec_status, "plan": plan, "error": self.error, "loads": self.loads,
            "crashes_recent": len(self.life.crashes), "ready_s": self.ready_s,
            "uptime_s": time.monotonic() - self.ready_since if self.ready_since and self.state == READY else None,
            "idle_s": time.monotonic() - self.last_used, "active_requests": self.active,
            "stats": self.stats.to_json(), "log": str(self.log_path),
            "retry": self.retry_json(), "prompts": self.prompts,
            "workload": self.cfg.workload, "spec_check": self.spec_check,
            "chat_template": _template_json(self.cfg.path),  # which template, and whether it is bostudio's fallback
            "spec_flagged": bool(self.spec_check and self.spec_check["state"] == "below"),
            "break_even_source": self.break_even_source,
            "tune_refused": self.tune_refused,
            "auto_off": ({"workload": self.cfg.auto_off, "reason": self.cfg.auto_off_reason}
                         if self.cfg.auto_off else None),
            "admission": self.admission.to_json(),  # KV tokens reserved by requests in flight, and those queued
            "prefill": self.prefill_json(),  # the prompts in progress, their rate and time left
            "draft_length": ({"n_max": draft_length(self.speculator), "adapted": self.cfg.draft_len is not None,
                              "reason": self.cfg.draft_len_reason, "advice": self.draft_advice}
                             if self.speculator is not None and draft_length(self.speculator) is not None else None),
            "rpc": {"workers": self.pool.rpc, "lost": list(self.lost_workers),
                    "problems": list(self.pool.problems)} if self.pool.probes or self.lost_workers else None,
        }

    def prefill_json(self) -> list[dict]:
        """The prompts the child is processing now: tokens done of the total, the rate, the time left
        (before a prompt's first batch is done, estimated from the child's last long prefill)."""
        if self.state != READY:  # a child that stopped or crashed mid-prompt processes nothing
            return []
        return self.prefill.to_json(time.monotonic(), self.stats.long_prefill_tok_s)

    def retry_json(self) -> dict | None:
        """When a failed model is tried again: on the next request after the cool-down, or now on an
        explicit restart."""
        if self.state != FAILED or self.failed_at is None:
            return None
        cooldown = self.cfg_cooldown
        if cooldown <= 0:
            return {"how": "explicit restart only (bostudio restart MODEL)", "at": None, "in_s": None}
        at = self.failed_at + cooldown
        return {"how": "on the next request after the cool-down, or at once with an explicit restart",
                "at": at, "in_s": max(0.0, at - time.time())}
