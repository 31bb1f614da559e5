"""Lossless: with greedy sampling, speculation changes no output token, up to floating-point near-ties.

llama.cpp verifies drafts in batches, and batched arithmetic can flip a choice whose top two
candidates are nearly equal. So at the first token where the speculative output departs from the
baseline, the departure must be explained by batched arithmetic:

- the token the speculative run picked is within 0.1 nats of the baseline's top choice (a near-tie;
  it can be the third of three near-equal candidates: measured here 0.08 nats behind), or
- when the gap is a little wider (measured here on the Q4_K_M Gemma file on a CPU: 0.16 nats), the
  speculation-free server makes the very same choice when it evaluates the same prefix as one batch,
  which is what verification does. Then the flip comes from the arithmetic, not from speculation.

Anything else, such as a departure at a clear margin that batched evaluation does not reproduce, is a bug.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.runtime.client import LlamaClient
from bostudio.runtime.process import ServerProcess
from bostudio.speculation import Speculator
from tests.netutil import free_port

NEAR_TIE_NATS = 0.1
TOP_K = 5
BATCH_NOISE_NATS = 0.5  # the widest margin batched arithmetic may flip, when reproduced by a batch
N_PREDICT = 96
PROMPTS = [
    # Code with repetition: n-gram speculation drafts here.
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
    "class Queue:\n    def __init__(self):\n",
    # Prose.
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]

SPECULATORS = {
    "off": Speculator("none"),
    "ngram": Speculator("ngram", ("ngram-mod",)),
    "draft-simple": None,  # filled in with the model itself as its own draft
}


@pytest.fixture(scope="module")
def servers(engine, gemma_gguf: Path, tmp_path_factory) -> Iterator[dict[str, LlamaClient]]:
    logs = tmp_path_factory.mktemp("lossless-logs")
    specs = dict(SPECULATORS, **{"draft-simple": Speculator("draft", ("draft-simple",), draft=gemma_gguf, n_max=8)})
    procs: list[ServerProcess] = []
    clients: dict[str, LlamaClient] = {}
    try:
        for name, sp in specs.items():
            port = free_port()
            # One slot each, so every request sees the same fresh state.
            launch = LaunchSpec(model=gemma_gguf, alias="gemma", port=port, ctx=2048, speculator=sp, n_parallel=1)
            proc = ServerProcess(build_argv(engine.path, engine.flags, launch), port, logs / f"{name}.log")
            proc.start()
            procs.append(proc)
        for name, proc in zip(specs, procs):
            proc.wait_ready()
            clients[name] = LlamaClient(proc.base_url, timeout=None)
        yield clients
    finally:
        for c in clients.values():
            c.close()
        for p in procs:
            p.stop()


def generate(client: LlamaClient, prompt: str, n_probs: int = 0) -> dict:
    return client.completion(prompt, N_PREDICT, return_tokens=True, n_probs=n_probs, seed=0, top_k=1)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def gap_to_top(entry: dict, token: int) -> float | None:
    """How many nats `token` trails the baseline's best token; None if it is not among the top few."""
    probs = {t["id"]: t["logprob"] for t in entry["top_logprobs"]}
    return max(probs.values()) - probs[token] if token in probs else None


@pytest.mark.parametrize("spec_name", ["ngram", "draft-simple"])
@pytest.mark.parametrize("prompt_index", range(len(PROMPTS)))
def test_greedy_output_is_unchanged_by_speculation(servers, spec_name: str, prompt_index: int) -> None:
    prompt = PROMPTS[prompt_index]
    base = generate(servers["off"], prompt, n_probs=TOP_K)
    spec = generate(servers[spec_name], prompt)
    assert "draft_n" not in base["timings"]
    if spec_name == "draft-simple" or prompt_index == 0:
        # The speculator really ran: it drafted and had drafts accepted.
        assert spec["timings"]["draft_n"] > 0
        assert spec["timings"]["draft_n_accepted"] > 0
    i = first_difference(base["tokens"], spec["tokens"])
    if i is None:
        return
    where = f"{spec_name} departs from the baseline at token {i} of {len(base['tokens'])}"
    assert i < len(spec["tokens"]) and i < len(base["tokens"]), f"{where}: one output is a prefix of the other"
    margin = gap_to_top(base["completion_probabilities"][i], spec["tokens"][i])
    assert margin is not None, f"{where} to a token outside the baseline's top {TOP_K}: a bug"
    if margin < NEAR_TIE_NATS:
        return
    assert margin < BATCH_NOISE_NATS, f"{where} at a clear margin of {margin:.3f} nats: a bug"
    # Evaluate the prefix in one batch on the speculation-free server: the same flip proves arithmetic.
    prefix = servers["off"].tokenize(prompt) + base["tokens"][:i]
    batched = servers["off"].completion(prefix, 1, return_tokens=True)
    assert batched["tokens"][0] == spec["tokens"][i], (
        f"{where} (margin {margin:.3f} nats) and batched evaluation without speculation does not "
        f"reproduce the flip: a bug")


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    entry = {"top_logprobs": [{"id": 7, "logprob": -0.45}, {"id": 9, "logprob": -0.5}]}
    assert gap_to_top(entry, 9) == pytest.approx(0.05)
    assert gap_to_top(entry, 7) == 0
    assert gap_to_top(entry, 3) is None
