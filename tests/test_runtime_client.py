"""The llama-server clients at httpx's MockTransport seam: httpx's errors become ServerError here, once, with
what was asked and where the log is (the daemon's async client: ChildError, saying whether the request reached
the child); and the speculation check reads the probe's counters and the log."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import httpx
import pytest

from bostudio.errors import ServerError
from bostudio.runtime import passthrough
from bostudio.runtime.client import BROKEN, CONNECT, GARBLED, TIMED_OUT, AsyncLlamaClient, ChildError, LlamaClient
from bostudio.runtime.verify import PROBE_PROMPT, verify_speculation
from bostudio.speculation import Speculator

NGRAM = Speculator("ngram", ("ngram-mod",))


def client(handler, log: Path | None = None, name: str = "llama-server") -> LlamaClient:  # type: ignore[no-untyped-def]
    return LlamaClient("http://llama.test", name=name, log_path=log, transport=httpx.MockTransport(handler))


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def test_no_answer_is_a_server_error_naming_the_request_and_the_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    with pytest.raises(ServerError, match=r"^llama-server did not answer the probe request: connection refused$") as e:
        verify_speculation(client(refuse, log), NGRAM, log)
    assert e.value.hint == f"see the log: {log}"
    assert isinstance(e.value.__cause__, httpx.ConnectError)


def test_an_error_status_is_a_server_error_that_says_it_failed(tmp_path: Path) -> None:
    c = client(lambda r: httpx.Response(500, json={"error": "boom"}), tmp_path / "b.log", "llama-server (off)")
    with pytest.raises(ServerError, match=r"^llama-server \(off\) failed a bench request: .*500") as e:
        c.completion("x", 4, what="a bench request")
    assert e.value.hint == f"see the log: {tmp_path / 'b.log'}"
    with pytest.raises(ServerError, match=r"^llama-server did not answer GET /metrics") as e:
        client(refuse).metrics()
    assert e.value.hint == "is llama-server running at http://llama.test?"


def test_health_is_none_until_something_answers() -> None:
    assert client(refuse).health() is None
    assert client(lambda r: httpx.Response(503)).health() == 503


def test_speculation_is_active_when_the_probe_drafts(tmp_path: Path) -> None:
    bodies = []

    def server(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.read()))
        return httpx.Response(200, json={"timings": {"draft_n": 20, "draft_n_accepted": 15}})

    status = verify_speculation(client(server), NGRAM, tmp_path / "l.log")
    assert (status.active, status.draft_n, status.draft_accepted) == (True, 20, 15)
    assert status.detail == "active: the probe drafted 20 tokens, 15 accepted (75%)"
    assert (bodies[0]["prompt"], bodies[0]["temperature"]) == (PROBE_PROMPT, 0.0)  # greedy


def test_speculation_is_inactive_with_the_reason_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "l.log"
    log.write_text("load ...\nsrv  load_model: failed to initialize speculative decoding context: bad draft\n")

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "speculative": False}])
        return httpx.Response(200, json={"timings": {"draft_n": 0}})

    status = verify_speculation(client(server), NGRAM, log)
    assert not status.active
    assert status.detail == "INACTIVE: failed to initialize speculative decoding context: bad draft"
    off = verify_speculation(client(server), Speculator("none"), log)
    assert (off.active, off.detail) == (False, "off")


# ------------------------------------------------------------------ the daemon's async client of its children

def raising(exc_type: type[httpx.HTTPError]):  # type: ignore[no-untyped-def]
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc_type("nope", request=request) if exc_type is not httpx.DecodingError else exc_type("nope")
    return handler


@pytest.mark.parametrize("exc_type, kind, reached", [
    (httpx.ConnectError, CONNECT, False),  # nothing reached the child: the router may send it again
    (httpx.ConnectTimeout, TIMED_OUT, True),  # a timeout like any other (a busy child): the request goes on
    (httpx.ReadTimeout, TIMED_OUT, True),
    (httpx.RemoteProtocolError, BROKEN, True),  # the child may have died of it
    (httpx.ReadError, BROKEN, True),
    (httpx.DecodingError, GARBLED, True),
])
def test_the_async_client_says_whether_a_failed_request_reached_the_child(exc_type, kind, reached) -> None:  # type: ignore[no-untyped-def]
    async def go() -> ChildError:
        async with AsyncLlamaClient("http://child.test", "k", name="llama-server for m",
                                    transport=httpx.MockTransport(raising(exc_type))) as c:
            with pytest.raises(ChildError) as e:
                await c.post("/tokenize", json={"content": "x"})
            assert await c.health() is None  # no answer: not listening (yet)
            return e.value

    err = asyncio.run(go())
    assert (err.kind, err.reached) == (kind, reached)
    assert err.message.startswith("llama-server for m: POST /tokenize failed: ") and isinstance(err, ServerError)


def test_the_async_client_hands_back_any_status_with_the_key() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(503, json={"error": "loading"})

    async def go() -> tuple[int, int | None]:
        async with AsyncLlamaClient("http://child.test", "k", transport=httpx.MockTransport(handler)) as c:
            return (await c.get("/slots")).status_code, await c.health()

    assert asyncio.run(go()) == (503, 503) and seen == ["Bearer k", "Bearer k"]


def test_the_streaming_path_raises_the_same_error_when_nothing_listens() -> None:
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(ChildError) as e:
            asyncio.run(passthrough.post("127.0.0.1", port, "/completion", b"{}", "k"))
    assert e.value.kind == CONNECT and not e.value.reached
