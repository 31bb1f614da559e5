"""The edge of pairing: read the table and the local GGUFs (and hub copies already on disk), check
compatibility, call the pure `select`, make self-drafts with llama-quantize and record them in the user's
table. Drafters still on the hub, and the `pair` command's report, are fetch's (the layer above)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from bostudio import paths
from bostudio.catalog.index import scan_catalog
from bostudio.engine.discover import Engine
from bostudio.engine.quantize import quantize
from bostudio.errors import BostudioError, ConfigError, GGUFFormatError
from bostudio.gguf import ModelInfo, describe
from bostudio.files import write_atomic
from bostudio.hardware.device import Device, devices_from_engine
from bostudio.pairing.core.compat import check_compatibility
from bostudio.pairing.core.cost import draft_step_cost, speculator_memory_bytes
from bostudio.pairing.core.guardrails import GuardrailContext, load_allowed, load_guardrails
from bostudio.pairing.core.select import Considered, DraftFile, Selection, select
from bostudio.pairing.core.table import PairingTable, load_pairings, parse_table, user_table_path
from bostudio.profiles import find_profile
from bostudio.speculation import DRAFT_N_MAX, SpecRequest


def _could_draft(target: ModelInfo, info: ModelInfo) -> bool:
    """A cheap pre-filter on (possibly cached) metadata before a file is described and checked in full."""
    if info.kind == "drafter":
        return True
    t, d = target.tokenizer, info.tokenizer
    return info.kind == "model" and t.model == d.model and abs(t.vocab_size - d.vocab_size) <= 128


def local_gguf_paths(target: ModelInfo, extra: Iterable[Path] = ()) -> list[Path]:
    """GGUFs that could draft for `target`: the catalog's (every store it scans) that pass a cheap
    tokenizer pre-filter, the target's own folder (drafters sit beside their target), and `extra`."""
    seen: dict[Path, None] = {}
    for entry in scan_catalog():
        if entry.info is not None and _could_draft(target, entry.info):
            seen.setdefault(entry.path.resolve(), None)
    if target.path.parent.is_dir():
        for p in sorted(target.path.parent.glob("*.gguf")):
            seen.setdefault(p.resolve(), None)
    seen.pop(target.path.resolve(), None)
    for p in extra:  # a draft named explicitly may be the target itself (a self-draft test)
        seen.setdefault(p.resolve(), None)
    return list(seen)


def hub_refs(target: ModelInfo, table: PairingTable) -> dict[str, str]:
    """Drafter hub refs (-> source) of the table entries that match `target` by name, architecture or
    tokenizer. An `mtp` candidate's ref names the target's own MTP variant, a whole model: not a drafter."""
    entries = table.matching(target.path.name, target.name, target.architecture, target.tokenizer.fingerprint)
    return {c.hub: c.evidence for e in entries if not e.match.is_catch_all for c in e.candidates
            if c.hub and c.kind != "mtp"}


def local_hub_copies(refs: Mapping[str, str]) -> dict[str, Path]:
    """Refs already in the Hugging Face cache (disk only)."""
    from bostudio.catalog.hub import cached_path

    out = {}
    for ref in refs:
        p = cached_path(ref)
        if p is not None:
            out[ref] = p
    return out


def draft_files(target: ModelInfo, candidates: Iterable[Path]) -> list[DraftFile]:
    """Describe each candidate file and check it against the target; unreadable files are left out."""
    out = []
    for p in candidates:
        try:
            info = describe(p)
        except (GGUFFormatError, OSError):
            continue
        if info.kind not in ("model", "drafter"):
            continue
        out.append(DraftFile(info, check_compatibility(target, info)))
    return out


