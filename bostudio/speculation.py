"""Which speculator to run: parse the user's `--spec` and choose what pays for this model and engine.

Pure: no file, process or network access. `choose_speculator` serves the explicit modes and the table-less
auto fallback; `bostudio.pairing.core.select` adds the pairing table, auto-detection and compatibility checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bostudio.errors import ConfigError, EngineError

MODES = ("auto", "off", "ngram", "draft:PATH", "mtp", "self-draft:QUANT")


@dataclass(frozen=True)
class SpecRequest:
    mode: str  # auto | off | ngram | draft | mtp | self-draft
    draft: Path | None = None
    quant: str | None = None  # self-draft: the low-bit type of the target's own copy (Q2_K ...)


# llama.cpp instantiates (and tries) implementations in this fixed order whatever the command line says
# (common/speculative.cpp:2612-2627, reference 1.4): draftless n-gram types first, then the draft types.
SPEC_TYPE_ORDER = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
                   "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
NGRAM_VARIANTS = SPEC_TYPE_ORDER[:5]
# speculator kind -> its --spec-type
KIND_SPEC_TYPE = {"draft": "draft-simple", "eagle3": "draft-eagle3", "mtp": "draft-mtp",
                  "dflash": "draft-dflash", "dspark": "draft-dspark"}
KINDS = ("none", "ngram", *KIND_SPEC_TYPE)
# the n-gram parameters each variant takes: --spec-<variant>-<name with - for _>
NGRAM_PARAMS = {"ngram-simple": ("size_n", "size_m", "min_hits"), "ngram-map-k": ("size_n", "size_m", "min_hits"),
                "ngram-map-k4v": ("size_n", "size_m", "min_hits"), "ngram-mod": ("n_match", "n_min", "n_max"),
                "ngram-cache": ()}


def ordered_spec_types(types: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """`types` without duplicates, in the order llama.cpp runs them."""
    unknown = [t for t in types if t not in SPEC_TYPE_ORDER]
    if unknown:
        raise ConfigError(f"unknown speculative type {unknown[0]!r}", "one of: " + ", ".join(SPEC_TYPE_ORDER))
    return tuple(t for t in SPEC_TYPE_ORDER if t in types)


@dataclass(frozen=True)
class Speculator:
    """What llama-server is asked to run. `spec_types` are `--spec-type` names in llama.cpp's order.

    kind is the main speculator (none | ngram | draft | mtp | dflash | dspark | eagle3); an n-gram type may
    run alongside a draft kind (spec_types then holds both). ngram_params are (variant, name, value).
    """

    kind: str
    spec_types: tuple[str, ...] = ()
    draft: Path | None = None
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    cache_type_k_draft: str | None = None  # -ctkd; llama.cpp's default is f16, not the target's type
    cache_type_v_draft: str | None = None  # -ctvd
    ngram_params: tuple[tuple[str, str, int], ...] = ()
    reason: str = ""

    @property
    def label(self) -> str:
        return ",".join(self.spec_types) if self.spec_types else "off"

    @property
    def same_prefill(self) -> bool:
        """Whether a server running it does exactly off's work on a prompt: off and the n-gram speculators (a
        draft model or MTP heads prefill too)."""
        return self.kind in ("none", "ngram") and self.draft is None

    @property
    def detail(self) -> str:
        """The label with the parameters set beside llama.cpp's defaults, e.g. `ngram-simple size_n=6`."""
        params = [f"{name}={value}" for _, name, value in self.ngram_params]
        params += [f"{k}={v:g}" for k, v in (("n_max", self.n_max), ("p_min", self.p_min)) if v is not None]
        return " ".join([self.label, *params])


def parse_spec(value: str) -> SpecRequest:
    v = value.strip()
    if v in ("auto", "off", "ngram", "mtp"):
        return SpecRequest(v)
    if v in ("none", "no", "false"):
        return SpecRequest("off")
    if v.startswith("draft:") and len(v) > len("draft:"):
        return SpecRequest("draft", Path(v[len("draft:"):]).expanduser())
    if v.startswith("self-draft:") and len(v) > len("self-draft:"):
        quant = v[len("self-draft:"):]
        if not quant.replace("_", "").isalnum():
            raise ConfigError(f"--spec {value!r}: {quant!r} is not a quantization type",
                              "write --spec self-draft:Q2_K (a type llama-quantize knows)")
        return SpecRequest("self-draft", quant=quant.upper())
    if v in ("self-draft", "self-draft:"):
        raise ConfigError("--spec self-draft needs the low-bit type of the copy",
                          "write --spec self-draft:Q2_K")
    if v == "draft" or v == "draft:":
        raise ConfigError("--spec draft needs the draft model's path",
                          "write --spec draft:PATH, e.g. --spec draft:models/small.gguf")
    raise ConfigError(f"unknown --spec value {value!r}", "use one of: " + " | ".join(MODES))


