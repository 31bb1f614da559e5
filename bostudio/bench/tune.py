"""Autotune: sweep the speculators the engine and model allow and their parameters, by successive halving
within a time budget; choose the fastest, or off when nothing beats the baseline beyond the measured spread.

`candidates`, `halve`, `choose_config` and `break_even_acceptance` are pure; `run_tune` is the edge (it
launches llama-server through `runner.Bench`, one candidate at a time beside a baseline that stays up).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from bostudio.bench.measure import OFF, Sample, accept_length, both_ran, paired_total, total_rate
from bostudio.profiles import (MIN_NOISE, MIN_PAIRED, Measured, ModelIdentity, Profile, beats_off, engine_identity,
                               save_profile, speculator_to_json)
from bostudio.speculation import Speculator

CONFIDENCE = 0.9  # of the interval around a candidate's paired speed-up
RESAMPLES = 2000  # bootstrap resamples of the paired prompts (total_interval)
# Tune's prompts start here, far from the variants `bench` uses (run number + 31 x task), so that a bench after
# a tune measures the chosen configuration on prompts the choice did not see.
TUNE_VARIANT = 1000
RANKED = 8  # the sweep's best configurations kept in the profile (`bench --spec sweep@WORKLOAD`)


@dataclass(frozen=True)
class Candidate:
    label: str
    speculator: Speculator
    default: bool = False  # a type at its defaults: preferred over its tuned variants within the noise (choose_config)


def _ng(variant: str, **params: int) -> Candidate:
    label = variant + "".join(f" {k}={v}" for k, v in params.items())
    return Candidate(label, Speculator("ngram", (variant,), ngram_params=tuple((variant, k, v) for k, v in params.items()),
                                       reason=f"tuned: {label}"))


def candidates(engine_spec_types: Sequence[str], has_mtp: bool, draft: Path | None) -> list[Candidate]:
    """The sweep: the n-gram types and their sizes, draft n_max 1..8 and p_min, MTP n_max, and n-gram + draft
    combinations. Ordered so that a tight budget still sees every kind: first llama.cpp's default of each
    type, then the parameter variants."""
    have = set(engine_spec_types)
    first: list[Candidate] = []
    then: list[Candidate] = []
    if "ngram-mod" in have:
        first.append(_ng("ngram-mod"))
        then += [_ng("ngram-mod", n_match=12, n_min=8, n_max=32), _ng("ngram-mod", n_match=16, n_min=16, n_max=48)]
    if "ngram-simple" in have:
        first.append(_ng("ngram-simple"))
        then += [_ng("ngram-simple", size_n=6, size_m=16), _ng("ngram-simple", size_n=3, size_m=8)]
    if "ngram-map-k" in have:
        first.append(_ng("ngram-map-k"))
        then.append(_ng("ngram-map-k", size_n=6, size_m=16))
    if "ngram-map-k4v" in have:
        first.append(_ng("ngram-map-k4v"))
    if "ngram-cache" in have:
        first.append(_ng("ngram-cache"))
    if has_mtp and "draft-mtp" in have:
        mtp = [Candidate(f"mtp n_max={n}", Speculator("mtp", ("draft-mtp",), n_max=n, reason=f"tuned: MTP n_max={n}"))
               for n in (3, 1, 2, 4)]
        first.append(mtp[0])
        then += mtp[1:]
    if draft is not None and "draft-simple" in have:
        drafts = []
        # p_min 0 is llama.cpp's default since #26100 (it was 0.75): a draft then always runs to n_max; 0.75 stops
        # it at the first token the draft is unsure of, which spares the verification on a CPU (0.35 target
        # steps per drafted token there: pairing.core.cost.CPU_VERIFY_PER_TOKEN)
        for n in (3, 1, 2, 4, 6, 8):
            for p in (0.0, 0.75):
                label = f"draft-simple n_max={n}" + (f" p_min={p:g}" if p else "")
                drafts.append(Candidate(label, Speculator("draft", ("draft-simple",), draft=draft, n_max=n,
                                                          p_min=p or None,
                                                          reason=f"tuned: {label} with {draft.name}")))
        first.append(drafts[0])
        then += drafts[1:]
        if "ngram-simple" in have:
            then.append(Candidate("ngram-simple + draft-simple n_max=4", Speculator(
                "draft", ("ngram-simple", "draft-simple"), draft=draft, n_max=4,
                reason=f"tuned: ngram-simple with draft-simple n_max=4 ({draft.name})")))
    return [replace(c, default=True) for c in first] + then


@dataclass
class Tally:
    """A candidate's samples, each paired with the baseline's on the same prompt."""

    candidate: Candidate
    samples: list[Sample] = field(default_factory=list)
    baseline: list[Sample] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [s.tok_s / b.tok_s for s, b in zip(self.samples, self.baseline) if b.tok_s > 0]

    @property
    def pairs(self) -> list[tuple[Sample, Sample]]:
        return list(zip(self.samples, self.baseline))

    @property
    def speedup(self) -> float:
        """Its tokens over its time against off's on the same prompts (measure.paired_total): the time a user
        waits on the workload, not the median prompt's ratio."""
        return paired_total(self.pairs)

    @property
    def tok_s(self) -> float:
        return total_rate(self.samples)

    @property
    def interval(self) -> tuple[float, float]:
        return total_interval(self.pairs)

    @property
    def decode_ratios(self) -> list[float]:
        """The paired ratios of decode speed alone (the same as `ratios` for single requests; for session
        passes, whose `ratios` are of wall times, the part speculation can change)."""
        return [s.decode_rate / b.decode_rate for s, b in zip(self.samples, self.baseline) if b.decode_rate > 0]

    def measured(self) -> Measured:
        drafted = sum(s.drafted for s in self.samples)
        accepted = sum(s.accepted for s in self.samples)
        r = self.ratios or [0.0]
        return Measured(self.candidate.label, speculator_to_json(self.candidate.speculator), self.tok_s,
                        self.speedup, min(r), max(r), accepted / drafted if drafted else None,
                        accept_length(sum(s.predicted for s in self.samples), accepted), len(self.samples),
                        self.interval[0])


