"""Near-miss tool calls made real. A small model given tools often writes its call as text: a fenced
```json block (or a bare JSON object) holding `{"name": ..., "arguments": {...}}`, where its template asks
for `<tool_call>` markers. llama-server's parser then finds no call, the agent prints the JSON as its answer
and nothing happens (Qwen2.5-Coder-1.5B did so on Claude Code's prompt and on a one-tool request).

The rule is narrow on purpose. A response becomes a tool call only when ALL of it:
- is the whole text of the answer (nothing before or after but white space), with no real call beside it;
- is one or more call blocks, bare or in one ``` fence (any language tag). A block is a JSON object, or
  <tool_call> or <tools> tags around blocks (Qwen2.5-Coder-1.5B echoes the tag its template lists the tools
  in), or one of the two XML-ish forms the same model wrote on Codex's prompt:
  `<function name="N" arguments='{...}'>` and `<function><name>N</name><arguments>{...}</arguments></function>`;
- each block names one of the request's own tools (`name`), with its arguments as an object (`arguments`,
  `parameters` or `input`; a JSON string holding an object counts) and no other key; an invalid `\'` escape in
  the JSON is read as the quote it stands for (the only reading it has);
- and the first block's arguments validate against that tool's JSON schema.
Of several blocks (each fenced, tagged or bare) the first becomes the call: the model wrote out its plan,
and it writes the next step again once it has read the first one's result. The later ones are dropped, not
sent, so they need only be calls to the request's own tools. Text that fails any of these passes through
unchanged: never a call that fails the schema. A request with `tool_choice: none` (or no tools) is never
touched.

An answer held whole that tried to call one of the request's tools in a form no rule reads (broken JSON,
tags of the model's own: attempted_tool) is not guessed at: the request is asked again with a call to that
tool forced (forcing), so llama.cpp's grammar for the tool's schema writes it, and that response goes to the
client instead. Nothing of the first answer has gone out by then; when the forced one cannot be had, the
first goes out as it was.

For a streamed answer, text deltas are held only while the answer so far could still be such a block (it
is empty or starts with "`", "{", "<tool_call>", "<tools>" or a "<function" tag); the first other character
releases them and the rest streams through untouched. A held answer is decided at its end. Pure: bytes in, bytes out, per API
dialect (OpenAI chat, Anthropic messages, OpenAI Responses), streamed (SSE) or whole (JSON).
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import jsonschema
import referencing.exceptions

from bostudio.daemon.http.normalise import tool_name

TAGS = ("<tool_call>", "<tools>", "<function ", "<function>", "<function-name>", "<function=")
FENCED_BLOCK = re.compile(r"```[\w+-]*[ \t]*\n(.*?)\n?[ \t]*```", re.S)
WRAPPER = re.compile(r"<(tool_call|tools)>")
# <function name="N" arguments='{...}'> : the JSON is read by a JSON decoder, so quotes inside it are no end
FUNCTION_ATTR = re.compile(r"""<function\s+name\s*=\s*["']([\w.-]+)["']\s+arguments\s*=\s*(["'])""")
FUNCTION_ATTR_END = re.compile(r"""(["'])\s*(?:/>|>\s*</function>|>)""")
FUNCTION_ELEM = re.compile(r"<function>\s*<name>\s*([\w.-]+)\s*</name>\s*<arguments>(.*?)</arguments>\s*</function>",
                           re.S)
ARG_KEYS = ("arguments", "parameters", "input")
# `\'` is not a JSON escape, but a small model writes it for a quote inside a shell command
# (Qwen2.5-Coder-1.5B on Codex: "cmd": "python3 -c 'print(\'hello\')'"); its only reading is `'`.
BAD_QUOTE_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\'")
ATTEMPT_WITHIN = 256  # characters of a held answer in which a broken call must name its tool
MAX_HELD = 1 << 20  # bytes of held text; past this the answer streams on as text


def request_tools(api: str, body: dict) -> dict[str, dict]:
    """The request's function tools, name -> JSON schema of the arguments ({} when it may call none)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none"):
        return {}
    out: dict[str, dict] = {}
    for t in tools:
        if not isinstance(t, dict):
            continue
        if api == "anthropic":
            if t.get("type") not in (None, "custom"):
                continue  # a server tool (web search ...): no schema of ours
            name, schema = t.get("name"), t.get("input_schema")
        elif isinstance(t.get("function"), dict):  # OpenAI chat
            name, schema = t["function"].get("name"), t["function"].get("parameters")
        elif t.get("type") == "function":  # Responses
            name, schema = t.get("name"), t.get("parameters")
        else:
            continue
        if isinstance(name, str) and name:
            out[name] = schema if isinstance(schema, dict) else {"type": "object"}
    return out


def near_miss_call(text: str, tools: dict[str, dict]) -> tuple[str, dict] | None:
    """(tool name, arguments) when the whole `text` is one or more calls to `tools` whose first validates,
    else None. Of several calls the first is returned: a small model writes out the steps it plans (write the
    file, then run it), and it writes the next one again once it has read the first one's result."""
    if not tools or len(text) > MAX_HELD:
        return None
    inner = text.strip()
    calls = _blocks(inner)
    if calls is None and BAD_QUOTE_ESCAPE.search(inner):
        calls = _blocks(BAD_QUOTE_ESCAPE.sub(r"\1'", inner))
    if not calls or any(name not in tools for name, _ in calls) or not _valid(*calls[0], tools):
        return None
    return calls[0]


def _valid(name: str, args: dict, tools: dict[str, dict]) -> bool:
    """Whether `args` validate against the JSON schema of `tools[name]` (never a guess)."""
    schema = tools[name]
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        return bool(cls(schema).is_valid(args))
    except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable, RecursionError, TypeError,
            ValueError):
        return False  # a schema we cannot check


