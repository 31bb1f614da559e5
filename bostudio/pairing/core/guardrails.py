"""Per-backend guardrails: a shipped table of known speculative regressions in llama.cpp, each with its
issue or PR number. Pure apart from `load_guardrails` (reads the shipped TOML and the user's allow list).

    rules = load_guardrails()                       # the shipped table, validated
    hit = blocking_rule(rules, sp, arch, is_mla, backends, allowed)   # the first rule that forbids sp
"""

from __future__ import annotations

import difflib
import fnmatch
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bostudio import paths
from bostudio.config import config_table
from bostudio.errors import ConfigError
from bostudio.speculation import SPEC_TYPE_ORDER, Speculator

SHIPPED = Path(__file__).with_name("guardrails.toml")
BACKENDS = ("any", "cpu", "cuda", "hip", "sycl", "metal", "vulkan", "openvino", "opencl", "cann", "musa", "rpc")
_RULE_KEYS = ("id", "backends", "spec_types", "architectures", "mla", "up_to_build", "llama_cpp", "what")
_REQUIRED = ("id", "backends", "spec_types", "llama_cpp", "what")


@dataclass(frozen=True)
class Guardrail:
    id: str
    backends: tuple[str, ...]
    spec_types: tuple[str, ...]
    llama_cpp: int  # issue or PR number in ggml-org/llama.cpp
    what: str
    architectures: tuple[str, ...] = ()  # empty: every architecture
    mla: bool = False  # only models with multi-head latent attention
    up_to_build: int | None = None  # only llama.cpp builds 1..N (a build number of 0 is unknown: not matched)

    @property
    def reference(self) -> str:
        return f"llama.cpp #{self.llama_cpp}"

    def matches(self, sp: Speculator, architecture: str, is_mla: bool, backends: Iterable[str],
                engine_build: int = 0) -> bool:
        if not set(self.spec_types) & set(sp.spec_types):
            return False
        if self.up_to_build is not None and not 0 < engine_build <= self.up_to_build:
            return False
        used = {b.lower() for b in backends}
        if "any" not in self.backends and not used & set(self.backends):
            return False
        if self.architectures and not any(fnmatch.fnmatchcase(architecture.lower(), a) for a in self.architectures):
            return False
        return is_mla or not self.mla

    def explain(self) -> str:
        where = "any backend" if "any" in self.backends else "/".join(self.backends)
        return (f"known regression ({self.reference}, rule {self.id!r}): {self.what} [{where}]; "
                f"override with `allow = [\"{self.id}\"]` under [guardrails] in config.toml")


def parse_guardrails(text: str, source: Path) -> tuple[Guardrail, ...]:
    """Validate the table: known keys, known backends and spec types, a positive llama.cpp number, unique ids."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: cannot read the guardrail table: {exc}", "fix the TOML syntax") from exc
    if data.get("version") != 1:
        raise ConfigError(f"{source}: guardrail table version must be 1", "write version = 1 at the top")
    out: list[Guardrail] = []
    for i, raw in enumerate(data.get("rule", [])):
        where = f"{source}: rule {i + 1}"
        for key in raw:
            if key not in _RULE_KEYS:
                near = difflib.get_close_matches(key, _RULE_KEYS, n=1)
                raise ConfigError(f"{where}: unknown key `{key}`",
                                  f"did you mean `{near[0]}`?" if near else "valid keys: " + ", ".join(_RULE_KEYS))
        missing = [k for k in _REQUIRED if k not in raw]
        if missing:
            raise ConfigError(f"{where}: missing `{missing[0]}`", "every rule needs " + ", ".join(_REQUIRED))
        if not isinstance(raw["llama_cpp"], int) or isinstance(raw["llama_cpp"], bool) or raw["llama_cpp"] <= 0:
            raise ConfigError(f"{where}: `llama_cpp` must be the issue or PR number", "e.g. llama_cpp = 23203")
        lists = {}
        for key in ("backends", "spec_types", "architectures"):
            value = raw.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"{where}: `{key}` must be a list of names", f'e.g. {key} = ["..."]')
            lists[key] = tuple(v.lower() for v in value)
        bad = [b for b in lists["backends"] if b not in BACKENDS]
        if bad or not lists["backends"]:
            raise ConfigError(f"{where}: unknown backend {bad[0] if bad else '(none)'!r}",
                              "one of: " + ", ".join(BACKENDS))
        bad = [t for t in lists["spec_types"] if t not in SPEC_TYPE_ORDER]
        if bad or not lists["spec_types"]:
            raise ConfigError(f"{where}: unknown spec type {bad[0] if bad else '(none)'!r}",
                              "one of: " + ", ".join(SPEC_TYPE_ORDER))
        up_to = raw.get("up_to_build")
        if up_to is not None and (not isinstance(up_to, int) or isinstance(up_to, bool) or up_to <= 0):
            raise ConfigError(f"{where}: `up_to_build` must be a llama.cpp build number", "e.g. up_to_build = 10820")
        if not isinstance(raw.get("mla", False), bool):
            raise ConfigError(f"{where}: `mla` must be true or false", "e.g. mla = true")
        if not isinstance(raw["id"], str) or not raw["id"] or not isinstance(raw["what"], str) or not raw["what"]:
            raise ConfigError(f"{where}: `id` and `what` must be non-empty strings", 'e.g. id = "sycl-mtp"')
        out.append(Guardrail(raw["id"], lists["backends"], lists["spec_types"], raw["llama_cpp"], raw["what"],
                             lists["architectures"], raw.get("mla", False), up_to))
    ids = [r.id for r in out]
    dup = next((x for x in ids if ids.count(x) > 1), None)
    if dup:
        raise ConfigError(f"{source}: rule id {dup!r} appears twice", "give every rule its own id")
    return tuple(out)


def load_allowed(config: Path | None = None) -> frozenset[str]:
    """Rule ids the user overrides: `[guardrails] allow = [...]` in config.toml."""
    config = config or paths.config_file()
    table = config_table("guardrails", config)
    for key in table:
        if key != "allow":
            raise ConfigError(f"{config}: unknown key `{key}` in [guardrails]", "the only key is `allow`")
    allow = table.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise ConfigError(f"{config}: [guardrails] allow must be a list of rule ids",
                          'e.g. allow = ["sycl-draft-mtp-memory"]')
    return frozenset(allow)


def load_guardrails(path: Path = SHIPPED) -> tuple[Guardrail, ...]:
    return parse_guardrails(path.read_text(encoding="utf-8"), path)


@dataclass(frozen=True)
class GuardrailContext:
    """What the rules are checked against for one launch: the table, the backends in use, the overrides."""

    rules: tuple[Guardrail, ...] = ()
    backends: tuple[str, ...] = ("cpu",)
    allowed: frozenset[str] = frozenset()
    engine_build: int = 0  # llama.cpp build number of the engine (0: unknown)

    def blocking(self, sp: Speculator, architecture: str, is_mla: bool) -> Guardrail | None:
        """The first rule that forbids `sp` for this model and these backends (None: none, or overridden)."""
        for rule in self.rules:
            if rule.id not in self.allowed and rule.matches(sp, architecture, is_mla, self.backends,
                                                            self.engine_build):
                return rule
        return None
