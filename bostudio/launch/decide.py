"""The one launch decision, pure: from the gathered inputs (bostudio.launch.gather) to the memory
plan and the one llama-server argv. No file, process or network access here.

    decide(inputs) -> Decision          raises PlanError when nothing fits
    view(inputs) -> (Decision, refusal) for screens: the planner's best attempt and why a launch refuses it
    Decision.argv(port=..., alias=...)  the argv, parameterised only by port, host, alias, API key and
                                        the slot-save directory

Everything that starts a llama-server (`up`, each daemon child, `bench`) and everything that shows what
would start (`plan`, `pair`, the TUI's plan view through the daemon's plans route) builds its argv here;
no flag is appended anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from bostudio.engine.argv import LaunchSpec, build_argv, kind_args, plan_args
from bostudio.engine.discover import Engine
from bostudio.errors import PlanError
from bostudio.gguf import ModelInfo
from bostudio.gguf.capabilities import ModelCaps
from bostudio.gguf.template import TemplateChoice, template_for
from bostudio.hardware import Device
from bostudio.planner import Intent, Plan, plan
from bostudio.planner.fit import DEFAULT_MIN_CTX
from bostudio.planner.memory import GIB
from bostudio.rpc.probe import Pool
from bostudio.speculation import Speculator

# Slots of every generating server: one agent's concurrent requests (opencode sends two at once, Claude Code
# a side request beside the main one) each get a slot. With -kvu the slots share one KV pool of the whole
# context, so each of them can hold a prompt as long as the context; the daemon queues the requests the
# pool cannot hold together (bostudio.daemon.supervise.admission).
N_SLOTS = 4


@dataclass(frozen=True)
class LaunchIntent:
    """What the user (or the daemon's model config) asked for; nothing about the model itself (its kind,
    template and flags are gathered from its header: LaunchInputs.caps). Built by the CLI's option parsing
    and by the launchers' constructors (bostudio.launch.intents), nowhere else.

    ctx: an exact context (None: the largest that fits, up to the training context); spec: the
    --spec request (auto | off | ngram | mtp | draft:PATH | self-draft:QUANT); speculation: the planner's
    mode (None: auto for `--spec auto`, off for off, on for an explicit speculator); prompt_reuse: the
    daemon's host prompt cache (--cache-ram) and full SWA caches; draft_len: (n, why) a draft length
    settled on at run time (the daemon's acceptance check), run and priced instead of the speculator's;
    threads: (-t, -tb) asked for instead of the planned ones (bench --threads); cold_slots: every pass of a
    session starts cold, only a slot's own cache carrying a prefix from turn to turn (bench's sessions)."""

    ctx: int | None = None
    cache_type: str = "f16"
    spec: str = "auto"
    speculation: str | None = None
    draft_cache_type: str | None = None  # None: the speculator's (pairings.toml cache_type_k_draft), else f16
    min_ctx: int = DEFAULT_MIN_CTX
    n_parallel: int = N_SLOTS
    reserve: int = 1 * GIB
    prompt_reuse: bool = False
    verbosity: int | None = None  # -lv (None: 4 with RPC workers, to log each device's buffers)
    children: int = 1  # llama-servers sharing the host's cores with this one (planner.threads splits them)
    flash_attn: str = "auto"  # -fa: auto (the plan chooses, planner.fit.choose_flash_attn) | on | off
    draft_len: tuple[int, str] | None = None
    threads: tuple[int, int] | None = None
    cold_slots: bool = False  # no host prompt cache (-cram 0), slots erasable (--slot-save-path): bench's sessions


@dataclass(frozen=True)
class LaunchInputs:
    """Everything the decision reads, gathered once by the edge: the model's header and capabilities (its
    kind: chat, embedding or rerank), the engine (path, flags), the devices (this machine's and the pool's),
    the RPC pool, the chosen speculator (pairing tables, tuned profile, hub pulls) with its draft's header,
    and the intent."""

    info: ModelInfo
    engine: Engine
    devices: tuple[Device, ...]
    speculator: Speculator
    draft: ModelInfo | None = None
    pool: Pool = field(default_factory=Pool)
    intent: LaunchIntent = field(default_factory=LaunchIntent)
    caps: ModelCaps | None = None  # None: planned from a remote header alone, served as a chat model

    @property
    def generates(self) -> bool:
        """False for embedding and rerank models: no speculator, no chat template, no prompt cache."""
        return self.caps is None or self.caps.kind == "chat"

    @property
    def kind_args(self) -> tuple[str, ...]:
        """The flags the model's kind needs (engine.argv.kind_args: --embeddings, --pooling, --reranking)."""
        return kind_args(self.caps) if self.caps is not None else ()

    def planner_intent(self) -> Intent:
        i, sp = self.intent, self.speculator
        mode = i.speculation or ("off" if not self.generates or i.spec == "off" else
                                 "auto" if i.spec in ("auto", "on") else "on")
        dk = i.draft_cache_type or sp.cache_type_k_draft or "f16"
        dv = i.draft_cache_type or sp.cache_type_v_draft or sp.cache_type_k_draft or "f16"
        reuse = i.prompt_reuse and self.generates
        return Intent(ctx=i.ctx, min_ctx=i.min_ctx, speculation=mode, cache_type_k=i.cache_type,
                      cache_type_v=i.cache_type, draft_cache_type_k=dk, draft_cache_type_v=dv,
                      n_parallel=i.n_parallel, reserve=i.reserve, prompt_cache=reuse, swa_full=reuse,
                      children=i.children, flash_attn=i.flash_attn, threads=i.threads)


