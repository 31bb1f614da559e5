"""The daemon's clients, at httpx's MockTransport seam: both make their calls from one table of routes, a model
name of any shape reaches the daemon's own route for it, and failures become DaemonError."""

from __future__ import annotations

import asyncio
import inspect
import json
from urllib.parse import unquote

import httpx
import pytest
from starlette.routing import Match

from bostudio.daemon.client import ROUTES, AsyncDaemonClient, DaemonClient, Route
from bostudio.daemon.http.app import build_app
from bostudio.daemon.http.routes.control import DaemonInfo
from bostudio.daemon.http.security import allowed_hosts
from bostudio.daemon.supervise.supervisor import SupervisorOptions
from bostudio.errors import DaemonError

NAMES = ["plain", "org/Repo-GGUF:Q4_K_M", "what?x=1", "a#b", "with space", "modèle-ü-模型", "a/b/stop",
         "50%", "../status"]
URL = "http://daemon.test"


@pytest.fixture(scope="module")
def app_routes() -> list:
    """The daemon app's routes (its supervisor never starts: nothing runs)."""
    app = build_app(SupervisorOptions(), DaemonInfo("127.0.0.1", 1, False, 0.0), allowed_hosts("127.0.0.1"), None)
    return list(app.app.routes)  # inside the SecurityMiddleware


def route_of(routes: list, request: httpx.Request) -> tuple[str, dict]:
    """(path template, path params) of the daemon route that serves `request`, matched as uvicorn hands the
    request to the app: the path percent-decoded, the query apart."""
    raw_path = request.url.raw_path.decode("ascii").partition("?")[0]
    scope = {"type": "http", "method": request.method, "path": unquote(raw_path), "raw_path": raw_path.encode(),
             "root_path": "", "query_string": request.url.query, "headers": []}
    for r in routes:
        match, child = r.matches(scope)
        if match == Match.FULL:
            return r.path, child.get("path_params", {})
    raise AssertionError(f"no daemon route serves {request.method} {raw_path}")


