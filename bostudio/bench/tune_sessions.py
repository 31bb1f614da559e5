"""`tune --workload agent|DIR`: autotune on whole agent sessions, so that auto's profile reflects agent traffic.

The sweep is tune's (candidates, successive halving, the off-or-not rule, the profile), with one session pass
as the unit instead of one prompt: each candidate replays the session turn by turn beside the baseline (off),
the two alternating who goes first each turn, both on fresh servers for every pass (agent.run_sessions),
started off first on a candidate's even passes and the candidate first on its odd ones (pair_order). A
pass's figure is the session's output tokens over its wall time (prefill, first tokens and decode together),
so the paired ratio candidate/off is the ratio of the session wall times.

The budget is a bound: before each pass, its cost is estimated from the passes measured so far (the most
expensive one: a session costs about the same on every configuration, and prefill dominates it), and a pass
that would not end within the budget is not started. Only the very first pass has nothing to be estimated
from; it always runs. A choice needs MIN_PAIRED passes of a candidate, so a round of single passes keeps room
to measure its leader again (confirm_reserve), and a round that does not fit for every survivor measures the
leader alone.

A pass costs the same on every n-gram configuration (they do off's work on the prompt, and the session's cold
prefill is most of a pass), so the sweep opens with a screen: off and llama.cpp's default of every n-gram type,
one server each, in ONE pass of the session, turn by turn (screen_goes_on: turns are added while the budget
keeps room to confirm the leader, so on a short budget the screen is a slice of the session). That is one
paired sample per type for the price of (types + 1) / 2 pair passes. Without it, tune measures candidates pair
by pair in a fixed order, and a 900 s budget on a 2-core CPU reached one (it chose ngram-mod, and
ngram-simple, which it never measured, ran 4% faster on a recorded session: BENCHMARKS.md, run 6). The
screen's leader and the other kinds' first candidates (draft, MTP) then go on pair by pair, on whole sessions.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bostudio.bench.measure import OFF, Sample
from bostudio.profiles import MIN_NOISE, MIN_PAIRED, ModelIdentity, Profile, engine_identity, save_profile
from bostudio.bench.tune import (Tally, TuneResult, best_by_kind, break_even_acceptance,
                                 candidates, choose_config, halve, ranked_profile, ranking)
from bostudio.speculation import Speculator

if TYPE_CHECKING:
    from bostudio.bench.agent import TurnResult

C = TypeVar("C")  # a bench configuration (runner.BenchConfig, imported where the servers start)
# Tune's passes of the shipped session are variants -1, -2 ..., the bench's 0, 1 ...: they read different
# modules (sessions.module_of_turn), so tune does not choose on what the bench then measures. Before, tune's
# passes were the prompts' variants (tune.TUNE_VARIANT, 1000 on).
SESSION_VARIANT = -1


def pass_fits(elapsed_s: float, budget_s: float, pass_costs: Sequence[float]) -> bool:
    """Whether one more session pass ends within the budget, estimated from the passes measured so far (the
    most expensive one); the first pass (nothing measured) always runs."""
    if not pass_costs:
        return True
    return elapsed_s + max(pass_costs) <= budget_s


def passes_this_round(round_no: int, elapsed_s: float, budget_s: float, survivors: int,
                      pass_costs: Sequence[float]) -> int:
    """Session passes per survivor in round `round_no` (1, 2, 4 ...: successive halving), fewer when the whole
    round would not end within the budget at the measured cost per pass; 0 when not even one pass each fits."""
    want = 2 ** (round_no - 1)
    if not pass_costs:
        return want
    per = max(pass_costs) * max(1, survivors)
    return max(0, min(want, int((budget_s - elapsed_s) // per))) if per > 0 else want


def confirm_reserve(passes: int, pass_costs: Sequence[float]) -> float:
    """Seconds a round of `passes` session passes keeps free for measuring its leader again. A candidate needs
    MIN_PAIRED paired passes to be chosen at all (profiles.beats_off), so a round of fewer does not start
    another candidate when that would leave no room to confirm the best one (at 210 s a pass and 900 s,
    four candidates once each would leave none of them choosable; three and the leader again can)."""
    return max(pass_costs, default=0.0) * max(0, MIN_PAIRED - passes)


def pair_order(off: C, candidate: C, passes: int) -> list[C]:
    """The two servers of a candidate's next pass, in start order (the first also takes the session's first
    turn, its cold prefill): off first on even passes, the candidate first on odd ones, so that a candidate's
    paired ratios weigh both orders alike. With off always first, each of four passes put a candidate 1.03-1.05x
    of off, and the bench, whose passes rotate the start order, then measured those candidates at 0.97-1.02x."""
    return [off, candidate] if passes % 2 == 0 else [candidate, off]


def screened(pool: Sequence[Tally]) -> list[Tally]:
    """The screen's candidates: llama.cpp's default of each n-gram type (one spec type, no parameters set),
    whose servers do off's work on the prompt (Speculator.same_prefill) and hold no model but the target's."""
    return [t for t in pool if (sp := t.candidate.speculator).kind == "ngram" and sp.same_prefill
            and len(sp.spec_types) == 1 and not sp.ngram_params]


def servers_that_fit(plan) -> int:  # type: ignore[no-untyped-def]
    """How many servers of `plan` (a planner.Plan) fit side by side: on every device it uses, what the device
    may count on over what one server takes there. The screen runs one server per type beside off's, so it is
    cut to what fits (a 2-core CPU with a small model holds all; one 24 GiB GPU does not hold six 8B models)."""
    counts = [d.usable_bytes // b for d in plan.devices if (b := plan.chosen.device_bytes(d.label)) > 0]
    return max(1, min(counts)) if counts else 1


def screen_estimate(turn_costs: Sequence[float], turns: int, servers: int) -> float:
    """A whole session's pass on two servers (one candidate and off), from a screen on `servers` servers whose
    turn rounds cost `turn_costs` so far: the rounds measured, and the mean warm round (the second on) for
    every turn not screened yet, at 2/servers of it all. A recording's later turns can start a new prompt:
    Claude Code's 15th request of a recording was a cold 13.8k-token prefill (380 s on six servers), and
    the dearest warm round times every later turn would put a 554 s pair pass at about 2,600 s: the leader
    would never be confirmed, and tune would choose off."""
    done = len(turn_costs)
    warm = statistics.fmean(turn_costs[1:]) if done > 1 else turn_costs[0]
    return 2 / servers * (sum(turn_costs) + max(0, turns - done) * warm)


def screen_goes_on(turn_costs: Sequence[float], turns: int, servers: int, elapsed_s: float, budget_s: float) -> bool:
    """Whether the screen takes one more turn (every server): its first turn always runs (the cold prefill);
    the second (one warm turn to estimate the others from) while it ends within the budget at the cold turn's
    cost, which bounds a warm one (the 1.5B's screen of six servers: an 874 s cold turn, then a warm one of 493 s
    started at 1,280 s of a 1,200 s budget); then another while its cost (the dearest warm round so far) and the
    leader's confirmation (MIN_PAIRED - 1 whole-session pair passes, screen_estimate) end within the budget."""
    if not turn_costs:
        return True
    if len(turn_costs) == 1:
        return elapsed_s + turn_costs[0] <= budget_s
    reserve = screen_estimate(turn_costs, turns, servers) * max(0, MIN_PAIRED - 1)
    return elapsed_s + max(turn_costs[1:]) + reserve <= budget_s