def _blocks(s: str, depth: int = 0) -> list[tuple[str, dict]] | None:
    """The calls `s` consists of, one block after another with only white space between, or None when any
    part of it is not a call block. Blocks: a JSON object {"name", "arguments"}; <tool_call>/<tools> tags
    around blocks; <function name="N" arguments='{...}'> (closed by /> or </function>); and
    <function><name>N</name><arguments>{...}</arguments></function>; a ``` fence around blocks."""
    calls: list[tuple[str, dict]] = []
    s = s.strip()
    while s:
        one = _block(s, depth)
        if one is None:
            return None
        got, s = one
        calls += got
        s = s.lstrip()
    return calls


def _block(s: str, depth: int) -> tuple[list[tuple[str, dict]], str] | None:
    """The call block at the start of `s` and the text after it, or None."""
    fence = FENCED_BLOCK.match(s)
    if fence and depth < 2:
        inner = _blocks(fence.group(1), depth + 1)
        return (inner, s[fence.end():]) if inner else None
    if s.startswith("{"):
        obj, end = _decode(s)
        call = _call(obj)
        return ([call], s[end:]) if call else None
    tag = WRAPPER.match(s)
    if tag and depth < 2:
        close = s.find(f"</{tag.group(1)}>", tag.end())
        inner = _blocks(s[tag.end():close], depth + 1) if close >= 0 else None
        return (inner, s[close + len(tag.group(1)) + 3:]) if inner else None
    attr = FUNCTION_ATTR.match(s)
    if attr:
        args, end = _decode(s[attr.end():])
        rest = FUNCTION_ATTR_END.match(s[attr.end() + end:]) if end else None
        if not isinstance(args, dict) or not rest or rest.group(1) != attr.group(2):
            return None
        return [(attr.group(1), args)], s[attr.end() + end + rest.end():]
    elem = FUNCTION_ELEM.match(s)
    if elem:
        args = _loads(elem.group(2))
        return ([(elem.group(1), args)], s[elem.end():]) if isinstance(args, dict) else None
    return None


