"""Fit and trade-off: the largest context and offload that fit, with the speculator and without it.

Pure: devices, models and intent in, a Plan out. The memory figures come from planner.memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable

from bostudio.errors import PlanError
from bostudio.hardware.device import Device
from bostudio.planner.memory import (GIB, MIB, ContextSettings, attention_layers, compute_buffer_bytes,
                                     host_inputs_bytes, logits_buffer_bytes,
                                     amx_host_weights, cpu_repack_bytes, host_weight_bytes, kv_cache_bytes,
                                     max_gpu_layers,
                                     output_buffer_bytes, output_growth_bytes, platform_overhead,
                                     recurrent_layer_count, recurrent_state_bytes, weight_split)
from bostudio.planner.threads import ThreadPlan, plan_threads
from bostudio.speculation import NGRAM, Speculator

if TYPE_CHECKING:
    from bostudio.gguf.describe import ModelInfo

SPEC_KINDS = ("none", "ngram", "draft", "mtp", "dflash", "dspark", "eagle3")
# DFlash/DSpark/EAGLE3 drafters and MTP sidecars are second models with their own context: planned
# like a draft (their recurrent-state copies on hybrid targets are not modelled).
DRAFT_MODEL_KINDS = ("draft", "dflash", "dspark", "eagle3")


def plan_kind(spec: Speculator) -> str:
    """How the plan places a speculator: draft (a model of its own, an MTP head in its own file included),
    mtp, ngram or none."""
    if spec.kind in DRAFT_MODEL_KINDS or (spec.kind == "mtp" and spec.draft is not None):
        return "draft"
    return spec.kind
NGRAM_MOD_BYTES = 4194304 * 4  # ngram-mod's hash table: "mod size=4194304 (16.000 MB)", host RAM
DEFAULT_MIN_CTX = 32768
# The one component llama.cpp allocates after load (so its load log never shows it).
RUNTIME_OUTPUT = "output buffer growth when drafting"
DRAFT_N_MAX_DEFAULT = 3  # llama.cpp's --spec-draft-n-max default (common/common.h)
NGRAM_MOD_N_MAX_DEFAULT = 64  # --spec-ngram-mod-n-max default: ngram-mod drafts up to 64 tokens


def spec_label(spec: Speculator) -> str:
    """How a speculator is named in reasons and tables."""
    if spec.kind == "draft" and spec.draft is not None:
        return f"draft {spec.draft.name}"
    return {"none": "no speculation", "ngram": "n-gram speculation", "mtp": "MTP head"}.get(spec.kind, spec.kind)


@dataclass(frozen=True)
class _Spec:
    """What the memory model needs about a speculator: its kind, the draft's header, the draft
    length (rows of outputs and of recurrent state) and the draft context's cache types."""

    kind: str
    draft: "ModelInfo | None"
    n_max: int
    cache_type_k: str
    cache_type_v: str


def _spec(spec: Speculator, draft: "ModelInfo | None", intent: "Intent") -> _Spec:
    if spec.kind not in SPEC_KINDS:
        raise PlanError(f"unknown speculator {spec.kind!r}", f"one of {', '.join(SPEC_KINDS)}")
    kind = plan_kind(spec)
    if kind == "draft" and draft is None:
        raise PlanError("a draft speculator needs the draft model's header to be planned",
                        "pass draft=describe(draft_path)")
    default = NGRAM_MOD_N_MAX_DEFAULT if kind == "ngram" else DRAFT_N_MAX_DEFAULT
    return _Spec(kind, draft if kind == "draft" else None,
                 spec.n_max if spec.n_max is not None else default,
                 intent.draft_cache_type_k, intent.draft_cache_type_v)


NO_SPEC = Speculator("none")
NGRAM_SPEC = Speculator("ngram", NGRAM)
MTP_SPEC = Speculator("mtp", ("draft-mtp",), n_max=3)


@dataclass(frozen=True)
class Intent:
    """What the user asked for. ctx: an exact context (None: as large as fits, up to the training
    context); min_ctx: what `auto` must keep with the draft (capped at the training context);
    speculation: auto | on | off; reserve: bytes kept free on every device."""

    ctx: int | None = None
    min_ctx: int = DEFAULT_MIN_CTX
    speculation: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    draft_cache_type_k: str = "f16"  # -ctkd/-ctvd: the draft/MTP context's own (llama.cpp default f16)
    draft_cache_type_v: str = "f16"
    n_parallel: int = 4
    n_ubatch: int = 512
    n_batch: int = 2048
    flash_attn: str = "auto"  # auto (plan() chooses: choose_flash_attn) | on | off
    reserve: int = 1 * GIB  # like llama.cpp's --fit-target 1024 MiB
    max_ctx: int | None = None  # an upper bound for the search (None: the training context)
    # Prompt reuse (the daemon): a host prompt cache (--cache-ram) as large as one copy of the KV
    # pool, and full-size sliding-window caches (--swa-full) so a saved slot can be reused.
    prompt_cache: bool = False
    swa_full: bool = False
    # llama-servers that may compute on the host's cores at once (the daemon's children): the planned
    # CPU threads (planner.threads) are split between them.
    children: int = 1
    threads: tuple[int, int] | None = None  # (-t, -tb) asked for instead of the planned ones (bench --threads)

    def __post_init__(self) -> None:
        if self.speculation not in ("auto", "on", "off"):
            raise PlanError(f"speculation must be auto, on or off, not {self.speculation!r}")
        if self.flash_attn not in FLASH_ATTN_MODES:
            raise PlanError(f"flash attention must be auto, on or off, not {self.flash_attn!r}")


FLASH_ATTN_MODES = ("auto", "on", "off")
FULL_V_TYPES = ("f16", "bf16", "f32")  # V cache types llama.cpp runs without flash attention

PROMPT_CACHE = "prompt cache (--cache-ram)"


