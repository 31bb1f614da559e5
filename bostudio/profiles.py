"""Tuned profiles: what `bostudio tune` measured and chose, per (model file identity, engine commit +
backend, workload), with the best configuration of each speculator kind beside the choice, and the
break-even acceptance a running instance is judged by.

`bostudio tune` (bench.tune) writes them; pairing (auto mode), `up`, the daemon and `bench` read them, so the
store sits below all of them.

Stored as small JSON files under $XDG_STATE_HOME/bostudio/profiles/, written atomically. A profile older
than the engine build or the model file is ignored, with a note saying why.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bostudio import paths
from bostudio.config import config_table
from bostudio.engine.discover import Engine
from bostudio.errors import ConfigError
from bostudio.files import write_atomic
from bostudio.speculation import Speculator

VERSION = 1


def profiles_dir() -> Path:
    return paths.state_dir() / "profiles"


def engine_identity(engine: Engine) -> str:
    """llama.cpp commit + the backends that run (cpu alone when there is no GPU backend)."""
    gpu = [b for b in engine.backends if b != "cpu"]
    return f"{engine.commit}-{'+'.join(gpu) or 'cpu'}"


@dataclass(frozen=True)
class ModelIdentity:
    name: str  # file name
    size: int
    mtime: float

    @staticmethod
    def of(path: Path) -> "ModelIdentity":
        st = path.stat()
        return ModelIdentity(path.name, st.st_size, st.st_mtime)

    @property
    def key(self) -> str:
        return f"{self.name}-{self.size}"


def speculator_to_json(sp: Speculator) -> dict:
    return {"kind": sp.kind, "spec_types": list(sp.spec_types), "draft": str(sp.draft) if sp.draft else None,
            "n_max": sp.n_max, "n_min": sp.n_min, "p_min": sp.p_min, "cache_type_k_draft": sp.cache_type_k_draft,
            "cache_type_v_draft": sp.cache_type_v_draft, "ngram_params": [list(p) for p in sp.ngram_params]}


def speculator_from_json(d: dict, reason: str = "") -> Speculator:
    return Speculator(d["kind"], tuple(d.get("spec_types", ())), Path(d["draft"]) if d.get("draft") else None,
                      d.get("n_max"), d.get("n_min"), d.get("p_min"), d.get("cache_type_k_draft"),
                      d.get("cache_type_v_draft"), tuple(tuple(p) for p in d.get("ngram_params", ())),  # type: ignore[misc]
                      reason)


MIN_NOISE = 0.03  # a 3% edge is within what a busy machine moves between two identical runs


MIN_PAIRED = 2  # one paired sample has no spread: its interval is the sample itself


def beats_off(low: float, samples: int, floor: float = MIN_NOISE) -> bool:
    """A paired speed-up beyond the measured spread and the noise floor: at least MIN_PAIRED paired samples
    (one has no spread to be beyond: tune on whole sessions chose ngram-map-k from one pass at 1.23x of off,
    and it then ran 1% slower than off over 6 sessions), and the lower end of its speed-up's confidence
    interval (tune.total_interval; with fewer than 5 samples, the smallest ratio) more than MIN_NOISE above 1.
    The whole interval, not only the speed-up: tune chose ngram-mod on two session passes at 1.05x and 1.03x
    (1.04x, interval 1.01-1.05x), and it then ran 0.5% and 3.2% slower than off on 6 sessions.
    `floor` is MIN_NOISE unless a figure holds less of the servers' own noise (tune_sessions.session_floor)."""
    return samples >= MIN_PAIRED and low > 1.0 + floor


@dataclass(frozen=True)
class Measured:
    """One configuration's figures from the sweep."""

    label: str
    speculator: dict  # speculator_to_json
    tok_s: float  # decode tok/s over its prompts (tokens over time; medians in profiles before 2026-12-07)
    speedup: float  # paired speed-up against off (tune.Tally.speedup)
    speedup_min: float
    speedup_max: float
    acceptance: float | None
    accept_len: float | None
    samples: int
    speedup_low: float = 0.0  # the lower end of the speed-up's confidence interval (tune.total_interval)
    refused: str = ""  # why tune's choice rule refused it ('' for the chosen one, and in older profiles)

    def lost_text(self, chosen: "Measured | None") -> str:
        """How much it lost: against the chosen configuration, or against off when off was chosen."""
        ref, name = (chosen.speedup, chosen.label) if chosen is not None else (1.0, "off")
        loss = 1.0 - self.speedup / ref if ref > 0 else 0.0
        if loss > 0:
            return f"{self.speedup:.2f}x of off, {100 * loss:.0f}% slower than {name}"
        return f"{self.speedup:.2f}x of off, {100 * -loss:.0f}% faster than {name} on its prompts"


