"""The httpx clients of the daemon's control API: DaemonClient (blocking) for the CLI, bench and autotune,
AsyncDaemonClient for the TUI (calls and the /bostudio/events subscription run on its event loop).
Both make their calls from one table (ROUTES: method, path, timeout) and translate transport errors and
OpenAI-shaped error bodies into DaemonError at this one boundary."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx

from bostudio.daemon import DEFAULT_HOST, DEFAULT_PORT, state
from bostudio.daemon.http.security import read_token
from bostudio.errors import DaemonError

TIMEOUT = httpx.Timeout(30.0, connect=2.0)
LOAD_TIMEOUT = httpx.Timeout(900.0, connect=2.0)


def transport_error(url: str, method: str, path: str, exc: httpx.HTTPError) -> DaemonError:
    if isinstance(exc, httpx.ConnectError):
        return DaemonError(f"the bostudio daemon is not running at {url}", "start it with `bostudio daemon start`")
    return DaemonError(f"the daemon did not answer {method} {path}: {exc!r}", "see `bostudio daemon status`")


def answer(r: httpx.Response, method: str, path: str) -> dict:
    """The JSON body of a control-API answer, or DaemonError with the daemon's message and hint."""
    try:
        body = r.json()
    except ValueError:
        body = {}
    if r.status_code >= 400:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        raise DaemonError(err.get("message") or f"HTTP {r.status_code} for {method} {path}",
                          err.get("hint") or "see `bostudio daemon status` and the daemon log")
    return body if isinstance(body, dict) else {"data": body}


@dataclass(frozen=True)
class Route:
    """One call of the control API, as both clients make it: the method, the path (`{model}` is filled in
    URL-quoted, so a name with `/`, `?`, `#` or spaces stays one path segment), the timeout, and the key of
    the answer the call returns (None: the whole answer)."""

    method: str
    path: str
    timeout: httpx.Timeout = field(default_factory=lambda: TIMEOUT)
    key: str | None = None

    def url(self, model: str | None = None) -> str:
        if "{model}" not in self.path:
            return self.path
        if model is None:
            raise TypeError(f"{self.path} needs a model name")
        return self.path.format(model=quote(model, safe=""))

    def result(self, body: dict):  # type: ignore[no-untyped-def]
        return body[self.key] if self.key else body


# The control API (bostudio/daemon/http/routes/ serves it), one line per call of DaemonClient and AsyncDaemonClient.
ROUTES: dict[str, Route] = {
    "status": Route("GET", "/bostudio/status"),
    "devices": Route("GET", "/bostudio/devices"),
    "engine": Route("GET", "/bostudio/engine"),
    "engines": Route("GET", "/bostudio/engines", key="engines"),
    "catalog": Route("GET", "/bostudio/catalog", key="models"),
    "plan": Route("GET", "/bostudio/plans/{model}"),
    "pairings": Route("GET", "/bostudio/pairings/{model}"),
    "instances": Route("GET", "/bostudio/instances", key="instances"),
    "start": Route("POST", "/bostudio/instances", LOAD_TIMEOUT),
    "stop": Route("POST", "/bostudio/instances/{model}/stop", LOAD_TIMEOUT),
    "restart": Route("POST", "/bostudio/instances/{model}/restart", LOAD_TIMEOUT),
    "set_speculation": Route("PUT", "/bostudio/instances/{model}/speculation", LOAD_TIMEOUT),
    "stats": Route("GET", "/bostudio/instances/{model}/stats"),
    "log": Route("GET", "/bostudio/instances/{model}/log", key="lines"),
    "complete": Route("POST", "/v1/completions", LOAD_TIMEOUT),
    "events": Route("GET", "/bostudio/events", httpx.Timeout(30.0, connect=2.0, read=None)),
    "log_stream": Route("GET", "/bostudio/instances/{model}/log/stream", httpx.Timeout(30.0, connect=2.0, read=None)),
}


def _present(**values: object) -> dict:
    return {k: v for k, v in values.items() if v is not None}


def _wait(wait: bool) -> dict:
    return {"wait": str(wait).lower()}


def sse_data(line: str) -> dict | None:
    """The JSON of one `data:` line of a server-sent event stream (None for anything else)."""
    if not line.startswith("data:"):
        return None
    try:
        data = json.loads(line[5:])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def daemon_url() -> str:
    rec = state.running()
    return rec.url if rec else f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"


