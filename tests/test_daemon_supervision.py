"""The daemon's app in this process (Starlette's TestClient runs it, lifespan included) against fake llama-server
children (tests/fake_llama_server.py): what the effects runner does with the lifecycle's decisions for real
child processes (out of memory, a loader that prints progress, a silent one, eviction and idle unloading), the
HTTP edge's refusals, and the control API. No daemon subprocess: tests/test_daemon_faults.py keeps the few
cases that need one (a crash loop, a busy port, kill -9 of the daemon, start/stop in the background)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from starlette.testclient import TestClient

from bostudio.daemon.http.app import build_app
from bostudio.daemon.http.routes.control import DaemonInfo
from bostudio.daemon.http.security import allowed_hosts, create_token, read_token, token_path
from bostudio.daemon.supervise.supervisor import SupervisorOptions
from tests.daemon_util import fake_engine
from bostudio.gguf.synth import tiny_llama

FAKES = ("fake-ok", "fake-ok2", "fake-oom", "fake-silent", "fake-progress")
STALL_S = 1.5
HANG_GUARD_S = 120  # waits for a state end as soon as it is reached; the guard only stops a hang
BASE = "http://127.0.0.1:8642"


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("fakes")
    (root / "models").mkdir()
    for name in FAKES:
        tiny_llama(root / "models" / f"{name}.gguf")
    fake_engine(root)
    with pytest.MonkeyPatch.context() as mp:  # the daemon's XDG dirs and model dir, as daemon_util.daemon_env
        mp.setenv("XDG_STATE_HOME", str(root / "state"))
        mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
        mp.setenv("BOSTUDIO_MODELS_DIR", str(root / "models"))
        yield root


def daemon_app(root: Path, **options) -> TestClient:  # type: ignore[no-untyped-def]
    opts = SupervisorOptions(engine=str(root / "llama-server"), prompt_store_dir=str(root / "prompts"), **options)
    return TestClient(build_app(opts, DaemonInfo("127.0.0.1", 8642, False, 0.0), allowed_hosts("127.0.0.1"), None),
                      base_url=BASE)


def events(client: TestClient) -> list[dict]:
    return list(client.app.app.state.bus.recent)  # type: ignore[attr-defined]  (inside SecurityMiddleware)


def children(client: TestClient) -> list[int]:
    sup = client.app.app.state.supervisor  # type: ignore[attr-defined]
    return [c.pid for c in sup.children()]


@pytest.fixture(scope="module")
def client(fake_root: Path) -> Iterator[TestClient]:
    with daemon_app(fake_root, stall_timeout=STALL_S, idle_ttl=0) as c:
        yield c
        pids = children(c)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def start(client: TestClient, model: str, **kw):  # type: ignore[no-untyped-def]
    return client.post("/bostudio/instances", json={"model": model, **kw})


def test_out_of_memory_is_reported_as_such_with_the_plan(client: TestClient) -> None:
    r = start(client, "fake-oom")
    assert r.status_code == 503
    inst = r.json()["instance"]
    assert inst["state"] == "failed"
    assert inst["loads"] == 1  # the same plan would run out of memory again: no restart
    assert inst["error"]["type"] == "OutOfMemoryError"
    assert "out of memory" in inst["error"]["message"]
    # the plan it ran: the largest context that fits, here the tiny model's training context
    assert "plan:" in inst["error"]["message"] and f"fake-oom at ctx {inst['plan']['ctx']}" in inst["error"]["message"]
    assert inst["plan"]["ctx"] == inst["plan"]["n_ctx_train"]
    assert inst["error"]["plan"]["bytes"] > 0


def test_loader_printing_progress_is_not_killed_for_slowness(client: TestClient) -> None:
    t0 = time.monotonic()
    r = start(client, "fake-progress")
    assert r.status_code == 200, r.text
    inst = r.json()
    assert inst["state"] == "ready" and inst["loads"] == 1
    assert time.monotonic() - t0 > 2 * STALL_S  # slower than the stall timeout, yet kept


def test_silent_loader_is_killed_after_the_stall_timeout(client: TestClient) -> None:
    r = start(client, "fake-silent", wait=False)
    assert r.status_code == 200
    pid = None
    deadline = time.monotonic() + HANG_GUARD_S
    while pid is None and time.monotonic() < deadline:
        pid = client.get("/bostudio/instances/fake-silent").json()["pid"]
        time.sleep(0.05)
    assert pid is not None
    psutil.Process(pid).wait(HANG_GUARD_S)  # killed: silent past the stall timeout

    def reasons() -> list[str]:
        return [e.get("reason", "") for e in events(client)
                if e.get("state") == "restarting" and e.get("model") == "fake-silent"]

    deadline = time.monotonic() + HANG_GUARD_S
    while not reasons() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reasons() and "silent for" in reasons()[0]
    assert client.post("/bostudio/instances/fake-silent/stop").json()["state"] == "stopped"


def test_routes_streams_and_counts_stats_through_a_fake(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": "fake-ok", "prompt": "x", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "fake"
    with client.stream("POST", "/v1/completions", json={"model": "fake-ok", "prompt": "x", "max_tokens": 3,
                                                        "stream": True}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        data = [ln for ln in s.iter_lines() if ln.startswith("data:")]
    assert data[-1] == "data: [DONE]" and len(data) == 5
    deadline = time.monotonic() + HANG_GUARD_S
    while (client.get("/bostudio/instances/fake-ok/stats").json()["mean_accepted_length"] is None
           and time.monotonic() < deadline):
        time.sleep(0.2)  # the next /metrics scrape (every 2 s)
    st = client.get("/bostudio/instances/fake-ok/stats").json()
    assert st["requests"] == 2
    assert st["draft_tokens"] == 8 and st["draft_accepted"] == 6
    assert st["acceptance_rate"] == pytest.approx(0.8)  # /metrics: 8 / 10
    assert st["mean_accepted_length"] == pytest.approx(3.0)  # 1 + 8 / 4
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}


def test_a_broken_tool_call_is_asked_again_with_the_call_forced(client: TestClient, fake_root: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The child answers a get_weather call in a form no rule reads; the daemon asks again forcing that tool
    (tool_choice required, that tool alone) and the client gets the real call; ps counts it."""
    from tests.fake_llama_server import BROKEN_CALL_WORD

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    other = {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}
    assert start(client, "fake-ok").status_code in (200, 201)  # loaded (or already there)
    before = client.get("/bostudio/instances/fake-ok/stats").json()
    r = client.post("/v1/chat/completions", json={
        "model": "fake-ok", "tools": [other, weather],
        "messages": [{"role": "user", "content": f"weather in Paris? {BROKEN_CALL_WORD}"}]})
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather", msg
    st = client.get("/bostudio/instances/fake-ok/stats").json()
    assert st["tool_calls_forced"] == before["tool_calls_forced"] + 1
    assert st["requests"] == before["requests"] + 2  # the answer and the forced one
    # A request without tools gets the child's text as it is, and nothing is asked again.
    r = client.post("/v1/chat/completions", json={
        "model": "fake-ok", "messages": [{"role": "user", "content": f"hi {BROKEN_CALL_WORD}"}]})
    assert r.json()["choices"][0]["message"]["content"].startswith("<function name=")
    assert client.get("/bostudio/instances/fake-ok/stats").json()["tool_calls_forced"] == st["tool_calls_forced"]


