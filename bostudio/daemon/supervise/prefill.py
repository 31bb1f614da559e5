"""Prompt processing the user can see: how far a child has got through each long prompt, its measured
prefill rate and the time left (on a CPU an agent's first turn prefills for minutes).

What llama-server exposes (server-context.cpp, the pinned tree): `GET /slots` is answered while a batch
decodes (the server yields to its queue for METRICS and SLOT_GET tasks during `llama_process`), and each
busy slot carries `n_prompt_tokens_cache` (tokens reused from the cache) and `n_prompt_tokens_processed`
(tokens decoded so far; it grows after each batch of n_batch tokens), and `n_prompt_tokens` already
counts the batch being decoded (tokens join the slot's prompt when the batch is built). It does not carry the prompt's
total, and a released slot's counts are zeroed. So the total comes from the daemon itself: admission
counts every generating request's prompt with the child's own template and tokenizer before it is sent
(`PrefillTracker.expect`), and a new task seen in a slot takes the oldest counted prompt still waiting.

Pure bookkeeping: the caller polls /slots and passes the answer and the time in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    """The measured rate and the time left of one prompt in progress (both None when unknown)."""

    rate: float | None  # prompt tokens per second
    rate_source: str | None  # "measured": this prompt's own batches; "last request": the child's last prefill
    eta_s: float | None


def estimate(total: int | None, done: int, cached: int, started: float, changed: float, now: float,
             fallback_rate: float | None = None) -> Estimate:
    """The rate and time left of a prompt of `total` tokens of which `done` are in the KV cache (`cached`
    of them reused, the rest decoded between `started` and `changed`, the time `done` was last seen to
    grow). Before its first batch is done the child's last measured prefill rate stands in. The time left
    counts down from the last change, never below zero."""
    processed = max(0, done - cached)
    if processed > 0 and changed > started:
        rate, source, since = processed / (changed - started), "measured", changed
    elif fallback_rate and fallback_rate > 0:
        rate, source, since = fallback_rate, "last request", started
    else:
        return Estimate(None, None, None)
    if total is None:
        return Estimate(rate, source, None)
    return Estimate(rate, source, max(0.0, (total - done) / rate - max(0.0, now - since)))


@dataclass
class PromptJob:
    """A generating request on its way to the child: its prompt as admission counted it."""

    total: int
    sent: float


@dataclass
class LivePrompt:
    """One task's prompt in progress, as the polls saw it."""

    task: int
    slot: int
    total: int | None
    started: float
    done: int = 0
    cached: int = 0
    changed: float = 0.0
    in_batch: int = 0  # tokens of the batch being decoded now (they count once it is done)

    def to_json(self, now: float, fallback_rate: float | None) -> dict:
        total = self.total
        est = estimate(total, self.done, self.cached, self.started, self.changed, now, fallback_rate)
        return {"slot": self.slot, "task": self.task, "total": total, "done": self.done, "cached": self.cached,
                "processed": self.done - self.cached, "in_batch": self.in_batch,
                "fraction": (self.done / total) if total else None,
                "rate_tok_s": est.rate, "rate_source": est.rate_source, "eta_s": est.eta_s,
                "elapsed_s": max(0.0, now - self.started)}


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _decoded(slot: dict) -> int:
    nxt = slot.get("next_token")
    first = nxt[0] if isinstance(nxt, list) and nxt and isinstance(nxt[0], dict) else {}
    return _int(first.get("n_decoded")) or 0


class PrefillTracker:
    """The prompts a child is processing now, from its /slots answers and the prompts admission counted."""

    def __init__(self) -> None:
        self.jobs: deque[PromptJob] = deque()
        self.live: dict[int, LivePrompt] = {}  # task id -> its prompt in progress
        self.seen = -1  # the highest task id seen in a slot: a higher one is a new task

    def expect(self, total: int, now: float) -> None:
        """A request whose prompt admission counted at `total` tokens is about to reach the child."""
        self.jobs.append(PromptJob(total, now))

    def observe(self, slots: object, now: float, in_flight: int) -> None:
        """Take one /slots answer. `in_flight`: the requests the daemon has open on this child; with none,
        counted prompts that never showed up in a slot (refused, cancelled, too quick) are dropped."""
        live: dict[int, LivePrompt] = {}
        first = self.seen < 0  # at the first poll an idle slot's task is older than every counted prompt (the probe)
        newest = self.seen
        for s in sorted((s for s in slots if isinstance(s, dict)) if isinstance(slots, list) else [],
                        key=lambda s: _int(s.get("id_task")) or -1):
            task, slot = _int(s.get("id_task")), _int(s.get("id"))
            if task is None or slot is None:
                continue
            newest = max(newest, task)
            prompt = self.live.get(task)
            busy = s.get("is_processing") is True
            if prompt is None and task > self.seen and (busy or not first):  # a task started since the last poll
                job = self.jobs.popleft() if self.jobs else None
                prompt = LivePrompt(task, slot, job.total if job else None, job.sent if job else now, changed=now)
            if prompt is None or not busy or _decoded(s) > 0:
                continue  # an old task, or one that finished its prompt (a released slot's counts are zeroed)
            cached = _int(s.get("n_prompt_tokens_cache")) or 0
            done = cached + (_int(s.get("n_prompt_tokens_processed")) or 0)
            if prompt.total is not None and done > prompt.total:
                prompt.total = None  # the count it took was another request's: progress without a total
            if done == prompt.total:
                continue  # the whole prompt is in: generation starts
            if done > prompt.done:
                prompt.changed = now
            prompt.done, prompt.cached = max(done, prompt.done), cached
            # n_prompt_tokens counts the tokens put in the batch before it is decoded: a batch in flight
            held = _int(s.get("n_prompt_tokens")) or 0
            prompt.in_batch = max(0, min(held, prompt.total or held) - prompt.done)
            live[task] = prompt
        self.seen = newest
        self.live = live
        if in_flight <= 0:
            self.jobs.clear()

    def to_json(self, now: float, fallback_rate: float | None = None) -> list[dict]:
        """The prompts in progress, the longest first."""
        out = [p.to_json(now, fallback_rate) for p in self.live.values()]
        return sorted(out, key=lambda p: -(p["total"] or p["done"]))


__all__ = ["Estimate", "estimate", "PrefillTracker", "PromptJob", "LivePrompt"]