def after_screen(pool: Sequence[Tally], screen: Sequence[Tally]) -> list[Tally]:
    """The sweep's next candidates once the screen has run: its leader; the first candidate of every other kind
    (draft, MTP: their servers prefill too or hold another model, so they go pair by pair); then the leader's
    own parameter variants. The other n-gram types are out: the screen measured them on the same turns."""
    leader = ranking(screen)[0]
    others: dict[str, Tally] = {}
    for t in pool:
        if t not in screen and t.candidate.speculator.kind != "ngram":
            others.setdefault(t.candidate.speculator.kind, t)
    variants = [t for t in pool if t not in screen and t.candidate.speculator.kind == "ngram"
                and t.candidate.speculator.spec_types == leader.candidate.speculator.spec_types]
    return [leader, *others.values(), *variants]


def survivors(measured: list[Tally]) -> list[Tally]:
    """The next round's candidates, the leader first: successive halving; a lone candidate goes on alone while
    it has fewer than MIN_PAIRED passes (its confirmation), and then the sweep is done."""
    if len(measured) == 1:
        return measured if len(measured[0].samples) < MIN_PAIRED else []
    return halve(measured) if measured else []


def run_tune_sessions(model_path: Path, engine, workload: str, budget_s: float, tokens: int | None,  # type: ignore[no-untyped-def]
                      draft: Path | None, progress: Callable[[str], None], prefix_tokens: int,
                      session_turns: int) -> TuneResult:
    """Successive halving over session passes within `budget_s` (see the module docstring); saves and
    returns the profile of `workload` (`agent`, or the recording directory's name)."""
    from bostudio.bench import agent
    from bostudio.bench.runner import Bench, BenchConfig, bench_decision
    from bostudio.gguf import describe

    info = describe(model_path)
    started = time.monotonic()
    n_tokens = tokens or 128
    first = agent.fitted_session(workload, prefix_tokens, session_turns, SESSION_VARIANT, n_tokens, info.n_ctx_train,
                                 progress)
    ctx = agent.session_ctx([first], n_tokens, info.n_ctx_train, progress)
    pool = [Tally(c) for c in candidates(engine.spec_types, info.has_mtp, draft)]
    costs: list[float] = []
    base_decode: list[float] = []
    cand_decode: dict[str, list[float]] = {}
    served = 0
    rounds = 0
    off = BenchConfig(OFF, Speculator("none", reason="baseline"))
    name = Path(workload).name if workload != "agent" else workload
    shares: list[float] = []  # off's decode share of each session pass

    def record(t: Tally, turns: list) -> None:  # type: ignore[type-arg]
        """One paired sample of `t` from one session pass's turns (off's and the candidate's)."""
        label = t.candidate.label
        o = [x for x in turns if x.config == OFF]
        c = [x for x in turns if x.config == label]
        base, cand = session_samples(name, label, len(t.samples), o, c, t.candidate.speculator.same_prefill)
        t.baseline.append(base)
        t.samples.append(cand)
        off_totals = agent.session_totals(o)
        base_decode.append(off_totals["decode_tok_s"] or 0.0)
        cand_decode.setdefault(label, []).append(agent.session_totals(c)["decode_tok_s"] or 0.0)
        if off_totals["wall_s"] > 0:
            shares.append(off_totals["decode_s"] / off_totals["wall_s"])
    with tempfile.TemporaryDirectory(prefix="bostudio-tune-slots-") as slots:
        cold = Path(slots)  # cold passes: no host prompt cache, slots erased between passes (Bench)
        alive = pool
        decision = bench_decision(info, engine, ctx)  # every pass's servers share it (Bench)
        screen = screened(pool)[:max(0, servers_that_fit(decision.plan) - 1)]
        if len(screen) > 1:
            rounds, served = 1, 1
            est = _screen(info, engine, off, screen, first, ctx, cold, decision, n_tokens, started, budget_s,
                          progress, record)
            costs.append(est)
            alive = after_screen(pool, screen)
        while alive:
            n = passes_this_round(rounds + 1, time.monotonic() - started, budget_s, len(alive), costs)
            if (n == 0 and len(alive) > 1 and len(alive[0].samples) < MIN_PAIRED
                    and pass_fits(time.monotonic() - started, budget_s, costs)):
                progress(f"budget: round {rounds + 1} does not fit for {len(alive)} candidates; the leader, "
                         f"{alive[0].candidate.label}, is measured again alone (a choice needs {MIN_PAIRED} passes)")
                alive, n = alive[:1], 1
            if n == 0:
                progress(f"budget: {time.monotonic() - started:.0f} of {budget_s:.0f} s spent; round "
                         f"{rounds + 1} ({len(alive)} candidate(s)) does not fit, the sweep stops at round {rounds}")
                break
            rounds += 1
            progress(f"round {rounds}: {len(alive)} candidate(s) x {n} session pass(es)")
            sessions = [agent.fitted_session(workload, prefix_tokens, session_turns, SESSION_VARIANT - served - i,
                                             n_tokens, info.n_ctx_train, progress) for i in range(n)]
            sessions = [replace(x, name=f"{x.name}#{served + i + 1}") for i, x in enumerate(sessions)]
            served += n
            measured = []
            for t in alive:
                reserve = confirm_reserve(n, costs) if measured else 0.0
                if not pass_fits(time.monotonic() - started + reserve, budget_s, [c * n for c in costs]):
                    progress(f"budget: {time.monotonic() - started:.0f} of {budget_s:.0f} s spent in round "
                             f"{rounds}; {len(alive) - len(measured)} candidate(s) left unmeasured"
                             + (f" ({reserve:.0f} s kept to measure the leader again)" if reserve else ""))
                    break
                t0 = time.monotonic()
                # Off and the candidate on fresh servers for every pass (run_sessions restarts them), so that
                # no one server's own speed is under every candidate's ratio, and in either start order.
                cand = BenchConfig(t.candidate.label, t.candidate.speculator)
                with Bench(info, engine, pair_order(off, cand, len(t.samples)), ctx, progress, cold,
                           decision) as pair:
                    turns, _ = agent.run_sessions(pair, sessions, n_tokens, None, _turns(progress))
                for s in sessions:
                    record(t, [x for x in turns if x.session == s.name])
                costs.append((time.monotonic() - t0) / n)
                measured.append(t)
                # this pass's ratio and the candidate's passes together (1.03x can be the screen's 1.042x and
                # a confirming 1.009x)
                progress(f"  {t.candidate.label}: session {(t.ratios or [0.0])[-1]:.3f}x of off on this pass, "
                         f"{t.speedup:.3f}x over its {len(t.ratios)} "
                         f"({time.monotonic() - started:.0f}/{budget_s:.0f} s)")
            alive = survivors(measured)
    share = statistics.median(shares) if shares else 1.0
    choice = choose_config(pool, lambda t: session_floor(share) if t.candidate.speculator.same_prefill else MIN_NOISE)
    chosen = choice.chosen.measured() if choice.chosen else None
    base_tok = statistics.median(s.tok_s for t in pool for s in t.baseline) if any(t.baseline for t in pool) else 0.0
    be = None
    if chosen is not None and base_decode and cand_decode.get(chosen.label):
        # break-even from decode speeds: acceptance only changes decode, not prefill
        be = break_even_acceptance(statistics.median(base_decode),
                                   replace(chosen, tok_s=statistics.median(cand_decode[chosen.label])))
    ident = ModelIdentity.of(model_path)
    profile = Profile(ident.name, ident.size, ident.mtime, engine_identity(engine), name, chosen, base_tok,
                      choice.noise, choice.why, be, best_by_kind(pool), time.time(),
                      ranking=ranked_profile(choice, pool))
    path = save_profile(profile)
    baseline = tuple(s.tok_s for t in pool for s in t.baseline)
    return TuneResult(profile, path, tuple(pool), baseline, rounds, time.monotonic() - started)


