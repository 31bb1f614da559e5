"""An Ollama-compatible API on the daemon's port (/api/*), translated to and from llama-server's
OpenAI routes: editors and chat UIs that speak only Ollama get the same instances, speculation
included. NDJSON streaming (Ollama's default) is made from llama-server's SSE as it arrives.

Honoured: model, messages (role, content, tool_calls, tool results), prompt, system, raw, stream,
format ("json" or a JSON schema), tools, think (ignored by non-reasoning models), and options
temperature, top_p, top_k, min_p, typical_p, seed, num_predict, stop, repeat_penalty, repeat_last_n,
presence_penalty, frequency_penalty. Ignored (the daemon plans them per model): keep_alive and the
load-time options num_ctx, num_gpu, num_thread, num_batch, main_gpu, use_mmap, use_mlock, numa,
low_vram. Refused with 400: template (chat templates are rendered only by llama-server), context
(the deprecated token context), images and suffix (not supported through this API). Nothing else is
read: the translated body then passes the chat or completions allow-list and gets an output limit when
it has no num_predict (Router.prepare)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from bostudio.catalog.digest import file_digest
from bostudio.gguf.capabilities import ModelCaps, model_caps
from bostudio.daemon.http.router import Reject, Router, api_error, chained
from bostudio.daemon.supervise.lifecycle import RESIDENT_STATES
from bostudio.daemon.supervise.supervisor import Supervisor
from bostudio.errors import BostudioError, ModelError

# The Ollama API version this emulates (clients check it before using newer fields).
OLLAMA_VERSION = "0.13.5"  # codex --oss requires >= 0.13.4
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
            "typical_p": "typical_p", "seed": "seed", "num_predict": "max_tokens", "stop": "stop",
            "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
LOAD_TIME = {"num_ctx", "num_gpu", "num_thread", "num_batch", "main_gpu", "use_mmap", "use_mlock", "numa",
             "low_vram", "num_keep", "vocab_only", "f16_kv", "logits_all", "embedding_only"}
REFUSED = {"template": "chat templates are rendered only inside llama-server",
           "context": "the token `context` of /api/generate is deprecated; send the conversation to /api/chat",
           "images": "images are not supported through the daemon's Ollama API",
           "suffix": "fill-in-the-middle goes through /infill (llama.cpp's API)"}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _bad(message: str) -> BostudioError:
    from bostudio.errors import RequestError

    return RequestError(message, "see docs/daemon.md, 'Ollama API'")


def openai_body(body: dict, *, chat: bool) -> dict:
    """An Ollama /api/chat or /api/generate body as an OpenAI chat/completions body. Raises RequestError."""
    for key, why in REFUSED.items():
        if body.get(key) not in (None, "", [], {}):
            raise _bad(f"`{key}` is not supported: {why}")
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("images"):
            raise _bad(f"`images` is not supported: {REFUSED['images']}")
    out: dict[str, Any] = {"model": body.get("model"), "stream": body.get("stream", True) is not False}
    if out["stream"]:
        out["stream_options"] = {"include_usage": True}
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise _bad("`options` must be an object")
    for key, value in opts.items():
        if key in SAMPLING:
            out[SAMPLING[key]] = value
        elif key not in LOAD_TIME:
            raise _bad(f"option `{key}` is not supported (supported: {', '.join(sorted(SAMPLING))})")
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise _bad("`format` must be \"json\" or a JSON schema object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise _bad("`messages` must be a list")
        out["messages"] = [_message_in(m) for m in messages]
        if body.get("tools"):
            out["tools"] = body["tools"]
    else:
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            raise _bad("`prompt` must be a string")
        if body.get("raw"):
            out["prompt"] = prompt
        else:
            system = body.get("system")
            out["messages"] = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": prompt}]
    return out


def _message_in(m: object) -> dict:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise _bad("each message must be an object with a `role`")
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
    calls = m.get("tool_calls")
    if calls and (not isinstance(calls, list)
                  or not all(isinstance(c, dict) and isinstance(c.get("function", {}), dict) for c in calls)):
        raise _bad("`tool_calls` must be a list of objects, each with a `function` object")
    if calls:
        out["tool_calls"] = [{"id": c.get("id") or f"call_{i}", "type": "function",
                              "function": {"name": c.get("function", {}).get("name"),
                                           "arguments": json.dumps(c.get("function", {}).get("arguments", {}))}}
                             for i, c in enumerate(calls)]
    if m.get("tool_name"):
        out["name"] = m["tool_name"]
    return out


def _tool_calls_out(calls: list[dict]) -> list[dict]:
    out = []
    for c in calls:
        fn = c.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {"_raw": fn.get("arguments")}
        out.append({"function": {"name": fn.get("name"), "arguments": args}})
    return out


def final_fields(timings: dict | None, usage: dict | None, started: float, finish: str | None) -> dict:
    """Ollama's closing counters (durations in ns) from llama-server's timings and usage."""
    t = timings or {}
    u = usage or {}
    prompt_n = u.get("prompt_tokens", int(t.get("prompt_n", 0)) + int(t.get("cache_n", 0)))
    return {"done": True, "done_reason": {"length": "length", "tool_calls": "stop"}.get(finish or "", "stop"),
            "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
            "prompt_eval_count": prompt_n, "prompt_eval_duration": int(float(t.get("prompt_ms", 0)) * 1e6),
            "eval_count": u.get("completion_tokens", int(t.get("predicted_n", 0))),
            "eval_duration": int(float(t.get("predicted_ms", 0)) * 1e6)}


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict]:
    """The JSON objects of an SSE stream (lines may be split across chunks)."""
    buf = b""
    async for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data and data != b"[DONE]":
                    try:
                        yield json.loads(data)
                    except ValueError:
                        continue


def ndjson(obj: dict) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def add_routes(api: APIRouter, sup: Supervisor, router: Router) -> None:
    """The Ollama routes on `api`: the model list and details, chat and generate, embeddings."""
    _model_routes(api, sup, router)
    _generate_routes(api, sup, router)
    _embed_routes(api, router)


def _details(path: Path) -> dict:
    try:
        from bostudio.gguf import describe

        mi = describe(path)
        return {"parent_model": "", "format": "gguf", "family": mi.architecture, "families": [mi.architecture],
                "parameter_size": mi.size_label or "", "quantization_level": mi.quant}
    except BostudioError:
        return {"parent_model": "", "format": "gguf", "family": "", "families": [], "parameter_size": "",
                "quantization_level": ""}


def _digest(path: Path) -> str:
    """The file's sha256, as Ollama clients expect a digest (64 hex characters): computed once, then cached by
    path, size and mtime (catalog.digest). Blocking: called in a worker thread."""
    try:
        return file_digest(path)
    except OSError:
        return ""


def _entry(name: str, path: Path) -> dict:
    """A model as /api/tags and /api/ps list it. Blocking (stat, header, digest): call it in a worker."""
    try:
        st = path.stat()
        size, modified = st.st_size, datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat()
    except OSError:
        size, modified = 0, now_iso()
    return {"name": name, "model": name, "modified_at": modified, "size": size,
            "digest": _digest(path), "details": _details(path)}


def capabilities(caps: ModelCaps) -> list[str]:
    """What /api/show says a model can do, in Ollama's words: `tools` when the template it is served with
    renders tools (llama-server then parses the calls), `insert` with fill-in-the-middle tokens."""
    if caps.kind == "chat":
        return ["completion"] + (["tools"] if caps.template.renders_tools else []) + (["insert"] if caps.fim else [])
    return {"embedding": ["embedding"], "rerank": []}[caps.kind]


def served_template(caps: ModelCaps, own: str | None) -> str:
    """The chat template a client is shown: bostudio's shipped one when it serves the model, else the GGUF's.
    Blocking (reads the shipped file)."""
    if caps.template.source == "shipped" and caps.template.file is not None:
        try:
            return caps.template.file.read_text()
        except OSError:
            pass
    return own or ""


def _model_routes(api: APIRouter, sup: Supervisor, router: Router) -> None:
    """/api/version, /api/tags, /api/ps, /api/show."""

    @api.get("/api/version", tags=["ollama"], summary="Ollama: API version")
    async def version() -> dict:
        return {"version": OLLAMA_VERSION}

    @api.get("/api/tags", tags=["ollama"], summary="Ollama: every model the daemon serves")
    async def tags() -> dict:
        # Headers are read in a worker: a slow disk (or anything but a regular file) never stalls the loop.
        models = sorted(sup.catalog().items())
        return {"models": await asyncio.to_thread(lambda: [_entry(n, p) for n, p in models])}

    @api.get("/api/ps", tags=["ollama"], summary="Ollama: the loaded models")
    async def ps() -> dict:
        resident = [inst for inst in sup.instances.values() if inst.state in RESIDENT_STATES]
        entries = await asyncio.to_thread(lambda: [_entry(inst.name, inst.cfg.path) for inst in resident])
        for inst, e in zip(resident, entries):
            e.update(size=inst.bytes if inst.decision is not None else e["size"], size_vram=0, expires_at=None)
        return {"models": entries}

    @api.post("/api/show", tags=["ollama"], summary="Ollama: one model's details")
    async def show(request: Request) -> Response:
        try:
            _, body = await router.read_json(request, "ollama")
            name = body.get("model") or body.get("name")
            path = sup.catalog().get(name) if isinstance(name, str) else None
            if path is None:
                raise Reject(api_error("ollama", 404, f"model '{name}' not found", "not_found_error"))
            from bostudio.gguf import describe

            mi = await asyncio.to_thread(describe, path)
            caps = await asyncio.to_thread(model_caps, path)
            template = await asyncio.to_thread(served_template, caps, mi.chat_template)
            entry = await asyncio.to_thread(_entry, name, path)
        except Reject as r:
            return r.response
        except BostudioError as exc:
            return api_error("ollama", 400, exc.message, "invalid_request_error", exc.hint)
        # The template is a string shown to a client, never rendered here.
        return JSONResponse({"modelfile": f"FROM {path.name}\n", "parameters": "", "template": template,
                             "details": entry["details"], "capabilities": capabilities(caps),
                             "modified_at": entry["modified_at"], "digest": entry["digest"],
                             "model_info": {"general.architecture": mi.architecture,
                                            "general.parameter_count": mi.n_params,
                                            f"{mi.architecture}.context_length": mi.n_ctx_train,
                                            f"{mi.architecture}.embedding_length": mi.n_embd,
                                            f"{mi.architecture}.block_count": mi.n_block}})


def _generate_routes(api: APIRouter, sup: Supervisor, router: Router) -> None:
    """/api/chat and /api/generate, translated to llama-server's chat/completions and completions."""

    async def generate_like(request: Request, chat: bool) -> Response:
        started = time.monotonic()
        try:
            _, body = await router.read_json(request, "ollama")
            try:
                translated = openai_body(body, chat=chat)
            except BostudioError as exc:
                raise Reject(api_error("ollama", 400, exc.message, "invalid_request_error", exc.hint))
            path = "/v1/completions" if "prompt" in translated else "/v1/chat/completions"
            name = await router.admit(translated, path, "ollama")
            if not chat and not body.get("prompt") and not body.get("raw"):
                # An empty generate loads the model (what Ollama clients send to preload).
                try:
                    await sup.get_ready(name)
                except BostudioError as exc:
                    from bostudio.daemon.http.router import error_response
                    raise Reject(error_response(exc, "ollama"))
                return JSONResponse({"model": name, "created_at": now_iso(), "response": "", "done": True,
                                     "done_reason": "load"})
            raw, translated = await router.prepare(name, path, translated, "ollama")  # bounded, output limited
            inst, upstream = await router.open(name, path, raw, "ollama", translated, request)
        except Reject as r:
            return r.response
        streaming = translated["stream"]
        key = "message" if chat else "response"

        def piece(text: str, thinking: str | None = None, calls: list | None = None) -> dict:
            if chat:
                msg: dict[str, Any] = {"role": "assistant", "content": text}
                if thinking:
                    msg["thinking"] = thinking
                if calls:
                    msg["tool_calls"] = calls
                return {"model": name, "created_at": now_iso(), key: msg, "done": False}
            out = {"model": name, "created_at": now_iso(), key: text, "done": False}
            if thinking:
                out["thinking"] = thinking
            return out

        async def translate_stream(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            if upstream.status_code != 200:
                raw = b"".join([c async for c in chunks])
                yield ndjson({"error": _upstream_message(raw)})
                return
            timings = usage = finish = None
            calls: dict[int, dict] = {}
            async for ev in sse_events(chunks):
                if "error" in ev:
                    yield ndjson({"error": _upstream_message(json.dumps(ev).encode())})
                    return
                timings = ev.get("timings") or timings
                usage = ev.get("usage") or usage
                for choice in ev.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    delta = choice.get("delta") or {}
                    text = delta.get("content") if chat else choice.get("text")
                    for tc in delta.get("tool_calls") or []:
                        slot = calls.setdefault(tc.get("index", 0), {"function": {"name": "", "arguments": ""}})
                        fn = tc.get("function") or {}
                        slot["function"]["name"] += fn.get("name") or ""
                        slot["function"]["arguments"] += fn.get("arguments") or ""
                    if text or delta.get("reasoning_content"):
                        yield ndjson(piece(text or "", delta.get("reasoning_content")))
            if calls:
                yield ndjson(piece("", calls=_tool_calls_out([calls[k] for k in sorted(calls)])))
            last = piece("")
            last.update(final_fields(timings, usage, started, finish))
            yield ndjson(last)

        async def translate_body(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            raw = b"".join([c async for c in chunks])
            if upstream.status_code != 200:
                yield json.dumps({"error": _upstream_message(raw)}).encode()
                return
            data = json.loads(raw)
            choice = (data.get("choices") or [{}])[0]
            if chat:
                msg = choice.get("message") or {}
                out = piece(msg.get("content") or "", msg.get("reasoning_content"),
                            _tool_calls_out(msg.get("tool_calls") or []))
            else:
                out = piece(choice.get("text") or "")
            out.update(final_fields(data.get("timings"), data.get("usage"), started, choice.get("finish_reason")))
            yield json.dumps(out).encode()

        translate = translate_stream if streaming else translate_body
        rescue = router.tool_rescue(inst, path, "openai", translated, streaming, upstream.status_code) \
            if chat else None
        # The same order as Router.forward: the loop guard on the child's events, the rescue, then Ollama's shape.
        return router.relay(inst, upstream, streaming, "ollama",
                            transform=chained(router.loop_guard(inst, upstream, path, translated, streaming), rescue,
                                              translate),
                            media_type="application/x-ndjson" if streaming else "application/json",
                            status_code=upstream.status_code)

    @api.post("/api/chat", tags=["ollama"], summary="Ollama: chat (NDJSON stream by default)")
    async def chat(request: Request) -> Response:
        return await generate_like(request, chat=True)

    @api.post("/api/generate", tags=["ollama"], summary="Ollama: generate from a prompt (NDJSON stream by default)")
    async def generate(request: Request) -> Response:
        return await generate_like(request, chat=False)


def _embed_routes(api: APIRouter, router: Router) -> None:
    """/api/embed, translated to llama-server's /v1/embeddings."""

    @api.post("/api/embed", tags=["ollama"], summary="Ollama: embeddings (embedding models only)")
    async def embed(request: Request) -> Response:
        started = time.monotonic()
        try:
            _, body = await router.read_json(request, "ollama")
            inputs = body.get("input")
            if isinstance(inputs, str):
                inputs = [inputs]
            if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
                raise Reject(api_error("ollama", 400, "`input` must be a string or a list of strings",
                                       "invalid_request_error"))
            translated = {"model": body.get("model"), "input": inputs}
            name = await router.admit(translated, "/v1/embeddings", "ollama")
            raw, translated = await router.prepare(name, "/v1/embeddings", translated, "ollama")
            # (`request` by keyword: passed as the fifth argument it was taken for the body, and a
            # client that hung up was never cancelled upstream.)
            inst, upstream = await router.open(name, "/v1/embeddings", raw, "ollama", translated, request=request)
        except Reject as r:
            return r.response

        async def translate(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            raw = b"".join([c async for c in chunks])
            if upstream.status_code != 200:
                yield json.dumps({"error": _upstream_message(raw)}).encode()
                return
            data = json.loads(raw)
            rows = sorted(data.get("data") or [], key=lambda d: d.get("index", 0))
            yield json.dumps({"model": name, "embeddings": [r.get("embedding") for r in rows],
                              "total_duration": int((time.monotonic() - started) * 1e9), "load_duration": 0,
                              "prompt_eval_count": (data.get("usage") or {}).get("prompt_tokens", 0)}).encode()

        return router.relay(inst, upstream, False, "ollama", transform=translate, media_type="application/json",
                            status_code=upstream.status_code)


def _upstream_message(raw: bytes) -> str:
    try:
        err = json.loads(raw).get("error")
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return raw.decode("utf-8", "replace")[:2000]


__all__ = ["add_routes", "openai_body", "OLLAMA_VERSION", "ModelError"]
