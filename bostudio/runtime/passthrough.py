"""The daemon's hot path to a child llama-server: one POST over a fresh loopback connection, the
response body passed on chunk by chunk as it arrives.

Why not httpx here: every streamed token crosses this code, and on a small CPU the daemon's time per
token is taken from llama-server's own threads. httpx/httpcore/h11 cost ~1.5 ms of CPU per token on
a 2-core machine (decode through the daemon at 93-96% of direct); this reader costs a fraction of it.
llama-server closes a connection after a streamed response anyway, so there is no pool to keep:
each request opens its own connection (`Connection: close`), which also makes cancelling a request
as simple as closing its socket. Errors are raised as runtime/client.py's ChildError, as the daemon's
other requests to children: kind CONNECT (nothing was sent), else BROKEN (no response, or cut off).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

from bostudio.runtime.client import BROKEN, CONNECT, ChildError

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only
READ_LIMIT = 1 << 20


class UpstreamResponse:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status_code: int,
                 headers: dict[str, str]) -> None:
        self._reader = reader
        self._writer = writer
        self.status_code = status_code
        self.headers = headers
        sock = writer.get_extra_info("socket")
        self._sock = sock if _QUICKACK is not None else None

    def _quickack(self) -> None:
        # llama-server (cpp-httplib) does not set TCP_NODELAY: it writes a stream's headers and each
        # chunk separately, and Nagle holds a chunk until our ACK of the previous write arrives. A
        # request/response connection is in delayed-ACK mode (up to 40 ms), so ACK at once instead.
        if self._sock is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                self._sock = None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked transfer decoded, one piece per upstream chunk)."""
        r = self._reader
        try:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    self._quickack()
                    line = await r.readuntil(b"\r\n")
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while await r.readuntil(b"\r\n") != b"\r\n":  # trailers
                            pass
                        return
                    data = await r.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in self.headers:
                left = int(self.headers["content-length"])
                while left > 0:
                    self._quickack()
                    data = await r.read(min(left, 1 << 16))
                    if not data:
                        raise asyncio.IncompleteReadError(b"", left)
                    left -= len(data)
                    yield data
            else:
                while data := await r.read(1 << 16):
                    yield data
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            raise ChildError(f"the response was cut off: {exc!r}", kind=BROKEN) from exc

    async def aclose(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def post(host: str, port: int, path: str, body: bytes, api_key: str,
               timeout: float = 2.0, headers_timeout: float = 3600.0) -> UpstreamResponse:
    """POST `body` (JSON) to `path`; returns once the status line and headers are in."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=READ_LIMIT), timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        raise ChildError(f"cannot connect to {host}:{port}: {exc!r}", kind=CONNECT) from exc
    sock = writer.get_extra_info("socket")
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):
        pass
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {api_key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    try:
        writer.write(head.encode("latin-1") + body)  # one write: no Nagle wait between head and body
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), headers_timeout)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        writer.close()
        raise ChildError("Server disconnected without sending a response.", kind=BROKEN) from exc
    except (asyncio.TimeoutError, asyncio.LimitOverrunError) as exc:
        writer.close()
        raise ChildError(f"no response headers: {exc!r}", kind=BROKEN) from exc
    except BaseException:
        writer.close()
        raise
    lines = raw.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as exc:
        writer.close()
        raise ChildError(f"bad status line {lines[0]!r}", kind=BROKEN) from exc
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return UpstreamResponse(reader, writer, status, headers)
