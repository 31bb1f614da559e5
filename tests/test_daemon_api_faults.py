"""Every API route of the daemon against hostile input and wedged or failed children, with fake
llama-servers (tests/fake_llama_server.py): the security gate on every route the app has, bad
JSON / unknown models / oversized bodies in each API's own error shape, a route the model cannot
serve refused from its GGUF header, a stream that stalls mid-body, a failed model retried after
its cool-down."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from bostudio.gguf.capabilities import caps_from_header
from bostudio.daemon.http.app import build_app
from bostudio.daemon.http.routes.control import DaemonInfo
from bostudio.daemon.http.routes.models import PASSTHROUGH_ROUTES
from bostudio.daemon.http.security import allowed_hosts
from bostudio.daemon.supervise.supervisor import SupervisorOptions
from bostudio.engine.argv import kind_args
from bostudio.gguf.split import read_header
from tests.daemon_util import DaemonProc, fake_engine
from bostudio.gguf.synth import tiny_embedder, tiny_llama

TOKEN = "ab" * 32
NEW_POST_ROUTES = [p for p, *_ in PASSTHROUGH_ROUTES] + ["/api/chat", "/api/generate", "/api/embed", "/api/show"]


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("apifakes")
    (root / "models").mkdir()
    for name in ("fake-ok", "fake-stall", "fake-crash"):
        tiny_llama(root / "models" / f"{name}.gguf")
    tiny_embedder(root / "models" / "fake-embed.gguf")
    fake_engine(root)
    return root


@pytest.fixture(scope="module")
def daemon(fake_root: Path):
    d = DaemonProc(fake_root, fake_root / "models",
                   ["--engine", str(fake_root / "llama-server"), "--idle-ttl", "0", "--stream-idle-timeout", "1.5",
                    "--failed-cooldown", "2", "--max-body-mib", "1",
                    "--prompt-store-dir", str(fake_root / "prompts")])
    d.start()
    yield d
    assert d.stop() == 0
    assert not d.children()


# ------------------------------------------------------------------ the security gate, every route

def test_every_route_of_the_app_refuses_a_foreign_host_and_a_missing_token() -> None:
    """Listed from the app itself, so a route added later is covered without editing this test.
    Bound off loopback (require_token), as `bostudio daemon --host 0.0.0.0` runs it."""
    app = build_app(SupervisorOptions(), DaemonInfo("0.0.0.0", 1, True, 0.0), allowed_hosts("0.0.0.0"), TOKEN)
    routes = [(r.path, sorted(r.methods or [])) for r in app.app.routes if hasattr(r, "methods")]
    paths = {p for p, _ in routes}
    assert set(NEW_POST_ROUTES) | {"/api/version", "/api/tags", "/api/ps"} <= paths
    client = TestClient(app, base_url="http://127.0.0.1:8642")
    checked = 0
    for path, methods in routes:
        url = re.sub(r"\{[^}]+\}", "x", path)
        for method in methods:
            if method == "HEAD":
                continue
            foreign = client.request(method, url, headers={"Host": "evil.example", "Authorization": f"Bearer {TOKEN}"})
            assert foreign.status_code == 403, (method, path, foreign.status_code)
            anon = client.request(method, url)
            assert anon.status_code == 401, (method, path, anon.status_code)
            wrong = client.request(method, url, headers={"x-api-key": "cd" * 32})
            assert wrong.status_code == 401, (method, path)
            if path.startswith("/v1/messages"):
                assert anon.json()["type"] == "error" and anon.json()["error"]["type"] == "authentication_error"
            elif path.startswith("/api/"):
                assert isinstance(anon.json()["error"], str)
            else:
                assert anon.json()["error"]["type"] == "authentication_error"
            checked += 1
    assert checked >= 40
    # The right token passes the gate, as a Bearer token or (Anthropic clients) as x-api-key.
    assert client.get("/api/version", headers={"x-api-key": TOKEN}).status_code == 200
    assert client.get("/api/version", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


# ------------------------------------------------------------------ capabilities from the header

def test_capabilities_come_from_the_gguf_header(fake_root: Path, tmp_path: Path) -> None:
    chat = caps_from_header(read_header(fake_root / "models" / "fake-ok.gguf"))
    assert (chat.kind, chat.fim, kind_args(chat)) == ("chat", False, ())
    emb = caps_from_header(read_header(fake_root / "models" / "fake-embed.gguf"))
    assert (emb.kind, emb.pooling, kind_args(emb)) == ("embedding", "mean", ("--embeddings", "--pooling", "mean"))
    rank = caps_from_header(read_header(tiny_embedder(tmp_path / "rank.gguf", pooling=4)))
    assert (rank.kind, kind_args(rank)) == ("rerank", ("--reranking",))
    assert "embedding model" in chat.refusal("/v1/embeddings", "m").message
    assert "FIM" in chat.refusal("/infill", "m").message
    assert emb.refusal("/v1/chat/completions", "e").message.startswith("e is an embedding model")
    assert rank.refusal("/v1/rerank", "r") is None and chat.refusal("/tokenize", "m") is None


# ------------------------------------------------------------------ bad input on every new route

def shape_ok(path: str, body: dict) -> str:
    """The error message, checked to be in the route's API shape."""
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return body["error"]["message"]
    if path.startswith("/api/"):
        assert isinstance(body["error"], str)
        return body["error"]
    assert {"message", "type", "code"} <= set(body["error"])
    return body["error"]["message"]


