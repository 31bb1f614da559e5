"""The lossless rule, shared by tests/test_lossless.py and benchmarks/check_precision.py: with greedy sampling,
speculative output equals the output with speculation off, token for token, except at a real tie of the
baseline's top two candidates (the test module's docstring says why, and why on full precision)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.runtime.net import free_loopback_port
from bostudio.runtime.process import ServerProcess
from bostudio.speculation import Speculator

TIE_NATS = 0.01  # a real tie: the baseline's top two candidates closer than this
N_PREDICT = 128
TIMEOUT_S = 900  # per request: a loaded shared CI machine can be many times slower than a desktop
PROMPTS = {
    # Code with repetition: n-gram speculation drafts here.
    "code-classes": (
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
        "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
        "    def peek(self):\n        return self.items[-1]\n\n    def __len__(self):\n"
        "        return len(self.items)\n\n\nclass Queue:\n    def __init__(self):\n"),
    # Measured: a 0.005-nat tie at token 11 under `-np 4 -kvu`.
    "code-dijkstra": "import heapq\n\ndef dijkstra(graph, start):\n    dist = {start: 0}\n    queue = [(0, start)]\n",
    "prose-fisherman": "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "prose-press": ("The printing press changed how ideas travelled across Europe. Before it, a book was "
                    "copied by hand, and"),
}
GREEDY = {"temperature": 0.0, "top_k": 1, "seed": 0, "ignore_eos": True}


@dataclass(frozen=True)
class Greedy:
    """A greedy generation: its tokens, and per position the top candidates (id, logprob), best first."""

    tokens: list[int]
    top: list[list[tuple[int, float]]]
    timings: dict

    @staticmethod
    def from_native(resp: dict) -> "Greedy":
        """From llama-server's /completion with return_tokens (and n_probs, for a baseline)."""
        probs = resp.get("completion_probabilities") or []
        return Greedy(resp["tokens"], [_candidates(p) for p in probs], resp.get("timings", {}))

    @staticmethod
    def from_openai(resp: dict) -> "Greedy":
        """From /v1/completions with `logprobs`: llama-server puts token ids in logprobs.content."""
        content = resp["choices"][0]["logprobs"]["content"]
        return Greedy([c["id"] for c in content], [_candidates(c) for c in content], resp.get("timings", {}))


def _candidates(entry: dict) -> list[tuple[int, float]]:
    return sorted(((t["id"], t["logprob"]) for t in entry["top_logprobs"]), key=lambda c: -c[1])


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_lossless(base: Greedy, spec: Greedy, where: str) -> None:
    """`spec`'s tokens equal `base`'s, or first depart at a real tie of the baseline's top two candidates."""
    i = first_difference(base.tokens, spec.tokens)
    if i is None:
        return
    at = f"{where}: speculative output departs from the baseline at token {i} of {len(base.tokens)}"
    assert i < len(base.tokens) and i < len(spec.tokens), f"{at}: one output is a prefix of the other"
    top = base.top[i]
    assert len(top) >= 2, f"{at}: the baseline has no second candidate to tie with"
    (best_id, best), (second_id, second) = top[0], top[1]
    margin = best - second
    assert margin < TIE_NATS and spec.tokens[i] in (best_id, second_id), (
        f"{at}: it took token {spec.tokens[i]} where the baseline's top two were {best_id} and {second_id}, "
        f"{margin:.4f} nats apart (a tie is < {TIE_NATS}): speculation changed the output")


def launch(engine, model: Path, name: str, sp: Speculator, logs: Path, ctx: int = 2048) -> ServerProcess:
    port = free_loopback_port()
    # One slot each, so every request sees the same fresh state.
    spec = LaunchSpec(model=model, alias=name, port=port, ctx=ctx, speculator=sp, n_parallel=1)
    proc = ServerProcess(build_argv(engine.path, engine.flags, spec), port, logs / f"{name}.log")
    proc.start()
    return proc