def choose(target: ModelInfo, request: SpecRequest, engine: Engine, ctx: int = 4096,
           table: PairingTable | None = None,
           devices: tuple[Device, ...] | None = None, *, hub_copies: Mapping[str, Path] | None = None,
           remote: Sequence[DraftFile] = (), unavailable: Mapping[str, str] | None = None,
           workload: str | None = None) -> tuple[Selection, PairingTable]:
    """Select the speculator for `target` with the user's and the shipped tables and the local GGUFs.
    Explicit modes (off, ngram, mtp, draft:PATH) need neither the tables nor a scan of the catalog.
    `hub_copies` maps the table's hub refs to their files in the hub cache (default: looked up on disk);
    `remote` are hub drafters known by their header only, `unavailable` why other refs are not here
    (`fetch.choose_and_fetch` passes both). In auto mode with a `workload`, a fresh profile from
    `bostudio tune` decides (a stale one is noted in the reason)."""
    note = ""
    if request.mode == "auto" and workload:
        psel, note = _from_profile(target, engine, workload, devices)
        if psel is not None:
            return psel, PairingTable() if table is None else table
    if request.mode != "auto":
        table = PairingTable() if table is None else table
        drafts = draft_files(target, [request.draft] if request.draft is not None else [])
    else:
        table = load_pairings() if table is None else table
        named = [c.draft for e in table.entries for c in e.candidates if c.draft is not None]
        if hub_copies is None:
            hub_copies = local_hub_copies(hub_refs(target, table))
        # a hub copy keeps its snapshot path (the file's name), not the blob the catalog resolves it to
        blobs = {p.resolve() for p in hub_copies.values()}
        drafts = [d for d in draft_files(target, local_gguf_paths(target, named)) if d.path.resolve() not in blobs]
        for ref, p in hub_copies.items():
            drafts += [replace(d, hub=ref) for d in draft_files(target, [p])]
        drafts += list(remote)
    devices = devices_from_engine(engine.devices) if devices is None else devices

    def cost(sp, draft):  # type: ignore[no-untyped-def]
        return speculator_memory_bytes(target, sp, draft, ctx, devices)

    def step_cost(t: ModelInfo, d: ModelInfo):  # type: ignore[no-untyped-def]
        return draft_step_cost(t, d, devices)

    guard = _guard(engine, devices)
    sel = select(target, table, request, engine_spec_types=engine.spec_types, drafts=drafts, cost=cost,
                 has_gpu=engine.gpu_mib() > 0, unavailable=unavailable, guard=guard, step_cost=step_cost)
    if note:
        sel = replace(sel, speculator=replace(sel.speculator, reason=f"{sel.speculator.reason} ({note})"))
    return sel, table


def _guard(engine: Engine, devices: tuple[Device, ...]) -> GuardrailContext:
    # The backends that run the model: those of the devices in the plan (the CPU always takes part).
    backends = tuple(sorted({d.backend.lower() for d in devices if d.backend} | {"cpu"}))
    # Builds from the pinned sdist report build 1 (no git history): their number means nothing, and the
    # rules bounded by a build number were checked against the pinned source by hand (guardrails.toml).
    build = engine.build if engine.source != "built" else 0
    return GuardrailContext(load_guardrails(), backends, load_allowed(), build)


def _from_profile(target: ModelInfo, engine: Engine, workload: str,
                  devices: tuple[Device, ...] | None) -> tuple[Selection | None, str]:
    """The tuned profile's speculator for (model file, engine, workload), or why none applies."""
    found = find_profile(target.path, engine, workload)
    if found.profile is None:
        return None, found.note
    p = found.profile
    sp = p.speculator
    missing = [t for t in sp.spec_types if t not in engine.spec_types]
    if missing:
        return None, f"profile {found.path.name} needs --spec-type {','.join(missing)}: ignored"
    if sp.draft is not None and not sp.draft.is_file():
        return None, f"profile {found.path.name} names a draft that is gone ({sp.draft}): ignored"
    guard = _guard(engine, devices_from_engine(engine.devices) if devices is None else devices)
    rule = guard.blocking(sp, target.architecture, target.is_mla)
    if rule is not None:
        return None, f"profile {found.path.name} ignored: {rule.explain()}"
    measured = (f"; measured {p.chosen.tok_s:.1f} tok/s vs {p.baseline_tok_s:.1f} off"
                if p.chosen else f"; off measured {p.baseline_tok_s:.1f} tok/s")
    sp = replace(sp, reason=f"auto: profile for workload {workload!r} ({found.path}): {p.why}{measured}")
    origin = f"profile {found.path.name}"
    refused = tuple(Considered(m.label, origin, False, f"tune refused it ({m.lost_text(p.chosen)}; interval from "
                                                       f"{m.speedup_low:.2f}x over {m.samples} pair(s)): {m.refused}")
                    for m in p.refused())
    return Selection(sp, (Considered(sp.label, origin, True, sp.reason, sp),) + refused, 0), ""


# ------------------------------------------------------------------------------------------------ self-draft