def _call(obj: Any) -> tuple[str, dict] | None:
    """{"name": N, "arguments"|"parameters"|"input": {...} or a JSON string of one} as (N, arguments)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    keys = [k for k in obj if k != "name"]
    if len(keys) > 1 or (keys and keys[0] not in ARG_KEYS):
        return None
    args: Any = obj[keys[0]] if keys else {}
    if isinstance(args, str):
        args = _loads(args)
    return (obj["name"], args) if isinstance(args, dict) else None


def _decode(s: str) -> tuple[Any, int]:
    """The JSON value at the start of `s` and where it ends; (None, 0) when there is none."""
    try:
        return json.JSONDecoder().raw_decode(s)
    except (ValueError, RecursionError):
        return None, 0


def _loads(text: str) -> Any:
    """`text` as JSON, reading an invalid `\\'` escape as the quote it stands for; None when it is no JSON."""
    for candidate in (text.strip(), BAD_QUOTE_ESCAPE.sub(r"\1'", text.strip())):
        try:
            return json.loads(candidate)
        except (ValueError, RecursionError):
            continue
    return None


def attempted_tool(text: str, tools: dict[str, dict]) -> str | None:
    """The request's tool a held answer tried to call in a form no rule above reads (broken JSON, another
    tag), or None. It names the tool as a call does: `"name": "X"`, `name="X"`, `<name>X</name>`,
    `<function-name>X</function-name>` or `<function=X>`, within its first ATTEMPT_WITHIN characters (a call
    names its tool at its start; a code block that quotes a config further down does not count); the earliest
    such tool wins. Only an answer held whole (it began as a call may: could_be_call) is asked: prose that
    mentions a tool is not."""
    if not tools or len(text) > MAX_HELD or not could_be_call(text):
        return None
    best: tuple[int, str] | None = None
    for name in tools:
        m = re.search(r"""(?:"name"\s*:\s*"|\bname\s*=\s*["']|<(?:name|function-name|tool_name)>\s*|<function=)"""
                      + re.escape(name) + r"""(?=["'<>\s])""", text[:ATTEMPT_WITHIN])
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), name)
    return best[1] if best else None


