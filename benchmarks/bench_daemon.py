#!/usr/bin/env python
"""What the daemon costs: the same llama-server instance measured through the daemon's endpoint and
directly on its own port, interleaved in one run.

    decode throughput through the daemon / direct   (target >= 98%)
    added time to first token, median                (target <= 2 ms)

Usage: python -m benchmarks.bench_daemon [--model NAME_OR_PATH] [--runs N] [--tokens N] [--ttft-runs N]
It starts its own daemon (temporary state dir, free port) and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from bostudio.runtime.net import free_loopback_port

ROOT = Path(__file__).resolve().parent.parent


def stream(http: httpx.Client, body: dict) -> tuple[float, list[float], dict]:
    """(request start, arrival time of each token chunk, final timings) of one streamed completion."""
    try:
        return _stream(http, body)
    except httpx.RemoteProtocolError as exc:
        # llama-server sometimes closes a keep-alive connection right after a streamed response;
        # a request sent on it that very moment gets no answer (the daemon retries such requests
        # itself, inside its timing; this retry of the direct path is outside it).
        if "without sending a response" not in str(exc):
            raise
        return _stream(http, body)


def _stream(http: httpx.Client, body: dict) -> tuple[float, list[float], dict]:
    t0 = time.perf_counter()
    arrivals: list[float] = []
    timings: dict = {}
    with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("choices") and data["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
            timings = data.get("timings", timings)
    return t0, arrivals, timings


def main() -> int:
    # A SIGTERM must still stop the daemon this script started (the finally below).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma-3-270m-q4_k_m")
    ap.add_argument("--runs", type=int, default=6, help="decode runs per side (default 6)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per decode run (default 128)")
    ap.add_argument("--ttft-runs", type=int, default=40, help="time-to-first-token runs per side (default 40)")
    ap.add_argument("--spec", default="off", help="speculation of the instance (default off: steadier numbers)")
    ap.add_argument("--engine", default=None, help="llama-server binary (default: the one bostudio chooses)")
    args = ap.parse_args()
    if args.ttft_runs < 2:
        ap.error("--ttft-runs must be at least 2 (the report has a p90)")

    tmp = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    env = dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), XDG_CONFIG_HOME=str(tmp / "config"),
               PYTHONPATH=str(ROOT))
    port = free_loopback_port()
    extra = ["--engine", args.engine] if args.engine else []
    daemon = subprocess.Popen([sys.executable, "-m", "bostudio", "daemon", "--port", str(port), "--idle-ttl", "0",
                               *extra],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/bostudio/status", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or daemon.poll() is not None:
                print("the daemon did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)
        model = args.model
        if Path(model).expanduser().is_file():
            model = str(Path(model).expanduser().resolve())
        r = httpx.post(url + "/bostudio/instances", json={"model": model, "spec": args.spec}, timeout=600,
                       trust_env=False)
        r.raise_for_status()
        inst = r.json()
        name = inst["model"]
        key = psutil.Process(inst["pid"]).environ()["LLAMA_API_KEY"]  # the child's key, as only we can read it
        # Both clients expire idle connections before llama-server's 5 s keep-alive timeout.
        limits = httpx.Limits(keepalive_expiry=2.0)
        via_daemon = httpx.Client(base_url=url, timeout=300, trust_env=False, limits=limits)
        direct = httpx.Client(base_url=f"http://127.0.0.1:{inst['port']}", timeout=300, trust_env=False,
                              headers={"Authorization": f"Bearer {key}"}, limits=limits)
        sides = {"direct": direct, "daemon": via_daemon}
        print(f"model {name} (speculation {inst['speculation']}), llama-server pid {inst['pid']} "
              f"port {inst['port']}; daemon {url}")

        # Warm both paths (connections, prompt cache).
        for http in sides.values():
            stream(http, {"model": name, "prompt": "Hello", "max_tokens": 4, "stream": True, "temperature": 0})

        # Time to first token: a cached one-word prompt, one token, so overhead dominates. Interleaved.
        ttft: dict[str, list[float]] = {s: [] for s in sides}
        body = {"model": name, "prompt": "Hello", "max_tokens": 1, "stream": True, "temperature": 0}
        for i in range(args.ttft_runs):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for side in order:
                t0, arrivals, _ = stream(sides[side], body)
                ttft[side].append(1000 * (arrivals[0] - t0))

        # Decode throughput: tokens after the first over the time they took, seen by the client.
        tps: dict[str, list[float]] = {s: [] for s in sides}
        server_tps: dict[str, list[float]] = {s: [] for s in sides}
        prompt = "Write a long story about a lighthouse keeper and the sea."
        for i in range(args.runs):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for side in order:
                _, arrivals, timings = stream(sides[side], {"model": name, "prompt": prompt, "stream": True,
                                                            "max_tokens": args.tokens, "temperature": 0,
                                                            "ignore_eos": True})
                tps[side].append((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))
                server_tps[side].append(float(timings.get("predicted_per_second", 0)))

        med = {s: statistics.median(v) for s, v in ttft.items()}
        dec = {s: statistics.median(v) for s, v in tps.items()}
        print(f"time to first token, median of {args.ttft_runs}: direct {med['direct']:.2f} ms, "
              f"daemon {med['daemon']:.2f} ms -> added {med['daemon'] - med['direct']:.2f} ms (target <= 2 ms)")
        paired = [d - x for d, x in zip(ttft["daemon"], ttft["direct"])]
        print(f"  paired difference, median {statistics.median(paired):.2f} ms; "
              f"p90 direct {statistics.quantiles(ttft['direct'], n=10)[-1]:.2f} ms, "
              f"daemon {statistics.quantiles(ttft['daemon'], n=10)[-1]:.2f} ms")
        print(f"decode throughput, median of {args.runs} x {args.tokens} tokens (client side): "
              f"direct {dec['direct']:.1f} tok/s, daemon {dec['daemon']:.1f} tok/s -> "
              f"{100 * dec['daemon'] / dec['direct']:.1f}% of direct (target >= 98%)")
        print(f"  server-reported: direct {statistics.median(server_tps['direct']):.1f} tok/s, "
              f"daemon {statistics.median(server_tps['daemon']):.1f} tok/s")
        via_daemon.close()
        direct.close()
        return 0
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()


if __name__ == "__main__":
    raise SystemExit(main())
