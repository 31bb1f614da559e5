"""Prefill progress on the real daemon, the real llama-server and Gemma 3 270M: while a ~7k-token
chat prompt is processed (several batches of llama-server's default 2,048 tokens), the instance the daemon
reports carries the prompt's progress; afterwards the finished prefill is in its stats.

No verdict depends on speed: every report seen while the request ran must be consistent (its total is the
prompt llama-server processed, tokens done never exceed it nor go back, cached ones are part of them, the time
left is never negative), and the final numbers are llama-server's own (timings.prompt_n + cache_n). How many
reports fall mid-prompt depends on the machine, so it is printed, not asserted."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.daemon_util import DaemonProc, agent_prefix, models_dir

GEMMA = "gemma-3-270m-q4_k_m"
CTX = 16384  # agent_prefix(130): ~7k Gemma tokens, four batches of 2,048
HANG_GUARD_S = 900  # a guard against a hung test on a loaded machine, not a speed limit


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path):
    root = tmp_path_factory.mktemp("prefill")
    d = DaemonProc(root, models_dir(root, gemma_gguf), ["--idle-ttl", "0", "--no-prompt-reuse"]).start()
    try:
        with d.http(HANG_GUARD_S) as http:
            r = http.post("/bostudio/instances", json={"model": GEMMA, "ctx": CTX, "spec": "off"})
            assert r.status_code == 200, r.text
        yield d
    finally:
        d.stop()


def test_a_long_prompt_reports_consistent_progress_and_its_final_prefill(daemon: DaemonProc) -> None:
    messages = [{"role": "system", "content": agent_prefix(130)},
                {"role": "user", "content": "Which tool reads section 7? Answer with its name."}]
    answer: dict = {}

    def send() -> None:
        with daemon.http(HANG_GUARD_S) as http:
            answer["r"] = http.post("/v1/chat/completions", json={"model": GEMMA, "messages": messages,
                                                                  "max_tokens": 4, "temperature": 0})

    worker = threading.Thread(target=send)
    worker.start()
    seen: list[dict] = []
    with httpx.Client(base_url=daemon.url, timeout=30, trust_env=False) as http:
        while worker.is_alive():
            seen.extend(http.get(f"/bostudio/instances/{GEMMA}").json().get("prefill") or [])
            time.sleep(0.05)
    worker.join()
    r = answer["r"]
    assert r.status_code == 200, r.text
    total = r.json()["usage"]["prompt_tokens"]
    assert total > 6200, f"the prompt is only {total} tokens: not several batches of 2,048"

    deadline = time.monotonic() + HANG_GUARD_S  # the daemon's next look at /slots ends the report
    while (inst := daemon.instance(GEMMA)).get("prefill") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert inst["prefill"] == []
    last = inst["stats"]["last_prefill"]
    assert last["total"] == total == last["cached"] + last["processed"] and last["processed"] > 0
    assert last["rate_tok_s"] > 0 and inst["stats"]["long_prefill_tok_s"] == last["rate_tok_s"]

    for p in seen:
        assert p["total"] == total, p  # admission's count is the prompt llama-server processes
        assert 0 <= p["cached"] <= p["done"] < total and p["processed"] == p["done"] - p["cached"], p
        assert 0 <= p["in_batch"] <= total - p["done"], p
        assert p["eta_s"] is None or p["eta_s"] >= 0, p
        assert p["rate_tok_s"] is None or p["rate_tok_s"] > 0, p
        assert p["fraction"] == pytest.approx(p["done"] / total)
    dones = [p["done"] for p in seen]
    assert dones == sorted(dones), "progress went back"
    mid = sorted({d for d in dones if 0 < d < total})
    print(f"\n{len(seen)} progress reports while the {total}-token prompt ran; tokens done mid-prompt: {mid}")


def test_ps_prints_the_instance_with_its_finished_prefill_gone(daemon: DaemonProc) -> None:
    out = subprocess.run([sys.executable, "-m", "bostudio", "ps"], env=daemon.env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert GEMMA in out.stdout and "prefill" not in out.stdout