def forcing(api: str, body: dict, tool: str) -> dict:
    """`body` asking for one call to `tool` alone (its definition only, the dialect's forcing tool_choice, and
    on the OpenAI dialects no parallel calls): llama-server then writes the call under the grammar of the tool's
    schema (normalise.py opens it). One call, as a rescued answer sends one: forced with parallel calls allowed,
    the 1.5B wrote its plan as three (create the file, run it, `rm` it). On Anthropic's route, which llama-server
    gives no such switch, the daemon ends the answer after its first call (one_call). On the OpenAI routes
    llama-server reads the switch itself and, on the pinned build, honours it only mostly (a Responses answer whose
    prompt was cached held eight calls once in six runs): not cut by the daemon yet."""
    tools = [t for t in body.get("tools") or [] if tool_name(t) == tool]
    if api == "anthropic":
        return dict(body, tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    return dict(body, tools=tools, tool_choice="required", parallel_tool_calls=False)


def could_be_call(text: str) -> bool:
    """Whether an answer that starts with `text` may still turn out to be a near-miss call."""
    s = text.lstrip()
    return s == "" or s.startswith(("`", "{")) or any(tag.startswith(s[:len(tag)]) for tag in TAGS)


# ------------------------------------------------------------------------------------------- SSE plumbing

def _events(buf: bytearray) -> list[bytes]:
    """Complete SSE events taken off the front of `buf` (each with its blank-line terminator)."""
    out = []
    while True:
        cut = min((i for i in (buf.find(b"\n\n"), buf.find(b"\r\n\r\n")) if i >= 0), default=-1)
        if cut < 0:
            return out
        end = cut + (4 if buf[cut:cut + 4] == b"\r\n\r\n" else 2)
        out.append(bytes(buf[:end]))
        del buf[:end]


def _data(event: bytes) -> Any:
    """The JSON of an SSE event's data lines, or None (also for `[DONE]`)."""
    lines = [ln[5:].strip() for ln in event.splitlines() if ln.startswith(b"data:")]
    if not lines:
        return None
    try:
        return json.loads(b"\n".join(lines))
    except ValueError:
        return None


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _call_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


class _Dialect(ABC):
    """One API's streamed events: which carry answer text, which a real call, how to rewrite."""

    @abstractmethod
    def text_of(self, data: Any) -> str | None:
        ...

    @abstractmethod
    def has_call(self, data: Any) -> bool:
        ...

    @abstractmethod
    def rewrite(self, events: list[bytes], name: str, args: dict) -> list[bytes] | None:
        ...

    @abstractmethod
    def rewrite_body(self, data: dict, name: str, args: dict) -> dict | None:
        ...

    @abstractmethod
    def body_text(self, data: dict) -> str | None:
        ...


class _OpenAIChat(_Dialect):
    def text_of(self, data: Any) -> str | None:
        if not isinstance(data, dict):
            return None
        for c in data.get("choices") or []:
            if isinstance(c, dict) and isinstance(c.get("delta"), dict) and isinstance(c["delta"].get("content"), str):
                return c["delta"]["content"]
        return None

    def has_call(self, data: Any) -> bool:
        return isinstance(data, dict) and any(isinstance(c, dict) and isinstance(c.get("delta"), dict)
                                              and c["delta"].get("tool_calls") for c in data.get("choices") or [])

    def rewrite(self, events: list[bytes], name: str, args: dict) -> list[bytes] | None:
        out, placed = [], False
        call = {"index": 0, "id": _call_id("call_"), "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
        for ev in events:
            data = _data(ev)
            if not isinstance(data, dict) or not data.get("choices"):
                out.append(ev)
                continue
            choice = data["choices"][0]
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                if not placed:  # the call goes where the text began
                    placed = True
                    out.append(_sse({**data, "choices": [{**choice, "delta": {"tool_calls": [call]}}]}))
                continue
            if choice.get("finish_reason") is not None:
                if not placed:
                    return None
                data = {**data, "choices": [{**choice, "finish_reason": "tool_calls"}]}
                out.append(_sse(data))
                continue
            out.append(ev)
        return out if placed else None

    def body_text(self, data: dict) -> str | None:
        msg = ((data.get("choices") or [{}])[0] or {}).get("message") or {}
        return None if msg.get("tool_calls") else msg.get("content")

    def rewrite_body(self, data: dict, name: str, args: dict) -> dict | None:
        choice = data["choices"][0]
        msg = {**choice["message"], "content": None,
               "tool_calls": [{"id": _call_id("call_"), "type": "function",
                               "function": {"name": name, "arguments": json.dumps(args)}}]}
        return {**data, "choices": [{**choice, "message": msg, "finish_reason": "tool_calls"}]}


class _Anthropic(_Dialect):
    def text_of(self, data: Any) -> str | None:
        if isinstance(data, dict) and data.get("type") == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                return delta["text"]
        return None

    def has_call(self, data: Any) -> bool:
        return isinstance(data, dict) and data.get("type") == "content_block_start" and \
            (data.get("content_block") or {}).get("type") != "text"

    def rewrite(self, events: list[bytes], name: str, args: dict) -> list[bytes] | None:
        out, starts = [], 0
        block = {"type": "tool_use", "id": _call_id("toolu_"), "name": name, "input": {}}
        for ev in events:
            data = _data(ev)
            kind = data.get("type") if isinstance(data, dict) else None
            if kind == "content_block_start":
                starts += 1
                out.append(_sse({**data, "content_block": block}, "content_block_start"))
                out.append(_sse({"type": "content_block_delta", "index": data.get("index", 0),
                                 "delta": {"type": "input_json_delta", "partial_json": json.dumps(args)}},
                                "content_block_delta"))
            elif kind == "content_block_delta":
                continue
            elif kind == "message_delta":
                out.append(_sse({**data, "delta": {**(data.get("delta") or {}), "stop_reason": "tool_use"}},
                                "message_delta"))
            else:
                out.append(ev)
        return out if starts == 1 else None

    def body_text(self, data: dict) -> str | None:
        content = data.get("content")
        if not isinstance(content, list) or len(content) != 1 or (content[0] or {}).get("type") != "text":
            return None
        return content[0].get("text")

    def rewrite_body(self, data: dict, name: str, args: dict) -> dict | None:
        return {**data, "content": [{"type": "tool_use", "id": _call_id("toolu_"), "name": name, "input": args}],
                "stop_reason": "tool_use"}


class _Responses(_Dialect):
    def text_of(self, data: Any) -> str | None:
        if isinstance(data, dict) and data.get("type") == "response.output_text.delta":
            return data.get("delta") if isinstance(data.get("delta"), str) else None
        return None

    def has_call(self, data: Any) -> bool:
        return isinstance(data, dict) and data.get("type") == "response.output_item.added" and \
            (data.get("item") or {}).get("type") not in ("message", None)

    @staticmethod
    def _item(name: str, args: dict, status: str) -> dict:
        return {"type": "function_call", "id": _call_id("fc_"), "call_id": _call_id("call_"), "name": name,
                "arguments": json.dumps(args), "status": status}

    def rewrite(self, events: list[bytes], name: str, args: dict) -> list[bytes] | None:
        out, added = [], 0
        item = self._item(name, args, "completed")
        for ev in events:
            data = _data(ev)
            kind = data.get("type") if isinstance(data, dict) else None
            if kind == "response.output_item.added":
                added += 1
                idx = data.get("output_index", 0)
                out.append(_sse({**data, "output_index": idx, "item": {**item, "arguments": "", "status": "in_progress"}},
                                kind))
                out.append(_sse({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                                 "output_index": idx, "delta": item["arguments"]},
                                "response.function_call_arguments.delta"))
                out.append(_sse({"type": "response.function_call_arguments.done", "item_id": item["id"],
                                 "output_index": idx, "arguments": item["arguments"]},
                                "response.function_call_arguments.done"))
            elif kind in ("response.content_part.added", "response.output_text.delta", "response.output_text.done",
                          "response.content_part.done"):
                continue
            elif kind == "response.output_item.done":
                out.append(_sse({**data, "output_index": data.get("output_index", 0), "item": item}, kind))
            elif kind in ("response.completed", "response.done") and isinstance(data.get("response"), dict):
                out.append(_sse({**data, "response": self._completed(data["response"], item)}, kind))
            else:
                out.append(ev)
        return out if added == 1 else None

    @staticmethod
    def _completed(resp: dict, item: dict) -> dict:
        out = {**resp, "output": [item]}
        out.pop("output_text", None)
        return out

    def body_text(self, data: dict) -> str | None:
        output = data.get("output")
        if not isinstance(output, list) or len(output) != 1 or (output[0] or {}).get("type") != "message":
            return None
        parts = output[0].get("content") or []
        texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "output_text"]
        return "".join(t for t in texts if isinstance(t, str)) if len(texts) == len(parts) else None

    def rewrite_body(self, data: dict, name: str, args: dict) -> dict | None:
        return self._completed(data, self._item(name, args, "completed"))


DIALECTS: dict[str, _Dialect] = {"/v1/chat/completions": _OpenAIChat(), "/v1/messages": _Anthropic(),
                                 "/v1/responses": _Responses()}


def one_call(path: str, body: dict, streaming: bool, close_upstream: Callable[[], Awaitable[None]]
             ) -> Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]] | None:
    """Anthropic's `tool_choice.disable_parallel_tool_use`, which llama-server does not read (tools/server/
    server-chat.cpp converts only the choice's type): the answer ends after its first tool_use block, with
    `stop_reason: "tool_use"`. Forced, Qwen2.5-Coder-1.5B otherwise wrote calls until its output limit (nine
    get_weather calls in 200 tokens). A stream is cut at that block's end, the child's connection closed first
    so it stops generating (at the next block's start, llama-server closing its blocks only at the end); a whole
    answer keeps the content up to that block. None for any other request."""
    choice = body.get("tool_choice")
    if path != "/v1/messages" or not isinstance(choice, dict) or choice.get("disable_parallel_tool_use") is not True:
        return None

    async def stream(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        buf = bytearray()
        open_blocks: list[Any] = []
        call: Any = None  # the index of the first tool_use block
        deltas = 0

        def end() -> bytes:
            return b"".join(_sse({"type": "content_block_stop", "index": i}, "content_block_stop")
                            for i in open_blocks) \
                + _sse({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                        "usage": {"output_tokens": deltas}}, "message_delta") + _sse({"type": "message_stop"},
                                                                                      "message_stop")
        async for chunk in chunks:
            buf += chunk
            out = []
            for ev in _events(buf):
                data = _data(ev)
                kind = data.get("type") if isinstance(data, dict) else None
                index = data.get("index") if isinstance(data, dict) else None
                # llama-server closes its blocks only at the end of the answer: the next block's start is
                # where the first call is known to be whole.
                if call is not None and kind == "content_block_start":
                    await close_upstream()
                    yield b"".join(out) + end()
                    return
                out.append(ev)
                if kind == "content_block_start":
                    open_blocks.append(index)
                    if (data.get("content_block") or {}).get("type") == "tool_use":
                        call = index
                elif kind == "content_block_stop" and index in open_blocks:
                    open_blocks.remove(index)
                elif kind == "content_block_delta":
                    deltas += 1  # llama-server sends one per token
            if out:
                yield b"".join(out)
        if buf:
            yield bytes(buf)

    async def whole(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        raw = b"".join([c async for c in chunks])
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        content = data.get("content") if isinstance(data, dict) else None
        first = next((i for i, b in enumerate(content) if isinstance(b, dict) and b.get("type") == "tool_use"),
                     None) if isinstance(content, list) else None
        if first is None or first + 1 == len(content):  # type: ignore[arg-type]
            yield raw
            return
        yield json.dumps(dict(data, content=content[:first + 1], stop_reason="tool_use")).encode()  # type: ignore

    return stream if streaming else whole


Regenerate = Callable[[str], AsyncIterator[bytes]]


class RegenerateFailed(Exception):
    """The forced call could not be had (no room, the child refused it): the held answer goes out as it was."""


def rescuer(path: str, api: str, body: dict, streaming: bool, fired: Callable[[str], None],
            regenerate: Regenerate | None = None) -> Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]] | None:
    """A relay transform that turns a near-miss call in the answer to `body` into a real one (calling
    `fired(tool name)` when it does), or None when the request cannot have one. With `regenerate`, an answer
    that tried to call a tool in a form no rule reads (attempted_tool) is replaced by `regenerate(tool)`: the
    whole response (same route, same streaming) to the request forced to call that tool; it raises
    RegenerateFailed before its first chunk when it cannot be had."""
    dialect = DIALECTS.get(path)
    tools = request_tools(api, body) if dialect is not None else {}
    if not tools:
        return None
    return _stream(dialect, tools, fired, regenerate) if streaming else _whole(dialect, tools, fired, regenerate)


