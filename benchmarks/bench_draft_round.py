"""Where a draft round's time goes, on the pinned llama-server: the smallest reproduction.

Starts two llama-servers with the same threads (the target alone, the draft alone) and measures, interleaved
three times: a decode step of each, and the target's batch of k new tokens after a cached prefix (what
verifying k-1 drafted tokens costs). Prints each in target decode steps, and the round cost the pairing
model (bostudio.pairing.core.cost.StepCost.round_cost) predicts from them, beside its own estimate.

Run: .venv/bin/python -m benchmarks.bench_draft_round TARGET.gguf DRAFT.gguf [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from bostudio.engine.discover import find_engine
from bostudio.gguf import describe
from bostudio.pairing.core.cost import draft_step_cost
from bostudio.runtime.net import free_loopback_port

BATCHES = (1, 2, 4, 9, 17)


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))


def _start(server: Path, model: Path, threads: int) -> tuple[int, subprocess.Popen]:
    port = free_loopback_port()
    proc = subprocess.Popen([str(server), "-m", str(model), "--port", str(port), "-c", "2048", "-np", "1",
                             "-t", str(threads), "-tb", str(threads), "--no-warmup",
                             # a sliding-window model (Gemma 3) reuses a cached prefix only with a full-size
                             # window cache; without it a "batch of k" recomputes part of the prefix
                             "--swa-full"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)).get("status") == "ok":
                return port, proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{model.name}: llama-server did not get ready")


def _decode_ms(port: int, tokens: list[int]) -> float:
    t = _post(port, "/completion", {"prompt": tokens, "n_predict": 24, "temperature": 0, "ignore_eos": True,
                                    "cache_prompt": True})["timings"]
    return t["predicted_ms"] / t["predicted_n"]


def _batch_ms(port: int, tokens: list[int], k: int) -> float:
    _post(port, "/completion", {"prompt": tokens, "n_predict": 1, "temperature": 0, "cache_prompt": True})
    t = _post(port, "/completion", {"prompt": tokens + tokens[50:50 + k], "n_predict": 1, "temperature": 0,
                                    "cache_prompt": True})["timings"]
    if t["prompt_n"] != k:
        raise SystemExit(f"expected a batch of {k} new tokens, the server processed {t['prompt_n']}")
    return t["prompt_ms"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("draft", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    server = find_engine(None).path
    text = (Path(__file__).resolve().parents[1] / "bostudio" / "pairing" / "core" / "compat.py").read_text()[:1200]
    (tp, tproc), (dp, dproc) = _start(server, args.target, args.threads), _start(server, args.draft, args.threads)
    try:
        tokens = _post(tp, "/tokenize", {"content": text})["tokens"][:256]
        rows: dict[str, list[float]] = {"target step": [], "draft step": []}
        rows.update({f"target batch of {k}": [] for k in BATCHES})
        for rep in range(args.reps):  # interleaved, so that a busy machine's drift hits every figure alike
            rows["target step"].append(_decode_ms(tp, tokens))
            rows["draft step"].append(_decode_ms(dp, tokens))
            for k in BATCHES:
                rows[f"target batch of {k}"].append(_batch_ms(tp, tokens, k))
    finally:
        for p in (tproc, dproc):
            p.terminate()
            p.wait(30)
    step = statistics.median(rows["target step"])
    print(f"llama-server {server}, -t {args.threads} -tb {args.threads}")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"  {name:20} {med:8.1f} ms  {med / step:5.2f} target steps  (runs: "
              + ", ".join(f"{v:.0f}" for v in values) + ")")
    c = statistics.median(rows["draft step"]) / step
    est = draft_step_cost(describe(args.target), describe(args.draft))
    per_token = (statistics.median(rows["target batch of 9"]) / step - 1) / 8
    print(f"draft step: measured {c:.2f}, estimated {est.ratio:.2f} (weight bytes); verification: measured "
          f"{per_token:.2f} target steps per extra token, planned {est.verify_per_token:.2f}")
    for n in (1, 3, 8):
        batch = 1 + per_token * n
        cost = n * c + batch * (1 + c)  # llama-server re-evaluates the verified batch in the draft
        print(f"  n_max {n}: a round costs {cost:.2f} target steps (model: {est.round_cost(n):.2f}); every token "
              f"accepted: at most {(n + 1) / cost:.2f}x of off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
