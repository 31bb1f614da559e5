#!/usr/bin/env python3
"""Benchmark: the tune goal (auto within reach of the best measured configuration), end to end. For each
workload, `bostudio tune` (with a self-draft copy, so that draft-simple is in the sweep), then one
`bostudio bench` run with off, `auto@W` (as `up --workload W` runs it), the sweep's three best, every n-gram
variant, self-draft and draft-simple (the model drafting for itself). Prints markdown tables and, per
workload, auto / the best configuration and auto / off.

    .venv/bin/python -m benchmarks.bench_tune_goal [MODEL] [--out DIR] [--budget code=1200,edit=600,chat=600]
                                                 [--runs code=5,edit=10,chat=10] [--tokens N]

Profiles go to DIR/state (not your own), so a run changes nothing `bostudio up` uses. About 65 minutes on 2
cores with the defaults; run it on a quiet machine: the figures are ratios within one run, but a busy
machine widens their spread.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.commands import bostudio

NGRAM = "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache"


def per_workload(value: str) -> dict[str, int]:
    return {k: int(v) for k, _, v in (part.partition("=") for part in value.split(","))}


def tune_table(res: dict) -> str:
    p = res["profile"]
    lines = [f"### tune {p['workload']}: {res['rounds']} rounds in {res['elapsed_s']:.0f} s, "
             f"off {p['baseline_tok_s']:.1f} tok/s\n", p["why"], "",
             "| candidate | prompts | tok/s | paired speed-up (90% low) | acceptance |", "|---|---|---|---|---|"]
    for m in sorted(res["sweep"], key=lambda m: (-m["samples"], -m["tok_s"])):
        acc = "-" if m["acceptance"] is None else f"{100 * m['acceptance']:.0f}%"
        star = "**" if p["chosen"] and m["label"] == p["chosen"]["label"] else ""
        lines.append(f"| {star}{m['label']}{star} | {m['samples']} | {m['tok_s']:.1f} | "
                     f"{m['speedup']:.2f}x ({m['speedup_low']:.2f}) | {acc} |")
    return "\n".join(lines)


def bench_table(doc: dict) -> str:
    rows = [r for r in doc["results"] if r["ctx"] is None]
    lines = [f"### bench {rows[0]['workload']}: {doc['runs']} interleaved runs, {doc['engine']}\n",
             "| configuration | tok/s (each request's min-max) | speed-up (paired min-max) | acceptance "
             "| accepted length "
             "| prompt tok/s |", "|---|---|---|---|---|---|"]
    def speedup(r: dict) -> float:  # off's own is 1; every configuration ran the same prompts
        return r["speedup"] or 1.0

    for r in sorted(rows, key=lambda r: -speedup(r)):
        sp = "1.00x" if r["speedup"] is None else f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
        acc = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f}% ({r['accepted']}/{r['drafted']})"
        length = "-" if r["accept_len"] is None else f"{r['accept_len']:.2f}"
        prompt = "-" if r["prompt_tok_s"] is None else f"{r['prompt_tok_s']:.0f}"
        lines.append(f"| {r['config']} | {r['tok_s_total']:.1f} ({r['tok_s_min']:.1f}-{r['tok_s_max']:.1f}) | "
                     f"{sp} | {acc} | {length} | {prompt} |")
    auto = next(r for r in rows if r["config"].startswith("auto@"))
    best = max(rows, key=speedup)
    # the goal: within 3% of the best, and not below off by more than the 3% two identical runs differ by
    ok = speedup(auto) >= 0.97 * speedup(best) and speedup(auto) >= 0.97
    lines.append(f"\nauto / best ({best['config']}): {speedup(auto) / speedup(best):.3f}; auto / off: "
                 f"{speedup(auto):.3f} (paired {auto['speedup_min'] or 1:.2f}-"
                 f"{auto['speedup_max'] or 1:.2f}); goal {'met' if ok else 'NOT met'}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench-tune-goal"))
    ap.add_argument("--budget", type=per_workload, default=per_workload("code=1200,edit=600,chat=600"))
    ap.add_argument("--runs", type=per_workload, default=per_workload("code=5,edit=10,chat=10"))
    ap.add_argument("--tokens", type=int, default=None, help="output tokens per request (default: each task's)")
    ap.add_argument("--self-draft", default="Q2_K")
    args = ap.parse_args()
    if set(args.budget) != set(args.runs):
        sys.exit("--budget and --runs name different workloads")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, XDG_STATE_HOME=str(out / "state"), XDG_CONFIG_HOME=str(out / "config"))
    from bostudio.catalog.resolve import resolve_model
    model = str(resolve_model(args.model, log=lambda m: None))
    tokens = ["--tokens", str(args.tokens)] if args.tokens else []
    for w in args.budget:
        res = bostudio(["tune", model, "--workload", w, "--budget-s", str(args.budget[w]), "--self-draft",
                        args.self_draft, *tokens], out / f"tune-{w}", env)
        print(tune_table(res[0]) + "\n", flush=True)
    for w in args.runs:
        spec = f"auto@{w},sweep@{w}:3,{NGRAM},self-draft:{args.self_draft},draft:{model}"
        doc = bostudio(["bench", model, "--workload", w, "--runs", str(args.runs[w]), "--spec", spec, *tokens,
                        "--plot", str(out / f"bench-{w}.png")], out / f"bench-{w}", env)
        print(bench_table(doc) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