def test_bad_input_on_each_route_gets_a_clear_error_and_the_child_keeps_running(daemon: DaemonProc) -> None:
    with daemon.http(30) as http:
        assert http.post("/bostudio/instances", json={"model": "fake-ok"}).json()["state"] == "ready"
        pid = daemon.instance("fake-ok")["pid"]
        for path in NEW_POST_ROUTES:
            r = http.post(path, content=b"{not json", headers={"Content-Type": "application/json"})
            assert r.status_code == 400, path
            assert "JSON" in shape_ok(path, r.json())
            r = http.post(path, json={"model": "no-such-model", "messages": [], "prompt": "x", "input": "x"})
            assert r.status_code == 404, (path, r.status_code, r.text)
            assert "no-such-model" in shape_ok(path, r.json())
            r = http.post(path, json={"model": "fake-ok", "prompt": "x" * (2 << 20)})
            assert r.status_code == 413, path
            assert "larger than 1 MiB" in shape_ok(path, r.json())
        if True:  # the Anthropic shape for a missing model field too
            r = http.post("/v1/messages", json={"max_tokens": 4, "messages": []})
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    inst = daemon.instance("fake-ok")
    assert inst["state"] == "ready" and inst["pid"] == pid and inst["loads"] == 1


def test_a_route_the_model_cannot_serve_is_refused_before_any_launch(daemon: DaemonProc) -> None:
    with daemon.http(30) as http:
        r = http.post("/v1/embeddings", json={"model": "fake-stall", "input": "hello"})
        assert r.status_code == 400
        assert "embedding model" in r.json()["error"]["message"]
        r = http.post("/infill", json={"model": "fake-stall", "input_prefix": "def f(", "input_suffix": ")"})
        assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]
        r = http.post("/api/embed", json={"model": "fake-stall", "input": "x"})
        assert r.status_code == 400 and "embedding model" in r.json()["error"]
        r = http.post("/v1/chat/completions", json={"model": "fake-embed", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]
        r = http.post("/v1/messages", json={"model": "fake-embed", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        names = {i["model"] for i in http.get("/bostudio/instances").json()["instances"]}
        assert not names & {"fake-stall", "fake-embed"}  # nothing was launched for them


def test_an_embedding_model_is_launched_with_its_flags(daemon: DaemonProc) -> None:
    with daemon.http(30) as http:
        plan = http.get("/bostudio/plans/fake-embed").json()
        assert plan["kind"] == "embedding" and plan["speculation"] == "off"
        assert plan["argv"][plan["argv"].index("--embeddings"):][:3] == ["--embeddings", "--pooling", "mean"]
        assert "--slot-save-path" not in plan["argv"]
        chat = http.get("/bostudio/plans/fake-ok").json()
        assert "--embeddings" not in chat["argv"] and "-cram" in chat["argv"]
        cram = int(chat["argv"][chat["argv"].index("-cram") + 1])
        cache = [u for u in chat["uses"] if u["component"].startswith("prompt cache")]
        assert cache and cram == cache[0]["bytes"] >> 20 and cram < 8192  # the plan's, not the 8 GiB default
        assert chat["bytes"] == sum(u["bytes"] for u in chat["uses"])  # counted in what the budget sees
        r = http.post("/v1/embeddings", json={"model": "fake-embed", "input": "hello"})
        assert r.status_code == 200  # routed to the child (the fake answers every POST)
    log = Path(daemon.instance("fake-embed")["log"])
    assert log.exists()


# ------------------------------------------------------------------ wedged and failed children

def test_a_stream_that_stalls_mid_body_ends_with_an_error_after_the_idle_timeout(daemon: DaemonProc) -> None:
    body = {"model": "fake-stall", "prompt": "x", "max_tokens": 8, "stream": True}
    started = time.monotonic()
    with httpx.stream("POST", daemon.url + "/v1/completions", json=body, timeout=60, trust_env=False) as r:
        assert r.status_code == 200
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and "[DONE]" not in line]
    assert events[0]["choices"][0]["text"] == "t0"
    assert "sent nothing for 1.5 s" in events[-1]["error"]["message"]
    assert time.monotonic() - started < 50
    # Ollama's NDJSON stream ends the same way, in its own shape.
    with httpx.stream("POST", daemon.url + "/api/generate", json={"model": "fake-stall", "prompt": "x", "raw": True,
                                                                  "options": {"num_predict": 8}},
                      timeout=60, trust_env=False) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert lines[0]["response"] == "t0" and "sent nothing" in lines[-1]["error"]
    inst = daemon.instance("fake-stall")
    assert inst["state"] == "ready" and inst["stats"]["errors"] >= 2 and inst["active_requests"] == 0


def test_a_failed_model_is_retried_after_its_cooldown_and_ps_says_when(daemon: DaemonProc) -> None:
    with daemon.http(60) as http:
        r = http.post("/bostudio/instances", json={"model": "fake-crash"})
        inst = r.json()["instance"]
        assert inst["state"] == "failed" and inst["loads"] == 5
        assert "next request after the cool-down" in inst["retry"]["how"] and inst["retry"]["in_s"] <= 2
        r = http.post("/v1/completions", json={"model": "fake-crash", "prompt": "x"})
        if r.status_code == 503:  # still cooling down: said so, and nothing relaunched
            assert "retried automatically in" in r.json()["error"]["hint"]
            assert daemon.instance("fake-crash")["loads"] == 5
        time.sleep(2.2)
        r = http.post("/v1/completions", json={"model": "fake-crash", "prompt": "x"})
        assert r.status_code == 503  # it crashes again, but it was tried again
        assert daemon.instance("fake-crash")["loads"] == 10
