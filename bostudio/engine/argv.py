"""LaunchSpec → llama-server argv, checked against what the probed binary supports. Pure.

With bostudio.launch, the one place llama-server flags are written: the speculator's (build_argv), the
memory plan's (plan_args: context, offload, slots, cache types, threads, prompt cache), the chat template's
(template_args) and the model kind's (kind_args)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bostudio.errors import EngineError
from bostudio.gguf.capabilities import ModelCaps
from bostudio.gguf.template import TemplateChoice
from bostudio.planner.fit import OUTPUT_ON_HOST_OT, PROMPT_CACHE, Plan, plan_kind
from bostudio.planner.memory import MIB
from bostudio.planner.threads import ThreadPlan
from bostudio.speculation import Speculator


@dataclass(frozen=True)
class LaunchSpec:
    model: Path
    alias: str
    port: int
    host: str = "127.0.0.1"
    ctx: int = 4096
    speculator: Speculator = field(default_factory=lambda: Speculator("none"))
    api_key: str | None = None
    n_parallel: int | None = None  # None: llama-server's auto (4 slots, unified KV)
    metrics: bool = True
    verbosity: int | None = None  # -lv; 4 shows memory sizes and spec statistics
    extra_args: tuple[str, ...] = ()  # planner-chosen args (-ngl, -ctk, ...), checked like the rest
    chat_template: TemplateChoice | None = None  # None or the GGUF's own: no template flags (gguf/template.py)
    rpc: str | None = None  # RPC workers, HOST:PORT,... (their devices are RPC0.. in -dev/-ts/-devd)


def build_argv(server: Path, flags: frozenset[str], spec: LaunchSpec) -> list[str]:
    """The argv for `spec`. Raises EngineError when the binary lacks an option the spec needs."""
    # --rpc first: it registers the RPC devices that -dev and -devd name later in the argv
    argv = [str(server), *(["--rpc", spec.rpc] if spec.rpc else []), "-m", str(spec.model), "--alias", spec.alias,
            "--host", spec.host, "--port", str(spec.port), "-c", str(spec.ctx)]
    if spec.n_parallel is not None:
        argv += ["-np", str(spec.n_parallel)]
    if spec.metrics:
        argv.append("--metrics")
    if spec.api_key:
        argv += ["--api-key", spec.api_key]
    if spec.verbosity is not None:
        argv += ["-lv", str(spec.verbosity)]
    sp = spec.speculator
    if sp.kind == "none":
        # Explicit: also stops llama.cpp from inferring a type from the GGUF (reference 1.2).
        argv += ["--spec-type", "none"] if "--spec-type" in flags else []
    else:
        argv += ["--spec-type", ",".join(sp.spec_types)]
        if sp.draft is not None:
            argv += ["-md", str(sp.draft)]
        if sp.n_max is not None:
            argv += ["--spec-draft-n-max", str(sp.n_max)]
        if sp.n_min is not None:
            argv += ["--spec-draft-n-min", str(sp.n_min)]
        if sp.p_min is not None:
            argv += ["--spec-draft-p-min", f"{sp.p_min:g}"]
        if sp.cache_type_k_draft is not None:
            argv += ["-ctkd", sp.cache_type_k_draft]
        if sp.cache_type_v_draft is not None:
            argv += ["-ctvd", sp.cache_type_v_draft]
        for variant, name, value in sp.ngram_params:
            argv += [f"--spec-{variant}-{name.replace('_', '-')}", str(value)]
    if spec.chat_template is not None:
        argv += list(template_args(spec.chat_template))
    argv += list(spec.extra_args)
    used = [a for a in argv[1:] if a.startswith("-") and not _is_number(a)]
    missing = sorted({a for a in used if a not in flags})
    if missing:
        raise EngineError(f"{server} does not support {', '.join(missing)}",
                          "build the pinned engine with `bostudio engine build`, or pass a newer --engine")
    return argv


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def plan_args(plan: Plan) -> list[str]:
    """The memory and CPU flags of the plan's chosen option: context, offload, slots, cache types (the
    draft's too), decode and batch threads (Plan.threads), the prompt cache. The speculator's own flags
    (--spec-type, -md, --spec-draft-n-max) come from `chosen.speculator` through build_argv. `-fit off`: this
    plan is the fit, llama.cpp must not shrink it again. `-np N -kvu`: an explicit -np alone would turn the
    unified KV pool the plan assumes (llama-server's -np auto) off."""
    o, i = plan.chosen, plan.intent
    args = ["-c", str(o.n_ctx), "-ngl", str(o.n_gpu_layers), "-np", str(i.n_parallel), "-kvu",
            "-ctk", i.cache_type_k, "-ctv", i.cache_type_v, "-fit", "off"]
    if i.flash_attn != "auto":  # always, once plan() has chosen: llama.cpp's own auto is on for a CPU
        args += ["-fa", i.flash_attn]
    if o.split:
        # name the devices (their order is the -ts order) and fix each one's share of the layers
        args += ["-dev", ",".join(name for name, _ in o.split), "-ts", ",".join(str(c) for _, c in o.split)]
    if o.output_on_host and o.n_gpu_layers:
        args += ["-ot", OUTPUT_ON_HOST_OT]
    if plan_kind(o.speculator) == "draft":
        args += ["-ngld", str(o.n_gpu_layers_draft)]
        if o.draft_device is not None:
            args += ["-devd", o.draft_device]
    if plan_kind(o.speculator) in ("draft", "mtp"):
        args += ["-ctkd", i.draft_cache_type_k, "-ctvd", i.draft_cache_type_v]
    threads = plan.threads
    args += thread_args(threads) if threads is not None else []
    return args + prompt_cache_args(plan)


def prompt_cache_args(plan: Plan) -> list[str]:
    """--cache-ram sized by the plan (llama-server's default is 8192 MiB, counted nowhere), and --swa-full
    when planned; none when the plan has no prompt cache."""
    args = []
    cram = plan.chosen.component_bytes(PROMPT_CACHE)
    args += ["-cram", str(cram // MIB)] if plan.intent.prompt_cache else []
    if plan.intent.swa_full and plan.model.sliding_window:
        args.append("--swa-full")
    return args


def thread_args(threads: ThreadPlan) -> list[str]:
    """-t and -tb of one child (bostudio.planner.threads)."""
    return ["-t", str(threads.threads), "-tb", str(threads.threads_batch)]


def template_args(choice: TemplateChoice) -> tuple[str, ...]:
    """llama-server flags for a chat template choice (none for the GGUF's own template)."""
    if choice.source == "shipped":
        stops = tuple(a for s in choice.stops for a in ("--reverse-prompt", s))
        return ("--jinja", "--chat-template-file", str(choice.file), *stops)
    if choice.source == "builtin":
        return ("--no-jinja", "--chat-template", choice.name)
    return ()


def kind_args(caps: ModelCaps) -> tuple[str, ...]:
    """llama-server flags a model's kind needs (embeddings are off by default)."""
    if caps.kind == "rerank":
        return ("--reranking",)
    if caps.kind == "embedding":
        return ("--embeddings",) + (("--pooling", caps.pooling) if caps.pooling not in (None, "none") else ())
    return ()
