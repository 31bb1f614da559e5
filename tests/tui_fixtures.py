"""Fixed data for the TUI's snapshot tests, fed at the DaemonClient seam (a stand-in with the
AsyncDaemonClient's methods): no clock, no machine values, so the SVGs are the same on every machine.
Everything else about the TUI is tested against a real daemon (tests/test_tui.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

GIB = 1 << 30
MIB = 1 << 20
HOSTILE = "evil-[reverse]x[/reverse]-\x1b[2J\x1b]52;c;aGk=\x07"  # Rich markup and terminal escapes

CATALOG = [
    {"model": "gemma-3-270m-q4_k_m", "path": "/models/gemma-3-270m-q4_k_m.gguf", "architecture": "gemma3",
     "n_params": 268_098_176, "quant": "Q4_K_M", "file_size": 253_105_440, "n_ctx_train": 32768, "n_nextn": 0},
    {"model": "glm-mtp", "path": "/models/glm-mtp.gguf", "architecture": "glm4moe", "n_params": 2_000_000,
     "quant": "F32", "file_size": 8 * MIB, "n_ctx_train": 2048, "n_nextn": 1},
    {"model": HOSTILE, "path": f"/models/{HOSTILE}.gguf", "architecture": "llama[bold]", "n_params": 100_000,
     "quant": "F32", "file_size": 400_000, "n_ctx_train": 2048, "n_nextn": 0},
]

PAIRINGS = {
    "gemma-3-270m-q4_k_m": {
        "model": "gemma-3-270m-q4_k_m",
        "modes": {"auto": {"speculation": "ngram-mod", "kind": "ngram",
                           "reason": "auto: ngram-mod: drafts from text already in the context, no second model"}},
        "tokenizer": {"model": "llama", "pre": "default", "vocab_size": 262144, "fingerprint": "0123456789abcdef"},
        "candidates": [
            {"label": "draft-mtp", "origin": "auto-detection", "usable": False, "why": "no MTP (NextN) layers",
             "memory_bytes": None, "chosen": False},
            {"label": "draft-simple with gemma-3-270m.self-Q2_K", "origin": "auto-detection", "usable": False,
             "why": "not a quarter of the target's parameters", "memory_bytes": 180 * MIB, "chosen": False},
            {"label": "ngram-mod", "origin": "auto-detection", "usable": True, "why": "no second model",
             "memory_bytes": 16 * MIB, "chosen": True}]},
    "glm-mtp": {"model": "glm-mtp", "modes": {"auto": {"speculation": "draft-mtp", "kind": "mtp",
                                                       "reason": "auto: the model's own MTP head"}},
                "tokenizer": {"model": "gpt2", "pre": "glm4", "vocab_size": 32, "fingerprint": "fedcba9876543210"},
                "candidates": [{"label": "draft-mtp", "origin": "auto-detection", "usable": True,
                                "why": "1 NextN layer", "memory_bytes": 2 * MIB, "chosen": True}]},
    HOSTILE: {"model": HOSTILE, "modes": {"auto": {"speculation": "ngram-mod[blink]", "kind": "ngram",
                                                   "reason": "\x1b[31mred[/]"}},
              "tokenizer": {"model": "llama", "pre": "[i]x", "vocab_size": 32, "fingerprint": "\x1b]0;t\x07"},
              "candidates": []},
}


def plan(fits: bool = True) -> dict:
    groups = {"weights": 253 * MIB, "KV": 1536 * MIB if fits else 30 * GIB, "draft": 0, "draft KV": 0,
              "compute": 520 * MIB, "prompt cache": 0}
    used = sum(groups.values())
    budget = 12 * GIB
    return {"model": "gemma-3-270m-q4_k_m", "ctx": 32768 if fits else 600000, "cache_type": "f16",
            "spec_mode": "auto", "speculation": "ngram-mod",
            "reason": "auto: ngram-mod: drafts from text already in the context, no second model",
            "bytes": used, "fits": fits, "not_fit_reason": "" if fits else "needs 31.0 GiB on CPU, 12.0 GiB free",
            "why": "keeps the n-gram speculation: with it 32768 tokens still fit (wanted 32768), without it 32768",
            "cost_line": "the ngram-mod costs 0.13 GiB = 2048 tokens of context", "spec_cost_bytes": 140 * MIB,
            "spec_cost_tokens": 2048, "n_ctx_train": 32768,
            "bars": [{"device": "CPU", "budget": budget, "used": used, "free": max(0, budget - used), "groups": groups}],
            "budget_bytes": budget, "argv": [], "would_fit": [] if fits else [
                {"change": "a smaller context", "ctx": 32768, "cache_type": "f16", "speculation": "ngram-mod",
                 "bytes": 2300 * MIB},
                {"change": "a q4_0 KV cache", "ctx": 600000, "cache_type": "q4_0", "speculation": "ngram-mod",
                 "bytes": 11 * GIB}]}


# A long prompt in progress: the daemon's instances[].prefill[], an agent's first turn.
PREFILL = [{"slot": 0, "task": 7, "total": 11712, "done": 4096, "cached": 512, "processed": 3584, "in_batch": 2048,
            "fraction": 0.35, "rate_tok_s": 48.0, "rate_source": "measured", "eta_s": 158.0, "elapsed_s": 74.7}]


def instance(state: str = "ready", active: bool = True, accept_len: float = 2.4, prefill: bool = False) -> dict:
    inst = {"model": "gemma-3-270m-q4_k_m", "path": "/models/gemma-3-270m-q4_k_m.gguf", "state": state,
            "pid": 4242, "port": 40001, "ctx": 4096, "cache_type": "f16", "spec_mode": "auto",
            "speculation": "ngram-mod", "speculation_reason": "auto: ngram-mod",
            "spec_status": {"active": active, "detail": "active: the probe drafted 46 tokens, 46 accepted (100%)"
                            if active else "INACTIVE: the draft's vocabulary differs", "draft_n": 46, "draft_accepted": 46},
            "plan": {"bytes": 2300 * MIB}, "error": None, "loads": 1, "ready_s": 1.4, "uptime_s": None,
            "idle_s": 0.0, "active_requests": 0,
            "stats": {"requests": 5, "errors": 0, "tokens_generated": 160, "decode_tok_s": 61.5,
                      "decode_tok_s_avg": 58.0, "prompt_tok_s": 300.0, "draft_tokens": 100, "draft_accepted": 70,
                      "acceptance_rate": 0.7, "mean_accepted_length": accept_len},
            "log": "/state/logs/instances/gemma-3-270m-q4_k_m.log"}
    return {**inst, "prefill": PREFILL, "active_requests": 1} if prefill else inst


STATS_HISTORY = [  # cumulative snapshots, as the daemon publishes them after requests
    {"requests": i, "tokens_generated": 32 * i, "decode_tok_s": v, "draft_tokens": 20 * i, "draft_accepted": a, "mean_accepted_length": 1.0 + 0.3 * i}
    for i, (v, a) in enumerate([(40.0, 10), (55.0, 22), (48.0, 35), (62.0, 50), (61.5, 70)], start=1)]

LOG_LINES = ["srv  load_model: loading model '/models/gemma-3-270m-q4_k_m.gguf'",
             "srv  update_slots: all slots are idle", "evil \x1b[2J [bold]not bold[/bold]"]

BENCH = {"model": "gemma-3-270m-q4_k_m", "engine": "llama-server b6000 cpu", "runs": 3,
         "results": [
             {"workload": "code", "ctx": None, "config": "off", "tok_s_median": 40.0, "tok_s_min": 39.0,
              "tok_s_max": 41.0, "speedup": None, "speedup_min": None, "speedup_max": None, "acceptance": None,
              "accept_len": None, "prompt_tok_s": 300.0, "drafted": 0, "accepted": 0},
             {"workload": "code", "ctx": None, "config": "ngram-mod", "tok_s_median": 70.0, "tok_s_min": 66.0,
              "tok_s_max": 73.0, "speedup": 1.75, "speedup_min": 1.6, "speedup_max": 1.85, "acceptance": 0.8,
              "accept_len": 3.1, "prompt_tok_s": 298.0, "drafted": 400, "accepted": 320},
             {"workload": "chat", "ctx": None, "config": "off", "tok_s_median": 41.0, "tok_s_min": 40.0,
              "tok_s_max": 42.0, "speedup": None, "speedup_min": None, "speedup_max": None, "acceptance": None,
              "accept_len": None, "prompt_tok_s": 301.0, "drafted": 0, "accepted": 0},
             {"workload": "chat", "ctx": None, "config": "ngram-mod", "tok_s_median": 45.0, "tok_s_min": 43.0,
              "tok_s_max": 47.0, "speedup": 1.1, "speedup_min": 1.02, "speedup_max": 1.15, "acceptance": 0.35,
              "accept_len": 1.4, "prompt_tok_s": 299.0, "drafted": 300, "accepted": 105}],
         "projection": {"turns": 100, "tokens_per_turn": 256, "decode_only": True, "seconds_saved": {"ngram-mod": 250.0}}}

DEVICES = {"engine": "/engines/llama-server", "backends": ["cpu"], "devices": [
    {"name": "CUDA0", "description": "NVIDIA GeForce RTX 4090", "total_mib": 24564, "free_mib": 20000, "backend": "cuda"}],
    "host": {"total_bytes": 64 * GIB, "available_bytes": 40 * GIB, "cpus": 16}}
ENGINES = [{"path": "/engines/llama-server", "source": "built", "version": "b6000", "backends": ["cpu", "cuda"],
            "spec_types": ["draft-simple", "draft-mtp", "ngram-mod"], "devices": ["CUDA0"], "problem": None,
            "in_use": True},
           {"path": "/usr/bin/llama-server", "source": "path", "version": "b4000", "backends": ["cpu"],
            "spec_types": [], "devices": [], "problem": "no --spec-type: too old for speculation", "in_use": False}]


class FixedClient:
    """The AsyncDaemonClient's methods, answering fixed data (snapshot tests only)."""

    url = "http://127.0.0.1:8642"

    async def aclose(self) -> None:
        pass

    async def devices(self) -> dict:
        return DEVICES

    async def engines(self) -> list[dict]:
        return ENGINES

    async def catalog(self) -> list[dict]:
        return CATALOG

    async def pairings(self, model: str) -> dict:
        return PAIRINGS[model]

    async def plan(self, model: str, **kw: object) -> dict:
        return plan()

    async def events(self) -> AsyncIterator[dict]:
        yield {"type": "snapshot", "seq": 1, "instances": [instance()]}
        await asyncio.Event().wait()

    async def log_stream(self, model: str, lines: int = 20) -> AsyncIterator[dict]:
        for line in LOG_LINES:
            yield {"line": line}
        await asyncio.Event().wait()
