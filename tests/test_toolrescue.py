"""Near-miss tool calls (bostudio/daemon/http/toolrescue.py): the narrow rule, table-driven, and the rewrite of
each API dialect's answer, streamed and whole. The streams are shaped as the pinned llama-server sends them
(tests/data/rescue_streams.json holds streams captured from it); every rewritten answer is read back by the
official client library's own parser, so a client sees a real call."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bostudio.daemon.http import toolrescue
from bostudio.daemon.http.toolrescue import could_be_call, near_miss_call, request_tools

WRITE = {"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
         "required": ["file_path", "content"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = {"Write": WRITE, "get_weather": WEATHER}
CALL = '{"name": "Write", "arguments": {"file_path": "hello.py", "content": "print(\'hello\')\\n"}}'
WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize("text, expected", [
    (f"```json\n{CALL}\n```", "Write"),
    (f"\n\n```json\n{CALL}\n```\n", "Write"),
    (f"```\n{CALL}\n```", "Write"),
    (CALL, "Write"),
    (f"<tool_call>\n{CALL}\n</tool_call>", "Write"),
    (f"```json\n<tool_call>\n{CALL}\n</tool_call>\n```", "Write"),
    (f"<tools>\n{CALL}\n</tools>", "Write"),
    ('```json\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n```', "get_weather"),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', "get_weather"),
    # written on Codex's prompt by Qwen2.5-Coder-1.5B: its plan as several blocks (the first is the call),
    # XML-ish forms, an invalid \' escape (read as ')
    (f"<tools>\n{CALL}\n</tools>\n<tools>\n{WEATHER_CALL}\n</tools>", "Write"),
    (f"{CALL}\n{WEATHER_CALL}", "Write"),
    (f"```json\n{CALL}\n```\n\n```json\n{WEATHER_CALL}\n```", "Write"),
    (f"{CALL}\n{{\"name\": \"get_weather\", \"arguments\": {{\"town\": 1}}}}", "Write"),  # dropped, not sent
    ("<function name=\"get_weather\" arguments='{\"city\": \"Paris\"}'>", "get_weather"),
    ("<function name=\"get_weather\" arguments='{\"city\": \"it's\"}'/>\n"
     "<function name=\"get_weather\" arguments='{\"city\": \"Rome\"}'></function>", "get_weather"),
    ("<tools>\n  <function>\n    <name>get_weather</name>\n    <arguments>\n      {\"city\": \"Paris\"}\n"
     "    </arguments>\n  </function>\n</tools>", "get_weather"),
    ('{"name": "get_weather", "arguments": {"city": "python3 -c \'print(\\\'hi\\\')\'"}}', "get_weather"),
    # not a call: prose around it, another tool, schema failures, extra keys, not JSON, several objects
    (f"Here is the call:\n```json\n{CALL}\n```", None),
    (f"```json\n{CALL}\n```\nDone.", None),
    ('```json\n{"name": "Bash", "arguments": {"command": "ls"}}\n```', None),
    ('```json\n{"name": "Write", "arguments": {"file_path": "hello.py"}}\n```', None),
    ('```json\n{"name": "Write", "arguments": {"file_path": 3, "content": "x"}}\n```', None),
    ('```json\n{"name": "Write", "arguments": {"file_path": "a", "content": "x", "mode": "w"}}\n```', None),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}, "id": 1}\n```', None),
    ('```json\n{"name": "get_weather", "arguments": ["Paris"]}\n```', None),
    ('```python\nprint("hello")\n```', None),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"title": "get_weather"}\n```', None),
    ('{"city": "Paris"}', None),
    # a plan whose first step fails its schema, or with a step the request has no tool for; a form left open
    (f"{{\"name\": \"get_weather\", \"arguments\": {{}}}}\n{CALL}", None),
    (f"```json\n{CALL}\n```\nThen I ran it.", None),
    (f"<tools>{CALL}</tools><tools>{{\"name\": \"Bash\", \"arguments\": {{}}}}</tools>", None),
    ("<function name=\"get_weather\" arguments='{\"city\": \"Paris\"}\"/>", None),
    ("<function name=\"get_weather\" arguments='{\"city\": \"Paris\"'>", None),
    ("<function name=\"get_weather\" arguments='{\"city\": \"Paris\"}'> and then I ran it", None),
    # tags that do not pair, a tag left open, the tool list echoed back (a definition, not a call)
    (f"<tools>\n{CALL}\n</tool_call>", None),
    (f"<tools>\n{CALL}", None),
    ('<tools>\n{"type": "function", "function": {"name": "get_weather", "parameters": {}}}\n</tools>', None),
    ("", None),
])
def test_the_rule_is_narrow(text: str, expected: str | None) -> None:
    found = near_miss_call(text, TOOLS)
    assert (found[0] if found else None) == expected


def test_an_unusable_schema_is_never_guessed() -> None:
    assert near_miss_call('{"name": "f", "arguments": {}}', {"f": {"type": "no-such-type"}}) is None


def test_request_tools_per_dialect_and_tool_choice_none() -> None:
    chat = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]}
    assert request_tools("openai", chat) == {"get_weather": WEATHER}
    assert request_tools("openai", {**chat, "tool_choice": "none"}) == {}
    responses = {"tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER},
                           {"type": "web_search"}]}
    assert request_tools("openai", responses) == {"get_weather": WEATHER}
    anthropic = {"tools": [{"name": "Write", "input_schema": WRITE}, {"type": "web_search_20250305", "name": "ws"}]}
    assert request_tools("anthropic", anthropic) == {"Write": WRITE}
    assert request_tools("anthropic", {**anthropic, "tool_choice": {"type": "none"}}) == {}
    assert request_tools("openai", {"messages": []}) == {}


@pytest.mark.parametrize("text, could", [("", True), ("  \n", True), ("`", True), ("``", True), ("```js", True),
                                         ("{", True), ("<tool", True), ("<tool_call>{", True), ("<tools>", True),
                                         ("<tools>\n{", True), ("<function name=", True), ("<func", True),
                                         ("<function>", True), ("<toolbox>", False), ("<functional>", False),
                                         ("Hello", False), ("<div>", False), ("I'll", False)])
def test_which_beginnings_are_held(text: str, could: bool) -> None:
    assert could_be_call(text) is could


# ------------------------------------------------------------------------------------ dialect rewrites

STREAMS = json.loads((Path(__file__).parent / "data" / "rescue_streams.json").read_text())


def run(transform, chunks: list[bytes]) -> bytes:
    async def source():
        for c in chunks:
            yield c

    async def collect() -> bytes:
        return b"".join([c async for c in transform(source())])
    return asyncio.run(collect())


def split_odd(data: bytes, n: int = 7) -> list[bytes]:
    """The stream cut in arbitrary places, as TCP may deliver it."""
    return [data[i:i + n] for i in range(0, len(data), n)]


def body_for(path: str, tools: dict) -> dict:
    name, schema = next(iter(tools.items()))
    if path == "/v1/messages":
        return {"tools": [{"name": name, "input_schema": schema}]}
    if path == "/v1/responses":
        return {"tools": [{"type": "function", "name": name, "parameters": schema}]}
    return {"tools": [{"type": "function", "function": {"name": name, "parameters": schema}}]}


def api_for(path: str) -> str:
    return "anthropic" if path == "/v1/messages" else "openai"


def with_text(path: str, text: str) -> bytes:
    """The captured stream of `path` with its answer text replaced by `text` (one delta per character run)."""
    out, done = [], False
    for ev in STREAMS[path]["stream"]:
        data = json.loads(ev["data"]) if ev["data"] != "[DONE]" else None
        d = toolrescue.DIALECTS[path]
        if data is not None and d.text_of(data) is not None:
            if done:
                continue
            done = True
            for piece in [text[i:i + 5] for i in range(0, len(text), 5)]:
                out.append(_event(ev, _set_text(path, data, piece)))
            continue
        out.append(_event(ev, data))
    assert done
    return b"".join(out)


def _set_text(path: str, data: dict, text: str) -> dict:
    data = json.loads(json.dumps(data))
    if path == "/v1/chat/completions":
        data["choices"][0]["delta"]["content"] = text
    elif path == "/v1/messages":
        data["delta"]["text"] = text
    else:
        data["delta"] = text
    return data


def _event(ev: dict, data: dict | None) -> bytes:
    head = f"event: {ev['event']}\n" if ev.get("event") else ""
    return f"{head}data: {'[DONE]' if data is None else json.dumps(data)}\n\n".encode()


def client_for(path: str, raw: bytes, content_type: str = "text/event-stream"):
    """The official client of `path`'s API, answered `raw` through a mock transport (no socket)."""
    import anthropic
    import httpx
    import openai

    def client_of(lib):  # the anthropic SDK ships its own httpx fork (httpx2)
        def serve(request):
            return lib.Response(200, content=raw, headers={"content-type": content_type})
        return lib.Client(transport=lib.MockTransport(serve))
    if path == "/v1/messages":
        import httpx2
        return anthropic.Anthropic(base_url="http://daemon", api_key="x", http_client=client_of(httpx2))
    return openai.OpenAI(base_url="http://daemon/v1", api_key="x", http_client=client_of(httpx))


