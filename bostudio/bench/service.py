"""`bostudio bench`: the workloads x configurations, run interleaved, summarised (the edge of bench/)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bostudio.bench import agent, measure
from bostudio.bench.load import CompetingLoad
from bostudio.bench.runner import (Bench, BenchConfig, Plan, bench_decision, config_names, parse_ctx_list,
                                   parse_flash_attn, parse_threads, resolve_configs, run, sweep_fits)
from bostudio.bench.sessions import DEFAULT_PREFIX_TOKENS, DEFAULT_TURNS, is_session
from bostudio.bench.workloads import resolve_workloads
from bostudio.catalog.resolve import model_name, resolve_model
from bostudio.engine.discover import find_engine
from bostudio.errors import ConfigError, PlanError
from bostudio.gguf import describe

BASE_CTX = 4096


@dataclass(frozen=True)
class BenchOptions:
    model: str | None = None
    workloads: tuple[str, ...] = ("code", "edit", "chat")
    spec: str | None = None  # comma-separated configurations; None: off + every n-gram variant (+ MTP)
    ctx: str | None = None  # context sweep, e.g. "4k,16k"
    runs: int = 3
    tokens: int | None = None  # override each task's fixed output length
    repeat: bool = False
    first_run: int = 0  # the prompts of runs first_run, first_run + 1, ... (tune's are from 1000)
    turns: int = 50
    tokens_per_turn: int = 400
    engine: str | None = None
    load: int = 0  # busy processes beside the servers (each sample alone and beside them)
    threads: str | None = None  # --threads LIST: planned, all, T, T/TB (default: planned)
    flash_attn: str | None = None  # --flash-attn LIST: planned, on, off (default: planned)
    prefix_tokens: int = DEFAULT_PREFIX_TOKENS  # the shipped agent session's system prompt + tools
    session_turns: int = DEFAULT_TURNS  # the shipped agent session's turns


def run_bench(opts: BenchOptions, progress: Callable[[int, int, str], None],
              note: Callable[[str], None]) -> tuple[list[measure.Row], measure.Projection, dict]:
    """Run the bench; returns the rows, the projection and the JSON document."""
    if opts.runs < 1:
        raise ConfigError(f"--runs {opts.runs} is not a number of runs", "use --runs 1 or more")
    if opts.first_run < 0:
        raise ConfigError(f"--first-run {opts.first_run} is not a run", "use --first-run 0 or more")
    if opts.tokens is not None and not 1 <= opts.tokens <= 4096:
        raise ConfigError(f"--tokens {opts.tokens} is out of range", "use 1 to 4096 output tokens")
    if any(is_session(w) for w in opts.workloads):
        return run_agent_bench(opts, progress, note)
    workloads = resolve_workloads(list(opts.workloads)) if opts.workloads else {}
    path = resolve_model(opts.model, log=note)
    info = describe(path)
    engine = find_engine(opts.engine)
    sweep = sweep_fits(info, parse_ctx_list(opts.ctx), note)
    if not workloads and not sweep:
        raise ConfigError("nothing to measure", "give --workload code|edit|chat|FILE or a --ctx sweep")
    # The servers' context: the largest sweep length that the memory plan fits, plus room for the output.
    while True:
        ctx = max([BASE_CTX] + [c + 64 for c in sweep])
        try:
            bench_decision(info, engine, ctx)
            break
        except PlanError as exc:
            if not sweep:
                raise
            note(f"context {sweep[-1]} does not fit this machine ({exc.message}): left out of the sweep")
            sweep = sweep[:-1]
    configs = with_settings(
        [c for n in config_names(opts.spec, engine, info) for c in resolve_configs(n, info, engine, ctx, note)],
        opts.threads, opts.flash_attn)
    plan = Plan(workloads, opts.runs, tuple(sweep), opts.tokens, opts.repeat, len(configs), opts.first_run)
    with CompetingLoad(opts.load) as load, Bench(info, engine, configs, ctx, note) as bench:
        samples = run(bench, plan, progress, load if opts.load else None)
        argv = {c.label: bench.argv(c, 0)[1:] for c in configs}
        threads = bench.threads
    rows = measure.summarise(samples)
    projection = measure.project(rows, opts.turns, opts.tokens_per_turn)
    doc = measure.report_json(model_name(path), f"{engine.version} ({engine.commit}, {'+'.join(engine.backends)})",
                              opts.runs, rows, projection, model_path=str(path), repeat=opts.repeat,
                              first_run=opts.first_run,
                              configs={c.label: {"spec_types": list(c.speculator.spec_types),
                                                 "draft": str(c.speculator.draft) if c.speculator.draft else None,
                                                 "argv": argv[c.label]} for c in configs},
                              load=opts.load, threads=threads.to_json() if threads is not None else None)
    return rows, projection, doc


def with_settings(configs: list[BenchConfig], threads: str | None, flash_attn: str | None = None) -> list[BenchConfig]:
    """Each configuration once per --threads and --flash-attn setting; labels name a setting that is not the
    plan's."""
    return [replace(c, label=c.label + (f" t={t}" if t != "planned" else "") + (f" fa={f}" if f != "planned" else ""),
                    threads=t, flash_attn=f)
            for f in parse_flash_attn(flash_attn) for t in parse_threads(threads) for c in configs]


