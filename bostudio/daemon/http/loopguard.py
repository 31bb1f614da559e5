"""Runaway answers stopped. A small model behind a coding agent sometimes repeats the same text until its
output limit (Qwen2.5-Coder-1.5B on Codex: three runs each spent 8-9 minutes of a CPU on 8192 tokens of a
loop). A streamed answer whose generated text is caught in an exact loop is ended here as the output limit
would end it, so the agent reads a truncated answer it already handles and the session goes on.

The rule is narrow on purpose (a false stop on real work is worse than a late one): the generated text so
far (answer text, reasoning/thinking text and tool-call argument deltas, in the order they came) ends in a
unit of period p (1 <= p <= MAX_PERIOD characters) repeated exactly, the periodic tail covering at least
LOOP_CHARS characters and at least MIN_REPEATS periods. It is checked every CHECK_EVERY new characters, on
the last WINDOW characters only: a few slice comparisons, never a scan of the whole answer.

When it fires, the upstream is closed first (llama-server cancels a generation whose client left: the same
path as a client that hangs up), then the stream gets the end the output limit gives in its dialect, as
the pinned llama-server writes it:
- OpenAI chat and completions: a chunk with `finish_reason: "length"`, then `data: [DONE]`;
- Anthropic: each open content block closed (a thinking block after its empty `signature_delta`), a
  `message_delta` with `stop_reason: "max_tokens"`, then `message_stop`;
- Responses: each open output item done, then `response.completed`, status "completed". llama-server ends
  a Responses stream at its output limit so (tests/data/rescue_streams.json was captured at max_tokens);
  OpenAI's own `response.incomplete` is not sent: the pinned Codex (0.171) reads it as an error ("Incomplete
  response returned, reason: ..." in its binary), where an answer cut at the limit should end the turn.
The stopped answer's usage is unknown (the child never sent its last event): Anthropic's `output_tokens`
counts the deltas seen (llama-server sends one per token), the other dialects carry none.

Only streamed 200 answers are guarded. A non-streamed answer reaches the daemon whole, once the child has
generated it all: stopping it early would need the stream the client did not ask for, so it is left alone
and the output limit (normalise.default_output_limit) still bounds it.

The guard sits first in the relay, on the child's own events, before toolrescue: the rescue holds an answer
that may still be a call (one starting with "{" or "```") until its end, so behind it the guard would see a
looping call only once the child had hit its limit. In front of it, the guard stops generation at the source,
and the rescue then reads the guard's end as the output limit's end.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bostudio.daemon.http.toolrescue import _data, _events, _sse  # the one SSE splitter of the relay

# About 1000 tokens of code: ~40 s at 25 tok/s on a CPU, against 5.5+ minutes to the 8192-token limit of a
# 32k context. Legitimate output rarely holds 4 KB of exactly periodic text (a table rule, a long run of one
# character); counters, line numbers and ids break exact periodicity, so such lists never fire.
LOOP_CHARS = 4096
MAX_PERIOD = 512  # characters in the repeated unit: a few lines of code, a paragraph
MIN_REPEATS = 8  # periods in the tail: implied by the two above (8 * 512 = 4096), kept so either can change alone
CHECK_EVERY = 256  # new characters between checks: a loop is seen at most this late
WINDOW = 2 * LOOP_CHARS  # characters of the answer's tail kept and checked


@dataclass(frozen=True)
class Loop:
    """An exact loop at the end of an answer: its period, the repeated unit (as last written) and how many
    characters the periodic tail covers (within the text looked at)."""

    period: int
    unit: str
    chars: int


def find_loop(text: str, min_chars: int = LOOP_CHARS, max_period: int = MAX_PERIOD,
              min_repeats: int = MIN_REPEATS) -> Loop | None:
    """The shortest-period exact loop `text` ends in: a tail of at least max(min_chars, min_repeats * p)
    characters equal to itself shifted by p, for 1 <= p <= max_period; None when there is none. Pure; the
    cost is one short slice comparison per period whose last character matches."""
    n = len(text)
    for p in range(1, min(max_period, n) + 1):
        need = max(min_chars, min_repeats * p, p + 1)
        if need > n:
            return None  # `need` only grows with p
        if text[n - 1 - p] != text[n - 1] or text[n - need + p:] != text[n - need:n - p]:
            continue
        start = n - need
        while start > 0 and text[start - 1] == text[start - 1 + p]:
            start -= 1
        return Loop(p, text[n - p:], n - start)
    return None


class _Ending(ABC):
    """One dialect's streamed events: the generated text each carries, and the end the output limit gives
    (built from what the stream said so far: ids, open blocks, items)."""

    @abstractmethod
    def see(self, data: Any) -> str:
        ...

    @abstractmethod
    def end(self) -> list[bytes]:
        ...


class _Chat(_Ending):
    """OpenAI chat completions: content, reasoning_content and tool-call arguments deltas."""

    object = "chat.completion.chunk"

    def __init__(self, model: str) -> None:
        self.head: dict[str, Any] = {"model": model}
        self.index = 0

    def see(self, data: Any) -> str:
        if not isinstance(data, dict):
            return ""
        self.head.update((k, data[k]) for k in ("created", "id", "model", "system_fingerprint") if k in data)
        out = []
        for c in data.get("choices") or []:
            if not isinstance(c, dict):
                continue
            self.index = c.get("index", self.index)
            out.append(self.text_of(c))
        return "".join(out)

    @staticmethod
    def text_of(choice: dict) -> str:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return ""
        out = [delta.get("reasoning_content"), delta.get("content")]
        for tc in delta.get("tool_calls") or []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            out.append(fn.get("arguments") if isinstance(fn, dict) else None)
        return "".join(t for t in out if isinstance(t, str))

    def last_choice(self) -> dict:
        return {"finish_reason": "length", "index": self.index, "delta": {}}

    def end(self) -> list[bytes]:
        return [_sse({"choices": [self.last_choice()], **self.head, "object": self.object}), b"data: [DONE]\n\n"]


class _Completions(_Chat):
    """OpenAI (legacy) completions, which Ollama's /api/generate is served by: choices[].text."""

    object = "text_completion"

    @staticmethod
    def text_of(choice: dict) -> str:
        return choice["text"] if isinstance(choice.get("text"), str) else ""

    def last_choice(self) -> dict:
        return {"text": "", "index": self.index, "logprobs": None, "finish_reason": "length"}