def parse_stream(path: str, raw: bytes) -> tuple[str, list[tuple[str, dict]], str | None]:
    """(text, calls, stop reason) as the official client library reads the stream."""
    client = client_for(path, raw)
    hi = [{"role": "user", "content": "hi"}]
    if path == "/v1/messages":
        with client.messages.stream(model="m", max_tokens=8, messages=hi) as s:
            msg = s.get_final_message()
        text = "".join(b.text for b in msg.content if b.type == "text")
        return text, [(b.name, b.input) for b in msg.content if b.type == "tool_use"], msg.stop_reason
    if path == "/v1/chat/completions":
        text, calls, finish = "", {}, None
        for chunk in client.chat.completions.create(model="m", messages=hi, stream=True):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, ["", ""])
                    slot[0] += tc.function.name or ""
                    slot[1] += tc.function.arguments or ""
        return text, [(n, json.loads(a)) for n, a in calls.values()], finish
    text, calls, status = "", [], None
    for ev in client.responses.create(model="m", input="hi", stream=True):
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type == "response.completed":
            status = ev.response.status
            calls = [(o.name, json.loads(o.arguments)) for o in ev.response.output if o.type == "function_call"]
    return text, calls, status


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_a_streamed_near_miss_becomes_a_call_the_client_reads(path: str) -> None:
    fired: list[str] = []
    text = f"```json\n{CALL}\n```"
    transform = toolrescue.rescuer(path, api_for(path), body_for(path, {"Write": WRITE}), True, fired.append)
    out = run(transform, split_odd(with_text(path, text)))
    got_text, calls, stop = parse_stream(path, out)
    assert calls == [("Write", {"file_path": "hello.py", "content": "print('hello')\n"})]
    assert got_text == "" and fired == ["Write"]
    assert stop in ("tool_calls", "tool_use", "completed")