@dataclass(frozen=True)
class Profile:
    model: str
    model_size: int
    model_mtime: float
    engine: str  # engine_identity
    workload: str
    chosen: Measured | None  # None: speculation off (nothing beat the baseline beyond the spread)
    baseline_tok_s: float
    noise: float  # the chosen (or best) configuration's interval half-width, relative to its speed-up
    why: str
    break_even_acceptance: float | None
    by_kind: dict[str, Measured] = field(default_factory=dict)  # the best configuration of each kind
    created: float = 0.0
    version: int = VERSION
    ranking: list[Measured] = field(default_factory=list)  # the sweep's best configurations, best first

    @property
    def speculator(self) -> Speculator:
        if self.chosen is None:
            return Speculator("none", reason=self.why)
        return speculator_from_json(self.chosen.speculator, self.why)

    def refused(self) -> list[Measured]:
        """The sweep's configurations the choice rule turned down, best first (from `ranking`)."""
        return [m for m in self.ranking if m.refused and (self.chosen is None or m.label != self.chosen.label)]

    def next_best(self) -> Measured | None:
        """The best configuration of another kind than the chosen one that beat off (runtime fallback)."""
        others = [m for k, m in self.by_kind.items()
                  if self.chosen is None or m.speculator["kind"] != self.chosen.speculator["kind"]]
        others = [m for m in others if beats_off(m.speedup_low, m.samples)]
        return max(others, key=lambda m: m.tok_s, default=None)

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "Profile":
        def m(x: dict | None) -> Measured | None:
            return Measured(**x) if x else None
        d = dict(d)
        d["chosen"] = m(d.get("chosen"))
        d["by_kind"] = {k: Measured(**v) for k, v in d.get("by_kind", {}).items()}
        d["ranking"] = [Measured(**v) for v in d.get("ranking", [])]
        return Profile(**d)


def profile_path(model: ModelIdentity, engine: str, workload: str) -> Path:
    raw = f"{model.key}--{engine}--{workload}"
    return profiles_dir() / (re.sub(r"[^A-Za-z0-9._+-]", "_", raw) + ".json")


def save_profile(p: Profile) -> Path:
    out = profile_path(ModelIdentity(p.model, p.model_size, p.model_mtime), p.engine, p.workload)
    write_atomic(out, json.dumps(p.to_json(), indent=2))
    return out


@dataclass(frozen=True)
class Lookup:
    profile: Profile | None
    path: Path
    note: str  # why no profile is used ("" when one is)


def find_profile(model_path: Path, engine: Engine, workload: str) -> Lookup:
    """The profile for this model file, engine and workload, if there is a fresh one."""
    ident = ModelIdentity.of(model_path)
    path = profile_path(ident, engine_identity(engine), workload)
    if not path.is_file():
        return Lookup(None, path, "")
    try:
        profile = Profile.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return Lookup(None, path, f"profile {path} is unreadable ({exc}); run `bostudio tune` again")
    if profile.version != VERSION:
        return Lookup(None, path, f"profile {path} has format {profile.version}; run `bostudio tune` again")
    try:
        engine_built = engine.path.stat().st_mtime
    except OSError:
        engine_built = 0.0
    if profile.created < ident.mtime:
        return Lookup(None, path, f"profile {path.name} is older than the model file: ignored; run `bostudio tune`")
    if profile.created < engine_built:
        return Lookup(None, path, f"profile {path.name} is older than the engine build: ignored; run `bostudio tune`")
    return Lookup(profile, path, "")


DEFAULT_WORKLOAD = "code"


def default_workload(model: str, config: Path | None = None) -> str:
    """The workload whose profile `up` and the daemon use for `model` when none is given: from config.toml

        [workload]
        default = "code"                 # every model
        "gemma-3-270m-q4_k_m" = "edit"   # one model (its name in `bostudio ls`)

    else "code" (the agent work bostudio is made for)."""
    config = config or paths.config_file()
    table = config_table("workload", config)
    if not all(isinstance(v, str) and v for v in table.values()):
        raise ConfigError(f"{config}: [workload] maps model names (or `default`) to a workload name",
                          '[workload]\ndefault = "code"')
    return table.get(model) or table.get("default") or DEFAULT_WORKLOAD


# Without a profile, the break-even acceptance assumed at run time: measured on this project's CPU,
# n-gram speculation at ~50% acceptance ran at 0.92-0.97x of off on fresh code.
DEFAULT_BREAK_EVEN = 0.55


def predicted_break_even(model_path: Path, engine: Engine, workload: str | None) -> tuple[float, str]:
    """The break-even acceptance for a running instance: its tuned profile's prediction, else the default."""
    if workload:
        found = find_profile(model_path, engine, workload)
        if found.profile is not None and found.profile.break_even_acceptance is not None:
            return found.profile.break_even_acceptance, f"profile {found.path.name}"
    return DEFAULT_BREAK_EVEN, "default (no tuned profile)"


def tune_refusals(model_path: Path, engine: Engine, workload: str | None) -> list[dict]:
    """What the tuned profile for (model, engine, workload) refused, and by how much each lost (for `ps`)."""
    if not workload:
        return []
    p = find_profile(model_path, engine, workload).profile
    if p is None:
        return []
    return [{"label": m.label, "speedup": m.speedup, "speedup_low": m.speedup_low, "samples": m.samples,
             "lost": m.lost_text(p.chosen), "why": m.refused} for m in p.refused()]
