"""Prompt reuse that survives reloads, on the real llama-server and Gemma 3 270M: a ≥ 4k-token
prefix paid once (cold), reused warm, after `bostudio stop MODEL` and a reload, and after a daemon
restart; a state saved for another context size is never loaded. The verdicts are llama-server's
own counters (`timings.cache_n`: prompt tokens taken from the cache, `prompt_n`: tokens computed),
never a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_util import DaemonProc, agent_prefix

GEMMA = "gemma-3-270m-q4_k_m"
CTX = 8192
PREFIX_TOKENS = 4000


def turn(d: DaemonProc, prefix: str, question: str) -> dict:
    with d.http(600) as http:
        r = http.post("/v1/completions", json={"model": GEMMA, "prompt": prefix + question, "max_tokens": 2,
                                               "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["timings"]


def load(d: DaemonProc, ctx: int = CTX) -> dict:
    with d.http(600) as http:
        r = http.post("/bostudio/instances", json={"model": GEMMA, "ctx": ctx})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path):
    root = tmp_path_factory.mktemp("reuse")
    models = root / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    args = ["--idle-ttl", "0", "--prompt-store-dir", str(root / "prompts")]
    return root, models, args


def test_a_long_prefix_is_paid_once_across_stop_reload_and_daemon_restart(setup) -> None:
    root, models, args = setup
    prefix = agent_prefix()
    d = DaemonProc(root, models, args).start()
    try:
        inst = load(d)
        assert inst["plan"]["prompt_cache_bytes"] > 0 and inst["prompts"]["restored_slots"] == 0
        cold = turn(d, prefix, "Question 1: which tool reads section 3?")
        assert cold["prompt_n"] >= PREFIX_TOKENS and cold["cache_n"] == 0
        warm = turn(d, prefix, "Question 2: which tool reads section 5?")
        assert warm["cache_n"] >= PREFIX_TOKENS and warm["prompt_n"] < 100

        # `bostudio stop MODEL` saves the slot; the next load restores it before it is ready.
        out = subprocess.run([sys.executable, "-m", "bostudio", "stop", GEMMA, "--json"], env=d.env,
                             capture_output=True, text=True, timeout=300)
        stopped = d.instance(GEMMA)
        assert stopped["state"] == "stopped", out.stderr
        assert stopped["prompts"]["saved_tokens"] >= PREFIX_TOKENS
        reloaded = load(d)
        assert reloaded["prompts"]["restored_tokens"] >= PREFIX_TOKENS
        after_reload = turn(d, prefix, "Question 3: which tool reads section 9?")
        assert after_reload["cache_n"] >= PREFIX_TOKENS and after_reload["prompt_n"] < 100
        status = d.http().get("/bostudio/status").json()
        assert status["prompt_store"]["bytes"] > 0 and len(status["prompt_store"]["entries"]) == 1
    finally:
        assert d.stop() == 0  # the daemon's shutdown saves the slots again

    d = DaemonProc(root, models, args).start()
    try:
        assert load(d)["prompts"]["restored_tokens"] >= PREFIX_TOKENS
        after_restart = turn(d, prefix, "Question 4: which tool reads section 11?")
        assert after_restart["cache_n"] >= PREFIX_TOKENS and after_restart["prompt_n"] < 100

        # Another context size is another identity: its state is never loaded.
        with d.http(300) as http:
            assert http.post(f"/bostudio/instances/{GEMMA}/stop").status_code == 200
        other = load(d, ctx=CTX - 2048)
        assert other["prompts"]["restored_slots"] == 0 and other["prompts"]["key"] != reloaded["prompts"]["key"]
        fresh = turn(d, prefix, "Question 5: which tool reads section 13?")
        assert fresh["cache_n"] == 0 and fresh["prompt_n"] >= PREFIX_TOKENS
    finally:
        assert d.stop() == 0
        assert not d.children()
