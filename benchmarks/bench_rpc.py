#!/usr/bin/env python3
"""Benchmark: what RPC costs on this machine. Decode tok/s of one model local-only against the same
model split over two rpc-servers on 127.0.0.1 (plus the local CPU), interleaved in one run, with
speculation off so the number is the split's alone. Launches exactly what `bostudio up` would
(prepare_launch), with per-worker budgets that force a three-way split.

    .venv/bin/python -m benchmarks.bench_rpc [MODEL] [--tokens N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bostudio.catalog.resolve import resolve_model
from bostudio.engine.discover import find_engine
from bostudio.gguf import describe
from bostudio.planner.memory import MIB
from bostudio.planner.pool import placement_lines
from bostudio.rpc.serve import RpcServeOptions, serve_argv
from bostudio.runtime.client import LlamaClient
from bostudio.runtime.net import free_loopback_port
from bostudio.runtime.process import ServerProcess
from bostudio.up import UpOptions, prepare_launch

PROSE = "The history of the printing press begins in the fifteenth century, when"
TIMEOUT_S = 900.0


def start_worker(rpc_server: Path, logdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_loopback_port()
    out = logdir / f"rpc-{port}.log"
    proc = subprocess.Popen(serve_argv(rpc_server, RpcServeOptions(port=port, threads=1)),
                            stdout=open(out, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:  # its stdout is block-buffered into the file: wait for the port instead
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"rpc-server did not start: {out.read_text()[-500:]}")
        time.sleep(0.1)
    return proc, port


def measure(opts: UpOptions, tokens: int, logdir: Path, tag: str) -> tuple[float, list[str]]:
    prep = prepare_launch(replace(opts, port=free_loopback_port()), note=lambda m: print(m, file=sys.stderr))
    server = ServerProcess(prep.argv, prep.launch.port, logdir / f"{tag}.log")
    server.start()
    try:
        server.wait_ready(timeout=TIMEOUT_S)
        with LlamaClient(server.base_url, timeout=None) as c:
            c.completion("Hello", 4, timeout=TIMEOUT_S)  # warm-up
            t = c.completion(PROSE, tokens, timeout=TIMEOUT_S)["timings"]
        return float(t["predicted_per_second"]), placement_lines(prep.plan)
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    model = resolve_model(args.model, log=lambda m: None)
    engine = find_engine(None)
    engine.require_rpc()
    assert engine.rpc_server is not None
    info = describe(model)
    layer = max(info.layer_bytes) / MIB
    out = (info.output_bytes or info.token_embd_bytes) / MIB
    logdir = Path(tempfile.mkdtemp(prefix="bench-rpc-"))
    cfg = logdir / "config" / "bostudio"
    cfg.mkdir(parents=True)
    workers = [start_worker(engine.rpc_server, logdir) for _ in range(2)]
    try:
        b0, b1 = int(4 * layer + 48), int(out + 4 * layer + 64)
        (cfg / "config.toml").write_text("".join(
            f'[[rpc]]\nhost = "127.0.0.1"\nport = {port}\nbudget_mib = {b}\n\n' for (_, port), b in zip(workers, (b0, b1))))
        os.environ["XDG_CONFIG_HOME"] = str(logdir / "config")
        base = UpOptions(model=str(model), ctx=4096, spec="off")
        local, split, where = [], [], []
        for r in range(args.rounds):  # interleaved, so a change in the machine's load hits both
            local.append(measure(replace(base, rpc="none"), args.tokens, logdir, f"local-{r}")[0])
            tps, where = measure(base, args.tokens, logdir, f"split-{r}")
            split.append(tps)
        ml, ms = statistics.median(local), statistics.median(split)
        print(f"model: {model.name}, {args.tokens} tokens, speculation off, {args.rounds} interleaved rounds")
        print("split placement: " + "; ".join(where))
        print(f"local-only        : {ml:6.2f} tok/s  {['%.2f' % x for x in local]}")
        print(f"2 loopback workers: {ms:6.2f} tok/s  {['%.2f' % x for x in split]}")
        print(f"split / local     : {ms / ml:.2f}x  (logs: {logdir})")
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
