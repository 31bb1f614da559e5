"""Fetch what the target needs: drafters the pairing table names by hub ref, read before they are pulled.

The pull policy (`ask | always | never`) says whether a drafter on the hub may be downloaded. Before anything
is downloaded, the drafter's GGUF header is read with range requests (catalog.remote): its format is checked
and the planner prices it, so the offer says its size, what it costs in context tokens, and why it was chosen.
A drafter that is declined, or whose pull fails, is set aside with the reason and the choice falls back to
the next candidate. `choose_and_fetch` is the one entry point: `up`, the daemon and the TUI call it with their
own `ask` (a terminal prompt, a dialog, or none). `pair_model` is the `pair` command's report on top of it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from bostudio import paths
from bostudio.config import read_config
from bostudio.engine.discover import Engine
from bostudio.errors import BostudioError, ConfigError
from bostudio.gguf import ModelInfo, describe
from bostudio.hardware.device import Device, devices_from_engine
from bostudio.pairing.core.compat import check_compatibility
from bostudio.pairing.core.cost import context_tokens_for
from bostudio.pairing.edge.pair import choose, hub_refs, local_hub_copies
from bostudio.pairing.edge.probe import ProbeResult, probe_tokenization
from bostudio.pairing.core.select import Considered, DraftFile, Selection
from bostudio.pairing.core.table import PairingTable, load_pairings
from bostudio.speculation import SpecRequest

PULL_POLICIES = ("ask", "always", "never")


def default_pull_policy(interactive: bool) -> str:
    """`ask` when someone can answer (a terminal), `never` headless (daemon, CI, pipes)."""
    return "ask" if interactive else "never"


def configured_pull_policy(path: Path | None = None) -> str | None:
    """`[pull] policy` of config.toml, or None when it is not set."""
    path = path or paths.config_file()
    table = read_config(path).get("pull", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: `pull` must be a table", 'write it as [pull] with policy = "ask"')
    for key in table:
        if key != "policy":
            raise ConfigError(f"{path}: unknown key `{key}` in [pull]", "valid keys: policy")
    value = table.get("policy")
    if value is not None and value not in PULL_POLICIES:
        raise ConfigError(f"{path}: [pull] policy must be one of {', '.join(PULL_POLICIES)}, not {value!r}",
                          'e.g. policy = "ask"')
    return value


def resolve_pull_policy(flag: str | None, interactive: bool | None = None) -> str:
    """The policy in force: the command line's, else config.toml's, else ask on a terminal / never headless."""
    if flag is not None:
        if flag not in PULL_POLICIES:
            raise ConfigError(f"--pull {flag!r} is not a pull policy", "use --pull ask, always or never")
        return flag
    configured = configured_pull_policy()
    if configured is not None:
        return configured
    if interactive is None:
        interactive = sys.stdin.isatty() and sys.stderr.isatty()
    return default_pull_policy(interactive)


@dataclass(frozen=True)
class DrafterOffer:
    """A drafter that would be downloaded, with what the user needs to decide."""

    ref: str  # owner/repo[:quant]
    source: str  # where that ref was seen (issue, PR, model card)
    target: str
    size: int  # bytes to download
    memory_bytes: int | None  # what it costs at the planned context, according to the planner
    context_tokens: int | None  # the same, in tokens of the target's context
    reason: str

    def text(self) -> str:
        mem = "?" if self.memory_bytes is None else _size(self.memory_bytes)
        ctx = "" if not self.context_tokens else f" (about {self.context_tokens:,} tokens of context)"
        return (f"{self.target} would draft with {self.ref}: {_size(self.size)} to download, "
                f"{mem} of memory{ctx}; why: {self.reason}" + (f"; source: {self.source}" if self.source else ""))

    def to_json(self) -> dict:
        return {"ref": self.ref, "source": self.source, "target": self.target, "size": self.size,
                "memory_bytes": self.memory_bytes, "context_tokens": self.context_tokens, "reason": self.reason}


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 1024:,.0f} KiB"


@dataclass(frozen=True)
class PairReport:
    target: ModelInfo
    selection: Selection
    probe: ProbeResult | None  # tokenization probe of the chosen draft-simple pair
    tables: tuple[Path, ...]

    def to_json(self) -> dict:
        return {"target": str(self.target.path), "architecture": self.target.architecture,
                "tokenizer_fingerprint": self.target.tokenizer.fingerprint,
                "tables": [str(t) for t in self.tables], **self.selection.to_json(),
                "probe": self.probe.to_json() if self.probe else None}


AskFn = Callable[[DrafterOffer], bool]
LogFn = Callable[[str], None]


def remote_drafters(target: ModelInfo, refs: Mapping[str, str],
                    policy: str) -> tuple[list[DraftFile], dict[str, str], dict[str, int]]:
    """(drafters known by their remote header, why each other ref is unavailable, download size per ref).
    With policy `never` nothing is read from the network."""
    if policy == "never":
        why = ("on the hub only, not downloaded: the pull policy is never (`up --pull ask` or `--pull always` "
               "fetches it; or `bostudio pull {ref}`)")
        return [], {ref: why.format(ref=ref) for ref in refs}, {}
    from bostudio.catalog.hubfiles import parse_ref
    from bostudio.catalog.remote import read_remote_sources
    from bostudio.gguf import describe_header, merge_parts, parse_header

    out, unavailable, sizes = [], {}, {}
    for ref in refs:
        try:
            files, sources = read_remote_sources(ref)
            info = describe_header(merge_parts([parse_header(s) for s in sources]))
        except BostudioError as exc:
            unavailable[ref] = f"its header could not be read from the hub: {exc.message}"
            continue
        sizes[ref] = sum(f.size for f in files)
        # not a local path: named so that messages show the file's name
        info = replace(info, path=Path("<hub>") / parse_ref(ref)[0] / files[0].path)
        out.append(DraftFile(info, check_compatibility(target, info), hub=ref, remote=True))
    return out, unavailable, sizes


def choose_and_fetch(target: ModelInfo, request: SpecRequest, engine: Engine, ctx: int, *,
                     devices: tuple[Device, ...] | None = None, policy: str = "never", ask: AskFn | None = None,
                     log: LogFn = lambda _: None, table: PairingTable | None = None,
                     workload: str | None = None) -> Selection:
    """`pair.choose`, with the table's hub drafters in play: a chosen drafter that is only on the hub is
    offered (policy ask: `ask(offer)` decides; always: yes), pulled into the hub cache sha256-checked, and the
    choice made again with the local file. Declined or failed pulls fall back to the next candidate, and the
    reason shows in that candidate's `why`. With a `workload`, a fresh tuned profile decides first."""
    if policy not in PULL_POLICIES:
        raise ConfigError(f"unknown pull policy {policy!r}", "use ask, always or never")
    if request.mode != "auto":
        return choose(target, request, engine, ctx, table=table, devices=devices)[0]
    table = load_pairings() if table is None else table
    devices = devices_from_engine(engine.devices) if devices is None else devices
    refs = hub_refs(target, table)
    local = local_hub_copies(refs)
    missing = {r: s for r, s in refs.items() if r not in local}
    remote, unavailable, sizes = remote_drafters(target, missing, policy)
    for _ in range(len(refs) + 1):  # each pass settles one ref: pulled, declined or failed
        sel = choose(target, request, engine, ctx, table=table, devices=devices, hub_copies=local,
                     remote=[d for d in remote if d.hub not in unavailable], unavailable=unavailable,
                     workload=workload)[0]
        chosen: Considered | None = sel.considered[sel.chosen] if sel.chosen is not None else None
        if chosen is None or not chosen.fetch:
            return sel
        ref = chosen.hub
        tokens = (context_tokens_for(target, chosen.memory_bytes, ctx, devices)
                  if chosen.memory_bytes else None)
        offer = DrafterOffer(ref, chosen.evidence, target.path.name, sizes.get(ref, 0), chosen.memory_bytes,
                             tokens, chosen.why)
        log(offer.text())
        if policy == "ask" and (ask is None or not ask(offer)):
            unavailable[ref] = "declined: not downloaded" if ask is not None else \
                "not downloaded: the pull policy is ask, and no one can answer here (use --pull always)"
            log(f"{ref}: {unavailable[ref]}; falling back to the next candidate")
            continue
        from bostudio.catalog.hub import pull

        try:
            path = pull(ref, log=log)
        except BostudioError as exc:
            unavailable[ref] = f"the pull failed: {exc.message}"
            log(f"{ref}: {unavailable[ref]}; falling back to the next candidate")
            continue
        local[ref] = path
    return sel


