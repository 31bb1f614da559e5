"""The runaway guard (bostudio/daemon/http/loopguard.py): the loop rule over text, table-driven, and the stream
transform per dialect on recorded llama-server streams (tests/data/rescue_streams.json, read by the official
client libraries as in tests/test_toolrescue.py)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from bostudio.daemon.http.loopguard import CHECK_EVERY, LOOP_CHARS, MAX_PERIOD, MIN_REPEATS, find_loop, guard
from tests.test_toolrescue import STREAMS, parse_stream, split_odd, with_text


def unit_of(p: int) -> str:
    """A unit of exactly period p (no shorter period): distinct-ish characters from a fixed seed."""
    rng = random.Random(p)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz(){}=;: \n") for _ in range(p - 1)) + "#"


def looped(p: int, chars: int, lead: str = "def main():\n    x = 1\n") -> str:
    u = unit_of(p)
    return lead + (u * (chars // p + 1))[:chars]


CODE = "".join(f"def f{i}(x):\n    return x * {i} + {i * i} - len(str(x))  # case {i}\n\n" for i in range(200))
STEPS = "".join(f"step {i}\n" for i in range(1, 1200))


@pytest.mark.parametrize("p", [1, 37, MAX_PERIOD])
def test_an_exact_loop_of_4096_characters_fires(p: int) -> None:
    text = looped(p, LOOP_CHARS)
    loop = find_loop(text)
    assert loop is not None and loop.period == p and loop.unit == text[-p:]
    assert loop.chars == LOOP_CHARS


@pytest.mark.parametrize("text, why", [
    (looped(37, 4000), "4000 characters of loop"),
    (looped(MAX_PERIOD + 1, 3 * LOOP_CHARS), "a period of 513"),
    (CODE, "long code that does not repeat"),
    (STEPS, "counting lines: step 1, step 2, ..."),
    (looped(MAX_PERIOD, 7 * MAX_PERIOD), "7 periods"),
    ("", "nothing"),
])
def test_what_does_not_fire(text: str, why: str) -> None:
    assert find_loop(text) is None, why


def test_fewer_than_min_repeats_periods_never_fire_even_past_the_length() -> None:
    # With the shipped constants the length implies 8 periods; with a shorter length the count still holds.
    seven = looped(100, 7 * 100, lead="")
    assert find_loop(seven, min_chars=500) is None
    assert find_loop(looped(100, 8 * 100, lead=""), min_chars=500) == find_loop(looped(100, 8 * 100, lead=""),
                                                                               min_chars=800)
    assert find_loop(looped(100, 8 * 100, lead=""), min_chars=500) is not None
    assert MIN_REPEATS * MAX_PERIOD <= LOOP_CHARS


def test_the_shortest_period_and_the_whole_periodic_tail_are_reported() -> None:
    text = "intro\n" + "ab" * 3000
    loop = find_loop(text)
    assert loop is not None and loop.period == 2 and loop.unit == "ab" and loop.chars == 6000


# ------------------------------------------------------------------------------------------- the stream guard

STOPS = {"/v1/chat/completions": "length", "/v1/messages": "max_tokens", "/v1/responses": "completed"}


class Upstream:
    """A child's stream as chunks, counting what the guard read and whether it closed the connection."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.read = 0
        self.closed = 0

    async def source(self):  # type: ignore[no-untyped-def]
        for c in self.chunks:
            self.read += 1
            yield c

    async def close(self) -> None:
        self.closed += 1


def guarded(path: str, chunks: list[bytes]) -> tuple[bytes, Upstream, list]:
    up, fired = Upstream(chunks), []
    transform = guard(path, "m", fired.append, up.close)
    assert transform is not None

    async def collect() -> list[bytes]:
        return [c async for c in transform(up.source())]
    out = asyncio.run(collect())
    return b"".join(out), up, fired


