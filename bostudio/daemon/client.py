"""The httpx clients of the daemon's control API: DaemonClient (blocking) for the CLI, bench and autotune,
AsyncDaemonClient for the TUI (calls and the /bostudio/events subscription run on its event loop).
Both translate transport errors and OpenAI-shaped error bodies into DaemonError at this one boundary."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote

import httpx

from bostudio.daemon import DEFAULT_HOST, DEFAULT_PORT, state
from bostudio.daemon.security import read_token
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


def _m(model: str) -> str:
    return quote(model, safe="")


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

    def _call(self, method: str, path: str, timeout: httpx.Timeout = TIMEOUT, **kw) -> dict:
        try:
            r = self.http.request(method, path, timeout=timeout, **kw)
        except httpx.HTTPError as exc:
            raise transport_error(self.url, method, path, exc) from exc
        return answer(r, method, path)

    def status(self) -> dict:
        return self._call("GET", "/bostudio/status")

    def instances(self) -> list[dict]:
        return self._call("GET", "/bostudio/instances")["instances"]

    def start(self, model: str, spec: str | None = None, ctx: int | None = None, wait: bool = True,
              workload: str | None = None) -> dict:
        body = {"model": model, "spec": spec, "ctx": ctx, "wait": wait, "workload": workload}
        return self._call("POST", "/bostudio/instances", LOAD_TIMEOUT, json={k: v for k, v in body.items() if v is not None})

    def stop(self, model: str) -> dict:
        return self._call("POST", f"/bostudio/instances/{model}/stop", LOAD_TIMEOUT)

    def restart(self, model: str) -> dict:
        return self._call("POST", f"/bostudio/instances/{model}/restart", LOAD_TIMEOUT)

    def set_speculation(self, model: str, mode: str) -> dict:
        return self._call("PUT", f"/bostudio/instances/{model}/speculation", LOAD_TIMEOUT, json={"mode": mode})

    def stats(self, model: str) -> dict:
        return self._call("GET", f"/bostudio/instances/{model}/stats")

    def log(self, model: str, lines: int = 100) -> list[str]:
        return self._call("GET", f"/bostudio/instances/{model}/log", params={"lines": lines})["lines"]

    def events(self) -> Iterator[dict]:
        """The event stream: a snapshot, then every state change and stats update, until closed."""
        try:
            with self.http.stream("GET", "/bostudio/events", timeout=httpx.Timeout(30.0, connect=2.0, read=None)) as r:
                for line in r.iter_lines():
                    data = sse_data(line)
                    if data is not None:
                        yield data
        except httpx.ConnectError as exc:
            raise DaemonError(f"the bostudio daemon is not running at {self.url}",
                              "start it with `bostudio daemon start`") from exc


class AsyncDaemonClient:
    """The control API for an asyncio program (the TUI): the same calls as DaemonClient, plus what a
    live screen needs (catalog, plans, pairings, devices, the event and log streams)."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url or daemon_url()
        token = token if token is not None else read_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=TIMEOUT, trust_env=False,
                                      transport=transport)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, timeout: httpx.Timeout = TIMEOUT, **kw) -> dict:
        try:
            r = await self.http.request(method, path, timeout=timeout, **kw)
        except httpx.HTTPError as exc:
            raise transport_error(self.url, method, path, exc) from exc
        return answer(r, method, path)

    async def status(self) -> dict:
        return await self._call("GET", "/bostudio/status")

    async def devices(self) -> dict:
        return await self._call("GET", "/bostudio/devices")

    async def engine(self) -> dict:
        return await self._call("GET", "/bostudio/engine")

    async def engines(self) -> list[dict]:
        return (await self._call("GET", "/bostudio/engines"))["engines"]

    async def catalog(self) -> list[dict]:
        return (await self._call("GET", "/bostudio/catalog"))["models"]

    async def plan(self, model: str, ctx: int | None = None, cache_type: str | None = None,
                   spec: str | None = None) -> dict:
        params = {k: v for k, v in (("ctx", ctx), ("cache_type", cache_type), ("spec", spec)) if v is not None}
        return await self._call("GET", f"/bostudio/plans/{_m(model)}", params=params)

    async def pairings(self, model: str) -> dict:
        return await self._call("GET", f"/bostudio/pairings/{_m(model)}")

    async def instances(self) -> list[dict]:
        return (await self._call("GET", "/bostudio/instances"))["instances"]

    async def start(self, model: str, spec: str | None = None, ctx: int | None = None,
                    cache_type: str | None = None, wait: bool = False) -> dict:
        body = {"model": model, "spec": spec, "ctx": ctx, "cache_type": cache_type, "wait": wait}
        return await self._call("POST", "/bostudio/instances", LOAD_TIMEOUT,
                                json={k: v for k, v in body.items() if v is not None})

    async def stop(self, model: str) -> dict:
        return await self._call("POST", f"/bostudio/instances/{_m(model)}/stop", LOAD_TIMEOUT)

    async def restart(self, model: str, wait: bool = False) -> dict:
        return await self._call("POST", f"/bostudio/instances/{_m(model)}/restart", LOAD_TIMEOUT,
                                params={"wait": str(wait).lower()})

    async def set_speculation(self, model: str, mode: str, wait: bool = False) -> dict:
        return await self._call("PUT", f"/bostudio/instances/{_m(model)}/speculation", LOAD_TIMEOUT,
                                json={"mode": mode}, params={"wait": str(wait).lower()})

    async def stats(self, model: str) -> dict:
        return await self._call("GET", f"/bostudio/instances/{_m(model)}/stats")

    async def log(self, model: str, lines: int = 100) -> list[str]:
        return (await self._call("GET", f"/bostudio/instances/{_m(model)}/log", params={"lines": lines}))["lines"]

    async def complete(self, model: str, prompt: str, max_tokens: int = 32) -> dict:
        """One completion through the daemon's router (the TUI's "try it" request)."""
        return await self._call("POST", "/v1/completions", LOAD_TIMEOUT,
                                json={"model": model, "prompt": prompt, "max_tokens": max_tokens})

    async def _stream(self, path: str, params: dict | None = None) -> AsyncIterator[dict]:
        try:
            async with self.http.stream("GET", path, params=params,
                                        timeout=httpx.Timeout(30.0, connect=2.0, read=None)) as r:
                if r.status_code >= 400:
                    await r.aread()
                    answer(r, "GET", path)
                async for line in r.aiter_lines():
                    data = sse_data(line)
                    if data is not None:
                        yield data
        except httpx.HTTPError as exc:
            raise transport_error(self.url, "GET", path, exc) from exc

    def events(self) -> AsyncIterator[dict]:
        """/bostudio/events: a snapshot, then state, launch, evict, stats and daemon events, until the
        daemon goes away (DaemonError) or the caller stops iterating."""
        return self._stream("/bostudio/events")

    def log_stream(self, model: str, lines: int = 20) -> AsyncIterator[dict]:
        """An instance's log as it grows: {"line": ...} per line."""
        return self._stream(f"/bostudio/instances/{_m(model)}/log/stream", {"lines": lines})