# n-gram speculation: llama.cpp's ngram-mod defaults (n_match 24, drafts of 48..64 tokens); it
# drafts from text already seen in the context or generated before. Its table is ~16 MB, but the
# server sizes outputs for whole drafts, which the planner counts (large on a 262k vocabulary).
NGRAM = ("ngram-mod",)
# A separate draft model on a CPU only pays when it is much smaller than the target; keep drafts short.
DRAFT_N_MAX = 8


def choose_speculator(req: SpecRequest, *, n_nextn: int, engine_spec_types: tuple[str, ...],
                      has_gpu: bool = False) -> Speculator:
    """The speculator for `req`, given the model's MTP layer count and what the engine supports."""

    def need(types: tuple[str, ...]) -> None:
        missing = [t for t in types if t not in engine_spec_types]
        if missing:
            raise EngineError(f"this llama-server does not support --spec-type {','.join(missing)}",
                              "build the pinned engine with `bostudio engine build` or pass --engine")

    if req.mode == "off":
        return Speculator("none", reason="speculation switched off (--spec off)")
    if req.mode == "ngram":
        need(NGRAM)
        return Speculator("ngram", NGRAM, reason="n-gram speculation requested (--spec ngram)")
    if req.mode == "draft":
        assert req.draft is not None
        need(("draft-simple",))
        return Speculator("draft", ("draft-simple",), draft=req.draft, n_max=DRAFT_N_MAX,
                          reason=f"draft model {req.draft.name} requested (--spec draft:PATH)")
    if req.mode == "mtp":
        if n_nextn <= 0:
            raise ConfigError("--spec mtp needs a model with MTP (NextN) layers, and this one has none",
                              "use --spec ngram, --spec draft:PATH, or --spec auto")
        need(("draft-mtp",))
        return Speculator("mtp", ("draft-mtp",), n_max=3,
                          reason=f"the model's own MTP head ({n_nextn} NextN layer(s)) requested")
    # auto
    if n_nextn > 0 and "draft-mtp" in engine_spec_types:
        return Speculator("mtp", ("draft-mtp",), n_max=3,
                          reason=f"auto: the model has a built-in MTP head ({n_nextn} NextN layer(s)); "
                                 "it needs no second model")
    need(NGRAM)
    where = "a GPU" if has_gpu else "a CPU"
    return Speculator("ngram", NGRAM,
                      reason=f"auto: n-gram speculation (ngram-mod) measurably pays on {where} and needs no "
                             "second model; a separate draft model of similar size does not pay")


# ------------------------------------------------------------------------------- draft length at run time

# What sets the length of a draft, per --spec-type, with llama.cpp's default (common/common.h:328, 355-363):
# draft models and MTP: --spec-draft-n-max (3); ngram-mod: --spec-ngram-mod-n-max (64, with n-min 48: a shorter
# match drafts nothing); the other n-gram lookups: the m-gram they propose, --spec-<type>-size-m (48).
# ngram-cache has no length of its own.
_LENGTH_DEFAULTS = {"ngram-mod": 64, "ngram-simple": 48, "ngram-map-k": 48, "ngram-map-k4v": 48}
DRAFT_LENGTH_CEILING = {"ngram-mod": 64, "ngram-simple": 48, "ngram-map-k": 48, "ngram-map-k4v": 48}
DRAFT_MODEL_CEILING = 16


def _param(sp: Speculator, variant: str, name: str) -> int | None:
    return next((v for t, n, v in sp.ngram_params if t == variant and n == name), None)


def draft_length(sp: Speculator) -> int | None:
    """The longest draft `sp` proposes per step (None: no speculation, or one with no length to set)."""
    if sp.kind == "none" or not sp.spec_types:
        return None
    if sp.kind != "ngram":
        return sp.n_max if sp.n_max is not None else 3
    t = sp.spec_types[0]
    if t == "ngram-mod":
        return _param(sp, t, "n_max") or _LENGTH_DEFAULTS[t]
    if t in _LENGTH_DEFAULTS:
        return _param(sp, t, "size_m") or _LENGTH_DEFAULTS[t]
    return None


def draft_length_ceiling(sp: Speculator) -> int:
    if sp.kind == "ngram" and sp.spec_types:
        return DRAFT_LENGTH_CEILING.get(sp.spec_types[0], 64)
    return DRAFT_MODEL_CEILING


def with_draft_length(sp: Speculator, n: int, why: str) -> Speculator:
    """`sp` proposing drafts of at most `n` tokens (ngram-mod: n-max n and n-min n/2, so that shorter matches
    still draft; the other n-gram lookups: an m-gram of n; draft models and MTP: --spec-draft-n-max n)."""
    from dataclasses import replace

    n = max(1, n)
    reason = f"{sp.reason}; {why}" if sp.reason else why
    if sp.kind != "ngram":
        return replace(sp, n_max=n, n_min=min(sp.n_min, n) if sp.n_min is not None else None, reason=reason)
    t = sp.spec_types[0]
    names = {"ngram-mod": {"n_max": n, "n_min": max(1, n // 2)}}.get(t, {"size_m": n})
    kept = tuple(p for p in sp.ngram_params if not (p[0] == t and p[1] in names))
    return replace(sp, ngram_params=kept + tuple((t, k, v) for k, v in names.items()), reason=reason)