@pytest.mark.parametrize("path", sorted(STREAMS))
@pytest.mark.parametrize("text", ["Hello there, `x` is a name.", '```json\n{"name": "Write", "arguments": {}}\n```',
                                  "```python\nprint(1)\n```"])
def test_other_answers_stream_through_unchanged(path: str, text: str) -> None:
    fired: list[str] = []
    stream = with_text(path, text)
    transform = toolrescue.rescuer(path, api_for(path), body_for(path, {"Write": WRITE}), True, fired.append)
    out = run(transform, split_odd(stream))
    assert out == stream and not fired
    got_text, calls, _ = parse_stream(path, out)
    assert got_text == text and calls == []
    # Several events in one chunk (the loop guard before the rescue passes a chunk's events joined): the
    # ones after the event that releases the answer go on too.
    fresh = toolrescue.rescuer(path, api_for(path), body_for(path, {"Write": WRITE}), True, fired.append)
    assert run(fresh, [stream]) == stream and not fired


def test_ordinary_text_is_released_at_its_first_character() -> None:
    """Streaming is not delayed for a normal answer: the first chunk with prose comes out at once."""
    path = "/v1/chat/completions"
    stream = with_text(path, "Hello, world. " * 20)
    transform = toolrescue.rescuer(path, "openai", body_for(path, {"Write": WRITE}), True, lambda _: None)
    seen: list[bytes] = []

    async def source():
        for c in split_odd(stream, 64):
            yield c
            if len(seen) == 0 and b"Hello" in c:
                return  # the client must already have what came so far

    async def collect() -> None:
        async for c in transform(source()):
            seen.append(c)
    asyncio.run(collect())
    assert b"Hello" in b"".join(seen)


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_a_whole_answer_becomes_a_call(path: str) -> None:
    fired: list[str] = []
    body = json.loads(json.dumps(STREAMS[path]["whole"]))
    text = f"```json\n{CALL}\n```"
    if path == "/v1/chat/completions":
        body["choices"][0]["message"]["content"] = text
    elif path == "/v1/messages":
        body["content"][0]["text"] = text
    else:
        body["output"][0]["content"][0]["text"] = text
    transform = toolrescue.rescuer(path, api_for(path), body_for(path, {"Write": WRITE}), False, fired.append)
    client = client_for(path, run(transform, [json.dumps(body).encode()]), "application/json")
    if path == "/v1/chat/completions":
        choice = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "Write"
        assert json.loads(choice.message.tool_calls[0].function.arguments)["file_path"] == "hello.py"
    elif path == "/v1/messages":
        m = client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert m.stop_reason == "tool_use" and m.content[0].type == "tool_use"
        assert m.content[0].input["file_path"] == "hello.py"
    else:
        r = client.responses.create(model="m", input="hi")
        assert [o.type for o in r.output] == ["function_call"] and r.output[0].name == "Write"
        assert json.loads(r.output[0].arguments)["file_path"] == "hello.py"
    assert fired == ["Write"]


