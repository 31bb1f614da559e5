"""The model router's hot path, shared by every API the daemon speaks (OpenAI, Anthropic, Ollama):
read a bounded body, check it, refuse a route the model cannot serve (from its GGUF header, before
any launch), get the ready instance, open the upstream request, relay the body unbuffered with an
idle timeout, and answer errors in the shape of the API the client speaks."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from bostudio.daemon.capabilities import model_caps
from bostudio.daemon.guard import check_request
from bostudio.daemon.normalise import normalise
from bostudio.daemon.stats import timings_from_body, timings_from_sse
from bostudio.daemon.supervisor import Instance, Supervisor
from bostudio.errors import BostudioError, ConfigError, ModelError, RequestError, ServerError
from bostudio.runtime import passthrough

log = logging.getLogger("bostudio.daemon")

# Hop-by-hop and length headers are the proxy's own business.
DROP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date",
                "access-control-allow-origin", "access-control-allow-credentials", "access-control-allow-methods",
                "access-control-allow-headers"}
# Routes whose requests can carry tools (llama-server renders them with the chat template).
TOOL_ROUTES = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/messages/count_tokens",
                         "/v1/responses/input_tokens", "/v1/chat/completions/input_tokens", "/apply-template"})
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MAX_BODY = 64 << 20  # a 128k-token prompt with base64 images fits; more is refused (413)

# Anthropic's error types by status (docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    529: "overloaded_error"}


def error_body(api: str, status: int, message: str, type_: str, hint: str = "", code: str | None = None) -> dict:
    """An error in the shape of `api`: openai | anthropic | ollama."""
    if api == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                                           "message": message + (f" ({hint})" if hint else "")}}
    if api == "ollama":
        return {"error": message + (f" ({hint})" if hint else "")}
    err: dict[str, Any] = {"message": message, "type": type_, "param": None, "code": code or status}
    if hint:
        err["hint"] = hint
    return {"error": err}


def api_error(api: str, status: int, message: str, type_: str, hint: str = "", code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(api, status, message, type_, hint, code), status_code=status)


def error_response(exc: BaseException, api: str = "openai") -> JSONResponse:
    """Every error leaves the daemon as JSON in the client's API shape (OpenAI by default)."""
    if isinstance(exc, (RequestError, ConfigError)):
        return api_error(api, 400, exc.message, "invalid_request_error", exc.hint)
    if isinstance(exc, ModelError):
        return api_error(api, 404, exc.message, "not_found_error", exc.hint, "model_not_found")
    if isinstance(exc, ServerError):
        return api_error(api, 503, exc.message, "unavailable_error", exc.hint)
    if isinstance(exc, BostudioError):
        return api_error(api, 500, exc.message, "server_error", exc.hint)
    if isinstance(exc, asyncio.TimeoutError):
        return api_error(api, 503, "the model did not load in time", "unavailable_error")
    return api_error(api, 500, f"internal error: {exc!r}", "server_error", "see the daemon log")


def api_of(path: str) -> str:
    """Which API's error shape a request path speaks."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


def sse(data: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, default=str)}\n\n".encode()


def in_band_error(api: str, message: str) -> bytes:
    """An error a streaming client reads in-band, once headers (200) are gone."""
    if api == "anthropic":
        return sse(error_body(api, 500, message, "server_error"), "error")
    if api == "ollama":
        return (json.dumps({"error": message}) + "\n").encode()
    return sse({"error": {"message": message, "type": "server_error", "code": 502}}) + b"data: [DONE]\n\n"


class Reject(Exception):
    """A request refused before anything was forwarded; carries the response to send."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