@dataclass(frozen=True)
class Layout:
    """How the server's slots share its context: `slots` parallel sequences in one KV pool of
    `pool_ctx` tokens (-kvu), each able to grow to `slot_ctx` tokens while the pool has room."""

    slots: int
    pool_ctx: int
    slot_ctx: int
    unified: bool = True

    def line(self) -> str:
        return (f"{self.slots} slots share one KV pool of {self.pool_ctx} tokens (-np {self.slots} -kvu): each "
                f"request can use up to {self.slot_ctx} tokens (prompt + output) while the pool has room")

    def to_json(self) -> dict:
        return {"slots": self.slots, "pool_ctx": self.pool_ctx, "slot_ctx": self.slot_ctx, "unified": self.unified}


@dataclass(frozen=True)
class Decision:
    """The plan and what runs with it."""

    plan: Plan
    inputs: LaunchInputs

    @property
    def speculator(self) -> Speculator:
        return self.plan.chosen.speculator

    @property
    def ctx(self) -> int:
        return self.plan.chosen.n_ctx

    @property
    def bytes(self) -> int:
        """Everything the instance takes on all devices, by the planner's memory model."""
        return self.plan.chosen.total

    @property
    def pool(self) -> Pool:
        return self.inputs.pool

    @property
    def rpc(self) -> str | None:
        """--rpc for the pool's workers: all of them, in probe order, so the RPCn names the plan
        uses in -dev/-ts/-devd are the ones llama-server gives them."""
        return self.pool.rpc if self.pool.devices else None

    @property
    def layout(self) -> Layout:
        n = self.plan.intent.n_parallel
        return Layout(n, self.ctx, self.ctx)

    @property
    def template(self) -> TemplateChoice | None:
        """The chat template llama-server gets (bostudio.gguf.template): the GGUF's own, a tool-capable
        one bostudio ships, or a built-in by name; None for models that generate nothing."""
        return template_for(self.inputs.info) if self.inputs.generates else None

    def template_json(self) -> dict | None:
        return self.template.to_json() if self.template is not None else None

    def template_label(self) -> str:
        return self.template.label if self.template is not None else "none (the model generates nothing)"

    @property
    def prompt_reuse(self) -> bool:
        return self.plan.intent.prompt_cache

    def args(self) -> tuple[str, ...]:
        """The flags after the speculator's: the plan's (offload, slots, cache types, -fit off, the
        draft's placement and cache types, prompt cache; LaunchSpec carries -c) and the model kind's."""
        a = plan_args(self.plan)
        i = a.index("-c")
        cold = ("-cram", "0") if self.inputs.intent.cold_slots else ()
        return tuple(a[:i] + a[i + 2:]) + cold + self.inputs.kind_args

    def launch_spec(self, *, port: int, alias: str, host: str = "127.0.0.1", api_key: str | None = None,
                    slot_dir: Path | None = None, model: Path | None = None,
                    speculator: Speculator | None = None) -> LaunchSpec:
        """`speculator`: another speculator on this same memory plan (bench's A/B sides only; a model that
        generates nothing runs none)."""
        sp = self.speculator if speculator is None or not self.inputs.generates else speculator
        if "-ctkd" in self.args():  # the plan's draft cache types (priced at those) are the ones that run
            sp = replace(sp, cache_type_k_draft=None, cache_type_v_draft=None)
        extra = self.args()
        if slot_dir is not None and (self.prompt_reuse or self.inputs.intent.cold_slots):
            extra += ("--slot-save-path", str(slot_dir))
        verbosity = self.inputs.intent.verbosity
        if verbosity is None and self.rpc:
            verbosity = 4  # -lv 4 logs each device's buffers
        return LaunchSpec(model=model or self.inputs.info.path, alias=alias, port=port, host=host, ctx=self.ctx,
                          speculator=sp, api_key=api_key, extra_args=extra, rpc=self.rpc, verbosity=verbosity,
                          chat_template=self.template)

    def varied(self, *, flash_attn: str | None = None, threads: tuple[int, int] | None = None,
               cold_slots: bool | None = None) -> Decision:
        """This decision planned again with -fa (on | off), (-t, -tb) and/or cold slots asked for (bench's
        settings under test and its sessions' cold passes; None keeps the intent's), so the flags of every
        side come from a plan, never from editing an argv. Raises PlanError as decide() does."""
        i = self.inputs.intent
        intent = replace(i, flash_attn=flash_attn or i.flash_attn, threads=threads or i.threads,
                         cold_slots=i.cold_slots if cold_slots is None else cold_slots)
        return self if intent == i else decide(replace(self.inputs, intent=intent))

    def argv(self, *, port: int, alias: str, host: str = "127.0.0.1", api_key: str | None = None,
             slot_dir: Path | None = None, speculator: Speculator | None = None) -> list[str]:
        """The one llama-server argv. Raises EngineError when the engine lacks a flag it needs."""
        eng = self.inputs.engine
        return build_argv(eng.path, eng.flags, self.launch_spec(port=port, alias=alias, host=host, api_key=api_key,
                                                                slot_dir=slot_dir, speculator=speculator))


