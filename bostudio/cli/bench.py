"""`bostudio bench` and `bostudio tune`: parsing and printing only (the work is in bostudio/bench/)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bostudio.cli.options import add_engine, model_or_default

BAR = 28


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress(done: int, total: int, msg: str) -> None:
    # One line per step on stderr (the TUI reads them); a bar so that a person sees how far it is.
    filled = BAR * done // max(1, total)
    print(f"bench [{'#' * filled}{'-' * (BAR - filled)}] {done}/{total} {msg}", file=sys.stderr, flush=True)


def cmd_bench(args: argparse.Namespace) -> int:
    from bostudio.bench import report
    from bostudio.bench.service import BenchOptions, run_bench

    workloads = tuple(w for arg in args.workload for w in arg.split(",") if w) if args.workload else (
        () if args.ctx and args.ctx_only else ("code", "edit", "chat"))
    opts = BenchOptions(model=args.model, workloads=workloads, spec=args.spec, ctx=args.ctx, runs=args.runs,
                        tokens=args.tokens, repeat=args.repeat, first_run=args.first_run, turns=args.turns,
                        tokens_per_turn=args.tokens_per_turn, engine=args.engine, load=args.load,
                        threads=args.threads, flash_attn=args.flash_attn, prefix_tokens=args.prefix_tokens,
                        session_turns=args.session_turns)
    if args.plot:  # checked before the run: found after an hour of measuring, a bad --plot would lose the hour
        import importlib.util

        from bostudio.errors import ConfigError
        if Path(args.plot).suffix.lower() != ".png":
            raise ConfigError(f"--plot writes a PNG, and {args.plot} does not end in .png", "e.g. --plot bench.png")
        if importlib.util.find_spec("matplotlib") is None:
            raise ConfigError("--plot needs matplotlib, which is not installed",
                              "pip install 'bostudio[plot]' (or pip install matplotlib), or leave out --plot")
    rows, projection, doc = run_bench(opts, _progress, _note)
    if "sessions" in doc:
        return _print_sessions(args, doc)
    if _plot_and_json(args, doc, lambda path: report.plot(rows, path, f"{doc['model']} - {doc['engine']} - "
                                                                    f"{doc['runs']} run(s)")):
        return 0
    print(f"{doc['model']} on llama-server {doc['engine']}; {doc['runs']} interleaved run(s), "
          f"{'the same prompts each run (--repeat)' if args.repeat else 'fresh prompts each run'}")
    print(report.table(rows, projection))
    return 0


def _plot_and_json(args: argparse.Namespace, doc: dict, plot) -> bool:  # type: ignore[no-untyped-def]
    """--plot (the chart's path goes into the JSON) and --json; True when the JSON was printed."""
    if args.plot:
        out = plot(Path(args.plot))
        doc["plot"] = str(out)
        _note(f"chart written to {out}")
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return bool(args.json)


def _print_sessions(args: argparse.Namespace, doc: dict) -> int:
    from bostudio.bench import agent

    if _plot_and_json(args, doc, lambda path: agent.plot(doc, path, f"{doc['model']} - {doc['engine']} - agent "
                                                                   f"sessions, {doc['tokens_per_turn']} tokens a turn")):
        return 0
    print(f"{doc['model']} on llama-server {doc['engine']}; agent sessions turn by turn, at most "
          f"{doc['tokens_per_turn']} output tokens a turn, ctx {doc['ctx']}"
          + (f", beside {doc['load']} busy process(es)" if doc["load"] else ""))
    print(agent.table(doc))
    return 0


def _paired_draft(model: Path, engine) -> Path | None:  # type: ignore[no-untyped-def]
    """The draft model the pairing tables and auto-detection offer for `model` (chosen or passed over for its
    break-even: tune measures what the estimate could only guess), or None."""
    from bostudio.gguf import describe
    from bostudio.pairing.edge.pair import choose
    from bostudio.speculation import SpecRequest

    sel, _ = choose(describe(model), SpecRequest("auto"), engine)
    return next((c.draft.path for c in sel.considered if c.draft is not None and c.speculator is not None
                 and c.speculator.kind == "draft" and not c.fetch and c.step is not None), None)


def cmd_tune(args: argparse.Namespace) -> int:
    from bostudio.bench.tune import ranking, run_tune
    from bostudio.bench.workloads import resolve_workloads
    from bostudio.catalog.resolve import resolve_model
    from bostudio.engine.discover import find_engine
    from bostudio.errors import ConfigError
    from bostudio.pairing.edge.pair import make_self_draft

    if args.budget_s < 10:
        raise ConfigError(f"--budget-s {args.budget_s} is too short to measure anything", "give at least 10 s")
    model = resolve_model(args.model, log=_note)
    engine = find_engine(args.engine)
    draft = None
    if args.draft:
        draft = Path(args.draft).expanduser()
        if not draft.is_file():
            raise ConfigError(f"draft model {draft} not found", "pass an existing .gguf file as --draft")
    elif args.self_draft:
        draft = make_self_draft(model, args.self_draft, engine, log=_note)
    else:
        draft = _paired_draft(model, engine)
        if draft is not None:
            _note(f"tune: the pairing's draft model {draft.name} is swept too (--draft to name another)")
    from bostudio.bench.sessions import is_session
    from bostudio.bench.tune_sessions import run_tune_sessions

    names = [w for arg in args.workload for w in arg.split(",") if w] if args.workload else ["code"]
    out = []
    budget = args.budget_s / len(names)
    sessions = [n for n in names if is_session(n)]
    prompts = resolve_workloads([n for n in names if not is_session(n)])
    for name in sessions:
        _note(f"tuning {model.name} on agent session {name!r} within {budget:.0f} s")
        out.append(run_tune_sessions(model, engine, name, budget, args.tokens, draft, lambda m: _note(f"tune: {m}"),
                                     args.prefix_tokens, args.session_turns))
    for name, tasks in prompts.items():
        _note(f"tuning {model.name} for workload {name!r} within {budget:.0f} s")
        res = run_tune(model, engine, name, tasks, budget, args.tokens, draft,
                       lambda m: _note(f"tune: {m}"))
        out.append(res)
    if args.json:
        json.dump([{"profile": r.profile.to_json(), "path": str(r.path), "rounds": r.rounds,
                    "elapsed_s": r.elapsed_s, "baseline_tok_s": list(r.baseline),
                    "sweep": [{"label": t.candidate.label, **t.measured().__dict__} for t in r.tallies if t.samples]}
                   for r in out], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for r in out:
        p = r.profile
        print(f"workload {p.workload}: {p.why}")
        print(f"  baseline (off): {p.baseline_tok_s:.1f} tok/s over {len(r.baseline)} paired runs; "
              f"the best's interval +/-{100 * p.noise:.0f}%; {r.rounds} round(s) in {r.elapsed_s:.0f} s")
        for t in ranking(r.tallies):
            m = t.measured()
            acc = f"{100 * m.acceptance:.0f}%" if m.acceptance is not None else "-"
            mark = "*" if p.chosen and m.label == p.chosen.label else " "
            print(f"  {mark} {m.label:<40} {m.tok_s:7.1f} tok/s {m.speedup:5.2f}x "
                  f"(range {m.speedup_min:.2f}-{m.speedup_max:.2f}, low {m.speedup_low:.2f}) accept {acc:>4} "
                  f"x{m.samples}")
        if p.break_even_acceptance is not None:
            print(f"  break-even acceptance at run time: {100 * p.break_even_acceptance:.0f}%")
        print(f"  profile: {r.path} (`bostudio up --workload {p.workload}` and the daemon use it)")
    return 0


def _add_session_options(p) -> None:  # type: ignore[no-untyped-def]
    """The shipped agent session's size (bench and tune)."""
    p.add_argument("--prefix-tokens", type=int, default=18000, metavar="N",
                   help="agent: the shipped session's system prompt and tools, in tokens (default 18000)")
    p.add_argument("--session-turns", type=int, default=12, metavar="N",
                   help="agent: the shipped session's turns (default 12)")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", parents=[model_or_default()],
                       help="measure speculation side by side: tok/s, speed-up, acceptance",
                       description="Run the same prompts with speculation off and with each speculator, on the "
                                   "same engine in one run, interleaved (A B A B), fresh prompts each run. Per "
                                   "configuration: decode tok/s (its tokens over its decode time, summed over the "
                                   "prompts; each request's min-max), speed-up against off on the same prompts "
                                   "(the time a user waits) with the spread of the paired ratios, acceptance (accepted/drafted), mean accepted "
                                   "length (tokens per target forward), prompt tok/s. --ctx adds a context "
                                   "sweep filled with real code. Progress goes to stderr.")
    p.add_argument("--workload", action="append", default=None, metavar="W",
                   help="code | edit | chat | a prompt FILE; repeat or comma-separate (default: code,edit,chat); "
                        "or agent sessions, turn by turn: `agent` (the shipped session: a system prompt and tool "
                        "schemas of --prefix-tokens, then --session-turns turns of tool calls and edits on "
                        "bostudio's own source) or a DIR recorded with `bostudio daemon --record DIR`")
    _add_session_options(p)
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="also measure beside N busy processes (CPU-bound loops in their own process group, paused "
                        "for the samples taken alone, killed at the end): each sample alone and beside the load")
    p.add_argument("--threads", default=None, metavar="LIST",
                   help="CPU thread settings to compare: planned (the plan's -t/-tb, the default), all (every "
                        "core), T or T/TB; e.g. --threads planned,all --load 1")
    p.add_argument("--flash-attn", default=None, metavar="LIST",
                   help="flash attention settings to compare: planned (the plan's -fa, the default), on, off; "
                        "e.g. --flash-attn on,off")
    p.add_argument("--spec", default=None, metavar="LIST",
                   help="comma-separated configurations besides off: ngram-simple, ngram-map-k, ngram-map-k4v, "
                        "ngram-mod, ngram-cache, auto[@WORKLOAD] (as `up --workload` runs it: the tuned profile), "
                        "sweep@WORKLOAD[:N] (the N best of that workload's tuned sweep, default 3), mtp, "
                        "self-draft[:QUANT], draft:PATH (default: every "
                        "n-gram variant, plus mtp when the model has the head)")
    p.add_argument("--ctx", default=None, metavar="LIST",
                   help="context sweep, e.g. 4k,16k,32k: the prompt is filled with real code to each length "
                        "(lengths beyond what fits are left out with a note)")
    p.add_argument("--ctx-only", action="store_true", help="with --ctx and no --workload: only the sweep")
    p.add_argument("--runs", type=int, default=3, metavar="N", help="interleaved runs (default 3)")
    p.add_argument("--tokens", type=int, default=None, metavar="N",
                   help="output tokens per request (default: each task's own fixed length, 128-160; agent "
                        "sessions: 128 a turn)")
    p.add_argument("--repeat", action="store_true",
                   help="send the same prompts every run (n-gram state from earlier runs then flatters)")
    p.add_argument("--first-run", type=int, default=0, metavar="N",
                   help="send the prompts of runs N, N+1, ... (default 0: run r is the same prompt in every "
                        "bench, e.g. the same function on edit; another N asks other functions, modules and "
                        "topics; tune's prompts start at 1000)")
    p.add_argument("--turns", type=int, default=50, metavar="N", help="projection: agent turns (default 50)")
    p.add_argument("--tokens-per-turn", type=int, default=400, metavar="M",
                   help="projection: output tokens per turn (default 400)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="write a PNG: tok/s against context, and a bar chart per workload (needs matplotlib)")
    add_engine(p, "llama-server binary (default: the best found)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", parents=[model_or_default()],
                       help="find the speculator and parameters that pay for a model and workload",
                       description="Sweep the available speculators and their parameters (n-gram types and sizes, "
                                   "draft n_max 1-8 and p_min, MTP n_max, n-gram + draft) by successive halving "
                                   "(each round whole sets of one prompt per task of the workload, at least 3 prompts in "
                                   "round 1, doubling; the better half by speed-up over off goes on, and from round 2 any "
                                   "other the leader did not beat beyond the noise of the same prompts; whole rounds only) "
                                   "within --budget-s, each candidate paired with off on the same prompts (off runs each "
                                   "prompt once, shared by the candidates). Picks "
                                   "the best measured gain for its risk (the gain: its tokens over its time against "
                                   "off's on the same prompts; the risk: how far that speed-up's 90% interval "
                                   "reaches below 1.03, the part below 1 counted twice); "
                                   "a tuned variant only when it beats the types at their defaults by more than "
                                   "3% and beyond the noise of the same prompts; off when no gain outweighs its "
                                   "risk and nothing won clearly (3+ pairs, "
                                   "none slower than off beyond the 3% floor, the speed-up beyond twice it). "
                                   "Saves a profile per "
                                   "(model file, engine commit + backend, "
                                   "workload) under $XDG_STATE_HOME/bostudio/profiles that `up --workload W` and "
                                   "the daemon use; a profile older than the engine build or the model is ignored.")
    p.add_argument("--workload", action="append", default=None, metavar="W",
                   help="code | edit | chat | a prompt FILE; one profile each (default: code); or `agent` / a "
                        "recorded session DIR: tune on whole sessions (a pass = the session replayed turn by "
                        "turn beside off; ranked by session wall time; it opens with a screen of every n-gram "
                        "type's default in one pass, as many turns as the budget allows), profile `agent` / the "
                        "DIR's name")
    _add_session_options(p)
    p.add_argument("--budget-s", type=float, default=600.0, metavar="S",
                   help="time for the whole sweep, split between the workloads (default 600); a bound: each "
                        "round (and for sessions each pass) is estimated from what was measured and not started "
                        "when it would not end within it")
    p.add_argument("--tokens", type=int, default=None, metavar="N", help="output tokens per request "
                   "(default: each task's own length)")
    p.add_argument("--draft", default=None, metavar="PATH",
                   help="a draft model to sweep draft-simple with (default: the one `bostudio pair` finds for "
                        "MODEL, chosen or passed over)")
    p.add_argument("--self-draft", default=None, metavar="QUANT",
                   help="sweep draft-simple with a QUANT copy of MODEL (made with llama-quantize, cached)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_engine(p, "llama-server binary (default: the best found)")
    p.set_defaults(func=cmd_tune)
