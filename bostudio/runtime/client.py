"""The llama-server HTTP clients: LlamaClient (blocking: up, bench, the speculation probe) and AsyncLlamaClient
(the daemon's, one per child: ready-wait, slots, /metrics, prompt counts). Explicit timeouts.

httpx's errors are translated here, once: a blocking call that gets no answer or an error status raises
ServerError with what was asked and where the server's log is; an async call that gets no answer raises
ChildError, which says whether the request reached the child (the daemon decides from that whether the child
died of it). So callers handle bostudio's errors only. The daemon's streaming path (runtime/passthrough.py)
raises the same ChildError.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from bostudio.errors import ServerError

TIMEOUT = httpx.Timeout(10.0, connect=2.0)
CONNECT, TIMED_OUT, BROKEN, GARBLED = "connect", "timeout", "broken", "garbled"


class ChildError(ServerError):
    """A request to a llama-server child got no (whole) answer. `kind`: CONNECT (nothing reached the child),
    TIMED_OUT (it said nothing within the timeout), BROKEN (the connection broke with the request in it) or
    GARBLED (an answer httpx could not read)."""

    def __init__(self, message: str, hint: str = "", kind: str = BROKEN) -> None:
        super().__init__(message, hint)
        self.kind = kind

    @property
    def reached(self) -> bool:
        """Whether the child may have had (part of) the request."""
        return self.kind != CONNECT

    def __repr__(self) -> str:
        return f"ChildError({self.message!r}, kind={self.kind!r})"


def child_error(exc: httpx.HTTPError, what: str) -> ChildError:
    """httpx's error for a request to a child, as a ChildError."""
    kind = (CONNECT if isinstance(exc, httpx.ConnectError) else TIMED_OUT if isinstance(exc, httpx.TimeoutException)
            else BROKEN if isinstance(exc, httpx.TransportError) else GARBLED)
    return ChildError(f"{what}: {exc!r}", kind=kind)


class LlamaClient:
    """`name` and `log_path` go into the errors: "llama-server (off) did not answer a bench request: ...",
    hint "see the log: PATH"."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: httpx.Timeout | None = TIMEOUT, *,
                 name: str = "llama-server", log_path: Path | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout, trust_env=False,
                                 transport=transport)
        self.name = name
        self.log_path = log_path

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "LlamaClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, what: str, exc: httpx.HTTPError) -> ServerError:
        verb = "failed" if isinstance(exc, httpx.HTTPStatusError) else "did not answer"
        hint = f"see the log: {self.log_path}" if self.log_path else f"is {self.name} running at {self.http.base_url}?"
        return ServerError(f"{self.name} {verb} {what}: {exc}", hint)

    def _request(self, method: str, path: str, what: str, **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
        try:
            r = self.http.request(method, path, **kw)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise self._error(what, exc) from exc
        return r

    def health(self) -> int | None:
        """HTTP status of /health: 200 ready, 503 loading; None when nothing answers (not listening yet)."""
        try:
            return self.http.get("/health", timeout=httpx.Timeout(2.0)).status_code
        except httpx.HTTPError:
            return None

    def slots(self, what: str = "GET /slots") -> list[dict]:
        return self._request("GET", "/slots", what).json()

    def completion(self, prompt: str | list[int], n_predict: int, timeout: float = 120.0, *,
                   what: str = "a completion request", **params) -> dict:  # type: ignore[no-untyped-def]
        """llama-server's native /completion (greedy unless told otherwise). `what` names the request in errors."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": False, **params}
        return self._request("POST", "/completion", what, json=body,
                             timeout=httpx.Timeout(timeout, connect=2.0)).json()

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._request("POST", "/tokenize", "a tokenize request",
                             json={"content": text, "add_special": add_special}).json()["tokens"]

    def metrics(self) -> str:
        return self._request("GET", "/metrics", "GET /metrics").text


class AsyncLlamaClient:
    """The daemon's client of one child: any status comes back as a response, a request that gets no answer
    raises ChildError. `name` goes into the errors."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: httpx.Timeout = httpx.Timeout(2.0), *,
                 name: str = "llama-server", transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, trust_env=False,
                                      transport=transport)
        self.name = name

    async def __aenter__(self) -> "AsyncLlamaClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
        """The child's answer, whatever its status; ChildError when there is none."""
        try:
            return await self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise child_error(exc, f"{self.name}: {method} {path} failed") from exc

    async def get(self, path: str, **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
        return await self.request("GET", path, **kw)

    async def post(self, path: str, **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
        return await self.request("POST", path, **kw)

    async def health(self) -> int | None:
        """HTTP status of /health: 200 ready, 503 loading; None when nothing answers (not listening yet)."""
        try:
            return (await self.get("/health")).status_code
        except ChildError:
            return None