def recording_transport(routes: list, seen: list, answer: dict | None = None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        path, params = route_of(routes, request)
        seen.append((request.method, path, params, dict(request.url.params),
                     json.loads(request.content) if request.content else None))
        return httpx.Response(200, json=answer if answer is not None else {"ok": True, "instances": [],
                                                                           "lines": ["l"], "models": []})
    return httpx.MockTransport(handler)


class _Async(httpx.AsyncBaseTransport):
    def __init__(self, sync: httpx.MockTransport) -> None:
        self.sync = sync

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return self.sync.handle_request(request)


def test_every_route_in_the_table_is_one_the_daemon_serves(app_routes: list) -> None:
    served = {(m, r.path.replace("{model:path}", "{model}")) for r in app_routes
              for m in getattr(r, "methods", None) or ()}
    for name, route in ROUTES.items():
        assert (route.method, route.path) in served, name


def test_both_clients_make_their_calls_from_the_one_table() -> None:
    for cls in (DaemonClient, AsyncDaemonClient):
        calls = {n for n, f in inspect.getmembers(cls, inspect.isfunction)
                 if not n.startswith("_") and n not in ("close", "aclose")}
        assert calls <= set(ROUTES), f"{cls.__name__} has calls outside ROUTES: {sorted(calls - set(ROUTES))}"
    assert {"status", "instances", "start", "stop", "restart", "set_speculation", "stats", "log",
            "events"} <= {n for n in dir(DaemonClient) if not n.startswith("_")}


@pytest.mark.parametrize("name", NAMES)
def test_the_blocking_client_sends_any_model_name_to_its_own_route(app_routes: list, name: str) -> None:
    seen: list = []
    with DaemonClient(URL, token="", transport=recording_transport(app_routes, seen)) as c:
        c.stop(name)
        c.restart(name)
        c.set_speculation(name, "off")
        c.stats(name)
        assert c.log(name, lines=7) == ["l"]
        c.start(name, spec="auto", ctx=4096)
    assert seen == [
        ("POST", "/bostudio/instances/{model:path}/stop", {"model": name}, {}, None),
        ("POST", "/bostudio/instances/{model:path}/restart", {"model": name}, {"wait": "true"}, None),
        ("PUT", "/bostudio/instances/{model:path}/speculation", {"model": name}, {"wait": "true"}, {"mode": "off"}),
        ("GET", "/bostudio/instances/{model:path}/stats", {"model": name}, {}, None),
        ("GET", "/bostudio/instances/{model:path}/log", {"model": name}, {"lines": "7"}, None),
        ("POST", "/bostudio/instances", {}, {}, {"model": name, "spec": "auto", "ctx": 4096, "wait": True}),
    ]


@pytest.mark.parametrize("name", NAMES)
def test_one_instance_is_read_by_any_model_name(app_routes: list, name: str) -> None:
    """GET /bostudio/instances/{model:path} comes after .../stats, .../log and .../log/stream (the tests above
    see those reached first), so it takes names with `/` too."""
    request = httpx.Request("GET", URL + Route("GET", "/bostudio/instances/{model}").url(name))
    assert route_of(app_routes, request) == ("/bostudio/instances/{model:path}", {"model": name})


@pytest.mark.parametrize("name", NAMES)
def test_the_async_client_sends_any_model_name_to_its_own_route(app_routes: list, name: str) -> None:
    seen: list = []

    async def calls() -> None:
        c = AsyncDaemonClient(URL, token="", transport=_Async(recording_transport(app_routes, seen)))
        try:
            await c.plan(name, ctx=8192)
            await c.pairings(name)
            await c.stop(name)
            await c.restart(name)
            await c.set_speculation(name, "ngram")
            await c.stats(name)
            await c.log(name)
            await c.start(name, cache_type="q8_0")
        finally:
            await c.aclose()

    asyncio.run(calls())
    assert seen == [
        ("GET", "/bostudio/plans/{model:path}", {"model": name}, {"ctx": "8192"}, None),
        ("GET", "/bostudio/pairings/{model:path}", {"model": name}, {}, None),
        ("POST", "/bostudio/instances/{model:path}/stop", {"model": name}, {}, None),
        ("POST", "/bostudio/instances/{model:path}/restart", {"model": name}, {"wait": "false"}, None),
        ("PUT", "/bostudio/instances/{model:path}/speculation", {"model": name}, {"wait": "false"}, {"mode": "ngram"}),
        ("GET", "/bostudio/instances/{model:path}/stats", {"model": name}, {}, None),
        ("GET", "/bostudio/instances/{model:path}/log", {"model": name}, {"lines": "100"}, None),
        ("POST", "/bostudio/instances", {}, {}, {"model": name, "cache_type": "q8_0", "wait": False}),
    ]


def test_the_log_stream_of_any_model_reaches_its_route(app_routes: list) -> None:
    name = "org/x?#y z"
    seen: list = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(route_of(app_routes, request))
        return httpx.Response(200, text='data: {"line": "one"}\n\n')

    async def read() -> list:
        c = AsyncDaemonClient(URL, token="", transport=_Async(httpx.MockTransport(handler)))
        try:
            return [ev async for ev in c.log_stream(name)]
        finally:
            await c.aclose()

    assert asyncio.run(read()) == [{"line": "one"}]
    assert seen == [("/bostudio/instances/{model:path}/log/stream", {"model": name})]


def test_failures_become_daemon_errors_with_the_daemons_words() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with DaemonClient(URL, token="", transport=httpx.MockTransport(refused)) as c:
        with pytest.raises(DaemonError, match="the bostudio daemon is not running at http://daemon.test"):
            c.status()
        with pytest.raises(DaemonError, match="not running"):
            list(c.events())

    def not_found(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": {"message": "model 'x' has no instance", "hint": "GET it"}})

    with DaemonClient(URL, token="", transport=httpx.MockTransport(not_found)) as c:
        with pytest.raises(DaemonError, match="model 'x' has no instance") as err:
            c.stop("x")
        assert err.value.hint == "GET it"
        with pytest.raises(DaemonError, match="model 'x' has no instance"):
            list(c.events())