def total_interval(pairs: Sequence[tuple[Sample, Sample]], decode: bool = False,
                   confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A confidence interval for paired_total: with TRUSTED_SAMPLES or more pairs, the expanded percentile
    interval of RESAMPLES bootstrap resamples of the pairs (seeded: the same pairs give the same interval
    anywhere); with fewer, the range of the per-pair ratios (too few to resample). The plain percentile
    interval is too narrow on few pairs (on 7 pairs at 0.95-1.15x it gave 1.00-1.08x, where Student's t gives
    0.99-1.09x); its half-widths are widened by sqrt(n / (n - 1)) t(n - 1) / z (Hesterberg, "What teachers
    should know about the bootstrap", 2015)."""
    both = both_ran(pairs)
    if not both:
        return 0.0, 0.0
    rate = (lambda x: x.decode_rate) if decode else (lambda x: x.tok_s)
    ratios = [rate(c) / rate(b) for c, b in both]
    if len(both) < TRUSTED_SAMPLES:
        return min(ratios), max(ratios)
    # each pair as (candidate tokens, candidate seconds, baseline tokens, baseline seconds)
    rows = [(c.predicted, c.predicted / rate(c), b.predicted, b.predicted / rate(b)) for c, b in both]
    low, high = _bootstrap(tuple(rows), confidence)
    mid = paired_total(both, decode)
    n = len(both)
    tail = 1.0 - (1.0 - confidence) / 2
    widen = math.sqrt(n / (n - 1)) * t_quantile(tail, n - 1) / statistics.NormalDist().inv_cdf(tail)
    return mid - widen * (mid - low), mid + widen * (high - mid)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by its Cornish-Fisher expansion in the normal quantile (within 0.1% of the table
    from 4 degrees of freedom: t(0.95, 6) = 1.943)."""
    z = statistics.NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


@lru_cache(maxsize=256)  # weigh, the verdicts and the profile read one tally's interval several times
def _bootstrap(rows: tuple[tuple[float, float, float, float], ...], confidence: float) -> tuple[float, float]:
    rng = random.Random(len(rows))
    n = len(rows)
    out = []
    for _ in range(RESAMPLES):
        ct = cs = bt = bs = 0.0
        for i in rng.choices(range(n), k=n):
            r = rows[i]
            ct += r[0]
            cs += r[1]
            bt += r[2]
            bs += r[3]
        out.append((ct / cs) / (bt / bs))
    out.sort()
    tail = (1.0 - confidence) / 2
    return out[int(tail * RESAMPLES)], out[min(RESAMPLES - 1, int((1.0 - tail) * RESAMPLES))]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def head_to_head(a: Tally, b: Tally) -> list[tuple[Sample, Sample]]:
    """(a's sample, b's sample) on each prompt both ran (the same `Sample.run`, as bench pairs configurations),
    for comparing two candidates with each other directly: paired_total of these pairs is a's speed-up over b's,
    and total_interval its interval."""
    theirs = {(x.workload, x.ctx, x.run): x for x in b.samples}
    return [(x, y) for x in a.samples if (y := theirs.get((x.workload, x.ctx, x.run))) is not None]


def clearly_slower(a: Tally, b: Tally) -> bool:
    """Whether `a` ran slower than `b` beyond the measured noise: the interval of its speed-up over b on the
    prompts both ran (head_to_head, total_interval) lies below 1.0. False when they ran no prompt in common
    (nothing tells them apart)."""
    pairs = head_to_head(a, b)
    return bool(pairs) and total_interval(pairs)[1] < 1.0


def halve(tallies: list[Tally]) -> list[Tally]:
    """Successive halving: keep the better half by their speed-up over off on the same prompts (Tally.speedup,
    the figure the choice reads; at least one), and every other candidate that did not run clearly slower than
    the leader on the prompts they both ran, once they shared TRUSTED_SAMPLES prompts (from round 2 on: round
    1's three prompts tell nothing apart, and it has to thin twenty-odd candidates).

    The survivors of a round ran the same prompts, but one after the other: each candidate's own tok/s carries
    the machine's drift over the minutes between them, which its paired baseline carries too and the speed-up
    cancels. On the 1.5B's code tune, round 1 ran ngram-mod 1.06x (18.1 tok/s), ngram-simple 1.04x (17.6
    tok/s) and ngram-map-k 1.03x (18.1 tok/s): halving by tok/s dropped ngram-simple, which bench then
    measured the best static configuration (1.10x over 15 prompts).

    A timed run of one prompt varies by up to 20% (the same prompt, with the same tokens drafted and accepted,
    ran 88.6 and 110.7 tok/s), and an edit prompt runs 0.7-2.5x of off, so the halving's cut falls within the
    noise: Gemma's edit tune halved ngram-simple out third of three at 1.34x against 1.42x and 1.37x over 21
    prompts, on which the bench then ran it even with the leader (1.405x against 1.402x), and over the next
    30 functions 1.40x against the chosen one's 1.26x. The budget still bounds the sweep: a round that keeps
    more candidates gives each fewer prompts (round_prompts)."""
    ranked = sorted(tallies, key=lambda t: t.speedup, reverse=True)
    half = max(1, (len(ranked) + 1) // 2)
    leader = ranked[0]
    return ranked[:half] + [t for t in ranked[half:] if len(head_to_head(t, leader)) >= TRUSTED_SAMPLES
                            and not clearly_slower(t, leader)]


# Round 1 runs at least this many prompts per candidate, in whole sets of the workload's tasks: the halving
# after it decides which half goes on, and one prompt decides nothing. Edit and chat have one task each, and
# on one prompt per candidate Gemma's edit tune dropped ngram-simple (which bench then measured the fastest,
# 1.71x of off over 15 prompts) at 1.30x and kept ngram-mod 12/8/32 (1.31x on bench).
FIRST_ROUND_PROMPTS = 3


def round_prompts(round_no: int, n_tasks: int, costs: Sequence[float] | None, left_s: float) -> int:
    """How many prompts each survivor runs in round `round_no` (1-based): whole sets of one prompt per task
    of the workload, at least FIRST_ROUND_PROMPTS in round 1, doubling every round (successive halving), so
    that each round weighs every task alike; when the whole round does not fit in `left_s` at its runners'
    measured cost per prompt, as many whole sets of tasks as fit; 0 when not even one set fits (the
    sweep stops there, never halfway through a round). `costs`: the seconds one prompt costs each
    runner of the round (off, once per prompt, and each survivor); None before anything was measured (round 1
    always runs)."""
    want = n_tasks * math.ceil(FIRST_ROUND_PROMPTS / n_tasks) * 2 ** (round_no - 1)
    if costs is None:
        return want
    per_prompt = sum(costs)
    if per_prompt <= 0:
        return want
    fits = int(left_s // per_prompt)
    # an overrun budget leaves nothing: a negative count ran a round of no prompts, whose cost per prompt then
    # came out negative, and the next round ran all its prompts (the 1.5B's edit tune: 16 prompt pairs past
    # a 900 s budget)
    return max(0, min(want, fits - fits % n_tasks))


def round_one_admits(costs: Sequence[float], next_cost: float, per_round: int, elapsed_s: float,
                     budget_s: float, off_cost: float = 0.0) -> bool:
    """Whether round 1 measures one more candidate. One prompt pair per candidate is too few to choose by
    (MIN_PAIRED): the better half must still run round 2 (twice the prompts each, about as long as round 1)
    within the budget, so round 1 takes only as many candidates as leave that room; the candidates come in
    the order `candidates` lists them (llama.cpp's defaults first). The first two only need to fit
    themselves. `costs`: seconds per prompt of the candidates measured so far in round 1 (their own runs);
    `off_cost`: seconds per prompt of off, which runs round 2's prompts once for all its candidates."""
    own = elapsed_s + next_cost * per_round
    k = len(costs) + 1
    if k <= 2:
        return own <= budget_s
    average = (sum(costs) + next_cost) / k
    round_two = ((k + 1) // 2 * average + off_cost) * 2 * per_round
    return own + round_two <= budget_s


def ranking(tallies: Sequence[Tally]) -> list[Tally]:
    """The sweep's order: the candidates that went furthest first (they ran the most prompts, the same ones),
    each group by speed-up over off on those prompts, as `halve` keeps them."""
    return sorted((t for t in tallies if t.samples), key=lambda t: (len(t.samples), t.speedup), reverse=True)


# With at least this many paired samples the interval is a bootstrap 90% interval of the paired speed-up
# (total_interval); with fewer it is only their range, and the noise floor must be cleared by its lower end
# (beats_off).
TRUSTED_SAMPLES = 5
# A configuration that no paired prompt found slower than off beyond the noise floor, whose gain is beyond
# twice that floor, with at least this many pairs, is chosen on that alone (weigh): on edit work some prompts
# give n-gram speculation nothing to copy and run at 1.00x while the rest run 1.6-1.8x, and an interval then
# reaches 1.00 on few prompts, so the interval rule refused a configuration that never lost (the 1.5B's edit
# tune: 1.66x over 3 prompts, one at 1.00x: off).
CLEAR_WIN_PAIRS = 3


@dataclass(frozen=True)
class Verdict:
    """What the choice rule made of one measured configuration."""

    label: str
    chosen: bool
    speedup: float  # paired speed-up against off (Tally.speedup)
    low: float  # lower end of its interval
    high: float
    score: float  # expected gain less measured risk (see weigh)
    why: str  # why refused ('' when chosen)

    def lost(self, chosen_speedup: float) -> float:
        """How much slower it ran than what was chosen (off: 1.0), as a share of that: 0.07 = 7% slower."""
        return max(0.0, 1.0 - self.speedup / chosen_speedup) if chosen_speedup > 0 else 0.0


@dataclass(frozen=True)
class Choice:
    chosen: Tally | None  # None: off
    noise: float  # the half-width of the best candidate's interval, relative to its speed-up
    why: str
    verdicts: tuple[Verdict, ...] = ()  # every measured configuration, what the rule made of it

    def refused(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.chosen]


def clear_win(t: Tally, floor: float) -> bool:
    """Never slower and clearly faster: CLEAR_WIN_PAIRS or more pairs, none of them (nor of their decode
    ratios) below 1 - floor, and a speed-up beyond 1 + 2 floor in both. A session tune's three passes at 1.05x,
    1.03x and 1.04x, which then ran slower than off, stay refused (1.04x is inside twice the 3% floor)."""
    ratios, decode = t.ratios, t.decode_ratios
    if len(ratios) < CLEAR_WIN_PAIRS or len(decode) < CLEAR_WIN_PAIRS:
        return False
    return (min(ratios) >= 1.0 - floor and min(decode) >= 1.0 - floor
            and t.speedup > 1.0 + 2 * floor and paired_total(t.pairs, decode=True) > 1.0 + 2 * floor)


def risk_of(low: float, floor: float) -> float:
    """The measured risk of a configuration whose interval reaches down to `low`: how far it reaches
    into the noise band (1 + floor), with the part below off counted twice, once as noise and once as a
    loss."""
    return max(0.0, 1.0 + floor - low) + max(0.0, 1.0 - low)


def weigh(t: Tally, floor: float) -> tuple[float, str]:
    """(score, why refused or ''). The expected gain is the paired speed-up over off, the workload's tokens
    over its time (Tally.speedup); the measured risk is `risk_of` its interval's lower end. With
    TRUSTED_SAMPLES or more pairs the interval is a bootstrap 90% interval (total_interval), and a
    configuration is chosen when its gain outweighs that risk: 1.20x over an interval of 1.01-1.43x is not
    refused for missing the 3% floor by 2 points, nor 1.20x over 0.97-1.66x (risk 9%: Gemma's code tune refused
    that ngram-mod for reaching 0.97x, and auto then ran off, 24% below the best static configuration), while
    1.05x over 0.95-1.15x (risk 13%) is. With fewer pairs the interval is only their range: its lower end must
    clear the floor (beats_off). Either way, a clear win (clear_win: no pair slower than off beyond the floor,
    the speed-up beyond twice it) is chosen. Never chosen: nothing accepted, a gain that does not outweigh its
    risk, a decode no faster than off's (weighed alike)."""
    n = len(t.ratios)
    low = t.interval[0]
    gain = t.speedup - 1.0
    risk = risk_of(low, floor)
    score = gain - risk
    if sum(s.accepted for s in t.samples) == 0:
        return score, "no drafted token was accepted"
    if clear_win(t, floor):
        return score, ""
    decode = t.decode_ratios
    decode_low, decode_high = total_interval(t.pairs, decode=True)
    if n >= TRUSTED_SAMPLES:
        if score <= 0:
            weighed = (f"its gain ({100 * gain:.1f}%) does not outweigh the risk ({100 * risk:.1f}%: its "
                       f"interval's lower end against the {100 * floor:.2g}% noise floor)")
            return score, (f"its interval reaches {low:.2f}x, not above off, and {weighed}" if low <= 1.0
                           else weighed)
        decode_score = paired_total(t.pairs, decode=True) - 1.0 - risk_of(decode_low, floor) if decode else score
        if decode_score <= 0:
            return score, (f"its decode did not run faster than off's beyond the risk ({decode_low:.2f}-"
                           f"{decode_high:.2f}x), so the edge is not speculation's")
        return score, ""
    if not beats_off(low, n, floor):
        if n < MIN_PAIRED and beats_off(low, MIN_PAIRED, floor):
            return score, "too few to tell an edge from noise (give tune a larger --budget-s)"
        return score, f"not beyond the measured spread and the {100 * floor:.2g}% noise floor"
    if decode_low <= 1.0:
        return score, (f"its decode was not faster than off's on every pair ({decode_low:.2f}-{decode_high:.2f}x), "
                       "so the edge is not speculation's")
    return score, ""


def plainest(top: Tally, eligible: Sequence[Tally], floor: float) -> Tally:
    """`top`, or the fastest type at its defaults among `eligible` that top did not beat beyond the noise: whose
    speed-up comes within `floor` of top's, or that top did not run clearly faster than on the prompts both ran
    (clearly_slower: its interval over the default reaches 1.0). A sweep picks the best of twenty-odd
    configurations on a few prompts each, and the best of many noisy figures is high by luck: on Gemma's edit
    tune, ngram-mod n_match=16 n_min=16 n_max=48 led ngram-simple by 2% over 3 prompts (2.44x against 2.39x),
    was chosen, and then ran 1.35x against ngram-simple's 1.96x on fresh prompts (acceptance 50%); a later one
    led it by 6% over 21 prompts (1.42x against 1.34x, 0.96-1.18x head to head in the bench's measure), and
    then ran 1.26-1.37x against its 1.40-1.54x on three sets of 30 functions. A tuned variant has to beat the
    defaults beyond the noise to be chosen."""
    if top.candidate.default:
        return top
    plain = [t for t in eligible if t.candidate.default
             and (t.speedup * (1.0 + floor) >= top.speedup or not clearly_slower(t, top))]
    return max(plain, key=lambda t: t.speedup, default=top)


def choose_config(tallies: Sequence[Tally], floor_of: Callable[[Tally], float] | None = None) -> Choice:
    """The configuration to run, or off: among the finalists (the candidates that ran the most prompts, the
    same ones), the one whose expected gain outweighs its measured risk by the most (weigh). A candidate that
    had no draft token accepted ran the baseline's own computation plus its drafting, so any edge it shows
    is noise: it is never chosen. Nor is one whose decode was not faster than off's on its paired samples:
    speculation changes the speed of nothing else for the better, so a session's edge without a decode edge
    is the servers' own spread (prefill is 85-89% of a session's wall time on a CPU). `floor_of`: a
    candidate's noise floor (default MIN_NOISE). Every measured configuration gets a verdict: the refused
    ones, and by how much they lost, are shown by `pair` and `ps`."""
    measured = [t for t in tallies if t.samples]
    if not measured:
        return Choice(None, MIN_NOISE, "nothing was measured: speculation off")
    floors = {id(t): floor_of(t) if floor_of is not None else MIN_NOISE for t in measured}
    weighed = {id(t): weigh(t, floors[id(t)]) for t in measured}
    ranked = ranking(measured)
    most = len(ranked[0].samples)
    finalists = [t for t in ranked if len(t.samples) == most]
    eligible = [t for t in finalists if not weighed[id(t)][1]]
    top = max(eligible, key=lambda t: weighed[id(t)][0], default=None)
    chosen = plainest(top, eligible, floors[id(top)]) if top is not None else None

    def beyond(variant: Tally) -> str:  # why the default went first (plainest)
        assert chosen is not None
        if chosen.speedup * (1.0 + floors[id(variant)]) >= variant.speedup:
            return f"within the {100 * floors[id(variant)]:.2g}% noise floor of"
        lo, hi = total_interval(head_to_head(variant, chosen))
        return f"not clearly faster ({lo:.2f}-{hi:.2f}x head to head, on the same prompts) than"

    def verdict(t: Tally) -> Verdict:
        score, why = weighed[id(t)]
        if t is not chosen and not why:
            why = ("ran fewer prompts than the finalists" if len(t.samples) < most else
                   f"a tuned variant {beyond(t)} {chosen.candidate.label}, a type at its defaults, which goes first"
                   if t is top and chosen is not None else "a finalist with less gain for its risk")
        low, high = t.interval
        return Verdict(t.candidate.label, t is chosen, t.speedup, low, high, score, why)

    verdicts = tuple(verdict(t) for t in ranked)
    if all(sum(s.accepted for s in t.samples) == 0 for t in measured):
        return Choice(None, MIN_NOISE, "tuned: off - no candidate had a drafted token accepted on this workload",
                      verdicts)
    best = chosen or next((t for t in finalists if sum(s.accepted for s in t.samples) > 0), finalists[0])
    if chosen is None and not any(sum(s.accepted for s in t.samples) > 0 for t in finalists):
        best = next(t for t in ranked if sum(s.accepted for s in t.samples) > 0)
    floor = floors[id(best)]
    m = best.measured()
    low, high = best.interval
    noise = max(floor, (high - low) / 2 / best.speedup) if best.speedup > 0 else floor
    acc = f", acceptance {100 * m.acceptance:.0f}%" if m.acceptance is not None else ""
    spread = (f"{100 * CONFIDENCE:.0f}% interval {low:.2f}-{high:.2f}x over "
              f"{len(best.ratios)} paired prompt(s)")
    if chosen is not None:
        over = (f"; preferred to {top.candidate.label} ({top.speedup:.2f}x), a tuned variant within the noise"
                if top is not None and top is not chosen else "")
        return Choice(best, noise, f"tuned: {best.candidate.label} ran {best.speedup:.2f}x of off "
                                   f"({best.tok_s:.1f} tok/s{acc}; {spread}), beyond the measured spread{over}",
                      verdicts)
    why = weighed[id(best)][1]
    return Choice(None, noise, f"tuned: off - the best, {best.candidate.label}, ran {best.speedup:.2f}x of off{acc} "
                               f"({spread}): {why}", verdicts)


def break_even_acceptance(baseline_tok_s: float, m: Measured) -> float | None:
    """The acceptance below which this configuration stops paying, predicted from its measured figures.

    A step of speculation costs c forwards of the plain model: c = accept_len x off / spec (tok/s). It pays
    while it commits more than c tokens per step, i.e. accepts more than c - 1 of the d tokens it drafts
    per step, with d = (accept_len - 1) / acceptance."""
    if not m.acceptance or not m.accept_len or m.accept_len <= 1.0 or m.tok_s <= 0:
        return None
    cost = m.accept_len * baseline_tok_s / m.tok_s
    drafted_per_step = (m.accept_len - 1.0) / m.acceptance
    return min(1.0, max(0.0, (cost - 1.0) / drafted_per_step))


def ranked_profile(choice: Choice, tallies: Sequence[Tally]) -> list[Measured]:
    """The sweep's best RANKED configurations for the profile, each with why the choice refused it."""
    why = {v.label: v.why for v in choice.verdicts if not v.chosen}
    return [replace(t.measured(), refused=why.get(t.candidate.label, "")) for t in ranking(tallies)[:RANKED]]


def best_by_kind(tallies: Sequence[Tally]) -> dict[str, Measured]:
    out: dict[str, Tally] = {}
    for t in ranking(tallies):
        out.setdefault(t.candidate.speculator.kind, t)
    return {k: t.measured() for k, t in out.items()}


# ------------------------------------------------------------------------------------------------ the edge

@dataclass(frozen=True)
class TuneResult:
    profile: Profile
    path: Path
    tallies: tuple[Tally, ...]
    baseline: tuple[float, ...]
    rounds: int
    elapsed_s: float


def _timed(bench, workload: str, pid: int, prompt: str, tokens: int) -> tuple[Sample, float]:  # type: ignore[no-untyped-def]
    """One run of `prompt` on `bench`'s server: its sample and the seconds it took, end to end."""
    t0 = time.monotonic()
    return bench.round(workload, None, pid, prompt, tokens, lambda *_: None)[0], time.monotonic() - t0


def run_tune(model_path: Path, engine, workload: str, tasks, budget_s: float, tokens: int | None,  # type: ignore[no-untyped-def]
             draft: Path | None, progress: Callable[[str], None]) -> TuneResult:
    """Successive halving within `budget_s`: every survivor of a round runs the same fresh prompts, one per
    task of the workload (then twice as many each round), each paired with the baseline on the same prompt.
    Off runs each prompt once, beside the first candidate that runs it, and every candidate that runs the
    prompt is paired with that run, as bench pairs its configurations with one run of off per prompt: a
    separate off run per candidate spent half the sweep on off (on Gemma's edit tune, 600 s left the three
    finalists 11 prompts each, and the same prompts decided, on a workload whose prompts run 0.7-2.5x);
    the better half goes on, until one is left (it runs one more round against off, which narrows the
    interval the off-or-not rule reads) or the next round does not fit in the budget. Saves and returns the
    profile.

    A candidate keeps its server from its first round to its last, as the daemon's server lives through a
    workload and as `bench` runs one: ngram-mod's hash pool is shared by every request a server sees
    (speculative.cpp:1872-1876), so a fresh server each round measured it on an empty pool. Gemma's edit tune
    chose ngram-mod n_match=16 n_min=16 n_max=48 at 87% acceptance over 5 prompts, each round on a fresh
    server; the bench, one server over 15 prompts, then measured it at 51% and 1.18x of off, against
    ngram-simple's 1.67x (session 16 the same: 1.35x against 1.96x)."""
    from bostudio.bench.runner import Bench, BenchConfig
    from bostudio.gguf import describe

    info = describe(model_path)
    started = time.monotonic()
    ctx = 4096
    pool = [Tally(c) for c in candidates(engine.spec_types, info.has_mtp, draft)]
    cost: dict[str, float] = {}  # seconds per prompt of each candidate's own runs
    off_cost: list[float] = []  # seconds of each run of off
    offs: dict[tuple[str, int], Sample] = {}  # off's run of each prompt (task, variant), shared by the candidates
    baseline_tok: list[float] = []
    served = 0  # prompts handed out so far: every prompt of the sweep is a different one
    rounds = 0
    off = BenchConfig(OFF, Speculator("none", reason="baseline"))
    live: dict[str, Bench] = {}  # each candidate's server, from its first round to its last
    with Bench(info, engine, [off], ctx, progress) as base:
        try:
            alive = pool
            while alive:
                left = budget_s - (time.monotonic() - started)
                per_round = round_prompts(rounds + 1, len(tasks), [_mean(off_cost)] + [
                    cost[t.candidate.label] for t in alive] if rounds else None, left)
                if per_round == 0:
                    progress(f"budget: {budget_s - left:.0f} of {budget_s:.0f} s spent; round {rounds + 1} "
                             f"({len(alive)} candidate(s)) does not fit, the sweep stops at round {rounds}")
                    break
                rounds += 1
                progress(f"round {rounds}: {len(alive)} candidate(s) x {per_round} prompt(s)")
                prompts = [(tasks[i % len(tasks)], TUNE_VARIANT + served + i) for i in range(per_round)]
                served += per_round
                measured_this_round = []
                for t in alive:
                    if rounds == 1 and cost and not round_one_admits(
                            [cost[m.candidate.label] for m in measured_this_round], max(cost.values()), per_round,
                            time.monotonic() - started, budget_s, _mean(off_cost)):
                        # round 1 may stop early (the candidates measured so far ran the same prompts), keeping
                        # the time for round 2
                        progress(f"budget: {time.monotonic() - started:.0f} of {budget_s:.0f} s spent in round 1; "
                                 f"{len(alive) - len(measured_this_round)} candidate(s) left unmeasured, the rest "
                                 f"kept for round 2")
                        break
                    cand = live.get(t.candidate.label)
                    if cand is None:
                        cand = Bench(info, engine, [BenchConfig(t.candidate.label, t.candidate.speculator)], ctx,
                                     progress)
                        cand.__enter__()  # stops its server itself when it fails to start
                        live[t.candidate.label] = cand
                    own = 0.0
                    for task, variant in prompts:
                        prompt = task.prompt(variant)
                        n = tokens or task.tokens
                        pid = len(t.samples)
                        key = (task.name, variant)
                        b = offs.get(key)
                        if b is None:  # off and the first candidate alternate who goes first (drift)
                            if pid % 2 == 0:
                                (b, off_s), (s, took) = _timed(base, workload, pid, prompt, n), \
                                    _timed(cand, workload, pid, prompt, n)
                            else:
                                (s, took), (b, off_s) = _timed(cand, workload, pid, prompt, n), \
                                    _timed(base, workload, pid, prompt, n)
                            offs[key] = b
                            off_cost.append(off_s)
                            baseline_tok.append(b.tok_s)
                        else:
                            s, took = _timed(cand, workload, pid, prompt, n)
                        own += took
                        t.baseline.append(b)
                        t.samples.append(s)
                    cost[t.candidate.label] = own / per_round
                    measured_this_round.append(t)
                    progress(f"  {t.candidate.label}: {t.tok_s:.1f} tok/s, {t.speedup:.2f}x of off "
                             f"({time.monotonic() - started:.0f}/{budget_s:.0f} s)")
                if len(measured_this_round) <= 1:
                    break
                alive = halve(measured_this_round)
                for label in set(live) - {t.candidate.label for t in alive}:
                    live.pop(label).__exit__()  # halved out: its server stops
        finally:
            for cand in live.values():
                cand.__exit__()
    choice = choose_config(pool)
    base_med = total_rate(s for t in pool for s in t.baseline)
    chosen = choice.chosen.measured() if choice.chosen else None
    ident = ModelIdentity.of(model_path)
    profile = Profile(ident.name, ident.size, ident.mtime, engine_identity(engine), workload, chosen, base_med,
                      choice.noise, choice.why, break_even_acceptance(base_med, chosen) if chosen else None,
                      best_by_kind(pool), time.time(), ranking=ranked_profile(choice, pool))
    path = save_profile(profile)
    return TuneResult(profile, path, tuple(pool), tuple(baseline_tok), rounds, time.monotonic() - started)