# ------------------------------------------------- a broken call asked again, with the call forced

@pytest.mark.parametrize("text, expected", [
    # seen on Codex's prompt (Qwen2.5-Coder-1.5B): JSON cut short inside a quoted attribute, tags of its own
    ("<function name=\"get_weather\" arguments='{\"city\": \"Paris'>", "get_weather"),
    ("<function-name>get_weather</function-name>\n<arguments>{\"city\": }</arguments>", "get_weather"),
    ('{{"name": "Write", "arguments": {"file_path": "a"}}}}', "Write"),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"\n```', "get_weather"),
    ('<tools>\n<function=get_weather>\n{"city": 1}\n</tools>', "get_weather"),
    ('{"name": "Write", "x": 1} {"name": "get_weather"}', "Write"),  # the earliest named tool
    # not an attempt at one of the request's tools: prose, another tool, a name that only starts alike
    ("I would call get_weather with Paris.", None),
    ('{"name": "Bash", "arguments": {"command": "ls"}', None),
    ('{"name": "get_weather_now", "arguments": {}', None),
    ("```python\nprint('get_weather')\n```", None),
    ("```python\n" + "x = 1\n" * 60 + 'CONFIG = {"name": "get_weather", "city": }\n```', None),  # named late
    ("", None),
])
def test_which_broken_answers_are_attempts(text: str, expected: str | None) -> None:
    assert toolrescue.attempted_tool(text, TOOLS) == expected


def test_forcing_keeps_the_named_tool_alone_and_forces_it_per_dialect() -> None:
    chat = body_for("/v1/chat/completions", TOOLS) | {"tools": [
        {"type": "function", "function": {"name": n, "parameters": s}} for n, s in TOOLS.items()]}
    forced = toolrescue.forcing("openai", chat, "get_weather")
    assert [t["function"]["name"] for t in forced["tools"]] == ["get_weather"] and forced["tool_choice"] == "required"
    assert forced["parallel_tool_calls"] is False  # one call, as a rescue sends one
    resp = {"tools": [{"type": "function", "name": n, "parameters": s} for n, s in TOOLS.items()], "input": "hi",
            "parallel_tool_calls": True}
    forced = toolrescue.forcing("openai", resp, "Write")
    assert [t["name"] for t in forced["tools"]] == ["Write"] and forced["input"] == "hi"
    assert forced["parallel_tool_calls"] is False and resp["parallel_tool_calls"] is True
    anth = {"tools": [{"name": n, "input_schema": s} for n, s in TOOLS.items()], "tool_choice": {"type": "auto"}}
    forced = toolrescue.forcing("anthropic", anth, "Write")
    assert [t["name"] for t in forced["tools"]] == ["Write"]
    assert forced["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert anth["tool_choice"] == {"type": "auto"}  # the client's body is not changed


BROKEN = "<function name=\"Write\" arguments='{\"file_path\": \"a.py\", \"content\": \"x'}'>"


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_a_broken_call_is_replaced_by_the_forced_one(path: str) -> None:
    """Nothing of the held answer reaches the client: the forced call's own stream does, whole."""
    forced_stream = with_text(path, f"```json\n{CALL}\n```")  # stands for llama-server's forced answer
    asked: list[str] = []

    async def regenerate(tool: str):
        asked.append(tool)
        for chunk in split_odd(forced_stream):
            yield chunk

    transform = toolrescue.rescuer(path, api_for(path), body_for(path, {"Write": WRITE}), True, lambda _: None,
                                   regenerate)
    out = run(transform, split_odd(with_text(path, BROKEN)))
    assert asked == ["Write"] and out == forced_stream


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_when_the_forced_call_cannot_be_had_the_answer_goes_out_as_it_was(path: str) -> None:
    async def regenerate(tool: str):
        raise toolrescue.RegenerateFailed
        yield b""  # an async generator

    stream = with_text(path, BROKEN)
    transform = toolrescue.rescuer(path, api_for(path), body_for(path, {"Write": WRITE}), True, lambda _: None,
                                   regenerate)
    assert run(transform, split_odd(stream)) == stream


def test_a_whole_broken_answer_is_replaced_too() -> None:
    path = "/v1/chat/completions"
    body = json.loads(json.dumps(STREAMS[path]["whole"]))
    body["choices"][0]["message"]["content"] = BROKEN
    forced = json.dumps({"forced": True}).encode()

    async def regenerate(tool: str):
        yield forced

    transform = toolrescue.rescuer(path, "openai", body_for(path, {"Write": WRITE}), False, lambda _: None, regenerate)
    assert run(transform, [json.dumps(body).encode()]) == forced
    never = toolrescue.rescuer(path, "openai", body_for(path, {"Write": WRITE}), False, lambda _: None, None)
    assert run(never, [json.dumps(body).encode()]) == json.dumps(body).encode()


# ------------------------------------------------------------- Anthropic's disable_parallel_tool_use kept

def _calls_stream(n: int) -> bytes:
    """An Anthropic stream of `n` get_weather calls, shaped as the pinned llama-server writes a forced answer."""
    def ev(data: dict) -> bytes:
        return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()
    out = [ev({"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant", "content": [],
                                                   "model": "m", "stop_reason": None, "stop_sequence": None,
                                                   "usage": {"input_tokens": 9, "output_tokens": 0}}})]
    for i, city in enumerate(["Paris", "London", "Rome"][:n]):
        out += [ev({"type": "content_block_start", "index": i,
                    "content_block": {"type": "tool_use", "id": f"c{i}", "name": "get_weather", "input": {}}}),
                ev({"type": "content_block_delta", "index": i,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps({"city": city})}}),
                ev({"type": "content_block_stop", "index": i})]
    out += [ev({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                "usage": {"output_tokens": 60}}), ev({"type": "message_stop"})]
    return b"".join(out)


