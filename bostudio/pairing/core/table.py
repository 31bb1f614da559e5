"""pairings.toml: which speculators a target model gets, in order. Schema, loader and errors.

The shipped table sits at the top of the project (`pairings.toml`); the user's own table
(`$XDG_CONFIG_HOME/bostudio/pairings.toml`) is read first, so its entries win. An entry matches a target by
name pattern, architecture and/or tokenizer fingerprint (every criterion given must hold; an entry without
any matches every target) and lists candidates in the order they are tried:

    [[pairing]]
    name = "llama3"
    note = "Llama 3.x drafts with Llama 3.2 1B"
    [pairing.match]
    name = ["*llama-3*"]           # fnmatch patterns, case-insensitive, over the file name and general.name
    architecture = ["llama"]
    tokenizer = ["<sha256 fingerprint>"]
    [[pairing.candidate]]
    kind = "draft"                 # draft | mtp | dflash | dspark | eagle3 | ngram
    draft = "~/models/Llama-3.2-1B-Instruct-Q8_0.gguf"   # a GGUF path (relative to this file) ...
    hub = ""                       # ... or a hub ref `owner/repo:quant`; empty: fill it in
    find = "*llama-3.2-1b*"        # ... or a name pattern for a local copy (same tokenizer)
    n_max = 16
    ...

Errors name the file, the line and the key, and for unknown keys the nearest valid one.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bostudio import paths
from bostudio.errors import ConfigError
from bostudio.gguf.names import quant_tag
from bostudio.speculation import KINDS, NGRAM_PARAMS, NGRAM_VARIANTS

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
CANDIDATE_KINDS = tuple(k for k in KINDS if k != "none")


class PairingTableError(ConfigError):
    """A pairings.toml that cannot be used: the message says file:line, the key, and what is wrong."""

    title = "pairing table error"

    def __init__(self, file: Path, line: int | None, key: str, problem: str, hint: str) -> None:
        where = f"{file}:{line}" if line else str(file)
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}", hint)
        self.file, self.line, self.key = file, line, key


@dataclass(frozen=True)
class Match:
    names: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    tokenizers: tuple[str, ...] = ()

    @property
    def is_catch_all(self) -> bool:
        return not (self.names or self.architectures or self.tokenizers)

    def matches(self, file_name: str, model_name: str | None, architecture: str, fingerprint: str) -> bool:
        if self.names:
            texts = [file_name.lower()] + ([model_name.lower()] if model_name else [])
            if not any(fnmatch.fnmatchcase(t, p.lower()) for p in self.names for t in texts):
                return False
        if self.architectures and architecture not in self.architectures:
            return False
        if self.tokenizers and not (fingerprint and any(fingerprint.startswith(t) for t in self.tokenizers)):
            return False
        return True


@dataclass(frozen=True)
class Candidate:
    """One speculator a table proposes, with its own settings."""

    kind: str
    draft: Path | None = None  # a local GGUF
    hub: str = ""  # owner/repo[:quant]
    find: str = ""  # name pattern for a local copy
    variant: str = "ngram-mod"  # for kind = ngram
    params: tuple[tuple[str, int], ...] = ()  # n-gram params of the variant
    with_ngram: str = ""  # an n-gram variant to run alongside a draft kind
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    cache_type_k_draft: str | None = None
    cache_type_v_draft: str | None = None
    self_draft: bool = False  # a low-bit copy of the target itself (made by `pair --self-draft`)
    note: str = ""
    entry: str = ""  # the entry's name
    source: str = ""  # file:line it came from
    evidence: str = ""  # the table's `source`: the public issue, PR or model card that names the hub ref

    @property
    def label(self) -> str:
        if self.kind == "ngram":
            return self.variant
        what = self.draft.name if self.draft else (self.hub or self.find or "")
        extra = f" + {self.with_ngram}" if self.with_ngram else ""
        return f"{self.kind} {what}".strip() + extra


@dataclass(frozen=True)
class Entry:
    name: str
    match: Match
    candidates: tuple[Candidate, ...]
    note: str = ""
    source: str = ""


@dataclass(frozen=True)
class PairingTable:
    entries: tuple[Entry, ...] = ()
    files: tuple[Path, ...] = field(default=())

    def matching(self, file_name: str, model_name: str | None, architecture: str,
                 fingerprint: str) -> list[Entry]:
        """Entries that match a target, in table order (the user's first)."""
        return [e for e in self.entries if e.match.matches(file_name, model_name, architecture, fingerprint)]


# ------------------------------------------------------------------------------------------------ loading

TOP_KEYS = ("version", "pairing")
ENTRY_KEYS = ("name", "note", "match", "candidate")
MATCH_KEYS = ("name", "architecture", "tokenizer")
CANDIDATE_KEYS = ("kind", "draft", "hub", "find", "variant", "params", "with_ngram", "n_max", "n_min", "p_min",
                  "cache_type_k_draft", "cache_type_v_draft", "self_draft", "note", "source")
_ALL_NGRAM_PARAMS = tuple(sorted({p for ps in NGRAM_PARAMS.values() for p in ps}))


def shipped_table_path() -> Path:
    return paths.PROJECT_ROOT / "pairings.toml"


def user_table_path() -> Path:
    return paths.config_dir() / "pairings.toml"


class _Reader:
    """Validates one parsed TOML document, naming file, line and key in every error."""

    def __init__(self, file: Path, text: str) -> None:
        self.file = file
        self.lines = text.splitlines()

    def line_of(self, key: str, section: str | None = None, index: int = 0) -> int | None:
        """Best-effort line of `key`: searched after the index-th header of `section` (a [[...]] table)."""
        start = 0
        if section is not None:
            header = re.compile(rf"^\s*\[\[?\s*{re.escape(section)}\s*\]\]?\s*(#.*)?$")
            seen = -1
            for i, line in enumerate(self.lines):
                if header.match(line):
                    seen += 1
                    if seen == index:
                        start = i
                        break
        *parents, leaf = key.split(".")
        for part in parents:  # a sub-table: its [header] or `part = {` line, after the section start
            sub = re.compile(rf"^\s*\[[^\]]*\b{re.escape(part)}\s*\]|(^|[\s{{,]){re.escape(part)}\s*=")
            start = next((i for i in range(start, len(self.lines)) if sub.search(self.lines[i])), start)
        pat = re.compile(rf"(^|[\s{{,]){re.escape(leaf)}\s*=|^\s*\[+[^\]]*\b{re.escape(leaf)}\s*\]")
        for i in range(start, len(self.lines)):
            if pat.search(self.lines[i]):
                return i + 1
        return start + 1 if section is not None else None

    @staticmethod
    def lookup(where: str, key: str) -> str:
        """The key path to search for: array-of-tables parts (pairing[1], candidate[2]) are sections."""
        return ".".join(p for p in (where + key).split(".") if p and "[" not in p)

    def fail(self, key: str, problem: str, hint: str, line: int | None) -> PairingTableError:
        return PairingTableError(self.file, line, key, problem, hint)

    def keys(self, table: dict, allowed: tuple[str, ...], where: str, section: str | None, index: int) -> None:
        for k in table:
            if k not in allowed:
                near = difflib.get_close_matches(k, allowed, n=1, cutoff=0.5)
                hint = f"did you mean `{near[0]}`?" if near else "valid keys: " + ", ".join(allowed)
                raise self.fail(f"{where}{k}", "unknown key", hint, self.line_of(self.lookup(where, k), section, index))

    def typed(self, table: dict, key: str, types: tuple[type, ...], where: str, section: str | None,
              index: int, type_name: str) -> Any:
        v = table.get(key)
        if v is None:
            return None
        ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
        if not ok:
            raise self.fail(f"{where}{key}", f"must be {type_name}, not {type(v).__name__} {v!r}",
                            f"write e.g. {key} = {_example(type_name)}", self.line_of(self.lookup(where, key), section, index))
        return v

    def strings(self, table: dict, key: str, where: str, section: str | None, index: int) -> tuple[str, ...]:
        v = table.get(key)
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,)
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return tuple(v)
        raise self.fail(f"{where}{key}", f"must be a string or a list of strings, not {v!r}",
                        f'write e.g. {key} = ["pattern"]', self.line_of(self.lookup(where, key), section, index))


