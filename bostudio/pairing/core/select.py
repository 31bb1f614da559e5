"""select(): the speculator a target gets, with the reasons for it and for every candidate passed over. Pure.

Candidates come, in this order, from (1) the table entries that match the target by name, architecture or
tokenizer, (2) auto-detection: the target's own MTP head, drafter GGUFs (DFlash/DSpark/EAGLE3/MTP sidecar,
recognised from their metadata) and every smaller local model llama.cpp accepts as a draft (cheapest step
first, pairing.core.cost), and (3) catch-all table entries (n-gram speculation). The first usable candidate is
chosen. A draft-simple pair that llama.cpp would refuse is never chosen: llama-server would silently run
without speculation.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bostudio.errors import ConfigError, EngineError
from bostudio.gguf import ModelInfo
from bostudio.pairing.core.compat import CompatReport
from bostudio.pairing.core.cost import MAX_BREAK_EVEN, MAX_STEP_COST, StepCost, best_draft_length, draft_step_cost
from bostudio.pairing.core.guardrails import GuardrailContext
from bostudio.pairing.core.table import Candidate, PairingTable
from bostudio.speculation import (DRAFT_N_MAX, KIND_SPEC_TYPE, SpecRequest, Speculator, choose_speculator,
                                  ordered_spec_types)

MTP_N_MAX = 3


@dataclass(frozen=True)
class DraftFile:
    """A local GGUF that could draft for the target, with its compatibility already checked (at the edge)."""

    info: ModelInfo
    compat: CompatReport
    hub: str = ""  # the table's hub ref this file is a copy of (in the HF cache), or will be once pulled
    remote: bool = False  # only its header was read (range requests): it must be pulled before launch

    @property
    def path(self) -> Path:
        return self.info.path


@dataclass(frozen=True)
class Considered:
    """One candidate and what became of it."""

    label: str
    origin: str  # where it came from: a table entry (file:line) or auto-detection
    usable: bool
    why: str  # why it is usable, or why it was passed over
    speculator: Speculator | None = None
    draft: ModelInfo | None = None
    memory_bytes: int | None = None
    note: str = ""
    hub: str = ""  # the candidate's hub ref (owner/repo[:quant])
    evidence: str = ""  # where that ref was seen (issue, PR, model card)
    fetch: bool = False  # the draft is on the hub only: pull `hub` before launch
    step: StepCost | None = None  # a draft model's step against a target step (pairing.core.cost.draft_step_cost)
    break_even: float | None = None  # the acceptance above which it pays at its n_max (None: never)

    def cost_text(self) -> str:
        """'a draft step costs 0.40 of a target step (...); pays above 72% acceptance at n_max 3'."""
        if self.step is None:
            return ""
        n = self.speculator.n_max if self.speculator is not None else None
        pays = ("never pays" if self.break_even is None else
                f"pays above {100 * self.break_even:.0f}% acceptance") + (f" at n_max {n}" if n else "")
        return f"{self.step.text()}; {pays}"

    def to_json(self) -> dict:
        return {"label": self.label, "origin": self.origin, "usable": self.usable, "why": self.why,
                "spec_types": list(self.speculator.spec_types) if self.speculator else [],
                "draft": str(self.draft.path) if self.draft else None, "memory_bytes": self.memory_bytes,
                "note": self.note, "hub": self.hub or None, "source": self.evidence or None,
                "fetch": self.fetch, "step_cost": self.step.to_json() if self.step else None,
                "break_even_acceptance": None if self.break_even is None else round(self.break_even, 4)}


@dataclass(frozen=True)
class Selection:
    speculator: Speculator
    considered: tuple[Considered, ...]
    chosen: int | None  # index into considered; None for explicit modes with nothing to weigh

    def to_json(self) -> dict:
        sp = self.speculator
        return {"speculator": {"kind": sp.kind, "spec_types": list(sp.spec_types),
                               "draft": str(sp.draft) if sp.draft else None, "n_max": sp.n_max, "n_min": sp.n_min,
                               "p_min": sp.p_min, "cache_type_k_draft": sp.cache_type_k_draft,
                               "cache_type_v_draft": sp.cache_type_v_draft,
                               "ngram_params": [list(p) for p in sp.ngram_params], "reason": sp.reason},
                "chosen": self.chosen, "candidates": [c.to_json() for c in self.considered]}


CostFn = Callable[[Speculator, ModelInfo | None], int | None]
StepCostFn = Callable[[ModelInfo, ModelInfo], StepCost]  # (target, draft) -> a draft step's cost


def _no_cost(sp: Speculator, draft: ModelInfo | None) -> int | None:
    return None


def _find(drafts: Sequence[DraftFile], target: ModelInfo, pattern: str) -> list[DraftFile]:
    pat = pattern.lower()
    return [d for d in drafts if d.path != target.path
            and (fnmatch.fnmatchcase(d.path.name.lower(), pat) or fnmatch.fnmatchcase(d.path.stem.lower(), pat))]


def _speculator(c: Candidate, kind: str, draft: Path | None, n_max: int | None, reason: str) -> Speculator:
    if kind == "ngram":
        params = tuple((c.variant, k, v) for k, v in c.params)
        return Speculator("ngram", ordered_spec_types([c.variant]), ngram_params=params, reason=reason)
    names = [KIND_SPEC_TYPE[kind]] + ([c.with_ngram] if c.with_ngram else [])
    params = tuple((c.with_ngram, k, v) for k, v in c.params) if c.with_ngram else ()
    return Speculator(kind, ordered_spec_types(names), draft=draft, n_max=n_max, n_min=c.n_min, p_min=c.p_min,
                      cache_type_k_draft=c.cache_type_k_draft, cache_type_v_draft=c.cache_type_v_draft,
                      ngram_params=params, reason=reason)


def _drafter_problem(target: ModelInfo, d: ModelInfo) -> str:
    """Why a DFlash/DSpark/EAGLE3/MTP-sidecar drafter does not fit this target ('' when it does).
    These mismatches abort llama-server instead of disabling speculation (reference 1.6)."""
    if d.drafter_format_problem:
        return (d.drafter_format_problem + "; llama-server cannot load it: use a drafter converted with "
                "upstream convert_hf_to_gguf.py --target-model-dir (general.architecture = dflash with "
                "dflash.target_layers), or the fork it was made for")
    bad = [layer for layer in d.drafter_target_layers if layer >= target.n_layer]
    if bad:
        return (f"it reads target layer {bad[0]}, but the target has only {target.n_layer} layers "
                "(made for another model)")
    if d.drafter_target_hidden and d.drafter_target_hidden != target.n_embd:
        return (f"it was built for a target with hidden size {d.drafter_target_hidden}, this target has "
                f"{target.n_embd} (made for another model)")
    if d.drafter == "mtp-sidecar" and d.architecture != target.architecture:
        return f"it is an MTP head for {d.architecture}, the target is {target.architecture}"
    if d.drafter == "mtp-sidecar" and not d.mtp_usable:
        return (f"this engine's llama.cpp has no MTP graph for {d.architecture} (the NextN layers are only "
                "preserved)")
    if d.drafter in ("dflash", "dspark") and not d.drafter_target_layers:
        return "it names no target layers"
    return ""


class _Evaluator:
    def __init__(self, target: ModelInfo, drafts: Sequence[DraftFile], engine_spec_types: tuple[str, ...],
                 cost: CostFn, unavailable: Mapping[str, str] | None = None,
                 guard: GuardrailContext = GuardrailContext(), step_cost: StepCostFn = draft_step_cost) -> None:
        self.target = target
        self.step_cost = step_cost
        self.guard = guard
        self.drafts = [d for d in drafts if not d.remote]
        self.by_hub: dict[str, list[DraftFile]] = {}
        for d in sorted(drafts, key=lambda d: d.remote):  # a local copy before the remote header
            if d.hub:
                self.by_hub.setdefault(d.hub, []).append(d)
        self.unavailable = unavailable or {}
        self.by_path = {d.path: d for d in self.drafts}
        self.engine = engine_spec_types
        self.cost = cost

    def result(self, c: Candidate, origin: str, usable: bool, why: str, sp: Speculator | None = None,
               draft: ModelInfo | None = None, step: StepCost | None = None) -> Considered:
        label = c.label
        if draft is not None:  # name the file found; a DFlash/DSpark file's own metadata names its kind
            kind = draft.drafter if draft.drafter in ("dflash", "dspark") else c.kind
            label = f"{kind} {draft.path.name}" + (f" + {c.with_ngram}" if c.with_ngram else "")
        mem = self.cost(sp, draft) if sp is not None else None
        fetch = bool(c.hub) and draft is not None and any(
            f.remote and f.path == draft.path for f in self.by_hub.get(c.hub, ()))
        if fetch:  # known by its remote header only: name it by its ref
            label = f"{label.split(' ', 1)[0]} {c.hub} (on the hub)" + (f" + {c.with_ngram}" if c.with_ngram else "")
        even = None
        if step is not None and sp is not None:
            even = step.break_even(sp.n_max if sp.n_max is not None else DRAFT_N_MAX)
        return Considered(label, origin, usable, why, sp, draft, mem, c.note, c.hub, c.evidence, fetch, step, even)

    def evaluate(self, c: Candidate, origin: str) -> Considered:
        t = self.target
        if c.kind == "ngram":
            sp = _speculator(c, "ngram", None, None, f"{c.variant}: drafts from text already in the context, "
                                                     "no second model")
            return self._engine_check(c, origin, sp, None, sp.reason)
        if c.kind == "mtp" and c.draft is None and not c.find:
            if not t.has_mtp:
                why = ("the target has no MTP (NextN) layers" if not t.n_nextn else
                       f"the target declares {t.n_nextn} NextN layer(s) but has no nextn.eh_proj tensor")
                if c.hub:  # the table names this model's MTP variant: a whole model, never fetched silently
                    why += (f"; this GGUF was converted without them, the variant that keeps them is {c.hub}: "
                            f"`bostudio pull {c.hub}` and serve that")
                return self.result(c, origin, False, why)
            if not t.mtp_usable:
                return self.result(c, origin, False, f"it keeps {t.n_nextn} NextN layer(s), but this engine's "
                                                     f"llama.cpp has no MTP graph for {t.architecture} (the "
                                                     "layers are only preserved); use another speculator")
            sp = _speculator(c, "mtp", None, c.n_max or MTP_N_MAX,
                             f"the target's own MTP head ({t.n_nextn} NextN layer(s)): no second model, "
                             "a small extra KV cache")
            return self._engine_check(c, origin, sp, None, sp.reason)
        files = self._locate(c)
        if isinstance(files, str):
            return self.result(c, origin, False, files)
        reasons = []
        for f in files:
            r = self._with_file(c, origin, f)
            if r.usable:
                return r
            reasons.append(r)
        return reasons[0]

    def _locate(self, c: Candidate) -> list[DraftFile] | str:
        if c.draft is not None:
            if c.draft == self.target.path:
                return "the draft is the target itself"
            d = self.by_path.get(c.draft)
            return [d] if d is not None else f"{c.draft} could not be read as a GGUF model"
        found = _find(self.drafts, self.target, c.find) if c.find else []
        if found:
            return found
        if c.hub and self.by_hub.get(c.hub):
            return self.by_hub[c.hub]
        where = f"no local model matches {c.find!r}" if c.find else "no draft file given"
        if c.find and fnmatch.fnmatchcase(self.target.path.name.lower(), c.find.lower()):
            where = f"the only local model matching {c.find!r} is the target itself"
        if c.hub:
            missing = self.unavailable.get(c.hub) or f"{c.hub} is not on this machine (bostudio pull {c.hub})"
            return f"{where}; {missing}"
        return f"{where}, and the hub ref is not filled in: set draft or hub in pairings.toml"

    def _with_file(self, c: Candidate, origin: str, f: DraftFile) -> Considered:
        t, d = self.target, f.info
        kind = c.kind
        if kind in ("dflash", "dspark", "eagle3") or (kind == "mtp"):
            detected = d.drafter
            if detected is None:
                return self.result(c, origin, False, f"{d.path.name} is a plain model, not a {kind} drafter "
                                                     "(by its metadata)", draft=d)
            want = "mtp-sidecar" if kind == "mtp" else kind
            if detected != want and not (kind in ("dflash", "dspark") and detected in ("dflash", "dspark")):
                return self.result(c, origin, False, f"{d.path.name} is a {detected} drafter, not {kind}", draft=d)
            kind = "mtp" if detected == "mtp-sidecar" else detected  # DFlash vs DSpark: the metadata decides
            problem = _drafter_problem(t, d)
            if problem:
                return self.result(c, origin, False, f"{d.path.name}: {problem}", draft=d)
            if kind != "eagle3" and not f.compat.compatible:  # EAGLE3 may map its own vocab (d2t)
                return self.result(c, origin, False, f"{d.path.name}: {f.compat.summary()}", draft=d)
            block = d.drafter_block_size
            n_max = c.n_max if c.n_max is not None else (
                block - 1 if kind == "dflash" else block if kind == "dspark" else MTP_N_MAX)
            if kind in ("dflash", "dspark") and n_max > (block - 1 if kind == "dflash" else block):
                n_max = block - 1 if kind == "dflash" else block  # llama.cpp clamps to the trained block size
            sp = _speculator(c, kind, d.path, n_max, f"{kind} drafter {d.path.name} (detected from its "
                                                     f"metadata){', block size ' + str(block) if block else ''}")
            return self._engine_check(c, origin, sp, d, sp.reason)
        # a classic draft model: llama.cpp's draft-simple rules decide
        if d.drafter is not None:
            return self.result(c, origin, False, f"{d.path.name} is a {d.drafter} drafter, not a draft model "
                                                 f"(use kind = \"{'mtp' if d.drafter == 'mtp-sidecar' else d.drafter}\")",
                               draft=d)
        if not f.compat.compatible:
            return self.result(c, origin, False, f"{d.path.name}: {f.compat.summary()}", draft=d)
        step = self.step_cost(t, d)
        if not c.self_draft and t.n_params and d.n_params >= t.n_params:
            return self.result(c, origin, False, f"{d.path.name} is not smaller than the target "
                                                 f"({d.size_label} vs {t.size_label})", draft=d, step=step)
        what = "a low-bit copy of the target itself" if c.self_draft else f"{d.size_label or '?'} parameters"
        # the draft length: the table's, else the one that pays best on these devices (best_draft_length)
        n_max = c.n_max if c.n_max is not None else best_draft_length(step)
        sp = _speculator(c, "draft", d.path, n_max,
                         f"draft model {d.path.name} ({what}, {d.quant}); {f.compat.summary()}; n_max {n_max}")
        if step.ratio >= MAX_STEP_COST:
            return self.result(c, origin, False, f"{d.path.name}: a draft step costs {step.ratio:.2f} of a "
                                                 "target step, so no acceptance makes it pay", sp, d, step)
        even = step.break_even(n_max)
        # a file the user's table names (a self-draft among them) is their choice: its cost is shown, not ruled on
        if (c.draft is None or c.entry == "auto") and (even is None or even > MAX_BREAK_EVEN):
            verify = (f", verifying adds {step.verify_per_token:.2f} of one per drafted token"
                      if step.verify_per_token else "")
            cost = (f"a step costs {step.ratio:.2f} of the target's{verify}, and llama-server re-evaluates each "
                    f"verified batch in the draft: a round of {n_max} costs {step.round_cost(n_max):.2f} target steps")
            what = (f"it cannot pay: accepting every drafted token, it runs at most {step.best_speedup(n_max):.2f}x "
                    f"of off at n_max {n_max}" if even is None else
                    f"it pays only above {100 * even:.0f}% acceptance at n_max {n_max}")
            return self.result(c, origin, False, f"{d.path.name}: {what} ({cost}); `bostudio tune` measures it",
                               sp, d, step)
        return self._engine_check(c, origin, sp, d, sp.reason, step)

    def _engine_check(self, c: Candidate, origin: str, sp: Speculator, d: ModelInfo | None,
                      why: str, step: StepCost | None = None) -> Considered:
        missing = [s for s in sp.spec_types if s not in self.engine]
        if missing:
            return self.result(c, origin, False, f"this llama-server does not support --spec-type "
                                                 f"{','.join(missing)}", sp, d, step)
        rule = self.guard.blocking(sp, self.target.architecture, self.target.is_mla)
        if rule is not None:
            return self.result(c, origin, False, rule.explain(), sp, d, step)
        return self.result(c, origin, True, why, sp, d, step)


def _auto_candidates(target: ModelInfo, drafts: Sequence[DraftFile], table_files: set[Path],
                     step_cost: StepCostFn = draft_step_cost) -> list[Candidate]:
    out: list[Candidate] = []
    if target.has_mtp:
        out.append(Candidate("mtp", entry="auto", note="detected from the target's metadata"))
    for f in drafts:
        d = f.info
        if d.path == target.path or d.path in table_files or f.remote:
            continue
        if d.drafter in ("dflash", "dspark", "eagle3", "mtp-sidecar") and f.compat.compatible:
            kind = "mtp" if d.drafter == "mtp-sidecar" else d.drafter
            out.append(Candidate(kind, draft=d.path, entry="auto", note="drafter kind detected from its metadata"))
    # Every smaller local model llama.cpp accepts as a draft (its tokenizer rules, compat.py) is a candidate,
    # cheapest step first: what a draft costs is the weight bytes it reads per step, not a parameter ratio.
    plain = [f for f in drafts if not f.remote and f.info.drafter is None and f.info.kind == "model"
             and f.path != target.path and f.path not in table_files and f.compat.compatible
             and f.info.n_params < target.n_params]
    for f in sorted(plain, key=lambda f: step_cost(target, f.info).ratio):
        d = f.info
        out.append(Candidate("draft", draft=d.path, entry="auto",
                             note=f"{f.compat.checked or 'compatible tokenizer'}, "
                                  f"{d.n_params / max(1, target.n_params):.0%} of the target's parameters"))
    return out


def select(target: ModelInfo, table: PairingTable, request: SpecRequest, *, engine_spec_types: tuple[str, ...],
           drafts: Sequence[DraftFile] = (), cost: CostFn = _no_cost, has_gpu: bool = False,
           unavailable: Mapping[str, str] | None = None,
           guard: GuardrailContext = GuardrailContext(), step_cost: StepCostFn = draft_step_cost) -> Selection:
    """The speculator for `target`. `drafts` are the GGUFs that could draft for it (the catalog's, those the
    table names, and hub drafters known by their remote header only: `remote`), each with its compatibility
    report; `cost` gives a speculator's memory bytes; `unavailable` says, per hub ref, why it is not here;
    `guard` holds the known regressions (guardrails.toml) for the backends in use: a candidate a rule
    matches is passed over, an explicit request is refused. `step_cost` prices a draft model's step against
    the target's on the devices in use (default: one device, the ratio of weight bytes read per token)."""
    if request.mode != "auto":
        sel = _explicit(target, request, engine_spec_types, drafts, cost, has_gpu, step_cost)
        rule = guard.blocking(sel.speculator, target.architecture, target.is_mla)
        if rule is not None:
            raise ConfigError(f"--spec {sel.speculator.label} on {target.architecture}: {rule.what} ({rule.reference})",
                              f"use another --spec, or override with allow = [\"{rule.id}\"] under [guardrails] "
                              "in config.toml")
        return sel
    ev = _Evaluator(target, drafts, engine_spec_types, cost, unavailable, guard, step_cost)
    entries = table.matching(target.path.name, target.name, target.architecture, target.tokenizer.fingerprint)
    specific = [e for e in entries if not e.match.is_catch_all]
    catch_all = [e for e in entries if e.match.is_catch_all]
    table_files = {c.draft for e in entries for c in e.candidates if c.draft is not None}
    table_files |= {f.path for f in drafts if f.hub}
    table_files |= {f.path for e in specific for c in e.candidates if c.find  # found by a table entry's pattern
                    for f in _find(drafts, target, c.find)}
    ordered: list[tuple[Candidate, str]] = []
    for e in specific:
        ordered += [(c, f"table entry {e.name!r} ({c.source})") for c in e.candidates]
    ordered += [(c, "auto-detected") for c in _auto_candidates(target, drafts, table_files, step_cost)]
    for e in catch_all:
        ordered += [(c, f"table entry {e.name!r} ({c.source})") for c in e.candidates]
    considered: list[Considered] = []
    chosen = None
    for c, origin in ordered:
        r = ev.evaluate(c, origin)
        if r.usable and chosen is None:
            chosen = len(considered)
        elif r.usable:
            r = replace(r, why="ranked below the chosen candidate; " + r.why)
        considered.append(r)
    if chosen is None:
        return Selection(Speculator("none", reason="no candidate is usable: " + "; ".join(
            f"{c.label}: {c.why}" for c in considered)), tuple(considered), None)
    sp = considered[chosen].speculator
    assert sp is not None
    return Selection(replace(sp, reason="auto: " + sp.reason), tuple(considered), chosen)


