"""From per-request samples to the bench figures (pure): tok/s over the workload and its spread, the speed-up
with the spread of the paired ratios, acceptance, mean accepted length, prompt tok/s, and the decode-only
projection.

A configuration's figure on a workload is its tokens over its time, summed over the prompts (`total_rate`), and
its speed-up that figure against off's on the same prompts (`paired_total`): the time a user waits. Not the
median of per-prompt figures: n-gram speculation runs some prompts at 2-2.5x (they have text to copy) and most
at 0.9-1.1x, and the median of such a mix moved 16% between two benches of one configuration (Gemma's code
workload, session 17) and ignored what the fast prompts saved.

The JSON shape is the contract with the TUI's Bench screen (see `Row.to_json` and `report_json`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

OFF = "off"


@dataclass(frozen=True)
class Sample:
    """One request's figures. `run` identifies the prompt: samples with the same `run` (and workload and
    ctx) got the same prompt, one per configuration, and are paired."""

    workload: str
    ctx: int | None  # the context-sweep length, None for the workloads' own prompts
    config: str
    run: int
    tok_s: float  # decode tokens per second (timings.predicted_per_second)
    prompt_tok_s: float | None
    predicted: int  # tokens decoded
    drafted: int
    accepted: int
    decode_tok_s: float | None = None  # a session pass's decode tok/s (tok_s is then its output over wall time)

    @property
    def decode_rate(self) -> float:
        """Decode tokens per second: tok_s for one request, the decode part of a session pass for a pass."""
        return self.tok_s if self.decode_tok_s is None else self.decode_tok_s

    @staticmethod
    def from_timings(workload: str, ctx: int | None, config: str, run: int, t: dict) -> "Sample":
        return Sample(workload, ctx, config, run, float(t.get("predicted_per_second") or 0.0),
                      float(t["prompt_per_second"]) if t.get("prompt_per_second") else None,
                      int(t.get("predicted_n") or 0), int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0))


def total_rate(samples: Iterable[Sample], decode: bool = False) -> float:
    """Tokens per second over all of `samples`: their tokens over their time (a request's time is its tokens
    over its rate; a session pass's, its wall time, or with `decode` its decode time). 0 when nothing ran."""
    tokens = seconds = 0.0
    for s in samples:
        rate = s.decode_rate if decode else s.tok_s
        if rate > 0 and s.predicted > 0:
            tokens += s.predicted
            seconds += s.predicted / rate
    return tokens / seconds if seconds > 0 else 0.0


def both_ran(pairs: Iterable[tuple[Sample, Sample]]) -> list[tuple[Sample, Sample]]:
    """The (candidate, baseline) pairs in which both sides decoded something."""
    return [(c, b) for c, b in pairs if c.tok_s > 0 and b.tok_s > 0 and c.predicted > 0 and b.predicted > 0]


def paired_total(pairs: Sequence[tuple[Sample, Sample]], decode: bool = False) -> float:
    """The speed-up of (candidate, baseline) pairs on the same prompts: the candidate's total_rate over the
    baseline's, both over the pairs where both ran (both_ran). 0 when no pair did."""
    both = both_ran(pairs)
    base = total_rate((b for _, b in both), decode)
    return total_rate((c for c, _ in both), decode) / base if base > 0 else 0.0


def accept_length(predicted: int, accepted: int) -> float | None:
    """Tokens committed per target forward, counting the target's own token: every forward commits one
    token of its own plus the draft tokens it accepted, so forwards = predicted - accepted."""
    forwards = predicted - accepted
    return predicted / forwards if predicted > 0 and forwards > 0 else None


@dataclass(frozen=True)
class Row:
    workload: str
    ctx: int | None
    config: str
    tok_s_median: float
    tok_s_min: float
    tok_s_max: float
    speedup: float | None
    speedup_min: float | None
    speedup_max: float | None
    acceptance: float | None
    accept_len: float | None
    prompt_tok_s: float | None
    drafted: int
    accepted: int
    runs: int
    tok_s_total: float = 0.0  # tokens over decode time, summed over its prompts (total_rate): the figure compared

    def to_json(self) -> dict:
        return {"workload": self.workload, "ctx": self.ctx, "config": self.config, "tok_s_total": self.tok_s_total,
                "tok_s_median": self.tok_s_median, "tok_s_min": self.tok_s_min, "tok_s_max": self.tok_s_max,
                "speedup": self.speedup, "speedup_min": self.speedup_min, "speedup_max": self.speedup_max,
                "acceptance": self.acceptance, "accept_len": self.accept_len, "prompt_tok_s": self.prompt_tok_s,
                "drafted": self.drafted, "accepted": self.accepted}


def summarise(samples: Sequence[Sample], baseline: str = OFF) -> list[Row]:
    """One row per (workload, ctx, config), in first-seen order. The speed-up is paired_total against the
    baseline's samples on the same prompts; its spread is the min and max of the per-run ratios config/baseline
    on the same prompt."""
    groups: dict[tuple[str, int | None, str], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.workload, s.ctx, s.config), []).append(s)
    medians = {k: statistics.median(x.tok_s for x in v) for k, v in groups.items()}
    rows = []
    for (w, ctx, cfg), group in groups.items():
        tok = [s.tok_s for s in group]
        base_key = (w, ctx, baseline)
        speedup = lo = hi = None
        if cfg != baseline and base_key in groups:
            base_by_run = {s.run: s for s in groups[base_key]}
            pairs = [(s, base_by_run[s.run]) for s in group if s.run in base_by_run]
            ratios = [c.tok_s / b.tok_s for c, b in pairs if b.tok_s > 0]
            if ratios and paired_total(pairs) > 0:
                speedup = paired_total(pairs)
                lo, hi = min(ratios), max(ratios)
        drafted = sum(s.drafted for s in group)
        accepted = sum(s.accepted for s in group)
        prompt = [s.prompt_tok_s for s in group if s.prompt_tok_s]
        rows.append(Row(w, ctx, cfg, medians[(w, ctx, cfg)], min(tok), max(tok), speedup, lo, hi,
                        accepted / drafted if drafted else None,
                        accept_length(sum(s.predicted for s in group), accepted),
                        statistics.median(prompt) if prompt else None, drafted, accepted, len(group),
                        total_rate(group)))
    return rows