def pair_model(target_path: Path, engine: Engine, request: SpecRequest = SpecRequest("auto"), ctx: int | None = None,
               probe: bool = True, workload: str | None = None) -> PairReport:
    """The speculator `up` would choose for the same request, context (None: the training context, as
    `up` prices it) and workload (its tuned profile decides first), with every candidate and why."""
    target = describe(target_path)
    # `pair` explains and never downloads: a hub drafter shows as what `up --pull ask|always` would fetch
    table = load_pairings() if request.mode == "auto" else PairingTable()
    sel = choose_and_fetch(target, request, engine, ctx or target.n_ctx_train, policy="never", table=table,
                           workload=workload)
    result = None
    sp = sel.speculator
    if probe and sp.kind == "draft" and sp.draft is not None:
        result = probe_tokenization(target.path, sp.draft)
    return PairReport(target, sel, result, table.files)


def interactive_ask(stream_in=None, stream_out=None) -> AskFn:  # type: ignore[no-untyped-def]
    """An `ask` for a terminal: prints the offer and reads y/N."""
    def ask(offer: DrafterOffer) -> bool:
        out = stream_out or sys.stderr
        inp = stream_in or sys.stdin
        print(f"Download {offer.ref} ({_size(offer.size)}) into the Hugging Face cache? [y/N] ",
              end="", file=out, flush=True)
        answer = inp.readline()
        return answer.strip().lower() in ("y", "yes")
    return ask


def table_hub_report(table: PairingTable) -> list[dict]:
    """For each table entry: what each candidate would use and from where, with the source of a hub ref
    (`bostudio pair --table`)."""
    from bostudio.catalog.hub import hub_endpoint

    out = []
    for e in table.entries:
        cands = []
        for c in e.candidates:
            if c.kind == "ngram":
                what = f"n-gram speculation ({c.variant}), nothing to fetch"
            elif c.draft is not None:
                what = f"the local file {c.draft}"
            elif c.hub and c.kind == "mtp":
                what = (f"the target's own MTP head; a GGUF without it is pointed to {c.hub} on {hub_endpoint()} "
                        "(a whole model: not fetched by itself)")
            elif c.hub:
                what = f"would fetch {c.hub} from {hub_endpoint()} (with --pull ask or always)"
            elif c.kind == "mtp" and not c.find:
                what = "the target's own MTP head, when its GGUF keeps it"
            else:
                what = (f"a local file matching {c.find!r}" if c.find else "nothing") + "; no verified hub ref"
            cands.append({"kind": c.kind, "hub": c.hub or None, "find": c.find or None, "what": what,
                          "source": c.evidence or None, "note": c.note or None, "where": c.source})
        out.append({"entry": e.name, "note": e.note, "match": {"name": list(e.match.names),
                    "architecture": list(e.match.architectures), "tokenizer": list(e.match.tokenizers)},
                    "candidates": cands})
    return out