def prompt_cache_bytes(state_bytes: int) -> int:
    """--cache-ram for a server whose KV pool and recurrent state take `state_bytes`: room for one
    copy of every slot's state (idle slots are moved there), in whole MiB (0 would turn it off)."""
    return max(MIB, -(-state_bytes // MIB) * MIB)


@dataclass(frozen=True)
class Use:
    """Bytes one component takes on one device."""

    device: str
    component: str
    bytes: int


@dataclass(frozen=True)
class PlanOption:
    """One candidate: a speculator with the context and offload found for it."""

    speculator: Speculator  # what llama-server is asked to run (bostudio.speculation)
    fits: bool
    n_ctx: int
    n_gpu_layers: int
    n_gpu_layers_draft: int
    uses: tuple[Use, ...]
    budgets: tuple[tuple[str, int], ...]
    reason: str = ""
    # Several offload devices: each one's layer count in llama.cpp's order (-dev NAMES -ts COUNTS).
    split: tuple[tuple[str, int], ...] = ()
    draft_device: str | None = None  # where the draft model runs (-devd), when the plan must say
    # The output projection pinned to the host (-ot OUTPUT_ON_HOST_OT): it fits no offload device, and
    # without the pin llama.cpp would put it on the last one (then no layer could be offloaded).
    output_on_host: bool = False

    def device_bytes(self, device: str) -> int:
        return sum(u.bytes for u in self.uses if u.device == device)

    @property
    def total(self) -> int:
        return sum(u.bytes for u in self.uses)

    def component_bytes(self, prefix: str) -> int:
        return sum(u.bytes for u in self.uses if u.component.startswith(prefix))


@dataclass(frozen=True)
class Plan:
    """The planner's answer: both options, the choice and why, and what the speculator costs.

    `chosen.speculator` is what to launch (in auto mode it may be the fallback, not the one asked
    for); bostudio.engine.argv.plan_args(plan) writes the memory and CPU thread flags that go with it."""

    model: "ModelInfo"
    devices: tuple[Device, ...]
    intent: Intent
    with_spec: PlanOption | None
    without_spec: PlanOption
    chosen: PlanOption
    why: str
    spec_cost_bytes: int = 0
    spec_cost_tokens: int = 0
    flash_attn_why: str = ""  # why intent.flash_attn is on or off (choose_flash_attn)

    def flash_attn_json(self) -> dict[str, str]:
        return {"mode": self.intent.flash_attn, "why": self.flash_attn_why}

    @property
    def cost_line(self) -> str:
        if self.with_spec is None:
            return ""
        return (f"the {spec_label(self.with_spec.speculator)} costs {self.spec_cost_bytes / GIB:.2f} GiB "
                f"= {self.spec_cost_tokens} tokens of context")

    @property
    def threads(self) -> ThreadPlan | None:
        """-t/-tb for the chosen option (planner.threads): from the host's cores, the children that
        share them, and whether any layer (or the draft) computes on the CPU. None: cores unknown."""
        host = next((d for d in self.devices if not d.is_gpu), None)
        o = self.chosen
        gpus = [d for d in self.devices if d.is_gpu]
        on_host = (not gpus or o.output_on_host
                   or o.n_gpu_layers < max_gpu_layers(self.model, include_nextn=o.speculator.kind == "mtp")
                   or (plan_kind(o.speculator) == "draft" and (o.n_gpu_layers_draft == 0 or o.draft_device == "none")))
        cores = host.cores if host is not None else None
        if self.intent.threads is not None:
            t, tb = self.intent.threads
            return ThreadPlan(t, tb, cores or max(t, tb), self.intent.children, f"-t {t} -tb {tb} as asked")
        return plan_threads(cores, self.intent.children, on_host)


# ---------------------------------------------------------------- memory of one configuration

# `-ot` override that keeps the output projection in host memory whatever -ngl says. llama.cpp names it
# output.weight, or token_embd.weight when tied (created TENSOR_DUPLICATED in the output layer); the
# input copy of token_embd is on the host anyway (llama-model.cpp: dev_input is the CPU). The override
# is matched by regex_search on each tensor's name (llama-model-loader.cpp:1235-1258).
OUTPUT_ON_HOST_OT = r"^(output|token_embd)\.weight$=CPU"


def _settings(intent: Intent, spec: _Spec, n_ctx: int) -> ContextSettings:
    # Any speculator makes the server size the target's outputs for a whole draft per slot
    # (common_speculative_get_output_limits, server-context.cpp:41-53): n-gram drafts are long
    # (64), so on a large vocabulary its logits cost far more than its 16 MiB table.
    drafting = spec.kind in ("draft", "mtp", "ngram")
    n_outputs = min(intent.n_batch, intent.n_parallel * (1 + spec.n_max)) if drafting else 0
    return ContextSettings(
        n_ctx=n_ctx, n_parallel=intent.n_parallel, kv_unified=True, n_batch=intent.n_batch,
        n_ubatch=intent.n_ubatch, cache_type_k=intent.cache_type_k, cache_type_v=intent.cache_type_v,
        flash_attn=intent.flash_attn != "off", n_rs_seq=spec.n_max if spec.kind == "mtp" else 0,
        n_outputs_max=n_outputs, swa_full=intent.swa_full)


def _spread(total: int, gpus: list[Device], component: str) -> list[Use]:
    """Split bytes over GPUs in proportion to their usable memory (llama.cpp's default split)."""
    if not gpus or total == 0:
        return []
    weights = [max(1, g.usable_bytes) for g in gpus]
    s = sum(weights)
    out, left = [], total
    for k, (g, w) in enumerate(zip(gpus, weights)):
        part = left if k == len(gpus) - 1 else total * w // s
        left -= part
        out.append(Use(g.label, component, part))
    return out


def llama_device_order(devices: Iterable[Device]) -> list[Device]:
    """The offload devices in llama.cpp's order: RPC devices first, then local GPUs
    (src/llama.cpp: "add RPC servers at the front of the list to minimize network transfers")."""
    gpus = [d for d in devices if d.is_gpu]
    return [d for d in gpus if d.remote] + [d for d in gpus if not d.remote]


def multi_device(devices: Iterable[Device]) -> bool:
    """More than one offload device, or a remote one: layers are split explicitly (-dev/-ts)."""
    gpus = [d for d in devices if d.is_gpu]
    return len(gpus) > 1 or any(d.remote for d in gpus)


def offloaded_sizes(model: "ModelInfo", n_gpu_layers: int, load_nextn: bool = False,
                    output_on_host: bool = False) -> list[int]:
    """Weight bytes of each offloaded layer in order, the output layer last (with the tied
    embedding's copy and the norms; only the norms when the output is pinned to the host), as
    -ngl N offloads them (the last N of n_block + 1)."""
    ngl = max(0, min(n_gpu_layers, model.n_block + 1))
    out = 0 if output_on_host else model.output_bytes or model.token_embd_bytes
    sizes = [model.layer_bytes[il] if il < model.n_layer or load_nextn else 0
             for il in range(model.n_block + 1 - ngl, model.n_block)]
    return sizes + [out + model.other_bytes] if ngl else []


def layer_counts(n_gpu_layers: int, gpus: list[Device], budgets: dict[str, int],
                 sizes: list[int] | None = None) -> list[int]:
    """How many of the `n_gpu_layers` offloaded layers (the output layer counting as one, last)
    each device gets, in llama.cpp's order: consecutive runs whose weight bytes (`sizes`, one per
    offloaded layer; equal when not given) are in proportion to the devices' budgets. Passed as
    `-ts` counts, llama.cpp's split points fall exactly on these boundaries (llama-model.cpp:
    device = upper_bound(cumulative split, j / ngl))."""
    if not gpus or n_gpu_layers <= 0:
        return [0] * len(gpus)
    sizes = list(sizes) if sizes else [1] * n_gpu_layers
    weights = [max(1, budgets.get(g.label, 0)) for g in gpus]
    total_w, total_b = sum(weights), sum(sizes) or 1
    counts, j, cum_w = [], 0, 0
    for k, w in enumerate(weights):
        cum_w += w
        if k == len(weights) - 1:
            counts.append(n_gpu_layers - j)
            break
        goal = total_b * cum_w / total_w  # where this device's share ends, in bytes
        start, acc = j, sum(sizes[:j])
        while j < n_gpu_layers and acc + sizes[j] / 2 <= goal:  # a layer goes where most of it belongs
            acc += sizes[j]
            j += 1
        counts.append(j - start)
    return counts


def device_layers(model: "ModelInfo", n_gpu_layers: int, counts: list[int]) -> list[list[int]]:
    """The layer indices each device holds (n_block = the output layer), from its -ts count."""
    start = model.n_block + 1 - sum(counts)
    out, il = [], start
    for c in counts:
        out.append(list(range(il, il + c)))
        il += c
    return out


def fastest_device(devices: Iterable[Device]) -> Device:
    """Where a draft runs best: a local GPU (a draft decodes token by token, so each step on a remote
    device pays a network round trip), the one with the most bandwidth, then the most memory; with
    no local GPU, the host (its RAM is local too)."""
    devs = list(devices)
    local = [d for d in devs if d.is_gpu and not d.remote]
    if local:
        return max(local, key=lambda d: (d.bandwidth_gbs or 0.0, d.usable_bytes, -devs.index(d)))
    return next((d for d in devs if not d.is_gpu), devs[0])


def _multi_uses(model: "ModelInfo", devs: list[Device], intent: Intent, s: ContextSettings, host: str,
                n_gpu_layers: int, mtp: bool, held: dict[str, int], output_on_host: bool = False) -> list[Use]:
    """Weights, KV cache, recurrent state and compute buffers layer by layer over several offload
    devices (RPC workers and local GPUs), each device's share from layer_counts()."""
    gpus = llama_device_order(devs)
    budgets = _split_budgets(devs, intent, held)
    ngl = max(0, min(n_gpu_layers, model.n_block + 1))
    counts = layer_counts(ngl, gpus, budgets, offloaded_sizes(model, ngl, mtp, output_on_host))
    layers = device_layers(model, ngl, counts)
    uses: list[Use] = []
    ws = weight_split(model, ngl, load_nextn=mtp, output_on_host=output_on_host)
    out = 0 if output_on_host else model.output_bytes or model.token_embd_bytes
    on_gpus = 0
    for g, ls in zip(gpus, layers):
        b = sum(model.layer_bytes[il] for il in ls if il < model.n_layer or (mtp and il < model.n_block))
        if model.n_block in ls:
            b += model.other_bytes + out
        on_gpus += b
        uses.append(Use(g.label, "weights", b))
    uses.append(Use(host, "weights", ws.cpu + max(0, ws.gpu - on_gpus)))
    n_all = model.n_block if mtp else model.n_layer
    uses.append(Use(host, "weights (CPU repack)", cpu_repack_bytes(model, 1 - ws.gpu_layers / max(1, n_all))))
    kv_total = kv_cache_bytes(model, s).total
    attn = set(attention_layers(model))
    kv_gpus = 0
    rs = recurrent_state_bytes(model, s)
    n_rec = recurrent_layer_count(model)
    rs_gpus = 0
    for g, ls in zip(gpus, layers):
        mine = [il for il in ls if il in attn]
        kv = kv_cache_bytes(model, s, layers=mine).total if mine else 0
        kv_gpus += kv
        uses.append(Use(g.label, "KV cache", kv))
        if n_rec:
            r = rs * sum(1 for il in ls if il < model.n_layer and _is_recurrent(model, il)) // n_rec
            rs_gpus += r
            uses.append(Use(g.label, "recurrent state", r))
    uses.append(Use(host, "KV cache", max(0, kv_total - kv_gpus)))
    uses.append(Use(host, "recurrent state", max(0, rs - rs_gpus)))
    # Each device reserves a graph buffer for its own layers; only the one holding the output layer
    # also needs room for the logits. The host runs the layers left to it and, when the output
    # stays there, the logits.
    for g, ls in zip(gpus, layers):
        if ls:
            mine = [il for il in ls if il < model.n_layer]
            out_here = model.n_block in ls and not output_on_host
            c = (compute_buffer_bytes(model, s, layers=mine, with_output=out_here) if mine
                 else logits_buffer_bytes(model, s) if out_here else 0)  # the output layer alone
            uses.append(Use(g.label, "compute buffer", c))
    host_layers = list(range(0, model.n_block + 1 - sum(counts)))
    host_mine = [il for il in host_layers if il < model.n_layer]
    staged = host_inputs_bytes(model, s)  # input embeddings and masks, in pinned host memory
    if host_mine or sum(counts) < model.n_block + 1:
        uses.append(Use(host, "compute buffer", compute_buffer_bytes(
            model, s, layers=host_mine or None, with_output=model.n_block in host_layers or output_on_host)))
    elif output_on_host:  # every layer offloaded, the output projection (and its logits) on the host
        uses.append(Use(host, "compute buffer", max(staged, logits_buffer_bytes(model, s))))
    else:
        uses.append(Use(host, "compute buffer", staged))
    return uses


def _is_recurrent(model: "ModelInfo", il: int) -> bool:
    return il < len(model.recurrent_layers) and bool(model.recurrent_layers[il])


def _single_uses(model: "ModelInfo", gpus: list[Device], host: str, s: ContextSettings, n_gpu_layers: int,
                 mtp: bool, n_all: int, output_on_host: bool = False) -> list[Use]:
    """Target weights, KV cache, recurrent state and compute buffers with at most one offload device."""
    uses: list[Use] = []
    # target weights
    if n_gpu_layers == 0:
        uses.append(Use(host, "weights", host_weight_bytes(model, load_nextn=mtp)))
        uses.append(Use(host, "weights (CPU repack)", cpu_repack_bytes(model)))
    else:
        ws = weight_split(model, n_gpu_layers, load_nextn=mtp, output_on_host=output_on_host)
        uses += _spread(ws.gpu, gpus, "weights")
        uses.append(Use(host, "weights", ws.cpu))
        share = ws.gpu_layers / max(1, n_all)
        uses.append(Use(host, "weights (CPU repack)", cpu_repack_bytes(model, 1 - share)))
    # target KV / recurrent state: on the device of their layer
    start = n_all + 1 - n_gpu_layers
    kv = kv_cache_bytes(model, s)
    rs = recurrent_state_bytes(model, s)
    frac = (sum(1 for il in range(model.n_layer) if il >= start) / model.n_layer) if model.n_layer else 0
    # the KV of the offloaded layers themselves: SWA layers hold fewer cells than full-attention ones
    on_gpu_layers = [il for il in attention_layers(model) if il >= start]
    kv_gpu = kv_cache_bytes(model, s, layers=on_gpu_layers).total if on_gpu_layers and gpus else 0
    for comp, total, on_gpu in (("KV cache", kv.total, kv_gpu), ("recurrent state", rs, int(rs * frac))):
        uses += _spread(on_gpu, gpus, comp)
        uses.append(Use(host, comp, total - on_gpu))
    compute = compute_buffer_bytes(model, s)
    host_compute = host_inputs_bytes(model, s)  # input embeddings and masks, in pinned host memory
    if n_gpu_layers and gpus and output_on_host:  # the logits are computed where the output weight is
        compute = compute_buffer_bytes(model, s, with_output=False)
        host_compute = max(host_compute, logits_buffer_bytes(model, s))
    if n_gpu_layers and gpus:
        # each GPU holding layers reserves its own worst-case graph buffer; counting the whole
        # estimate on each is the safe side of llama.cpp's per-split sizing
        uses += [Use(g.label, "compute buffer", compute) for g in gpus]
        uses.append(Use(host, "compute buffer", host_compute))
    else:
        uses.append(Use(host, "compute buffer", compute))
    return uses


def _draft_uses(spec: _Spec, s: ContextSettings, devs: list[Device], host: str) -> tuple[list[Use], int]:
    """A draft model's bytes, and its -ngld. It goes whole on the fastest device (a local GPU, else
    the host: never a remote one), and it is the target's layers that move when both do not fit
    (-ngld all, -devd)."""
    if spec.kind != "draft" or spec.draft is None:
        return [], 0
    d = spec.draft
    ds = replace(s, cache_type_k=spec.cache_type_k, cache_type_v=spec.cache_type_v, n_rs_seq=0, n_outputs_max=0)
    dev = fastest_device(devs).label
    uses: list[Use] = []
    ngld = 0
    if dev == host:
        uses.append(Use(host, "draft weights", host_weight_bytes(d)))
        uses.append(Use(host, "draft weights (CPU repack)", cpu_repack_bytes(d)))
    else:
        ngld = max_gpu_layers(d, include_nextn=False)
        split = weight_split(d, ngld)
        uses += [Use(dev, "draft weights", split.gpu), Use(host, "draft weights", split.cpu)]
    uses.append(Use(dev, "draft KV cache", kv_cache_bytes(d, ds).total + recurrent_state_bytes(d, ds)))
    uses.append(Use(dev, "draft compute buffer", compute_buffer_bytes(d, ds)))
    if dev != host:  # the draft's graph inputs, in pinned host memory as the target's
        uses.append(Use(host, "draft compute buffer (host inputs)", host_inputs_bytes(d, ds)))
    uses.append(Use(host, "draft output buffer", output_buffer_bytes(d, ds)))
    return uses, ngld


def _held(uses: list[Use], host: str) -> dict[str, int]:
    """Bytes already taken on each offload device (by the draft) before the target's layers are split."""
    out: dict[str, int] = {}
    for u in uses:
        if u.device != host:
            out[u.device] = out.get(u.device, 0) + u.bytes
    return out


def _split_budgets(devs: list[Device], intent: Intent, held: dict[str, int]) -> dict[str, int]:
    return {k: max(0, v - held.get(k, 0)) for k, v in _budgets(devs, intent.reserve).items()}


def memory_uses(model: "ModelInfo", devices: Iterable[Device], intent: Intent, speculator: Speculator,
                n_ctx: int, n_gpu_layers: int, draft: "ModelInfo | None" = None,
                output_on_host: bool = False) -> tuple[list[Use], int]:
    """Every component's bytes on every device for one configuration; also the draft's -ngld.
    `output_on_host`: the output projection pinned to the host (PlanOption.output_on_host)."""
    spec = _spec(speculator, draft, intent)
    devs = list(devices)
    gpus = [d for d in devs if d.is_gpu]
    host = next((d.label for d in devs if not d.is_gpu), "CPU")
    if not gpus:
        n_gpu_layers = 0
    s = _settings(intent, spec, n_ctx)
    mtp = spec.kind == "mtp"
    uses: list[Use] = []
    n_all = model.n_block if mtp else model.n_layer

    draft_uses, ngld = _draft_uses(spec, s, devs, host)
    multi = bool(gpus and n_gpu_layers and multi_device(devs))
    if multi:
        uses += _multi_uses(model, devs, intent, s, host, n_gpu_layers, mtp, _held(draft_uses, host),
                            output_on_host)
    else:
        uses += _single_uses(model, gpus, host, s, n_gpu_layers, mtp, n_all, output_on_host)
    uses.append(Use(host, "output buffer", output_buffer_bytes(model, s)))
    uses.append(Use(host, RUNTIME_OUTPUT, output_growth_bytes(model, s)))
    if intent.prompt_cache:  # llama-server's host prompt cache (--cache-ram), sized from the KV pool
        state = kv_cache_bytes(model, s).total + recurrent_state_bytes(model, s)
        uses.append(Use(host, PROMPT_CACHE, prompt_cache_bytes(state)))

    if spec.kind == "draft" and spec.draft is not None:
        uses += draft_uses
    elif mtp and model.n_nextn:
        # The MTP context: a KV cache of the NextN layers only, as long as the target's, with the
        # draft cache types; no second copy of the weights (llama-model.cpp:2661-2670).
        ms = replace(s, cache_type_k=spec.cache_type_k, cache_type_v=spec.cache_type_v,
                     n_rs_seq=0, n_outputs_max=0)
        nextn = list(range(model.n_layer, model.n_block))
        dev = _last_layer_device(model, devs, intent, n_gpu_layers) or host  # NextN layers are the last ones
        uses.append(Use(dev, "MTP KV cache", kv_cache_bytes(model, ms, layers=nextn).total))
        uses.append(Use(dev, "MTP compute buffer", compute_buffer_bytes(model, ms, layers=nextn)))
        uses.append(Use(host, "MTP output buffer", output_buffer_bytes(model, ms)))
    elif spec.kind == "ngram":
        uses.append(Use(host, "n-gram table", NGRAM_MOD_BYTES))
    host_dev = next((d for d in devs if not d.is_gpu), None)
    if host_dev is not None and host_dev.cpu_amx:
        uses = _on_amx_host(uses, host, model, n_gpu_layers, mtp, output_on_host,
                            spec.draft if spec.kind == "draft" and ngld == 0 else None)
    used = {u.device for u in uses if u.bytes}
    uses += [Use(g.label, "platform overhead", platform_overhead(g.backend)) for g in gpus if g.label in used]
    return [u for u in uses if u.bytes], ngld


def _on_amx_host(uses: list[Use], host: str, model: "ModelInfo", n_gpu_layers: int, mtp: bool,
                 output_on_host: bool, draft_on_host: "ModelInfo | None") -> list[Use]:
    """The host's weights when the engine's CPU backend has the AMX buffer type (Device.cpu_amx): the mapped
    range, the AMX copies and what CPU_REPACK still takes, from the tensor tables (amx_host_weights), in place
    of the per-layer sums; the target's and, when it runs on the host, the draft's."""
    figures = {}
    if model.tensor_places:
        mapped, amx, repack = amx_host_weights(model, n_gpu_layers, load_nextn=mtp, output_on_host=output_on_host)
        figures.update({"weights": mapped, "weights (CPU repack)": repack, "weights (CPU AMX)": amx})
    if draft_on_host is not None and draft_on_host.tensor_places:
        mapped, amx, repack = amx_host_weights(draft_on_host, 0)
        figures.update({"draft weights": mapped, "draft weights (CPU repack)": repack,
                        "draft weights (CPU AMX)": amx})
    out = [replace(u, bytes=figures[u.component]) if u.device == host and u.component in figures else u
           for u in uses]
    out += [Use(host, c, figures[c]) for c in ("weights (CPU AMX)", "draft weights (CPU AMX)") if c in figures]
    return out


def _last_layer_device(model: "ModelInfo", devs: list[Device], intent: Intent, n_gpu_layers: int) -> str | None:
    """The offload device holding the last layers (and the output), None when they stay on the host."""
    gpus = llama_device_order(devs)
    if not gpus or not n_gpu_layers:
        return None
    if not multi_device(devs):
        return gpus[0].label
    ngl = min(n_gpu_layers, model.n_block + 1)
    counts = layer_counts(ngl, gpus, _budgets(devs, intent.reserve), offloaded_sizes(model, ngl))
    return next((g.label for g, c in zip(reversed(gpus), reversed(counts)) if c), None)


def _budgets(devices: Iterable[Device], reserve: int) -> dict[str, int]:
    """What the plan may put on each device: its usable memory less the reserve, and never more
    than a budget the user set (an RPC worker's budget_mib)."""
    out = {}
    for d in devices:
        b = max(0, d.usable_bytes - reserve)
        out[d.label] = b if d.budget_bytes is None else min(b, d.budget_bytes)
    return out


def _fits(uses: list[Use], devices: list[Device], budgets: dict[str, int]) -> bool:
    per: dict[str, int] = {}
    for u in uses:
        per[u.device] = per.get(u.device, 0) + u.bytes
    if any(per.get(label, 0) > budget for label, budget in budgets.items()):
        return False
    # A unified GPU (Apple, iGPU) draws on the same RAM as the host: both must fit the host too.
    host = next((d for d in devices if not d.is_gpu), None)
    if host is not None:
        shared = sum(per.get(d.label, 0) for d in devices if d.is_gpu and d.unified)
        if shared and per.get(host.label, 0) + shared > budgets[host.label]:
            return False
    return not (set(per) - set(budgets))


# ---------------------------------------------------------------- search

CTX_STEP = 256  # llama.cpp pads n_ctx to a multiple of 256


def ctx_cap(model: "ModelInfo", intent: Intent) -> int:
    cap = model.n_ctx_train or 4096
    if intent.max_ctx:
        cap = min(cap, intent.max_ctx)
    return max(CTX_STEP, cap // CTX_STEP * CTX_STEP)


def min_ctx_wanted(model: "ModelInfo", intent: Intent) -> int:
    """The context `auto` insists on: the intent's minimum, never above the training context."""
    return min(intent.min_ctx, ctx_cap(model, intent))


def largest_ctx(model: "ModelInfo", devices: list[Device], intent: Intent, speculator: Speculator,
                n_gpu_layers: int, draft: "ModelInfo | None" = None, output_on_host: bool = False) -> int:
    """The largest multiple of 256 up to the cap that fits with this offload; 0 if none does.
    Memory grows with the context, so a binary search finds it."""
    budgets = _budgets(devices, intent.reserve)

    def ok(c: int) -> bool:
        uses = memory_uses(model, devices, intent, speculator, c, n_gpu_layers, draft, output_on_host)[0]
        return _fits(uses, devices, budgets)

    lo, hi = 0, ctx_cap(model, intent) // CTX_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid * CTX_STEP):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_STEP


def placement(model: "ModelInfo", devices: Iterable[Device], intent: Intent, speculator: Speculator,
              n_gpu_layers: int, draft: "ModelInfo | None" = None, n_ctx: int = CTX_STEP,
              output_on_host: bool = False) -> tuple[tuple[tuple[str, int], ...], str | None]:
    """(-dev/-ts split, -devd device) of a configuration: the split only with several offload
    devices or a remote one; the draft device whenever the draft could otherwise land elsewhere
    than on the fastest device (llama.cpp's default spreads it like the target)."""
    devs = list(devices)
    split: tuple[tuple[str, int], ...] = ()
    if multi_device(devs):
        gpus = llama_device_order(devs)
        ngl = max(0, min(n_gpu_layers, model.n_block + 1))
        host = next((d.label for d in devs if not d.is_gpu), "CPU")
        spec = _spec(speculator, draft, intent)
        held = _held(_draft_uses(spec, _settings(intent, spec, n_ctx), devs, host)[0], host)
        counts = layer_counts(ngl, gpus, _split_budgets(devs, intent, held),
                              offloaded_sizes(model, ngl, speculator.kind == "mtp", output_on_host))
        split = tuple((g.label, c) for g, c in zip(gpus, counts))
    draft_device = None
    if plan_kind(speculator) == "draft" and (multi_device(devs) or any(d.remote for d in devs)):
        fast = fastest_device(devs)
        draft_device = fast.label if fast.is_gpu else "none"  # "none": the draft stays on the host
    return split, draft_device


def _search(model: "ModelInfo", devs: list[Device], intent: Intent, speculator: Speculator,
            draft: "ModelInfo | None", layer_options: list[int], want: int,
            output_on_host: bool) -> tuple[int, int] | None:
    """(context, -ngl) of the first offload in `layer_options` whose context reaches `want`, else the
    one with the most context; None when nothing fits."""
    budgets = _budgets(devs, intent.reserve)
    best: tuple[int, int] | None = None
    for ngl in layer_options:
        if intent.ctx:
            uses = memory_uses(model, devs, intent, speculator, intent.ctx, ngl, draft, output_on_host)[0]
            if _fits(uses, devs, budgets):
                return intent.ctx, ngl
            continue
        c = largest_ctx(model, devs, intent, speculator, ngl, draft, output_on_host)
        if c >= want:
            return c, ngl
        if c and (best is None or c > best[0]):
            best = (c, ngl)
    return best


def fit_option(model: "ModelInfo", devices: Iterable[Device], intent: Intent, speculator: Speculator,
               draft: "ModelInfo | None" = None) -> PlanOption:
    """Most offload first, then the most context: keep every layer on the GPUs while the context
    still reaches the wanted minimum; otherwise move layers to the host until it does (like
    llama.cpp's --fit: shrink the context down to its minimum before moving layers).

    llama.cpp puts the output layer on the last offload device as soon as one layer is offloaded. When
    no offload is possible that way (the output projection fits no device, a large vocabulary on small
    devices), the output is pinned to the host with -ot and the search runs again: the repeating
    layers can then go to the devices."""
    devs = list(devices)
    gpus = [d for d in devs if d.is_gpu]
    budgets = _budgets(devs, intent.reserve)
    n_max = max_gpu_layers(model, include_nextn=speculator.kind == "mtp")
    layer_options = list(range(n_max, -1, -1)) if gpus else [0]
    want = intent.ctx if intent.ctx else min_ctx_wanted(model, intent)
    # An output projection larger than the output device takes stays on the host (llama.cpp's choice too,
    # made by the backend's supports_op): plan it there, and pin it so with -ot.
    output_on_host = bool(gpus) and output_too_large(model, devs)
    best = _search(model, devs, intent, speculator, draft, layer_options, want, output_on_host)
    if gpus and not output_on_host and (best is None or best[1] == 0):
        pinned = _search(model, devs, intent, speculator, draft, [n for n in layer_options if n >= 2], want, True)
        if pinned is not None and (best is None or pinned[0] >= min(want, best[0])):
            best, output_on_host = pinned, True
    if best is None:
        c = intent.ctx or CTX_STEP
        uses, ngld = memory_uses(model, devs, intent, speculator, c, 0, draft)
        need = sum(u.bytes for u in uses)
        return PlanOption(speculator, False, c, 0, ngld, tuple(uses), tuple(budgets.items()),
                          f"needs {need / GIB:.2f} GiB at {c} tokens even with every layer on the host")
    ctx, ngl = best
    uses, ngld = memory_uses(model, devs, intent, speculator, ctx, ngl, draft, output_on_host)
    reason = "" if ctx >= want else f"only {ctx} tokens fit (wanted {want})"
    split, draft_device = placement(model, devs, intent, speculator, ngl, draft, ctx, output_on_host)
    return PlanOption(speculator, True, ctx, ngl, ngld, tuple(uses), tuple(budgets.items()), reason,
                      split, draft_device, output_on_host)


def output_too_large(model: "ModelInfo", devices: Iterable[Device]) -> bool:
    """Whether the output projection exceeds the largest tensor the device that holds the output layer
    (the last offload device) takes."""
    gpus = llama_device_order(devices)
    limit = gpus[-1].max_tensor_bytes if gpus else None
    return limit is not None and (model.output_bytes or model.token_embd_bytes) > limit


def _bytes_per_token(model: "ModelInfo", devices: list[Device], intent: Intent, option: PlanOption) -> float:
    """What one more token of context costs in this option (KV, masks, ...), measured on the model."""
    c = max(option.n_ctx, CTX_STEP)
    step = 16 * CTX_STEP
    pin = option.output_on_host
    a = sum(u.bytes for u in memory_uses(model, devices, intent, NO_SPEC, c, option.n_gpu_layers, None, pin)[0])
    b = sum(u.bytes for u in memory_uses(model, devices, intent, NO_SPEC, c + step, option.n_gpu_layers, None,
                                         pin)[0])
    return max(1.0, (b - a) / step)


def default_fallback(model: "ModelInfo") -> Speculator:
    """What auto falls back to when a draft does not pay for its memory: the model's own MTP
    head if it has one, else n-gram speculation; neither has weights of its own (n-gram still
    widens the output rows, which the plan counts)."""
    return MTP_SPEC if model.n_nextn and model.has_mtp else NGRAM_SPEC


def choose_flash_attn(model: "ModelInfo", devices: tuple[Device, ...], intent: Intent,
                      speculator: Speculator = NO_SPEC) -> tuple[str, str]:
    """Flash attention on or off for this plan, and why. Asked for (on/off) is kept; off with a quantized V
    cache, the target's or a draft's (the draft context shares the setting), is refused (llama.cpp cannot
    run it). auto: on with a quantized V cache (required) or any GPU (llama.cpp's fused kernel, its own
    choice there); on a CPU alone, off, unless without it the attention scores' buffer (n_ubatch x context
    x heads, f32) costs context that fits with it. llama.cpp resolves its
    own auto to on for a CPU; measured here (2-core EPYC, Gemma 270M, 6,000-token prompt) that prefilled 11%
    slower (436 -> 388 tok/s) and decoded 5% slower (81 -> 77) and took ngram-mod's 1.24x decode gain to
    1.00x; llama.cpp #27086 (Arm Neoverse, up to 2x prefill) and llamafile #975 (Ice Lake, 16-74%) saw it too.
    A process left to the default also landed at either speed from one start to the next."""
    drafts = plan_kind(speculator) in ("draft", "mtp") and intent.speculation != "off"
    quant_v = next((f"{what}{t} V cache" for what, t in (("a ", intent.cache_type_v),
                                                          ("the draft's ", intent.draft_cache_type_v if drafts else "f16"))
                    if t not in FULL_V_TYPES), None)
    if intent.flash_attn == "off" and quant_v:
        raise PlanError(f"{quant_v} needs flash attention, and it was asked off",
                        "use --flash-attn auto or on, or an f16 KV cache")
    if intent.flash_attn != "auto":
        return intent.flash_attn, f"{intent.flash_attn} as asked"
    if quant_v:
        return "on", f"on: {quant_v} needs it"
    if any(d.is_gpu for d in devices):
        return "on", "on: a GPU computes attention (llama.cpp's fused kernel)"
    on = fit_option(model, devices, replace(intent, flash_attn="on"), NO_SPEC)
    off = fit_option(model, devices, replace(intent, flash_attn="off"), NO_SPEC)
    if on.fits and (not off.fits or off.n_ctx < on.n_ctx):
        lost = f"only {off.n_ctx} tokens fit" if off.fits else "the model does not fit"
        return "on", (f"on: without it the attention scores' buffer grows with the context ({lost}, "
                      f"{on.n_ctx} with it)")
    return "off", "off: CPU only (there it slows prefill and decode)"


def plan(model: "ModelInfo", devices: Iterable[Device], intent: Intent = Intent(),
         speculator: Speculator = NO_SPEC, draft: "ModelInfo | None" = None,
         fallback: Speculator | None = None) -> Plan:
    """Fit the model with and without the speculator (`draft`: the draft model's header, for a
    draft speculator) and choose.

    auto keeps the speculator when the context with it still reaches the wanted minimum and the
    offload does not drop; else it takes `fallback` (default_fallback) and says what the
    speculator would have cost."""
    devs = tuple(devices)
    if not devs:
        raise PlanError("no devices to plan for", "run `bostudio devices` or pass --devices-file")
    if speculator.kind == "mtp" and speculator.draft is None and not model.n_nextn:
        raise PlanError(f"{model.path.name} has no MTP (NextN) layers to speculate with",
                        "use n-gram speculation or a draft model")
    fa, fa_why = choose_flash_attn(model, devs, intent, speculator)
    return replace(_plan(model, devs, replace(intent, flash_attn=fa), speculator, draft, fallback),
                   flash_attn_why=fa_why)


def _plan(model: "ModelInfo", devs: tuple[Device, ...], intent: Intent, speculator: Speculator,
          draft: "ModelInfo | None", fallback: Speculator | None) -> Plan:
    without = fit_option(model, devs, intent, NO_SPEC)
    label = spec_label(speculator)
    if speculator.kind == "none" or intent.speculation == "off":
        why = ("speculation off as asked" if intent.speculation == "off" and speculator.kind != "none"
               else "no speculator given")
        if speculator.kind == "none" and speculator.reason:  # keep why it is off (a tuned profile, --spec off)
            without = replace(without, speculator=speculator)
        return Plan(model, devs, intent, None, without, without, why)
    with_ = fit_option(model, devs, intent, speculator, draft)
    # The cost of the speculator: the bytes it adds to the plan without it (at the offload of that
    # plan, and at the context the speculator runs with when that offload holds), and the context
    # tokens those bytes would buy instead.
    same_offload = with_.fits and with_.n_gpu_layers == without.n_gpu_layers
    ref_ctx, ref_ngl = (with_.n_ctx if same_offload else without.n_ctx), without.n_gpu_layers
    pin = without.output_on_host
    base = sum(u.bytes for u in memory_uses(model, devs, intent, NO_SPEC, ref_ctx, ref_ngl, None, pin)[0])
    spec_total = sum(u.bytes for u in memory_uses(model, devs, intent, speculator, ref_ctx, ref_ngl, draft, pin)[0])
    cost = max(0, spec_total - base)
    tokens = int(cost / _bytes_per_token(model, list(devs), intent, without))
    want = intent.ctx or min_ctx_wanted(model, intent)
    if intent.speculation == "on":
        if with_.fits:
            why = f"speculation on as asked; {with_.n_ctx} tokens fit with the {label}"
            return Plan(model, devs, intent, with_, without, with_, why, cost, tokens)
        raise PlanError(f"the {label} does not fit: {with_.reason}",
                        "lower --ctx, use a quantized --cache-type, or --spec-mode auto to fall back")
    if with_.fits and with_.n_ctx >= want and with_.n_gpu_layers >= without.n_gpu_layers:
        why = (f"keeps the {label}: with it {with_.n_ctx} tokens still fit "
               f"(wanted {want}), without it {without.n_ctx}")
        return Plan(model, devs, intent, with_, without, with_, why, cost, tokens)
    fallback = fallback or default_fallback(model)
    fb = fit_option(model, devs, intent, fallback)
    if with_.fits and with_.n_ctx < want:
        lost = f"only {with_.n_ctx} tokens fit with it (wanted {want})"
    elif with_.fits:
        lost = f"it would move layers off the GPU (-ngl {with_.n_gpu_layers} instead of {without.n_gpu_layers})"
    else:
        lost = with_.reason
    instead = (f"uses the {spec_label(fallback)} instead" if fb.fits else
               f"runs without speculation (the {spec_label(fallback)} does not fit either: {fb.reason})")
    why = (f"drops the {label}: {lost}; it would cost {cost / GIB:.2f} GiB = {tokens} tokens of "
           f"context; {instead}")
    return Plan(model, devs, intent, with_, without, fb if fb.fits else without, why, cost, tokens)


@dataclass(frozen=True)
class FitChange:
    """One change that makes a plan fit: what changes, the intent with it, and the option found."""

    change: str
    intent: Intent
    option: PlanOption


def what_would_fit(model: "ModelInfo", devices: Iterable[Device], intent: Intent, speculator: Speculator,
                   draft: "ModelInfo | None" = None) -> list[FitChange]:
    """For a plan that does not fit: what would, one change at a time (the largest context that fits,
    a q8_0 then q4_0 KV cache at the asked context, no speculator). Each with what it changes."""
    devs = tuple(devices)
    tries: list[tuple[str, Intent, Speculator, "ModelInfo | None"]] = []
    if intent.ctx is not None:
        tries.append(("a smaller context", replace(intent, ctx=None), speculator, draft))
    for ctype in ("q8_0", "q4_0"):
        if intent.cache_type_k != ctype:
            tries.append((f"a {ctype} KV cache", replace(intent, cache_type_k=ctype, cache_type_v=ctype),
                          speculator, draft))
    if speculator.kind != "none":
        tries.append(("no speculation", replace(intent, speculation="off"), NO_SPEC, None))
    out = []
    for change, i, sp, d in tries:
        i = replace(i, speculation="off" if sp.kind == "none" else "auto")
        try:
            chosen = plan(model, devs, i, sp, d).chosen
        except PlanError:
            continue
        if chosen.fits:
            out.append(FitChange(change, i, chosen))
    return out


__all__ = ["OUTPUT_ON_HOST_OT", "PROMPT_CACHE", "prompt_cache_bytes", "Intent", "Use", "PlanOption", "Plan", "plan", "what_would_fit", "FitChange", "fit_option", "largest_ctx",
           "memory_uses", "spec_label", "default_fallback", "NO_SPEC", "NGRAM_SPEC", "MTP_SPEC", "MIB", "GIB"]
