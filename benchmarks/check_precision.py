#!/usr/bin/env python3
"""Which weights make the lossless check exact on this CPU, and that the check can fail.

For each weight type (default: the embedded Gemma 3 270M Q4_K_M file, and copies at F16 and F32 made with the engine's
llama-quantize), one server without speculation and one with the Q4_K_M file as its draft
(`--spec-type draft-simple`, n_max 8) run the lossless test's prompts greedily; the script prints, per
prompt, whether the outputs are identical, where they first depart and at what margin, drafted/accepted
counts, and the decode speed without speculation (side by side, in one run).

    .venv/bin/python -m benchmarks.check_precision [--types Q4_K_M,F16,F32] [--tokens 128]
    .venv/bin/python -m benchmarks.check_precision --speed            # decode tok/s per type, interleaved
    .venv/bin/python -m benchmarks.check_precision --demo-failure     # the check against outputs that differ

Set LLAMA_SERVER to run it on another engine (e.g. the portable build: `bostudio engine build --portable`).

`--demo-failure` feeds the lossless rule (benchmarks/lossless.py:assert_lossless, which tests/test_lossless.py
applies) two "speculative" sides that are not lossless: a Q8_0 copy of the model, and the same F32 server
sampling at temperature 0.8. It prints what the rule reports for each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.lossless import GREEDY, PROMPTS, Greedy, assert_lossless, first_difference, launch
from bostudio.catalog.embedded import GEMMA_270M, ensure_embedded
from bostudio.engine.discover import find_engine
from bostudio.engine.quantize import precision_copy
from bostudio.runtime.client import LlamaClient
from bostudio.speculation import Speculator

TIMEOUT_S = 1800.0


def greedy(client: LlamaClient, prompt: str, tokens: int, probs: bool, **over: object) -> Greedy:
    params = dict(GREEDY, **over)
    extra = {"n_probs": 2} if probs else {}
    return Greedy.from_native(client.completion(prompt, tokens, timeout=TIMEOUT_S, return_tokens=True,
                                                **extra, **params))


def departure(base: Greedy, spec: Greedy) -> str:
    i = first_difference(base.tokens, spec.tokens)
    if i is None:
        return "identical"
    top = base.top[i]
    gap = {t: top[0][1] - lp for t, lp in top}.get(spec.tokens[i])
    where = f"token {i}: top-2 margin {top[0][1] - top[1][1]:.4f} nats"
    return f"departs at {where}" + (f", took a candidate {gap:.4f} behind" if gap is not None else
                                    ", took a token outside the baseline's top 2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_K_M,F16,F32", help="weight types, comma-separated")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--demo-failure", action="store_true")
    ap.add_argument("--speed", action="store_true", help="decode tok/s without speculation, types interleaved")
    args = ap.parse_args()
    engine = find_engine()
    q4 = ensure_embedded(GEMMA_270M, log=print)
    logs = Path(tempfile.mkdtemp(prefix="check-precision-"))
    if args.demo_failure:
        return demo_failure(engine, q4, args.tokens, logs)
    if args.speed:
        return speed(engine, q4, args.types.split(","), logs)
    print(f"engine {engine.path} ({engine.commit}); draft: {q4.name}; {args.tokens} tokens per prompt; logs {logs}")
    for qtype in args.types.split(","):
        model = q4 if qtype == "Q4_K_M" else precision_copy(q4, engine, qtype, log=print)
        off = launch(engine, model, f"{qtype}-off", Speculator("none"), logs)
        spec = launch(engine, model, f"{qtype}-draft", Speculator("draft", ("draft-simple",), draft=q4, n_max=8), logs)
        try:
            off.wait_ready()
            spec.wait_ready()
            with LlamaClient(off.base_url, timeout=None) as c_off, LlamaClient(spec.base_url, timeout=None) as c_sp:
                speeds, same = [], 0
                for name, prompt in PROMPTS.items():
                    base = greedy(c_off, prompt, args.tokens, probs=True)
                    plain = greedy(c_off, prompt, args.tokens, probs=False)
                    sp = greedy(c_sp, prompt, args.tokens, probs=False)
                    speeds.append(plain.timings["predicted_per_second"])
                    verdict = departure(base, sp)
                    same += verdict == "identical"
                    print(f"  {qtype:6} {name:16} {verdict:62} drafted {sp.timings.get('draft_n', 0):4} "
                          f"accepted {sp.timings.get('draft_n_accepted', 0):4}")
                print(f"{qtype}: {same}/{len(PROMPTS)} identical; decode without speculation "
                      f"{statistics.median(speeds):.1f} tok/s (median)")
        finally:
            off.stop()
            spec.stop()
    return 0


def speed(engine, q4: Path, types: list[str], logs: Path, rounds: int = 3, tokens: int = 64) -> int:  # type: ignore[no-untyped-def]
    """Decode tok/s of each type without speculation, the types taking turns on every prompt (ABBA), so
    that machine drift hits all alike."""
    models = {q: q4 if q == "Q4_K_M" else precision_copy(q4, engine, q, log=print) for q in types}
    procs = {q: launch(engine, m, f"{q}-speed", Speculator("none"), logs) for q, m in models.items()}
    try:
        clients = {}
        for q, p in procs.items():
            p.wait_ready()
            clients[q] = LlamaClient(p.base_url, timeout=None)
            clients[q].completion("Hello", 4, timeout=TIMEOUT_S)  # warm-up
        got: dict[str, list[float]] = {q: [] for q in clients}
        for r in range(rounds):
            for prompt in PROMPTS.values():
                for q in (types if r % 2 == 0 else types[::-1]):
                    got[q].append(greedy(clients[q], prompt, tokens, probs=False).timings["predicted_per_second"])
        base = statistics.median(got[types[-1]])
        for q, v in got.items():
            print(f"{q:7} decode {statistics.median(v):6.1f} tok/s median ({min(v):.1f}-{max(v):.1f}, n={len(v)}), "
                  f"{statistics.median(v) / base:.2f}x {types[-1]}")
    finally:
        for p in procs.values():
            p.stop()
    return 0


def demo_failure(engine, q4: Path, tokens: int, logs: Path) -> int:  # type: ignore[no-untyped-def]
    f32 = precision_copy(q4, engine, "F32", log=print)
    q8 = precision_copy(q4, engine, "Q8_0", log=print)
    off = launch(engine, f32, "f32-off", Speculator("none"), logs)
    other = launch(engine, q8, "q8-off", Speculator("none"), logs)
    try:
        off.wait_ready()
        other.wait_ready()
        with LlamaClient(off.base_url, timeout=None) as c_off, LlamaClient(other.base_url, timeout=None) as c_q8:
            for name, prompt in PROMPTS.items():
                base = greedy(c_off, prompt, tokens, probs=True)
                sides = {"Q8_0 copy": greedy(c_q8, prompt, tokens, probs=False),
                         "temperature 0.8": greedy(c_off, prompt, tokens, probs=False,
                                                   temperature=0.8, top_k=40, seed=1234)}
                for label, side in sides.items():
                    try:
                        assert_lossless(base, side, f"{label} on {name!r}")
                        print(f"PASSED  {label} on {name!r}: {departure(base, side)}")
                    except AssertionError as exc:
                        print(f"FAILED  {exc}")
    finally:
        off.stop()
        other.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
