"""Speculation is verified, not assumed: after launch, one greedy probe request must draft (or /slots must
show a speculative context on every slot), else the instance is marked inactive with the reason from its log."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bostudio.runtime.client import LlamaClient
from bostudio.runtime.process import tail
from bostudio.speculation import Speculator

# A probe that makes n-gram speculation draft: the continuation repeats text already in the context.
PROBE_PROMPT = "def add(a, b):\n    return a + b\n\n" * 6 + "def add(a, b):\n"
PROBE_TOKENS = 48


@dataclass(frozen=True)
class SpecStatus:
    active: bool
    detail: str
    draft_n: int = 0
    draft_accepted: int = 0


def _spec_failure_reason(log_path: Path) -> str:
    for line in reversed(tail(log_path, 400)):
        for marker in ("failed to initialize speculative decoding context:",
                       "no implementations specified for speculative decoding",
                       "speculative decoding not supported by this context",
                       "vocabs are not compatible"):
            if marker in line:
                return line[line.index(marker):].strip()
    return "llama-server created no speculative context for the slots (see the log)"


def verify_speculation(client: LlamaClient, speculator: Speculator, log_path: Path,
                       n_predict: int = PROBE_TOKENS, timeout: float = 120.0) -> SpecStatus:
    """Send one greedy probe; speculation is active if the probe drafted, or /slots says so.
    A server that does not answer within `timeout` seconds raises ServerError (from the client): the probe is
    a server's first request, when a software GPU (lavapipe) compiles its pipelines, silently, for minutes."""
    result = client.completion(PROBE_PROMPT, n_predict, timeout=timeout, what="the probe request")
    timings = result.get("timings", {})
    draft_n = int(timings.get("draft_n", 0))
    accepted = int(timings.get("draft_n_accepted", 0))
    if speculator.kind == "none":
        if draft_n:
            return SpecStatus(True, f"UNEXPECTED: speculation is on ({draft_n} drafted) though it was switched off",
                              draft_n, accepted)
        return SpecStatus(False, "off", 0, 0)
    if draft_n > 0:
        return SpecStatus(True, f"active: the probe drafted {draft_n} tokens, {accepted} accepted "
                                f"({100 * accepted / draft_n:.0f}%)", draft_n, accepted)
    slots = client.slots(what="the probe request")
    if slots and all(s.get("speculative") for s in slots):
        return SpecStatus(True, "active (every slot has a speculative context; the probe drafted nothing yet)")
    return SpecStatus(False, "INACTIVE: " + _spec_failure_reason(log_path))