async def _regenerated(tools: dict[str, dict], text: str, regenerate: Regenerate | None
                       ) -> AsyncIterator[bytes] | None:
    """The forced call's response for an answer that tried one (attempted_tool), started; None otherwise."""
    tool = attempted_tool(text, tools) if regenerate is not None else None
    if tool is None:
        return None
    gen = regenerate(tool).__aiter__()  # type: ignore[misc]
    try:
        first = await gen.__anext__()
    except (RegenerateFailed, StopAsyncIteration):
        return None

    async def rest() -> AsyncIterator[bytes]:
        yield first
        async for chunk in gen:
            yield chunk
    return rest()


def _whole(dialect: _Dialect, tools: dict[str, dict], fired: Callable[[str], None],
           regenerate: Regenerate | None = None):
    async def transform(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        raw = bytearray()
        async for chunk in chunks:
            raw += chunk
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        text = dialect.body_text(data) if isinstance(data, dict) else None
        found = near_miss_call(text, tools) if isinstance(text, str) else None
        new = dialect.rewrite_body(data, *found) if found and isinstance(data, dict) else None
        if new is None:
            again = await _regenerated(tools, text, regenerate) if isinstance(text, str) and not found else None
            if again is not None:
                async for chunk in again:
                    yield chunk
                return
            yield bytes(raw)
            return
        fired(found[0])  # type: ignore[index]
        yield json.dumps(new).encode()
    return transform


def _stream(dialect: _Dialect, tools: dict[str, dict], fired: Callable[[str], None],
            regenerate: Regenerate | None = None):
    async def transform(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        buf, held, text = bytearray(), [], []
        holding = True
        async for chunk in chunks:
            if not holding:
                yield chunk
                continue
            buf += chunk
            events = _events(buf)  # taken off buf: every one goes on, held or released
            for i, ev in enumerate(events):
                held.append(ev)
                data = _data(ev)
                piece = dialect.text_of(data)
                if piece is not None:
                    text.append(piece)
                released = dialect.has_call(data) or (piece is not None and not could_be_call("".join(text))) \
                    or sum(map(len, text)) > MAX_HELD
                if released:
                    holding = False
                    held += events[i + 1:]  # the chunk's later events (a transform before may join several)
                    break
            if not holding:  # an ordinary answer: everything so far, then the rest as it comes
                yield b"".join(held) + bytes(buf)
                held.clear()
                buf.clear()
        if not holding:
            return
        found = near_miss_call("".join(text), tools) if text else None
        rewritten = dialect.rewrite(held, *found) if found else None
        if rewritten is not None:
            fired(found[0])  # type: ignore[index]
            held = rewritten
        elif text:
            again = await _regenerated(tools, "".join(text), regenerate)
            if again is not None:  # nothing of the held answer went out: the forced call's stream instead
                async for chunk in again:
                    yield chunk
                return
        yield b"".join(held) + bytes(buf)
    return transform


__all__ = ["request_tools", "near_miss_call", "attempted_tool", "forcing", "one_call", "could_be_call", "rescuer",
           "RegenerateFailed", "DIALECTS"]
