"""Connection and body discipline for the daemon's HTTP server, as mature servers keep it (nginx's
client_header_timeout / client_body_timeout / large_client_header_buffers, Apache's mod_reqtimeout):
a slow, idle, half-open or oversized client costs a bounded amount of time and memory, and needs no
token to be refused.

- `guarded_protocol(limits, token)`: uvicorn's httptools protocol with a header-read timeout, a cap on
  the request head's bytes and lines, and a cap on open connections (uvicorn's own keep-alive timeout
  closes idle connections between requests). With a token required, a connection that showed it
  keeps its place at the cap: the oldest one that did not, waiting for a request head, gives way.
- `BodyLimits`: ASGI middleware that reads every request body before the route runs: bounded in size
  (one cap for the model routes, a small one for the control API), with a timeout between pieces, and
  parsed as JSON off the event loop with a depth and a size limit. Every refusal is JSON in the shape
  of the API the path belongs to; the parsed body is handed to the router so it is parsed once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bostudio.daemon.http.router import PARSED_KEY, api_of, error_body
from bostudio.daemon.http.security import given_token, token_matches

log = logging.getLogger("bostudio.daemon")

INLINE_PARSE_BYTES = 64 << 10  # smaller bodies are parsed on the loop (a thread hop costs more)


@dataclass(frozen=True)
class HttpLimits:
    """Every limit the daemon's HTTP server keeps; `bostudio daemon --help` lists the flags."""

    header_timeout: float = 10.0  # the request line and headers must be in within this (s)
    keepalive_timeout: float = 5.0  # an idle keep-alive connection is closed after this (s)
    body_timeout: float = 30.0  # a request body silent for this long is refused with 408 (s)
    max_connections: int = 256  # more open connections are refused at once (503)
    max_header_bytes: int = 64 << 10  # request line + headers (431 above)
    max_headers: int = 100  # header lines (431 above)
    max_control_body: int = 1 << 20  # /bostudio/* bodies (the model routes use --max-body-mib)
    max_json_depth: int = 64  # nesting of JSON objects and arrays
    max_json_containers: int = 1 << 19  # `{` plus `[` in a body, counted before parsing


def _json_error(status: int, message: str, path: str) -> bytes:
    type_ = {408: "timeout_error", 413: "invalid_request_error", 431: "invalid_request_error",
             503: "unavailable_error"}.get(status, "invalid_request_error")
    return json.dumps(error_body(api_of(path), status, message, type_)).encode()


# ---------------------------------------------------------------- connections

class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus: the head of each request must arrive within
    `header_timeout` and stay within `max_header_bytes` / `max_headers`; beyond `max_connections`
    a new connection is answered 503 and closed. Over-limit clients get a JSON error and a close."""

    limits = HttpLimits()
    token: str | None = None  # with --require-token: connections that showed it are never given way

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head = True  # waiting for (the rest of) a request head
        self._head_bytes = 0
        self._head_lines = 0
        self._refusal: tuple[int, str] | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._authenticated = False  # a request on it showed the token
        self._opened = self.loop.time()
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._refuse(503, f"more than {self.limits.max_connections} open connections; try again later")
            return
        self._arm_head_timer()

    def _make_room(self) -> bool:
        """With a token required: the oldest connection that has shown no token and waits for a request
        head gives way to this new one (closed with 503), so that sockets without the token cannot hold
        every connection and lock the token holder out. A connection that showed the token keeps its
        place. True when room was made."""
        if self.token is None:
            return False
        idle = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol)
                and not c._authenticated and c._in_head and c._refusal is None]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._opened)
        oldest._refuse(503, f"more than {self.limits.max_connections} open connections; this one sent no "
                            "request in time for a new one")
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(408, f"the request headers did not arrive within {self.limits.header_timeout:g} s")

    def _refuse(self, status: int, message: str) -> None:
        self._cancel_head_timer()
        self._refusal = (status, message)
        if self.transport.is_closing():
            return
        body = _json_error(status, message, self.scope.get("path", "") if self.scope else "")
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large",
                  503: b"Service Unavailable"}.get(status, b"Error")
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n" % (status, reason, len(body)) + body)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        super().data_received(data)
        if self._refusal is not None:  # a parser callback found the head too large
            self._refuse(*self._refusal)
        elif self._in_head and self.parser is not None:
            # Still inside a head after this piece: it all counts (httptools buffers it until the end).
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(431, f"the request headers are larger than {self.limits.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # the next request on a kept-alive connection: its head is timed too
            self._in_head = True
            self._arm_head_timer()
        self._head_bytes = 0
        self._head_lines = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_lines += 1
        if self._head_lines > self.limits.max_headers:
            if self._refusal is None:
                self._refusal = (431, f"more than {self.limits.max_headers} request headers")
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refusal is not None:
            return
        if self.token is not None and not self._authenticated:
            self._authenticated = token_matches(given_token(dict(self.headers)), self.token)
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refusal is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refusal is None:
            super().on_message_complete()


def guarded_protocol(limits: HttpLimits, token: str | None = None) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn.Config(http=...), keeping `limits`; `token` (when the daemon
    requires one) lets connections that show it keep their place when the connection cap is reached."""
    return type("BostudioHttpProtocol", (GuardedHttpToolsProtocol,), {"limits": limits, "token": token})