def _screen(info, engine, off, screen: list[Tally], session, ctx: int, cold: Path,  # type: ignore[no-untyped-def]
            decision, n_tokens: int, started: float, budget_s: float, progress: Callable[[str], None],
            record: Callable[[Tally, list], None]) -> float:  # type: ignore[type-arg]
    """The screen (module docstring): off and every screened type in one pass of `session`, as many turns as
    screen_goes_on allows; one paired sample per type. Returns the estimated cost of a whole-session pair pass."""
    from bostudio.bench import agent
    from bostudio.bench.runner import Bench, BenchConfig

    configs = [off] + [BenchConfig(t.candidate.label, t.candidate.speculator) for t in screen]
    turns = len(session.requests)
    marks: list[float] = []

    def more(done: int) -> bool:
        marks.append(time.monotonic())
        rounds = [b - a for a, b in zip(marks, marks[1:])]
        return done == 0 or screen_goes_on(rounds, turns, len(configs), time.monotonic() - started, budget_s)

    progress(f"round 1 (screen): off and {len(screen)} n-gram types in one pass of the session, turn by turn, "
             f"while the budget keeps room to confirm the leader on whole sessions")
    with Bench(info, engine, configs, ctx, progress, cold, decision) as bench:
        results, _ = agent.run_sessions(bench, [session], n_tokens, None, _turns(progress), more)
        end = time.monotonic()
    done = max((r.turn for r in results), default=0)
    if len(marks) <= done:  # the pass ran to the session's end: its last round's end
        marks.append(end)
    rounds = [b - a for a, b in zip(marks, marks[1:])]
    totals = {c.label: agent.session_totals([r for r in results if r.config == c.label]) for c in configs}
    for t in screen:
        record(t, results)
    for t in ranking(screen):
        c = totals[t.candidate.label]
        acc = "" if c["acceptance"] is None else f", acceptance {100 * c['acceptance']:.0f}%"
        progress(f"  {t.candidate.label}: {done} of {turns} turns in {c['wall_s']:.1f} s (off "
                 f"{totals[OFF]['wall_s']:.1f} s), decode {c['decode_tok_s'] or 0:.1f} tok/s (off "
                 f"{totals[OFF]['decode_tok_s'] or 0:.1f}){acc}: off's session retimed with its decode, "
                 f"{t.speedup:.3f}x of off")
    progress(f"  screen done: {time.monotonic() - started:.0f}/{budget_s:.0f} s")
    return screen_estimate(rounds, turns, len(configs)) if rounds else 0.0