ONE_CALL = {"tool_choice": {"type": "any", "disable_parallel_tool_use": True}}


def test_one_call_ends_an_anthropic_stream_after_its_first_call() -> None:
    closed = []

    async def close() -> None:
        closed.append(True)
    transform = toolrescue.one_call("/v1/messages", ONE_CALL, True, close)
    out = run(transform, split_odd(_calls_stream(3)))
    assert closed == [True]  # the child stopped generating
    text, calls, stop = parse_stream("/v1/messages", out)
    assert calls == [("get_weather", {"city": "Paris"})] and stop == "tool_use" and text == ""
    # llama-server closes its blocks only at the end: the call's block is closed by the daemon.
    late = _calls_stream(3).replace(b'event: content_block_stop\ndata: {"type": "content_block_stop", "index": 0}\n\n',
                                    b"")
    assert late != _calls_stream(3)
    _, calls, stop = parse_stream("/v1/messages", run(transform, [late]))
    assert calls == [("get_weather", {"city": "Paris"})] and stop == "tool_use"
    # One call already: the stream is the child's own, end included.
    closed.clear()
    one = _calls_stream(1).replace(b'"stop_reason": "max_tokens"', b'"stop_reason": "tool_use"')
    assert run(transform, split_odd(one)) == one and closed == []


def test_one_call_keeps_a_whole_anthropic_answer_to_its_first_call() -> None:
    async def close() -> None:
        raise AssertionError("a whole answer has no generation left to stop")
    whole = {"id": "m1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "max_tokens",
             "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 60},
             "content": [{"type": "tool_use", "id": f"c{i}", "name": "get_weather", "input": {"city": c}}
                         for i, c in enumerate(["Paris", "London"])]}
    out = run(toolrescue.one_call("/v1/messages", ONE_CALL, False, close), [json.dumps(whole).encode()])
    msg = client_for("/v1/messages", out, "application/json").messages.create(
        model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert [(b.name, b.input) for b in msg.content] == [("get_weather", {"city": "Paris"})]
    assert msg.stop_reason == "tool_use"


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"tool_choice": {"type": "any"}}),  # parallel calls allowed: the API's default
    ("/v1/messages", {"tool_choice": {"type": "any", "disable_parallel_tool_use": False}}),
    ("/v1/messages", {}),
    ("/v1/chat/completions", ONE_CALL),  # llama-server reads parallel_tool_calls there itself
])
def test_one_call_only_where_asked(path: str, body: dict) -> None:
    async def close() -> None:
        pass
    assert toolrescue.one_call(path, body, True, close) is None


def test_the_forced_anthropic_retry_asks_for_one_call() -> None:
    anth = {"tools": [{"name": n, "input_schema": s} for n, s in TOOLS.items()]}
    forced = toolrescue.forcing("anthropic", anth, "Write")
    assert forced["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}

    async def close() -> None:
        pass
    assert toolrescue.one_call("/v1/messages", forced, True, close) is not None