def run_agent_bench(opts: BenchOptions, progress: Callable[[int, int, str], None],
                    note: Callable[[str], None]) -> tuple[list[measure.Row], measure.Projection, dict]:
    """`bench --workload agent|DIR`: whole sessions turn by turn (bench.agent); the rows are empty (the JSON
    document carries the sessions, their turns and totals, and the measured projection)."""
    if not all(is_session(w) for w in opts.workloads):
        raise ConfigError("agent sessions and single-prompt workloads cannot be mixed in one bench",
                          "run `--workload agent` (or a recorded DIR) on its own")
    if opts.ctx:
        raise ConfigError("--ctx does not apply to agent sessions", "leave out --ctx")
    tokens = opts.tokens or 128
    path = resolve_model(opts.model, log=note)
    info = describe(path)
    engine = find_engine(opts.engine)
    # one pass per --runs, each shipped pass on a fresh prefix (another variant of the session)
    sessions = [agent.fitted_session(w, opts.prefix_tokens, opts.session_turns, r, tokens, info.n_ctx_train, note)
                for r in range(opts.runs) for w in opts.workloads]
    if opts.runs > 1:
        sessions = [replace(s, name=f"{s.name}#{i // len(opts.workloads) + 1}") for i, s in enumerate(sessions)]
    ctx = agent.session_ctx(sessions, tokens, info.n_ctx_train, note)
    configs = with_settings(
        [c for n in config_names(opts.spec, engine, info) for c in resolve_configs(n, info, engine, ctx, note)],
        opts.threads, opts.flash_attn)
    for s in sessions:
        for skipped in s.skipped:
            note(f"{s.name}: not replayed (not a generation): {skipped}")
    # A session's passes must each start cold: no host prompt cache (only the slot's own cache carries a prefix
    # from turn to turn), and the slots are erased before each pass (which needs a slot directory).
    with tempfile.TemporaryDirectory(prefix="bostudio-bench-slots-") as slots, CompetingLoad(opts.load) as load, \
            Bench(info, engine, configs, ctx, note, Path(slots)) as bench:
        turns, passes = agent.run_sessions(bench, sessions, tokens, load if opts.load else None, progress)
        argv = {c.label: bench.argv(c, 0)[1:] for c in configs}
        threads = bench.threads
    per_session = agent.sessions_json(turns)
    doc = {"model": model_name(path), "engine": f"{engine.version} ({engine.commit}, {'+'.join(engine.backends)})",
           "model_path": str(path), "workload": list(opts.workloads), "runs": opts.runs, "tokens_per_turn": tokens,
           "ctx": ctx, "load": opts.load, "threads": threads.to_json() if threads is not None else None,
           "sessions": per_session, "projection": agent.projection(per_session),
           # the pass's noise: servers doing the same work with the same settings (those of the first)
           "passes": agent.passes_json(passes, turns, [c.label for c in configs
                                                       if c.same_prefill and c.settings == configs[0].settings]),
           "configs": {c.label: {"spec_types": list(c.speculator.spec_types), "threads": c.threads,
                                 "flash_attn": c.flash_attn,
                                 "draft": str(c.speculator.draft) if c.speculator.draft else None,
                                 "argv": argv[c.label]} for c in configs}}
    return [], measure.Projection(0, tokens, {}), doc
