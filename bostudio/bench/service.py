"""`bostudio bench`: the workloads x configurations, run interleaved, summarised (the edge of bench/)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bostudio.bench import measure
from bostudio.bench.runner import (Bench, Plan, bench_decision, config_names, parse_ctx_list, resolve_configs, run,
                                   sweep_fits)
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
    turns: int = 50
    tokens_per_turn: int = 400
    engine: str | None = None


def run_bench(opts: BenchOptions, progress: Callable[[int, int, str], None],
              note: Callable[[str], None]) -> tuple[list[measure.Row], measure.Projection, dict]:
    """Run the bench; returns the rows, the projection and the JSON document."""
    if opts.runs < 1:
        raise ConfigError(f"--runs {opts.runs} is not a number of runs", "use --runs 1 or more")
    if opts.tokens is not None and not 1 <= opts.tokens <= 4096:
        raise ConfigError(f"--tokens {opts.tokens} is out of range", "use 1 to 4096 output tokens")
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
    configs = [c for n in config_names(opts.spec, engine, info) for c in resolve_configs(n, info, engine, ctx, note)]
    plan = Plan(workloads, opts.runs, tuple(sweep), opts.tokens, opts.repeat, len(configs))
    with Bench(info, engine, configs, ctx, note) as bench:
        samples = run(bench, plan, progress)
        argv = {c.label: bench.argv(c, 0)[1:] for c in configs}
    rows = measure.summarise(samples)
    projection = measure.project(rows, opts.turns, opts.tokens_per_turn)
    doc = measure.report_json(model_name(path), f"{engine.version} ({engine.commit}, {'+'.join(engine.backends)})",
                              opts.runs, rows, projection, model_path=str(path), repeat=opts.repeat,
                              configs={c.label: {"spec_types": list(c.speculator.spec_types),
                                                 "draft": str(c.speculator.draft) if c.speculator.draft else None,
                                                 "argv": argv[c.label]} for c in configs})
    return rows, projection, doc


def write_plot(rows: list[measure.Row], out: Path, title: str) -> Path:
    from bostudio.bench.report import plot

    return plot(rows, out, title)