def _turns(progress: Callable[[str], None]) -> Callable[[int, int, str], None]:
    """run_sessions' per-turn progress as tune's lines (a pass on a CPU takes minutes)."""
    return lambda done, total, what: progress(f"    {what}")


def retimed_wall(off: Sequence[TurnResult], cand: Sequence[TurnResult]) -> float:
    """Off's session wall time with each turn's decode at the candidate's speed (the candidate's decode time per
    token, times off's output tokens of that turn). Speculation changes decode and nothing else; for a server
    that does off's work on the prompt (an n-gram type), the rest of a pass (prefill, about 83% of the shipped
    session here) is the same work on both servers, and their gap on it is the servers' own speed, not the
    candidate's. Retimed, that gap is gone. Two measured passes of the shipped session, off's wall time over
    each type's: ngram-simple 1.032x and 1.022x, retimed 1.026x and 1.032x; ngram-map-k 1.022x and 1.004x,
    retimed 1.018x and 1.039x; ngram-mod 1.027x and 0.996x, retimed 1.011x and 1.022x. Decode is about 17% of
    that session, so its 13-17% faster decode is worth 2-4% of the session, under the 3% the servers' own
    speeds move it (session_floor)."""
    by_turn = {t.turn: t for t in cand}
    total = 0.0
    for o in off:
        c = by_turn.get(o.turn)
        decode = o.decode_s
        if c is not None and c.predicted_n > 0 and c.decode_s > 0:
            decode = o.predicted_n * c.decode_s / c.predicted_n
        total += o.wall_s - o.decode_s + decode
    return total