def _plan(inputs: LaunchInputs) -> Plan:
    sp = inputs.speculator
    if not inputs.generates and sp.kind != "none":
        sp = Speculator("none", reason="embedding and rerank models generate nothing to speculate on")
    return plan(inputs.info, inputs.devices, inputs.planner_intent(), sp, inputs.draft if sp.kind != "none" else None)


def decide(inputs: LaunchInputs) -> Decision:
    """The plan and argv for `inputs`. Raises PlanError when the model does not fit."""
    p = _plan(inputs)
    if not p.chosen.fits:
        raise PlanError(f"{inputs.info.path.name} does not fit on these devices: {p.chosen.reason}",
                        "use a smaller quant, a smaller --ctx, or a quantized KV cache (--cache-type q8_0)")
    return Decision(p, inputs)


def view(inputs: LaunchInputs) -> tuple[Decision, str | None]:
    """decide() for a screen: the decision and None, or, when a launch would refuse it, the planner's
    best attempt and the refusal (so the screen can show the bars and why)."""
    try:
        p = _plan(inputs)
    except PlanError as exc:  # speculation "on" that does not fit: show auto's plan beside the refusal
        p = plan(inputs.info, inputs.devices, replace(inputs.planner_intent(), speculation="auto"),
                 inputs.speculator, inputs.draft)
        return Decision(p, inputs), exc.message
    if not p.chosen.fits:
        return Decision(p, inputs), f"{inputs.info.path.name} does not fit on these devices: {p.chosen.reason}"
    return Decision(p, inputs), None
