"""Admission into a child's KV pool: requests the pool cannot hold together wait, in order, instead
of failing.

llama-server runs N slots over one unified KV pool (-np N -kvu, bostudio.launch). Each request may
grow to the whole context, but when the requests in flight need more cells than the pool has,
llama-server answers every one of them 500 "Context size has been exceeded" (server-context.cpp,
update_slots). So the daemon reserves, per request, what it can use at most: its prompt (counted by
the child's own tokenizer and chat template) plus the output it may generate (its max_tokens, else the
rest of the context), and admits a request only while the reservations fit the pool. The rest queue
FIFO with a bounded wait. A prompt that can never fit is refused with 400 and the numbers.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field

import httpx

from bostudio.errors import ContextOverflowError
from bostudio.runtime.client import BROKEN, CONNECT, AsyncLlamaClient, ChildError

# Where the child counts a request's prompt tokens (template applied) for each generating route.
COUNT_ROUTES = {"/v1/chat/completions": "/v1/chat/completions/input_tokens",
                "/v1/responses": "/v1/responses/input_tokens",
                "/v1/messages": "/v1/messages/count_tokens"}
PROMPT_ROUTES = ("/v1/completions", "/completion", "/completions")  # a plain prompt: /tokenize
# In llama-server's order: `n_predict`, then its aliases (server-schema.cpp); the Responses API's becomes
# `max_tokens` in llama-server's conversion.
OUTPUT_KEYS = ("n_predict", "max_completion_tokens", "max_tokens", "max_output_tokens")
COUNT_TIMEOUT = httpx.Timeout(60.0, connect=2.0)
# A speculating slot verifies its draft in the target's KV cache: up to n_max + 1 cells past its last
# token for a moment (64 + 1 for llama.cpp's ngram-mod default, the longest the pairings use).
DRAFT_ROOM = 65


class QueueTimeout(Exception):
    """A request waited longer than the bounded wait for room in the KV pool."""


@dataclass
class Admission:
    """The reservations of one child's KV pool and the requests waiting, first come first served."""

    in_use: int = 0
    pool: int = 0
    queue: deque = field(default_factory=deque)  # [tokens, future]
    waited: int = 0  # requests that had to wait, since the daemon started

    @property
    def waiting(self) -> int:
        return len(self.queue)

    def _fits(self, tokens: int) -> bool:
        return self.in_use == 0 or self.in_use + tokens <= self.pool

    async def acquire(self, tokens: int, pool: int, timeout: float) -> None:
        """Reserve `tokens` of a pool of `pool` tokens; waits behind earlier requests. Raises
        QueueTimeout after `timeout` seconds; a cancelled waiter leaves the queue."""
        self.pool = pool
        if not self.queue and self._fits(tokens):
            self.in_use += tokens
            return
        fut = asyncio.get_running_loop().create_future()
        self.waited += 1
        entry = [tokens, fut]
        self.queue.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.in_use -= tokens  # granted just as the wait ended: give it back
            else:
                fut.cancel()
                if entry in self.queue:
                    self.queue.remove(entry)
            self._wake()
            if isinstance(exc, asyncio.TimeoutError):
                raise QueueTimeout() from exc
            raise

    def release(self, tokens: int) -> None:
        self.in_use = max(0, self.in_use - tokens)
        self._wake()

    def _wake(self) -> None:
        while self.queue and self._fits(self.queue[0][0]):
            tokens, fut = self.queue.popleft()
            if fut.done():
                continue
            self.in_use += tokens
            fut.set_result(None)

    def to_json(self) -> dict:
        return {"reserved_tokens": self.in_use, "pool_tokens": self.pool, "queued": self.waiting,
                "waited_total": self.waited}


def output_budget(body: dict) -> int | None:
    """The most tokens the request may generate, from its body (None: not limited)."""
    for key in OUTPUT_KEYS:
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    opts = body.get("options")  # Ollama's, should a native body get here
    if isinstance(opts, dict) and isinstance(opts.get("num_predict"), int) and opts["num_predict"] > 0:
        return int(opts["num_predict"])
    return None


async def count_prompt(http: AsyncLlamaClient, path: str, raw: bytes, body: dict) -> int | None:
    """The prompt tokens of a request to `path` as the child counts them (its chat template and
    tokenizer), or None when the route has no count or the child could not count it (then
    llama-server answers the request itself). A connection that broke or never opened (ChildError, not a
    timeout) is raised: the child may have died of this request."""
    try:
        if path in COUNT_ROUTES:
            r = await http.post(COUNT_ROUTES[path], content=raw, headers={"Content-Type": "application/json"},
                                timeout=COUNT_TIMEOUT)
            return int(r.json()["input_tokens"]) if r.status_code == 200 else None
        if path in PROMPT_ROUTES and isinstance(body.get("prompt"), str):
            r = await http.post("/tokenize", json={"content": body["prompt"], "add_special": True},
                                timeout=COUNT_TIMEOUT)
            return len(r.json()["tokens"]) if r.status_code == 200 else None
    except ChildError as exc:
        if exc.kind in (CONNECT, BROKEN):
            raise
        return None  # a busy child (timed out): the request goes on without a count, as before
    except (ValueError, KeyError, TypeError):
        return None
    return None


def reservation(prompt: int, body: dict, ctx: int) -> int:
    """The KV cells a request may take at most: its prompt, the output it may generate (its max_tokens,
    else up to the end of the context) and the draft being verified beyond it (DRAFT_ROOM)."""
    room = max(0, ctx - prompt)
    out = output_budget(body)
    return min(ctx, prompt + (room if out is None else min(out, room)) + DRAFT_ROOM)


def too_long(model: str, prompt: int, ctx: int, n_ctx_train: int | None) -> ContextOverflowError:
    """The 400 for a prompt the context can never hold: the numbers and what to do."""
    more = (f"; restart the model with a larger context (`bostudio up --daemon {model} --ctx N`, up to the "
            f"{n_ctx_train} tokens it was trained for, as memory allows)" if n_ctx_train and n_ctx_train > ctx
            else "")
    return ContextOverflowError(f"prompt is too long: {prompt} tokens > {ctx} maximum ({model} runs with a "
                                f"context of {ctx} tokens)", f"shorten the conversation (compact it, drop old "
                                f"turns or tool output){more}")


def exceed_message(data: bytes) -> tuple[int, int] | None:
    """(prompt tokens, context) from llama-server's own 400 exceed_context_size_error body, else None."""
    try:
        err = json.loads(data).get("error", {})
    except (ValueError, AttributeError):
        return None
    if not isinstance(err, dict) or err.get("type") != "exceed_context_size_error":
        return None
    return int(err.get("n_prompt_tokens") or 0), int(err.get("n_ctx") or 0)