def test_a_runaway_answer_is_stopped_and_its_child_stops_generating(client: TestClient) -> None:
    """The child streams the same line until its client leaves. The daemon's loop guard ends the answer as the
    output limit would (finish_reason length / Ollama's done_reason length), closes the child's connection (the
    child logs it), ps counts each, and the model goes on serving."""
    from bostudio.daemon.http.loopguard import CHECK_EVERY, LOOP_CHARS
    from tests.fake_llama_server import LOOP_CAP, LOOP_LINE, LOOP_STOPPED, LOOP_WORD

    assert start(client, "fake-ok").status_code in (200, 201)
    before = client.get("/bostudio/instances/fake-ok/stats").json()
    # max_tokens keeps the fake's answer to the daemon's prompt count short; its loop ignores it, as a runaway
    # model under a large limit (the daemon's default: a quarter of the context) runs far past the guard.
    ask = {"model": "fake-ok", "messages": [{"role": "user", "content": f"count {LOOP_WORD}"}], "stream": True,
           "max_tokens": 4}

    def stopped_in_log() -> int:
        lines = client.get("/bostudio/instances/fake-ok/log", params={"lines": 500}).json()["lines"]
        return sum(LOOP_STOPPED in ln for ln in lines)

    logged = stopped_in_log()
    with client.stream("POST", "/v1/chat/completions", json=ask) as s:
        data = [ln[5:].strip() for ln in s.iter_lines() if ln.startswith("data:")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert LOOP_CHARS <= len(text) <= LOOP_CHARS + CHECK_EVERY + len(LOOP_LINE) < LOOP_CAP * len(LOOP_LINE)
    assert set(text.splitlines(keepends=True)) == {LOOP_LINE}

    ollama = {**ask, "options": {"num_predict": 4}}
    del ollama["max_tokens"]
    with client.stream("POST", "/api/chat", json=ollama) as s:  # the Ollama face: same relay, same guard
        lines = [json.loads(ln) for ln in s.iter_lines() if ln.strip()]
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "length"
    assert LOOP_CHARS <= len("".join(ln["message"]["content"] for ln in lines)) < LOOP_CAP * len(LOOP_LINE)

    st = client.get("/bostudio/instances/fake-ok/stats").json()
    assert st["runaways_stopped"] == before["runaways_stopped"] + 2
    deadline = time.monotonic() + HANG_GUARD_S
    while stopped_in_log() < logged + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stopped_in_log() == logged + 2  # the child saw each connection closed, long before LOOP_CAP lines
    r = client.post("/v1/completions", json={"model": "fake-ok", "prompt": "x", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "fake"


def test_foreign_host_header_and_origin_get_403(client: TestClient) -> None:
    for headers in ({"Host": "evil.example:80"}, {"Host": "attacker.test"}, {"Origin": "http://evil.example"}):
        r = client.get("/v1/models", headers=headers)
        assert r.status_code == 403, headers
        assert r.json()["error"]["type"] == "permission_error"
        assert "access-control-allow-origin" not in r.headers
    ok = client.get("/v1/models", headers={"Host": "localhost:8642", "Origin": "http://localhost:8642"})
    assert ok.status_code == 200
    assert "access-control-allow-origin" not in ok.headers


def test_harmful_parameters_are_rejected_with_400_before_any_launch(client: TestClient) -> None:
    def loads() -> int:
        r = client.get("/bostudio/instances/fake-ok2")
        return r.json()["loads"] if r.status_code == 200 else 0

    before = loads()
    for body in ({"model": "fake-ok2", "prompt": "x", "max_tokens": -1},
                 {"model": "fake-ok2", "prompt": "x", "id_slot": 0},
                 {"model": "fake-ok2", "prompt": "x", "lora": [{"id": 0, "scale": 1}]},
                 {"model": "../etc/passwd", "prompt": "x"},
                 {"model": "fake-ok2", "messages": [{"role": "user", "content": [
                     {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}):
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, body
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert client.post("/v1/completions", content=b"not json").status_code == 400
    r = client.post("/v1/completions", json={"model": "no-such-model", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert loads() == before


def test_control_api_devices_catalog_plans_pairings(client: TestClient) -> None:
    devices = client.get("/bostudio/devices").json()
    assert devices["engine"].endswith("llama-server") and devices["host"]["total_bytes"] > 0
    assert client.get("/bostudio/engine").json()["version"] == "0.5.0-dev"
    catalog = {m["model"]: m for m in client.get("/bostudio/catalog").json()["models"]}
    assert set(FAKES) <= set(catalog)
    assert catalog["fake-ok"]["architecture"] == "llama" and catalog["fake-ok"]["n_nextn"] == 0
    plan = client.get("/bostudio/plans/fake-ok").json()
    # The planner's figure: at least the n-gram table (16 MiB) on top of the tiny model (and, CPU only, so
    # without flash attention, the attention scores' buffer of a ubatch at the whole context).
    assert plan["speculation"] == "ngram-mod" and 16 << 20 < plan["bytes"] < 48 << 20
    assert plan["flash_attn"]["mode"] in ("on", "off") and plan["flash_attn"]["why"]
    assert "--spec-type" in plan["argv"] and "-m" in plan["argv"]
    pairings = client.get("/bostudio/pairings/fake-ok").json()["modes"]
    assert pairings["off"]["speculation"] == "off" and "error" in pairings["mtp"]
    missing = client.get("/bostudio/plans/no-such-model")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_lru_eviction_when_memory_is_needed_and_idle_unload(fake_root: Path) -> None:
    # The planner puts each tiny fake instance at ~22.5 MiB (its n-gram table alone is 16 MiB):
    # a 35 MiB budget holds one.
    with daemon_app(fake_root, memory_budget=35 << 20, idle_ttl=2) as c:
        assert c.post("/v1/completions", json={"model": "fake-ok", "prompt": "x"}).status_code == 200
        assert c.post("/v1/completions", json={"model": "fake-ok2", "prompt": "x"}).status_code == 200
        states = {i["model"]: i["state"] for i in c.get("/bostudio/instances").json()["instances"]}
        assert states == {"fake-ok": "stopped", "fake-ok2": "ready"}
        assert [e["model"] for e in events(c) if e["type"] == "evict"] == ["fake-ok"]
        assert len(children(c)) == 1
        deadline = time.monotonic() + HANG_GUARD_S
        while c.get("/bostudio/instances/fake-ok2").json()["state"] != "stopped" and time.monotonic() < deadline:
            time.sleep(0.1)
        idle = [e for e in events(c) if e.get("state") == "stopped" and e.get("model") == "fake-ok2"]
        assert idle and idle[-1]["reason"] == "idle"
        assert not children(c)


def test_off_loopback_the_daemon_wants_its_token(fake_root: Path) -> None:
    """`bostudio daemon --host 0.0.0.0` with a token (security.check_bind refuses it without one: test_daemon_units)."""
    path = create_token()
    token = read_token()
    assert path == token_path() and path.stat().st_mode & 0o777 == 0o600
    assert token is not None and len(bytes.fromhex(token)) == 32
    app = build_app(SupervisorOptions(engine=str(fake_root / "llama-server")), DaemonInfo("0.0.0.0", 8642, True, 0.0),
                    allowed_hosts("0.0.0.0"), token)
    with TestClient(app, base_url=BASE) as c:
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer " + "0" * 64}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_off_loopback_without_a_token_the_daemon_refuses_to_start(fake_root: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from bostudio.cli import main

    token_path().unlink(missing_ok=True)
    assert main(["daemon", "--host", "0.0.0.0", "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bostudio: daemon error: refusing to listen on 0.0.0.0 without a token")
    assert "(hint: " in err and "Traceback" not in err