class _Anthropic(_Ending):
    """Anthropic messages: text, thinking and input_json deltas, in content blocks opened and closed."""

    def __init__(self, model: str) -> None:
        self.open: dict[int, str] = {}  # index -> block type
        self.deltas = 0

    def see(self, data: Any) -> str:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "content_block_start":
            self.open[data.get("index", 0)] = str((data.get("content_block") or {}).get("type"))
        elif kind == "content_block_stop":
            self.open.pop(data.get("index", 0), None)
        elif kind == "content_block_delta":
            self.deltas += 1
            delta = data.get("delta") or {}
            for key in ("text", "thinking", "partial_json"):
                if isinstance(delta.get(key), str):
                    return delta[key]
        return ""

    def end(self) -> list[bytes]:
        out = []
        for index in sorted(self.open):
            if self.open[index] == "thinking":  # the API wants a signature before a thinking block closes
                out.append(_sse({"type": "content_block_delta", "index": index,
                                 "delta": {"type": "signature_delta", "signature": ""}}, "content_block_delta"))
            out.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        out.append(_sse({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                         "usage": {"output_tokens": self.deltas}}, "message_delta"))
        out.append(_sse({"type": "message_stop"}, "message_stop"))
        return out


class _Responses(_Ending):
    """OpenAI Responses: output text, reasoning text and function-call argument deltas, per output item."""

    DELTAS = ("response.output_text.delta", "response.reasoning_text.delta",
              "response.reasoning_summary_text.delta", "response.function_call_arguments.delta")

    def __init__(self, model: str) -> None:
        self.model = model
        self.response: dict[str, Any] = {}
        self.items: dict[str, dict] = {}  # item id -> the item as added, in order
        self.texts: dict[str, list[str]] = {}
        self.done: dict[str, dict] = {}  # item id -> the item as done (the child closed it itself)

    def see(self, data: Any) -> str:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "response.created" and isinstance(data.get("response"), dict):
            self.response = data["response"]
        elif kind in ("response.output_item.added", "response.output_item.done") and isinstance(data.get("item"), dict):
            item = data["item"]
            key = str(item.get("id"))
            if kind == "response.output_item.added":
                self.items[key] = item
            else:
                self.items.setdefault(key, item)
                self.done[key] = item
        elif kind in self.DELTAS and isinstance(data.get("delta"), str):
            self.texts.setdefault(str(data.get("item_id")), []).append(data["delta"])
            return data["delta"]
        return ""

    def end(self) -> list[bytes]:
        events, output = [], []
        for key, added in self.items.items():
            if key in self.done:
                output.append(self.done[key])
                continue
            text = "".join(self.texts.get(key, []))
            kind = added.get("type")
            if kind == "message":
                part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
                item = {"type": "message", "status": "completed", "id": key, "content": [part], "role": "assistant"}
                events.append(_sse({"type": "response.output_text.done", "item_id": key, "text": text},
                                   "response.output_text.done"))
                events.append(_sse({"type": "response.content_part.done", "item_id": key, "part": part},
                                   "response.content_part.done"))
            elif kind == "reasoning":
                item = {"id": key, "summary": [], "type": "reasoning",
                        "content": [{"text": text, "type": "reasoning_text"}], "encrypted_content": ""}
            elif kind == "function_call":
                item = {**added, "status": "completed", "arguments": text}
            else:
                item = {**added, "status": "completed"}
            events.append(_sse({"type": "response.output_item.done", "item": item}, "response.output_item.done"))
            output.append(item)
        response = {"id": self.response.get("id"), "object": "response", "created_at": int(time.time()),
                    "status": "completed", "model": self.model, "output": output}
        events.append(_sse({"type": "response.completed", "response": response}, "response.completed"))
        return events


