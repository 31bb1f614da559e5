"""A small llama-server HTTP client: health, slots, completions, metrics. Explicit timeouts."""

from __future__ import annotations

import socket

import httpcore
import httpx

TIMEOUT = httpx.Timeout(10.0, connect=2.0)


class LlamaClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: httpx.Timeout = TIMEOUT) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout, trust_env=False)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "LlamaClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> int:
        """HTTP status of /health: 200 ready, 503 loading. Raises httpx.TransportError if not listening."""
        return self.http.get("/health", timeout=httpx.Timeout(2.0)).status_code

    def slots(self) -> list[dict]:
        r = self.http.get("/slots")
        r.raise_for_status()
        return r.json()

    def completion(self, prompt: str | list[int], n_predict: int, timeout: float = 120.0, **params) -> dict:
        """llama-server's native /completion (greedy unless told otherwise)."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": False, **params}
        r = self.http.post("/completion", json=body, timeout=httpx.Timeout(timeout, connect=2.0))
        r.raise_for_status()
        return r.json()

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        r = self.http.post("/tokenize", json={"content": text, "add_special": add_special})
        r.raise_for_status()
        return r.json()["tokens"]

    def metrics(self) -> str:
        r = self.http.get("/metrics")
        r.raise_for_status()
        return r.text


# ---------------------------------------------------------------- the daemon's upstream client

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class _QuickAckStream(httpcore.AsyncNetworkStream):
    """llama-server (cpp-httplib) does not set TCP_NODELAY: it writes a streamed response's headers
    and its first chunk separately, and Nagle holds the chunk until our ACK of the headers arrives.
    A request/response connection is in delayed-ACK mode (up to 40 ms), so we re-arm TCP_QUICKACK
    before every read: the first token reaches the client without waiting for a delayed ACK."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._sock = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if _QUICKACK is not None and self._sock is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                pass
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, *args, **kwargs) -> httpcore.AsyncNetworkStream:
        return await self._inner.start_tls(*args, **kwargs)

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _QuickAckBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options=None) -> httpcore.AsyncNetworkStream:
        return _QuickAckStream(await self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None):
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def upstream_client(base_url: str, api_key: str, timeout: httpx.Timeout, limits: httpx.Limits) -> httpx.AsyncClient:
    """The async client the daemon forwards requests with: keep-alive, no Nagle, quick ACKs."""
    transport = httpx.AsyncHTTPTransport(limits=limits)
    # httpx has no parameter for the network backend: give its transport a pool that uses ours.
    transport._pool = httpcore.AsyncConnectionPool(
        max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry, network_backend=_QuickAckBackend(),
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.AsyncClient(base_url=base_url, timeout=timeout, trust_env=False, transport=transport,
                             headers={"Authorization": f"Bearer {api_key}"})