def self_draft_path(target: Path, quant: str) -> Path:
    stem = target.name[:-5] if target.name.lower().endswith(".gguf") else target.name
    return paths.drafts_dir() / f"{stem}.self-{quant}.gguf"


# Bits per weight of llama-quantize's types (ggml block sizes; K-quant mixes as llama.cpp reports them).
QUANT_BPW = {"Q2_K": 2.625, "Q2_K_S": 2.625, "Q3_K_S": 3.4375, "Q3_K_M": 3.91, "Q3_K_L": 4.27, "IQ2_XXS": 2.06,
             "IQ2_XS": 2.31, "IQ3_XXS": 3.06, "IQ4_XS": 4.25, "Q4_0": 4.5, "Q4_1": 5.0, "Q4_K_S": 4.58,
             "Q4_K_M": 4.89, "Q5_0": 5.5, "Q5_K_S": 5.54, "Q5_K_M": 5.7, "Q6_K": 6.5625, "Q8_0": 8.5,
             "F16": 16.0, "BF16": 16.0, "F32": 32.0}


def self_draft_info(target: ModelInfo, quant: str) -> ModelInfo:
    """The header of the self-draft of `target` at `quant`: the copy itself once made (`pair
    --self-draft`, `up --spec self-draft:Q`), else an estimate scaled from the target by bits per
    weight, for planning before the copy exists."""
    made = self_draft_path(target.path, quant)
    if made.exists():
        return describe(made)
    bpw = QUANT_BPW.get(quant.upper())
    total = sum(target.layer_bytes) + target.token_embd_bytes + target.output_bytes + target.other_bytes
    if bpw is None or not target.n_params or not total:
        raise ConfigError(f"cannot estimate a {quant} copy of {target.path.name} before it exists",
                          f"make it first: `bostudio pair {target.path} --self-draft {quant}`")
    ratio = min(1.0, bpw / (total * 8 / target.n_params))
    return replace(target, path=made, quant=quant.upper(),
                   layer_bytes=tuple(int(b * ratio) for b in target.layer_bytes),
                   token_embd_bytes=int(target.token_embd_bytes * ratio),
                   output_bytes=int(target.output_bytes * ratio), other_bytes=target.other_bytes,
                   matmul_bytes_by_type=())


def make_self_draft(target: Path, quant: str, engine: Engine, log: Callable[[str], None] = print,
                    force: bool = False) -> Path:
    """A low-bit copy of `target` made with the engine's llama-quantize (cached by name)."""
    out = self_draft_path(target, quant)
    if out.exists() and not force:
        log(f"self-draft {out} already exists")
        return out
    log(f"quantizing {target.name} to {quant} with llama-quantize ...")
    return quantize(engine, target, out, quant)


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def record_self_draft(target: ModelInfo, draft: Path, quant: str, table_path: Path | None = None,
                      n_max: int = DRAFT_N_MAX) -> bool:
    """Add a pairing target -> self-draft to the user's table; False when it is already there."""
    table_path = user_table_path() if table_path is None else table_path
    old = table_path.read_text(encoding="utf-8") if table_path.exists() else "version = 1\n"
    existing = parse_table(old, table_path)
    if any(c.draft == draft.resolve() for e in existing.entries for c in e.candidates):
        return False
    lines = [
        "[[pairing]]",
        f"name = {_toml_str('self-draft ' + target.path.name)}",
        f"note = {_toml_str(f'{quant} copy of the target made by `bostudio pair --self-draft {quant}`')}",
        "[pairing.match]",
        f"name = [{_toml_str(target.path.name)}]",
        f"tokenizer = [{_toml_str(target.tokenizer.fingerprint)}]" if target.tokenizer.fingerprint else "",
        "[[pairing.candidate]]",
        'kind = "draft"',
        f"draft = {_toml_str(str(draft.resolve()))}",
        "self_draft = true",
        f"n_max = {n_max}",
        f"note = {_toml_str('the same model at low precision: same tokenizer, high acceptance')}",
    ]
    new = old.rstrip("\n") + "\n\n" + "\n".join(ln for ln in lines if ln) + "\n"
    try:
        parse_table(new, table_path)
    except BostudioError as exc:  # never leave the user's table unreadable
        raise ConfigError(f"could not record the self-draft in {table_path}: {exc}",
                          "fix the table by hand and run the command again") from exc
    write_atomic(table_path, new)
    return True