ENDINGS: dict[str, Callable[[str], _Ending]] = {"/v1/chat/completions": _Chat, "/v1/completions": _Completions,
                                                "/v1/messages": _Anthropic, "/v1/responses": _Responses}

Transform = Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]]


def guard(path: str, model: str, fired: Callable[[Loop], None],
          close_upstream: Callable[[], Awaitable[None]]) -> Transform | None:
    """A relay transform over the streamed (SSE) answer of `path` that passes every complete event through
    as it came and, once the generated text ends in a loop (find_loop), awaits `close_upstream()` (so the
    child stops generating), calls `fired(loop)` and ends the stream as the output limit does; None for a
    route it does not know. Events are passed on whole: a chunk that ends inside an event holds that part
    back until the event is complete (llama-server writes whole events, so its chunks pass unchanged)."""
    make = ENDINGS.get(path)
    if make is None:
        return None

    async def transform(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        ending = make(model)
        buf = bytearray()
        tail, fresh, fresh_n = "", [], 0
        async for chunk in chunks:
            buf += chunk
            out = []
            for ev in _events(buf):
                out.append(ev)
                piece = ending.see(_data(ev))
                if not piece:
                    continue
                fresh.append(piece)
                fresh_n += len(piece)
                if fresh_n < CHECK_EVERY:
                    continue
                tail = (tail + "".join(fresh))[-WINDOW:]
                fresh, fresh_n = [], 0
                loop = find_loop(tail)
                if loop is not None:
                    await close_upstream()
                    fired(loop)
                    yield b"".join(out) + b"".join(ending.end())
                    return
            if out:
                yield b"".join(out)
        if buf:  # what followed the last complete event, as it came
            yield bytes(buf)
    return transform


__all__ = ["LOOP_CHARS", "MAX_PERIOD", "MIN_REPEATS", "CHECK_EVERY", "WINDOW", "Loop", "find_loop", "guard"]