def _example(type_name: str) -> str:
    return {"an integer": "16", "a number": "0.75", "a string": '"text"', "true or false": "true",
            "a table": "{ n_match = 24 }"}.get(type_name, "...")


def parse_table(text: str, file: Path) -> PairingTable:
    """Parse and validate one pairings.toml document (pure: relative draft paths resolve against `file`)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise PairingTableError(file, int(m.group(1)) if m else None, "", f"not valid TOML: {exc}",
                                "fix the syntax (strings in double quotes, one key = value per line)") from exc
    r = _Reader(file, text)
    r.keys(doc, TOP_KEYS, "", None, 0)
    version = r.typed(doc, "version", (int,), "", None, 0, "an integer")
    if version not in (None, 1):
        raise r.fail("version", f"unsupported version {version}", "this bostudio reads version = 1",
                     r.line_of("version"))
    raw_entries = doc.get("pairing", [])
    if not isinstance(raw_entries, list):
        raise r.fail("pairing", "must be an array of tables", "write each entry under [[pairing]]",
                     r.line_of("pairing"))
    entries = []
    n_candidates = 0
    for i, raw in enumerate(raw_entries):
        where = f"pairing[{i + 1}]."
        r.keys(raw, ENTRY_KEYS, where, "pairing", i)
        name = r.typed(raw, "name", (str,), where, "pairing", i, "a string")
        if not name:
            raise r.fail(f"{where}name", "missing", 'give every entry a name, e.g. name = "qwen3"',
                         r.line_of("pairing", "pairing", i))
        note = r.typed(raw, "note", (str,), where, "pairing", i, "a string") or ""
        match_raw = raw.get("match", {})
        if not isinstance(match_raw, dict):
            raise r.fail(f"{where}match", "must be a table", '[pairing.match] with name/architecture/tokenizer',
                         r.line_of("match", "pairing", i))
        r.keys(match_raw, MATCH_KEYS, f"{where}match.", "pairing", i)
        match = Match(r.strings(match_raw, "name", f"{where}match.", "pairing", i),
                      r.strings(match_raw, "architecture", f"{where}match.", "pairing", i),
                      tuple(t.lower() for t in r.strings(match_raw, "tokenizer", f"{where}match.", "pairing", i)))
        cands_raw = raw.get("candidate", [])
        if not isinstance(cands_raw, list) or not cands_raw:
            raise r.fail(f"{where}candidate", "an entry needs at least one candidate",
                         "add a [[pairing.candidate]] table with kind = ...", r.line_of("pairing", "pairing", i))
        cands = []
        for j, c in enumerate(cands_raw):
            cands.append(_candidate(r, c, f"{where}candidate[{j + 1}].", n_candidates, name, file))
            n_candidates += 1
        entries.append(Entry(name, match, tuple(cands), note, f"{file}:{r.line_of('pairing', 'pairing', i)}"))
    return PairingTable(tuple(entries), (file,))


def _candidate(r: _Reader, c: dict, where: str, index: int, entry: str, file: Path) -> Candidate:
    sec = "pairing.candidate"
    r.keys(c, CANDIDATE_KEYS, where, sec, index)

    def get(key: str, types: tuple[type, ...], type_name: str) -> Any:
        return r.typed(c, key, types, where, sec, index, type_name)

    kind = get("kind", (str,), "a string")
    if kind not in CANDIDATE_KINDS:
        near = difflib.get_close_matches(kind or "", CANDIDATE_KINDS, n=1)
        raise r.fail(f"{where}kind", "missing" if kind is None else f"unknown kind {kind!r}",
                     (f"did you mean `{near[0]}`? " if near else "") + "kinds: " + ", ".join(CANDIDATE_KINDS),
                     r.line_of("kind", sec, index))
    draft_text = get("draft", (str,), "a string") or ""
    draft = None
    if draft_text:
        draft = Path(draft_text).expanduser()
        if not draft.is_absolute():
            draft = (file.parent / draft).resolve()
        if not draft.is_file():
            raise r.fail(f"{where}draft", f"no such file: {draft}",
                         "fix the path, or leave draft empty and use hub/find", r.line_of("draft", sec, index))
    if kind == "ngram" and draft is not None:
        raise r.fail(f"{where}draft", "an n-gram speculator takes no draft model", "remove draft",
                     r.line_of("draft", sec, index))
    variant = get("variant", (str,), "a string") or "ngram-mod"
    if variant not in NGRAM_VARIANTS:
        near = difflib.get_close_matches(variant, NGRAM_VARIANTS, n=1)
        raise r.fail(f"{where}variant", f"unknown n-gram variant {variant!r}",
                     (f"did you mean `{near[0]}`? " if near else "") + "variants: " + ", ".join(NGRAM_VARIANTS),
                     r.line_of("variant", sec, index))
    with_ngram = get("with_ngram", (str,), "a string") or ""
    if with_ngram and with_ngram not in NGRAM_VARIANTS:
        raise r.fail(f"{where}with_ngram", f"unknown n-gram variant {with_ngram!r}",
                     "variants: " + ", ".join(NGRAM_VARIANTS), r.line_of("with_ngram", sec, index))
    params_raw = get("params", (dict,), "a table") or {}
    allowed = NGRAM_PARAMS[with_ngram or variant]
    params = []
    for k, v in params_raw.items():
        if k not in allowed:
            near = difflib.get_close_matches(k, allowed or _ALL_NGRAM_PARAMS, n=1, cutoff=0.5)
            raise r.fail(f"{where}params.{k}", f"unknown parameter for {with_ngram or variant}",
                         (f"did you mean `{near[0]}`? " if near else "")
                         + ("valid: " + ", ".join(allowed) if allowed else "this variant takes none"),
                         r.line_of(k, sec, index))
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise r.fail(f"{where}params.{k}", f"must be a non-negative integer, not {v!r}",
                         f"write e.g. {k} = 24", r.line_of(k, sec, index))
        params.append((k, v))
    n_max = get("n_max", (int,), "an integer")
    n_min = get("n_min", (int,), "an integer")
    for key, v in (("n_max", n_max), ("n_min", n_min)):
        if v is not None and v < 0:
            raise r.fail(f"{where}{key}", f"must not be negative ({v})", f"write e.g. {key} = 8",
                         r.line_of(key, sec, index))
    p_min = get("p_min", (int, float), "a number")
    if p_min is not None and not 0.0 <= p_min <= 1.0:
        raise r.fail(f"{where}p_min", f"must be a probability in [0, 1], not {p_min}", "write e.g. p_min = 0.75",
                     r.line_of("p_min", sec, index))
    cache = {}
    for key in ("cache_type_k_draft", "cache_type_v_draft"):
        v = get(key, (str,), "a string")
        if v is not None and v not in CACHE_TYPES:
            near = difflib.get_close_matches(v, CACHE_TYPES, n=1)
            raise r.fail(f"{where}{key}", f"unknown cache type {v!r}",
                         (f"did you mean `{near[0]}`? " if near else "") + "types: " + ", ".join(CACHE_TYPES),
                         r.line_of(key, sec, index))
        cache[key] = v
    hub = get("hub", (str,), "a string") or ""
    if hub:
        problem = hub_ref_problem(hub)
        if problem:
            raise r.fail(f"{where}hub", problem, 'write owner/repo, owner/repo:QUANT or owner/repo:FILE.gguf, '
                                                 'e.g. hub = "Qwen/Qwen3-8B-GGUF:Q4_K_M"', r.line_of("hub", sec, index))
        if kind == "ngram":
            raise r.fail(f"{where}hub", "an n-gram speculator takes no model", "remove hub",
                         r.line_of("hub", sec, index))
    return Candidate(
        kind=kind, draft=draft, hub=hub, find=get("find", (str,), "a string") or "",
        variant=variant, params=tuple(params), with_ngram=with_ngram, n_max=n_max, n_min=n_min,
        p_min=float(p_min) if p_min is not None else None, self_draft=bool(get("self_draft", (bool,), "true or false")),
        note=get("note", (str,), "a string") or "", entry=entry,
        evidence=get("source", (str,), "a string") or "",
        source=f"{file}:{r.line_of('kind', sec, index)}", **cache)


_REPO = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def hub_ref_problem(ref: str) -> str:
    """What is wrong with a hub ref `owner/repo[:QUANT|:FILE.gguf]` ('' when nothing is)."""
    repo, _, selector = ref.partition(":")
    if not _REPO.match(repo):
        return f"{ref!r} is not owner/repo"
    # a quant tag as the catalog reads it from file names (Q4_K_M, IQ2_XXS, BF16 ...): the pull selects by it
    if selector and not selector.lower().endswith(".gguf") and quant_tag(f"x-{selector}.gguf") != selector.upper():
        return f"{selector!r} is neither a quant tag (Q4_K_M, Q8_0, IQ4_XS, BF16 ...) nor a .gguf file name"
    return ""


def load_table_file(path: Path) -> PairingTable:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PairingTableError(path, None, "", "no such file", "create it, or check the path") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PairingTableError(path, None, "", f"cannot read it: {exc}", "check its permissions and encoding") from exc
    return parse_table(text, path)


def load_pairings(user: Path | None = None, shipped: Path | None = None) -> PairingTable:
    """The user's table (if it exists) followed by the shipped one."""
    user = user_table_path() if user is None else user
    shipped = shipped_table_path() if shipped is None else shipped
    tables = []
    if user.exists():
        tables.append(load_table_file(user))
    tables.append(load_table_file(shipped))
    return PairingTable(tuple(e for t in tables for e in t.entries), tuple(f for t in tables for f in t.files))
