#!/usr/bin/env python3
"""Benchmark: decode speed with speculation off vs `--spec auto` (or a given --spec, or a self-draft), side by
side in one run, plus the time `bostudio up` takes to be ready. Prints the numbers, ratios and acceptance.

    .venv/bin/python -m benchmarks.bench_spec [MODEL] [--tokens N] [--repeats R] [--spec MODE]
    .venv/bin/python -m benchmarks.bench_spec [MODEL] --self-draft Q2_K     # make/reuse a low-bit copy as draft

Workloads (greedy): a code continuation sent several times (n-gram speculation learns from what
the server generated before, so the first run and the repeats are reported apart) and a prose prompt.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bostudio.runtime.client import LlamaClient
from bostudio.runtime.net import free_loopback_port
from bostudio.runtime.process import ServerProcess
from bostudio.catalog.resolve import resolve_model
from bostudio.engine.discover import find_engine
from bostudio.pairing.edge.pair import make_self_draft
from bostudio.up import Prepared, UpOptions, prepare_launch

CODE = (
    "import json\nfrom dataclasses import dataclass\n\n\n@dataclass\nclass User:\n    name: str\n"
    "    email: str\n    age: int\n\n    def to_json(self) -> str:\n        return json.dumps({\"name\": self.name, "
    "\"email\": self.email, \"age\": self.age})\n\n\n@dataclass\nclass Order:\n    id: int\n    user: User\n"
)
COMPLETION_TIMEOUT_S = 900.0  # a loaded shared CPU can take minutes for one request
PROSE = "The history of the printing press begins in the fifteenth century, when"


def measure(opts: UpOptions, tokens: int, repeats: int, logdir: Path) -> tuple[Prepared, dict]:
    """Launch exactly what `bostudio up` would for `opts`, and time the workloads."""
    prep = prepare_launch(replace(opts, port=free_loopback_port()), note=lambda m: None)
    server = ServerProcess(prep.argv, prep.launch.port, logdir / f"{opts.spec}.log")
    server.start()
    try:
        server.wait_ready()
        out: dict = {}
        with LlamaClient(server.base_url, timeout=None) as c:
            c.completion("Hello", 4, timeout=COMPLETION_TIMEOUT_S)  # warm-up
            runs = [c.completion(CODE, tokens, timeout=COMPLETION_TIMEOUT_S)["timings"] for _ in range(repeats)]
            out["code, first run"] = [runs[0]]
            out["code, repeats"] = runs[1:]
            out["prose"] = [c.completion(PROSE, tokens, timeout=COMPLETION_TIMEOUT_S)["timings"]]
        return prep, out
    finally:
        server.stop()


def time_up(model: str | None) -> float:
    port = free_loopback_port()
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "bostudio", "up", *( [model] if model else []), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("Press Ctrl-C"):
                return time.monotonic() - started
        raise SystemExit("bostudio up exited before it was ready")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spec", default="auto", help="auto | ngram | mtp | draft:PATH (default auto)")
    ap.add_argument("--self-draft", default=None, metavar="QUANT", help="draft with a QUANT copy of the model")
    ap.add_argument("--no-up", action="store_true", help="skip timing `bostudio up`")
    args = ap.parse_args()

    spec = args.spec
    if args.self_draft:
        spec = f"draft:{make_self_draft(resolve_model(args.model), args.self_draft, find_engine(), log=print)}"
    with tempfile.TemporaryDirectory() as tmp:
        _, off = measure(UpOptions(model=args.model, spec="off"), args.tokens, args.repeats, Path(tmp))
        prep, on = measure(UpOptions(model=args.model, spec=spec), args.tokens, args.repeats, Path(tmp))
    e = prep.engine
    print(f"model: {prep.launch.model.name}  engine: {e.path} ({e.version}, {e.commit})  cpus: {os.cpu_count()}")
    print(f"--spec {spec} picks: {prep.launch.speculator.label} ({prep.launch.speculator.reason})")
    print(f"launch: {' '.join(prep.argv[1:])}")
    print(f"\n{'workload':22s} {'off tok/s':>10s} {'spec tok/s':>11s} {'ratio':>7s} {'accepted/drafted':>18s}")
    for name in off:
        if not off[name]:  # --repeats 1: the first run and no repeats
            continue
        a = statistics.mean(t["predicted_per_second"] for t in off[name])
        b = statistics.mean(t["predicted_per_second"] for t in on[name])
        drafted = sum(t.get("draft_n", 0) for t in on[name])
        accepted = sum(t.get("draft_n_accepted", 0) for t in on[name])
        rate = f"{100 * accepted / drafted:.0f}%" if drafted else "-"
        print(f"{name:22s} {a:10.1f} {b:11.1f} {b / a:6.2f}x {accepted:>8d}/{drafted:<8d} {rate:>5s}")
    if not args.no_up:
        print(f"\n`bostudio up` to ready (launch, health, probe): {time_up(args.model):.1f} s")


if __name__ == "__main__":
    main()