class DaemonClient:
    """The control API for the CLI, bench and autotune (blocking). Waits for loads by default."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url or daemon_url()
        token = token if token is not None else read_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT, trust_env=False,
                                 transport=transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "DaemonClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, name: str, model: str | None = None, **kw):  # type: ignore[no-untyped-def]
        route = ROUTES[name]
        path = route.url(model)
        try:
            r = self.http.request(route.method, path, timeout=route.timeout, **kw)
        except httpx.HTTPError as exc:
            raise transport_error(self.url, route.method, path, exc) from exc
        return route.result(answer(r, route.method, path))

    def status(self) -> dict:
        return self._call("status")

    def instances(self) -> list[dict]:
        return self._call("instances")

    def start(self, model: str, spec: str | None = None, ctx: int | None = None, wait: bool = True,
              workload: str | None = None, cache_type: str | None = None) -> dict:
        return self._call("start", json=_present(model=model, spec=spec, ctx=ctx, cache_type=cache_type, wait=wait,
                                                 workload=workload))

    def stop(self, model: str) -> dict:
        return self._call("stop", model)

    def restart(self, model: str, wait: bool = True) -> dict:
        return self._call("restart", model, params=_wait(wait))

    def set_speculation(self, model: str, mode: str, wait: bool = True) -> dict:
        return self._call("set_speculation", model, json={"mode": mode}, params=_wait(wait))

    def stats(self, model: str) -> dict:
        return self._call("stats", model)

    def log(self, model: str, lines: int = 100) -> list[str]:
        return self._call("log", model, params={"lines": lines})

    def events(self) -> Iterator[dict]:
        """The event stream: a snapshot, then every state change and stats update, until closed."""
        route = ROUTES["events"]
        path = route.url()
        try:
            with self.http.stream(route.method, path, timeout=route.timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    answer(r, route.method, path)
                for line in r.iter_lines():
                    data = sse_data(line)
                    if data is not None:
                        yield data
        except httpx.HTTPError as exc:
            raise transport_error(self.url, route.method, path, exc) from exc


class AsyncDaemonClient:
    """The control API for an asyncio program (the TUI): the same calls as DaemonClient, plus what a
    live screen needs (catalog, plans, pairings, devices, the event and log streams). Loads do not wait
    by default (the screen follows them on the event stream)."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url or daemon_url()
        token = token if token is not None else read_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=TIMEOUT, trust_env=False,
                                      transport=transport)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, name: str, model: str | None = None, **kw):  # type: ignore[no-untyped-def]
        route = ROUTES[name]
        path = route.url(model)
        try:
            r = await self.http.request(route.method, path, timeout=route.timeout, **kw)
        except httpx.HTTPError as exc:
            raise transport_error(self.url, route.method, path, exc) from exc
        return route.result(answer(r, route.method, path))

    async def status(self) -> dict:
        return await self._call("status")

    async def devices(self) -> dict:
        return await self._call("devices")

    async def engine(self) -> dict:
        return await self._call("engine")

    async def engines(self) -> list[dict]:
        return await self._call("engines")

    async def catalog(self) -> list[dict]:
        return await self._call("catalog")

    async def plan(self, model: str, ctx: int | None = None, cache_type: str | None = None,
                   spec: str | None = None) -> dict:
        return await self._call("plan", model, params=_present(ctx=ctx, cache_type=cache_type, spec=spec))

    async def pairings(self, model: str) -> dict:
        return await self._call("pairings", model)

    async def instances(self) -> list[dict]:
        return await self._call("instances")

    async def start(self, model: str, spec: str | None = None, ctx: int | None = None,
                    cache_type: str | None = None, wait: bool = False, workload: str | None = None) -> dict:
        return await self._call("start", json=_present(model=model, spec=spec, ctx=ctx, cache_type=cache_type,
                                                       wait=wait, workload=workload))

    async def stop(self, model: str) -> dict:
        return await self._call("stop", model)

    async def restart(self, model: str, wait: bool = False) -> dict:
        return await self._call("restart", model, params=_wait(wait))

    async def set_speculation(self, model: str, mode: str, wait: bool = False) -> dict:
        return await self._call("set_speculation", model, json={"mode": mode}, params=_wait(wait))

    async def stats(self, model: str) -> dict:
        return await self._call("stats", model)

    async def log(self, model: str, lines: int = 100) -> list[str]:
        return await self._call("log", model, params={"lines": lines})

    async def complete(self, model: str, prompt: str, max_tokens: int = 32) -> dict:
        """One completion through the daemon's router (the TUI's "try it" request)."""
        return await self._call("complete", json={"model": model, "prompt": prompt, "max_tokens": max_tokens})

    async def _stream(self, name: str, model: str | None = None, params: dict | None = None) -> AsyncIterator[dict]:
        route = ROUTES[name]
        path = route.url(model)
        try:
            async with self.http.stream(route.method, path, params=params, timeout=route.timeout) as r:
                if r.status_code >= 400:
                    await r.aread()
                    answer(r, route.method, path)
                async for line in r.aiter_lines():
                    data = sse_data(line)
                    if data is not None:
                        yield data
        except httpx.HTTPError as exc:
            raise transport_error(self.url, route.method, path, exc) from exc

    def events(self) -> AsyncIterator[dict]:
        """/bostudio/events: a snapshot, then state, launch, evict, stats and daemon events, until the
        daemon goes away (DaemonError) or the caller stops iterating."""
        return self._stream("events")

    def log_stream(self, model: str, lines: int = 20) -> AsyncIterator[dict]:
        """An instance's log as it grows: {"line": ...} per line."""
        return self._stream("log_stream", model, {"lines": lines})