def sse_data(raw: bytes) -> list[tuple[str | None, object]]:
    """(event name, data) of each event of a stream; data is "[DONE]" or the JSON."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name = next((ln[7:] for ln in block.splitlines() if ln.startswith("event: ")), None)
        data = "\n".join(ln[6:] for ln in block.splitlines() if ln.startswith("data: "))
        out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_a_looping_stream_is_ended_as_the_output_limit_ends_it(path: str) -> None:
    text = looped(37, 5 * LOOP_CHARS)
    chunks = split_odd(with_text(path, text), 97)
    out, up, fired = guarded(path, chunks)
    got, calls, stop = parse_stream(path, out)  # the official client reads a well-formed, truncated answer
    assert stop == STOPS[path] and calls == []
    assert text.startswith(got) and LOOP_CHARS <= len(got) - len(looped(37, 0)) <= LOOP_CHARS + CHECK_EVERY + 5
    assert [loop.period for loop in fired] == [37]
    assert up.closed == 1 and up.read < len(chunks) // 3  # the child was cut off, its stream not read on
    events = sse_data(out)
    if path == "/v1/chat/completions":
        assert events[-1] == (None, "[DONE]") and events[-2][1]["choices"][0]["finish_reason"] == "length"
        assert events[-2][1]["id"] == events[0][1]["id"]
    elif path == "/v1/messages":
        assert [e for e, _ in events[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    else:  # llama-server's end at its output limit: every item done, then response.completed
        assert [e for e, _ in events[-4:]] == ["response.output_text.done", "response.content_part.done",
                                               "response.output_item.done", "response.completed"]
        done = events[-1][1]["response"]
        assert done["id"] == events[0][1]["response"]["id"] and done["output"][0]["content"][0]["text"] == got


@pytest.mark.parametrize("path", sorted(STREAMS))
@pytest.mark.parametrize("text", ["Hello there, `x` is a name.", CODE, STEPS, "=" * 4000])
def test_an_ordinary_stream_passes_through_byte_for_byte(path: str, text: str) -> None:
    raw = with_text(path, text)
    for chunks in ([raw], split_odd(raw), split_odd(raw, 1000)):
        out, up, fired = guarded(path, chunks)
        assert out == raw and fired == [] and up.closed == 0 and up.read == len(chunks)
    whole_events = [ev + b"\n\n" for ev in raw.split(b"\n\n") if ev]
    out, _, _ = guarded(path, whole_events)
    assert out == raw


def test_a_loop_in_tool_call_arguments_is_stopped_too() -> None:
    def chunk(delta: dict) -> bytes:
        return f'data: {json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}], "id": "c1"})}\n\n'.encode()
    args = '{"cmd": "' + "echo hi; " * 2000
    chunks = [chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                          "function": {"name": "exec_command", "arguments": ""}}]})]
    chunks += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 4]}}]})
               for i in range(0, len(args), 4)]
    out, up, fired = guarded("/v1/chat/completions", chunks)
    assert [loop.period for loop in fired] == [9] and up.closed == 1
    assert sse_data(out)[-2][1]["choices"] == [{"finish_reason": "length", "index": 0, "delta": {}}]


def test_an_open_thinking_block_is_signed_and_closed() -> None:
    def ev(data: dict) -> bytes:
        return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()
    chunks = [ev({"type": "message_start", "message": {"id": "msg_1", "content": []}}),
              ev({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}})]
    chunks += [ev({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Wait, "}})
               ] * 1000
    out, up, fired = guarded("/v1/messages", chunks)
    events = sse_data(out)
    assert [loop.period for loop in fired] == [6] and up.closed == 1
    assert [e for e, _ in events[-4:]] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[-4][1]["delta"] == {"type": "signature_delta", "signature": ""}
    assert events[-2][1]["usage"]["output_tokens"] == len(events) - 6  # the deltas seen


def test_a_completions_stream_ends_with_length_and_done() -> None:
    chunks = [f'data: {json.dumps({"choices": [{"index": 0, "text": "la "}], "id": "cmpl-1"})}\n\n'.encode()] * 2000
    out, up, fired = guarded("/v1/completions", chunks)
    events = sse_data(out)
    assert fired and up.closed == 1 and up.read < 2000
    assert events[-1] == (None, "[DONE]") and events[-2][1]["choices"][0]["finish_reason"] == "length"
    assert events[-2][1]["object"] == "text_completion" and events[-2][1]["id"] == "cmpl-1"


def test_only_known_routes_are_guarded() -> None:
    assert guard("/v1/embeddings", "m", lambda _: None, Upstream([]).close) is None


def test_ps_says_how_many_answers_were_stopped_in_a_loop(capsys: pytest.CaptureFixture) -> None:
    from bostudio.cli.daemon import _print_ps

    row = {"model": "qwen2.5-coder-1.5b", "state": "ready", "pid": 42, "port": 4000, "speculation": "off",
           "stats": {"requests": 9, "runaways_stopped": 2}, "prompts": None}
    assert _print_ps([row]) == 0
    assert "  answers stopped in a loop (ended as the output limit ends them): 2 (of 9 requests)" in \
        capsys.readouterr().out.splitlines()
    _print_ps([{**row, "stats": {"requests": 9, "runaways_stopped": 0}}])
    assert "stopped in a loop" not in capsys.readouterr().out