def session_floor(decode_share: float) -> float:
    """The noise floor of a retimed figure: MIN_NOISE (what two runs of the same server move apart) on the part
    of the session the candidate's server still times, its decode (`decode_share` of off's wall time), so
    that the rule asks the same of a retimed session as of the decode speed itself."""
    return MIN_NOISE * min(1.0, max(0.0, decode_share))


def session_samples(workload: str, label: str, pid: int, off: Sequence[TurnResult], cand: Sequence[TurnResult],
                    same_prefill: bool) -> tuple[Sample, Sample]:
    """A session pass as one paired sample (off's, the candidate's): output tokens over wall time, so that the
    paired ratio is the ratio of the wall times; for a candidate that does off's work on the prompt, its wall
    time is off's retimed with its decode (retimed_wall) and its tokens off's. The decode tok/s are each
    server's own (tune.choose_config wants the decode faster too)."""
    from bostudio.bench.agent import session_totals

    o, c = session_totals(off), session_totals(cand)
    wall, tokens = (retimed_wall(off, cand), o["predicted_n"]) if same_prefill else (c["wall_s"], c["predicted_n"])

    def sample(config: str, totals: dict, wall_s: float, predicted: int) -> Sample:
        return Sample(workload, None, config, pid, predicted / wall_s if wall_s > 0 else 0.0, None,
                      totals["predicted_n"], totals["drafted"], totals["accepted"], totals["decode_tok_s"] or 0.0)

    return sample(OFF, o, o["wall_s"], o["predicted_n"]), sample(label, c, wall, tokens)