@dataclass(frozen=True)
class Projection:
    """Seconds saved on an agent task of `turns` x `tokens_per_turn` output tokens. Decode only: prompt
    processing, tool calls and network time are not in it."""

    turns: int
    tokens_per_turn: int
    seconds_saved: dict[str, float]

    def to_json(self) -> dict:
        return {"turns": self.turns, "tokens_per_turn": self.tokens_per_turn, "decode_only": True,
                "seconds_saved": self.seconds_saved}


def project(rows: Iterable[Row], turns: int = 50, tokens_per_turn: int = 400, baseline: str = OFF) -> Projection:
    """Per configuration: turns x tokens at the baseline's decode speed minus the same at the
    configuration's, averaged over the workloads (context-sweep rows left out)."""
    by_w: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.ctx is None and r.tok_s_total > 0:
            by_w.setdefault(r.workload, {})[r.config] = r.tok_s_total
    saved: dict[str, list[float]] = {}
    n = turns * tokens_per_turn
    for configs in by_w.values():
        base = configs.get(baseline)
        if not base:
            continue
        for cfg, tok in configs.items():
            if cfg != baseline:
                saved.setdefault(cfg, []).append(n / base - n / tok)
    return Projection(turns, tokens_per_turn, {c: statistics.mean(v) for c, v in saved.items()})


def report_json(model: str, engine: str, runs: int, rows: Sequence[Row], projection: Projection,
                **extra: object) -> dict:
    """The bench's JSON document (the contract with the TUI: model, engine, runs, results, projection)."""
    return {"model": model, "engine": engine, "runs": runs, "results": [r.to_json() for r in rows],
            "projection": projection.to_json(), **extra}