def _explicit(target: ModelInfo, request: SpecRequest, engine_spec_types: tuple[str, ...],
              drafts: Sequence[DraftFile], cost: CostFn, has_gpu: bool,
              step_cost: StepCostFn = draft_step_cost) -> Selection:
    if request.mode == "mtp" and target.has_mtp and not target.mtp_usable:
        raise ConfigError(f"{target.path.name} keeps {target.n_nextn} NextN layer(s), but this engine's llama.cpp "
                          f"has no MTP graph for {target.architecture} (the layers are only preserved)",
                          "use --spec auto or --spec ngram")
    sp = choose_speculator(request, n_nextn=target.n_nextn if target.has_mtp else 0,
                           engine_spec_types=engine_spec_types, has_gpu=has_gpu)
    draft_info = None
    if request.mode == "draft":
        assert request.draft is not None
        f = next((d for d in drafts if d.path.resolve() == request.draft.resolve()), None)
        if f is None:
            raise ConfigError(f"draft model {request.draft} could not be read", "pass a GGUF model file")
        draft_info = f.info
        if f.info.drafter is not None:
            kind = "mtp" if f.info.drafter == "mtp-sidecar" else f.info.drafter
            problem = _drafter_problem(target, f.info)
            if problem:
                raise ConfigError(f"{f.path.name} cannot draft for {target.path.name}: {problem}",
                                  "use a drafter made for this target, or --spec auto")
            if KIND_SPEC_TYPE[kind] not in engine_spec_types:
                raise EngineError(f"this llama-server does not support --spec-type {KIND_SPEC_TYPE[kind]}",
                                  "build the pinned engine with `bostudio engine build` or pass --engine")
            block = f.info.drafter_block_size
            n_max = block - 1 if kind == "dflash" else block if kind == "dspark" else MTP_N_MAX
            sp = Speculator(kind, (KIND_SPEC_TYPE[kind],), draft=f.path, n_max=n_max,
                            reason=f"{kind} drafter {f.path.name} requested (--spec draft:PATH; kind detected "
                                   "from its metadata)")
        elif not f.compat.compatible:
            raise ConfigError(f"{f.path.name} cannot draft for {target.path.name}: {f.compat.summary()}",
                              "llama-server would silently run without speculation; use a draft with the "
                              "target's tokenizer, or --spec auto")
        else:
            sp = replace(sp, reason=sp.reason + f"; {f.compat.summary()}")
    step = step_cost(target, draft_info) if draft_info is not None and sp.kind == "draft" else None
    if step is not None:  # the draft length that pays best on these devices (pairing.core.cost.best_draft_length)
        n = best_draft_length(step)
        sp = replace(sp, n_max=n, reason=f"{sp.reason}; n_max {n} planned for {step.draft_device}")
    even = step.break_even(sp.n_max or DRAFT_N_MAX) if step is not None else None
    c = Considered(sp.label, "requested", True, sp.reason, sp, draft_info,
                   cost(sp, draft_info) if sp.kind != "none" else 0, step=step, break_even=even)
    return Selection(sp, (c,), 0)