class Router:
    def __init__(self, sup: Supervisor, stream_idle_timeout: float, max_body: int = MAX_BODY) -> None:
        self.sup = sup
        self.idle_timeout = stream_idle_timeout
        self.max_body = max_body

    async def read_json(self, request: Request, api: str) -> tuple[bytes, dict]:
        """The body (bounded) and its JSON object. Raises Reject."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise Reject(self.too_large(api))
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.max_body:
                raise Reject(self.too_large(api))
        try:
            body = json.loads(raw)
        except ValueError:
            raise Reject(api_error(api, 400, "the request body is not JSON", "invalid_request_error"))
        if not isinstance(body, dict):
            raise Reject(api_error(api, 400, "the request body must be a JSON object", "invalid_request_error"))
        return bytes(raw), body

    def too_large(self, api: str) -> JSONResponse:
        return api_error(api, 413, f"the request body is larger than {self.max_body / (1 << 20):g} MiB",
                         "invalid_request_error", "send a shorter prompt or smaller media")

    async def admit(self, body: dict, route: str, api: str) -> str:
        """The model name of a checked body whose model can serve `route`. Raises Reject."""
        try:
            name = check_request(body)
            cfg = self.sup.config_for(name)
            caps = await asyncio.to_thread(model_caps, cfg.path)
            refusal = caps.refusal(route, name) or (caps.tool_refusal(body, name) if route in TOOL_ROUTES else None)
        except BostudioError as exc:
            raise Reject(error_response(exc, api))
        except OSError as exc:
            raise Reject(error_response(ModelError(f"cannot read the model file of {body.get('model')}: {exc}",
                                                   "GET /bostudio/catalog lists the models"), api))
        if refusal is not None:
            raise Reject(error_response(refusal, api))
        return name

    async def open(self, name: str, path: str, raw: bytes, api: str) -> tuple[Instance, passthrough.UpstreamResponse]:
        """The ready instance (loaded on demand) and its upstream response to POST `path`. The
        caller must `release(inst)` once done with it. Raises Reject."""
        for attempt in (1, 2):
            try:
                inst = await self.sup.get_ready(name)
            except (BostudioError, asyncio.TimeoutError) as exc:
                raise Reject(error_response(exc, api))
            inst.active += 1
            inst.stats.requests += 1
            try:
                if inst.http is None or inst.port is None:
                    raise httpx.ConnectError("instance is not ready")
                return inst, await passthrough.post("127.0.0.1", inst.port, path, raw, inst.api_key)
            except httpx.HTTPError as exc:
                inst.active -= 1
                inst.stats.errors += 1
                log.warning("%s: upstream %s failed (attempt %d): %r", inst.name, path, attempt, exc)
                # Not connected, or no response from a child that then died, means not served: wait
                # for the reload and retry once.
                if attempt == 1 and isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError)) \
                        and await self.sup.confirm_exited(inst):
                    continue
                raise Reject(api_error(api, 502, f"llama-server for {inst.name} failed: {exc!r}", "server_error",
                                       "the model is restarted automatically; send the request again"))
        raise AssertionError("unreachable")

    @staticmethod
    def release(inst: Instance) -> None:
        inst.active -= 1
        inst.last_used = time.monotonic()

    async def chunks(self, inst: Instance, upstream: passthrough.UpstreamResponse) -> AsyncIterator[bytes]:
        """The upstream body as it arrives; a body silent for longer than the idle timeout raises
        httpx.ReadTimeout (a wedged child must not hold the client forever)."""
        it = upstream.aiter_raw().__aiter__()
        while True:
            try:
                if self.idle_timeout > 0:
                    chunk = await asyncio.wait_for(it.__anext__(), self.idle_timeout)
                else:
                    chunk = await it.__anext__()
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise httpx.ReadTimeout(f"llama-server for {inst.name} sent nothing for {self.idle_timeout:g} s "
                                        "(--stream-idle-timeout)")
            yield chunk

    async def forward(self, request: Request, path: str, api: str = "openai") -> Response:
        """The whole pass-through: `path` on the child of the body's model, streamed unbuffered."""
        try:
            raw, body = await self.read_json(request, api)
            name = await self.admit(body, path, api)
            cfg = self.sup.config_for(name)
            changed = normalise(path, body, (await asyncio.to_thread(model_caps, cfg.path)).template.call_prefill,
                                output_limit=max(256, cfg.ctx // 4))
            if changed is not None:  # billing header stripped, forced call opened, output limited (normalise.py)
                raw, body = json.dumps(changed).encode(), changed
            inst, upstream = await self.open(name, path, raw, api)
        except Reject as r:
            return r.response
        streaming = body.get("stream") is True
        if api == "anthropic" and upstream.status_code >= 400:
            return await self.translate_error(inst, upstream, api)
        return self.relay(inst, upstream, streaming, api)

    async def translate_error(self, inst: Instance, upstream: passthrough.UpstreamResponse, api: str) -> Response:
        """llama-server's (OpenAI-shaped) error body, re-shaped for `api`."""
        data = bytearray()
        try:
            async for chunk in self.chunks(inst, upstream):
                data += chunk
                if len(data) > (1 << 20):
                    break
        except httpx.HTTPError:
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
            self.release(inst)
        try:
            err = json.loads(data).get("error", {})
            message = err.get("message") or str(err)
        except (ValueError, AttributeError):
            message = data.decode("utf-8", "replace")[:2000]
        return api_error(api, upstream.status_code, message, "invalid_request_error")

    def relay(self, inst: Instance, upstream: passthrough.UpstreamResponse, streaming: bool, api: str,
              transform: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]] | None = None,
              media_type: str | None = None, status_code: int | None = None) -> Response:
        """Stream the upstream body to the client (optionally through `transform`, e.g. SSE to
        NDJSON), recording timings; a client disconnect closes the upstream and so cancels it."""
        async def source() -> AsyncIterator[bytes]:
            body = bytearray()
            async for chunk in self.chunks(inst, upstream):
                if streaming:
                    t = timings_from_sse(chunk)
                    if t is not None:
                        inst.stats.add_timings(t)
                elif len(body) < (4 << 20):
                    body += chunk
                yield chunk
            if not streaming and upstream.status_code == 200:
                t = timings_from_body(bytes(body))
                if t is not None:
                    inst.stats.add_timings(t)

        async def out() -> AsyncIterator[bytes]:
            try:
                async for chunk in (transform(source()) if transform else source()):
                    yield chunk
            except httpx.HTTPError as exc:
                # The child died or stalled mid-response: tell a streaming client at once, in-band.
                inst.stats.errors += 1
                log.warning("%s: response failed mid-stream: %s", inst.name, exc)
                if streaming:
                    yield in_band_error(api, f"llama-server for {inst.name} failed mid-stream: {exc}")
                else:
                    raise
            finally:
                # A client that disconnects cancels this generator: closing the upstream response
                # closes its connection, and llama-server cancels the generation. The close is
                # shielded: inside a cancelled anyio scope every unshielded await is cancelled too.
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()
                self.release(inst)

        if transform is not None:
            headers: dict[str, str] = {}
        else:
            headers = {k: v for k, v in upstream.headers.items() if k.lower() not in DROP_HEADERS}
        if streaming:
            headers.update(SSE_HEADERS)
        return StreamingResponse(out(), status_code=status_code or upstream.status_code, headers=headers,
                                 media_type=media_type or upstream.headers.get("content-type"))


__all__ = ["Router", "Reject", "api_error", "error_body", "error_response", "api_of", "sse", "in_band_error",
           "SSE_HEADERS", "MAX_BODY"]
