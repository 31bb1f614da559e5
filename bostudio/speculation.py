"""Which speculator to run: parse the user's `--spec` and choose what pays for this model and engine.

Pure: no file, process or network access. (The pairing table of issue 5 extends `choose_speculator`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bostudio.errors import ConfigError, EngineError

MODES = ("auto", "off", "ngram", "draft:PATH", "mtp")


@dataclass(frozen=True)
class SpecRequest:
    mode: str  # auto | off | ngram | draft | mtp
    draft: Path | None = None


@dataclass(frozen=True)
class Speculator:
    """What llama-server is asked to run. `spec_types` are `--spec-type` names."""

    kind: str  # none | ngram | draft | mtp
    spec_types: tuple[str, ...] = ()
    draft: Path | None = None
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    reason: str = ""

    @property
    def label(self) -> str:
        return ",".join(self.spec_types) if self.spec_types else "off"


def parse_spec(value: str) -> SpecRequest:
    v = value.strip()
    if v in ("auto", "off", "ngram", "mtp"):
        return SpecRequest(v)
    if v in ("none", "no", "false"):
        return SpecRequest("off")
    if v.startswith("draft:") and len(v) > len("draft:"):
        return SpecRequest("draft", Path(v[len("draft:"):]).expanduser())
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
                                 "it drafts at almost no memory cost")
    need(NGRAM)
    where = "a GPU" if has_gpu else "a CPU"
    return Speculator("ngram", NGRAM,
                      reason=f"auto: n-gram speculation (ngram-mod) measurably pays on {where} and needs no "
                             "second model; a separate draft model of similar size does not pay")