# ---------------------------------------------------------------- bodies

class BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_depth_ok(value: object, max_depth: int) -> bool:
    """True if `value` nests objects/arrays no deeper than `max_depth` (iterative: no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > max_depth:
            return False
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def parse_json_body(raw: bytes, limits: HttpLimits) -> object:
    """The JSON value of a request body, within the limits. Raises BodyError (400). Pure CPU: large
    bodies are parsed in a worker thread."""
    containers = raw.count(b"{") + raw.count(b"[")  # counted in C; strings included, so it over-counts
    if containers > limits.max_json_containers:
        raise BodyError(400, f"the request body holds more than {limits.max_json_containers} JSON objects "
                             "and arrays")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BodyError(400, f"the request body nests JSON deeper than {limits.max_json_depth} levels")
    except (ValueError, UnicodeDecodeError):
        raise BodyError(400, "the request body is not JSON")
    if not json_depth_ok(value, limits.max_json_depth):
        raise BodyError(400, f"the request body nests JSON deeper than {limits.max_json_depth} levels")
    return value


class BodyLimits:
    """ASGI middleware: reads each request's body (bounded, timed), parses it as JSON off the loop,
    refuses what breaks a limit in the shape of the API the path belongs to, and replays the body to
    the app. A body that breaks no limit but is no JSON is left for the route to refuse."""

    def __init__(self, app, max_body: int, limits: HttpLimits) -> None:
        self.app = app
        self.max_body = max_body
        self.limits = limits

    def cap(self, path: str) -> int:
        return min(self.limits.max_control_body, self.max_body) if path.startswith("/bostudio/") else self.max_body

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        try:
            raw = await self.read(scope, receive)
            if raw is None:
                return  # the client went away while sending
            parsed = None
            if raw.strip():
                try:
                    parsed = (parse_json_body(raw, self.limits) if len(raw) <= INLINE_PARSE_BYTES
                              else await asyncio.to_thread(parse_json_body, raw, self.limits))
                except BodyError as exc:
                    if "not JSON" not in exc.message:
                        raise
                    parsed = exc  # the route answers "not JSON" in its own words
        except BodyError as exc:
            await _send_error(send, exc.status, exc.message, path)
            return
        if not isinstance(parsed, BodyError):
            scope[PARSED_KEY] = (raw, parsed)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def read(self, scope, receive) -> bytes | None:
        cap = self.cap(scope.get("path", ""))
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise BodyError(413, f"the request body is larger than {cap / (1 << 20):g} MiB")
        body = bytearray()
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.limits.body_timeout)
            except asyncio.TimeoutError:
                raise BodyError(408, f"the request body stalled for {self.limits.body_timeout:g} s")
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > cap:
                raise BodyError(413, f"the request body is larger than {cap / (1 << 20):g} MiB")
            if not message.get("more_body", False):
                return bytes(body)


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1").strip()
    return None


def _has_body(scope) -> bool:
    length = _header(scope, b"content-length")
    if length is not None:
        return length != "0"
    return _header(scope, b"transfer-encoding") is not None


async def _send_error(send, status: int, message: str, path: str) -> None:
    body = _json_error(status, message, path)
    # An unread rest of the body would be taken for the next request: close the connection.
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["HttpLimits", "guarded_protocol", "BodyLimits", "parse_json_body", "json_depth_ok"]
