"""The daemon's fault cases against fake llama-servers (tests/fake_llama_server.py): crash loops,
out-of-memory, stalls vs. slow progress, a decoy on the planned port, kill -9 of the daemon, bind
and Host/Origin rules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from bostudio.daemon import state
from tests.daemon_util import DaemonProc, daemon_env, fake_engine
from bostudio.gguf.synth import tiny_llama
from tests.netutil import free_port, port_is_free

FAKES = ("fake-ok", "fake-ok2", "fake-crash", "fake-oom", "fake-silent", "fake-progress")
STALL_S = 1.5
HANG_GUARD_S = 120  # waits for a state end as soon as it is reached; the guard only stops a hang


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fakes")
    (root / "models").mkdir()
    for name in FAKES:
        tiny_llama(root / "models" / f"{name}.gguf")
    fake_engine(root)
    return root


@pytest.fixture(scope="module")
def daemon(fake_root: Path):
    d = DaemonProc(fake_root, fake_root / "models",
                   ["--engine", str(fake_root / "llama-server"), "--stall-timeout", str(STALL_S), "--idle-ttl", "0"])
    d.start()
    yield d
    assert d.stop() == 0
    assert not d.children()


class Events:
    """Collects /bostudio/events in a thread."""

    def __init__(self, url: str) -> None:
        self.events: list[dict] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + HANG_GUARD_S
        while not self.events and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.events and self.events[0]["type"] == "snapshot"

    def _run(self, url: str) -> None:
        try:
            with httpx.stream("GET", url + "/bostudio/events", timeout=httpx.Timeout(5, read=None),
                              trust_env=False) as r:
                for line in r.iter_lines():
                    if self._stop:
                        return
                    if line.startswith("data:"):
                        self.events.append(json.loads(line[5:]))
        except httpx.HTTPError:
            return  # the daemon stopped

    def states(self, model: str) -> list[str]:
        return [e["state"] for e in self.events if e.get("type") == "state" and e.get("model") == model]

    def close(self) -> None:
        self._stop = True


def start(d: DaemonProc, model: str, **kw) -> httpx.Response:
    return httpx.post(d.url + "/bostudio/instances", json={"model": model, **kw}, timeout=120, trust_env=False)


def test_crash_loop_stops_after_five_crashes_with_the_last_log_lines(daemon: DaemonProc) -> None:
    events = Events(daemon.url)
    r = start(daemon, "fake-crash")
    assert r.status_code == 503
    body = r.json()
    assert body["error"]["type"] == "unavailable_error"
    inst = body["instance"]
    assert inst["state"] == "failed"
    assert inst["loads"] == 5
    assert "crashed 5 times" in inst["error"]["message"]
    assert any("fake crash" in line for line in inst["error"]["log_tail"])
    time.sleep(1.0)  # no sixth launch after giving up
    assert daemon.instance("fake-crash")["loads"] == 5
    assert events.states("fake-crash").count("restarting") == 4
    assert events.states("fake-crash")[-1] == "failed"
    # A request for a failed model gets an OpenAI-shaped error at once, and no new launch.
    r = httpx.post(daemon.url + "/v1/completions", json={"model": "fake-crash", "prompt": "x"}, trust_env=False)
    assert r.status_code == 503 and "failed" in r.json()["error"]["message"]
    assert daemon.instance("fake-crash")["loads"] == 5
    events.close()


def test_out_of_memory_is_reported_as_such_with_the_plan(daemon: DaemonProc) -> None:
    r = start(daemon, "fake-oom")
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


def test_loader_printing_progress_is_not_killed_for_slowness(daemon: DaemonProc) -> None:
    t0 = time.monotonic()
    r = start(daemon, "fake-progress")
    assert r.status_code == 200, r.text
    inst = r.json()
    assert inst["state"] == "ready"
    assert inst["loads"] == 1
    assert time.monotonic() - t0 > 2 * STALL_S  # slower than the stall timeout, yet kept


def test_silent_loader_is_killed_after_the_stall_timeout(daemon: DaemonProc) -> None:
    events = Events(daemon.url)
    r = start(daemon, "fake-silent", wait=False)
    assert r.status_code == 200
    pid = None
    deadline = time.monotonic() + HANG_GUARD_S
    while pid is None and time.monotonic() < deadline:
        pid = daemon.instance("fake-silent")["pid"]
        time.sleep(0.05)
    assert pid is not None
    proc = psutil.Process(pid)
    proc.wait(HANG_GUARD_S)  # killed: silent past the stall timeout
    deadline = time.monotonic() + HANG_GUARD_S
    while "restarting" not in events.states("fake-silent") and time.monotonic() < deadline:
        time.sleep(0.05)
    reasons = [e.get("reason", "") for e in events.events if e.get("state") == "restarting"
               and e.get("model") == "fake-silent"]
    assert reasons and "silent for" in reasons[0]
    assert httpx.post(daemon.url + "/bostudio/instances/fake-silent/stop", timeout=30,
                      trust_env=False).json()["state"] == "stopped"
    events.close()


def test_decoy_on_the_planned_port_is_detected_and_never_ready(daemon: DaemonProc, fake_root: Path) -> None:
    port = free_port()
    decoy_log = fake_root / "decoy.log"
    decoy = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fake_llama_server.py")),
                              "--decoy", str(port), "--decoy-log", str(decoy_log)])
    events = Events(daemon.url)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while port_is_free(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        r = start(daemon, "fake-ok2", port=port)
        assert r.status_code == 503
        inst = r.json()["instance"]
        assert inst["state"] == "failed"
        assert "another process" in inst["error"]["message"] or "in use" in inst["error"]["message"]
        assert "ready" not in events.states("fake-ok2")
        seen = decoy_log.read_text().splitlines() if decoy_log.exists() else []
        # The decoy may have been asked for /health, never for a probe or a completion.
        assert all(line.endswith("/health") for line in seen), seen
        r = httpx.post(daemon.url + "/v1/completions", json={"model": "fake-ok2", "prompt": "x"}, trust_env=False)
        assert r.status_code == 503
    finally:
        decoy.kill()
        decoy.wait()
        events.close()


def test_routes_streams_and_counts_stats_through_a_fake(daemon: DaemonProc) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30, trust_env=False) as http:
        r = http.post("/v1/completions", json={"model": "fake-ok", "prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "fake"
        with http.stream("POST", "/v1/completions", json={"model": "fake-ok", "prompt": "x", "max_tokens": 3,
                                                          "stream": True}) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            data = [ln for ln in s.iter_lines() if ln.startswith("data:")]
        assert data[-1] == "data: [DONE]" and len(data) == 5
        time.sleep(2.5)  # one /metrics scrape
        st = http.get("/bostudio/instances/fake-ok/stats").json()
        assert st["requests"] == 2
        assert st["draft_tokens"] == 8 and st["draft_accepted"] == 6
        assert st["acceptance_rate"] == pytest.approx(0.8)  # /metrics: 8 / 10
        assert st["mean_accepted_length"] == pytest.approx(3.0)  # 1 + 8 / 4
        assert "access-control-allow-origin" not in {k.lower() for k in r.headers}


def test_foreign_host_header_and_origin_get_403(daemon: DaemonProc) -> None:
    for headers in ({"Host": "evil.example:80"}, {"Host": "attacker.test"},
                    {"Origin": "http://evil.example"}):
        r = httpx.get(daemon.url + "/v1/models", headers=headers, trust_env=False)
        assert r.status_code == 403, headers
        assert r.json()["error"]["type"] == "permission_error"
        assert "access-control-allow-origin" not in r.headers
    ok = httpx.get(daemon.url + "/v1/models", headers={"Host": f"localhost:{daemon.port}",
                                                       "Origin": f"http://localhost:{daemon.port}"},
                   trust_env=False)
    assert ok.status_code == 200
    assert "access-control-allow-origin" not in ok.headers


def test_harmful_parameters_are_rejected_with_400(daemon: DaemonProc) -> None:
    loads = daemon.instance("fake-ok")["loads"] if httpx.get(
        daemon.url + "/bostudio/instances/fake-ok", trust_env=False).status_code == 200 else 0
    for body in ({"model": "fake-ok", "prompt": "x", "max_tokens": -1},
                 {"model": "fake-ok", "prompt": "x", "id_slot": 0},
                 {"model": "fake-ok", "prompt": "x", "lora": [{"id": 0, "scale": 1}]},
                 {"model": "../etc/passwd", "prompt": "x"},
                 {"model": "fake-ok", "messages": [{"role": "user", "content": [
                     {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}):
        r = httpx.post(daemon.url + "/v1/chat/completions", json=body, trust_env=False)
        assert r.status_code == 400, body
        assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(daemon.url + "/v1/completions", content=b"not json", trust_env=False)
    assert r.status_code == 400
    r = httpx.post(daemon.url + "/v1/completions", json={"model": "no-such-model", "prompt": "x"}, trust_env=False)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    if loads:
        assert daemon.instance("fake-ok")["loads"] == loads


def test_kill_9_of_the_daemon_leaves_no_orphan_and_a_restart_frees_the_ports(fake_root: Path,
                                                                             tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, fake_root / "models", ["--engine", str(fake_root / "llama-server")]).start()
    with httpx.Client(base_url=d.url, timeout=30, trust_env=False) as http:
        for model in ("fake-ok", "fake-ok2"):
            assert http.post("/v1/completions", json={"model": model, "prompt": "x"}).status_code == 200
        insts = http.get("/bostudio/instances").json()["instances"]
    ports = [i["port"] for i in insts]
    children = d.children()
    assert len(children) >= 2 and all(p is not None for p in ports)
    recorded = state.load(Path(d.env["XDG_STATE_HOME"]) / "bostudio" / "daemon.json")
    assert recorded is not None and {c.pid for c in recorded.children} == {i["pid"] for i in insts}

    os.kill(d.proc.pid, signal.SIGKILL)
    d.proc.wait(HANG_GUARD_S)
    d2 = DaemonProc(tmp_path, fake_root / "models", ["--engine", str(fake_root / "llama-server")]).start()
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline and (any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                                                   for c in children) or not all(map(port_is_free, ports))):
            time.sleep(0.05)
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        assert all(port_is_free(p) for p in ports)
    finally:
        assert d2.stop() == 0


def test_non_loopback_bind_without_a_token_is_refused(tmp_path: Path, fake_root: Path) -> None:
    env = daemon_env(tmp_path, fake_root / "models")
    proc = subprocess.run([sys.executable, "-m", "bostudio", "daemon", "--host", "0.0.0.0", "--port",
                           str(free_port())], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.startswith("bostudio: daemon error: refusing to listen on 0.0.0.0 without a token")
    assert "(hint: " in proc.stderr and "Traceback" not in proc.stderr


def test_non_loopback_bind_with_a_token_requires_it(tmp_path: Path, fake_root: Path) -> None:
    env = daemon_env(tmp_path, fake_root / "models")
    subprocess.run([sys.executable, "-m", "bostudio", "daemon", "token"], env=env, check=True, timeout=30)
    token_file = tmp_path / "config" / "bostudio" / "token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    token = token_file.read_text().strip()
    assert len(bytes.fromhex(token)) == 32
    d = DaemonProc(tmp_path, fake_root / "models", ["--host", "0.0.0.0"])
    d.url = f"http://127.0.0.1:{d.port}"
    out = open(tmp_path / "d.out", "wb")
    d.proc = subprocess.Popen([sys.executable, "-m", "bostudio", "daemon", "--host", "0.0.0.0", "--port",
                               str(d.port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        status = None
        while time.monotonic() < deadline:
            try:
                status = httpx.get(d.url + "/v1/models", trust_env=False).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert status == 401
        r = httpx.get(d.url + "/v1/models", headers={"Authorization": "Bearer " + "0" * 64}, trust_env=False)
        assert r.status_code == 401
        r = httpx.get(d.url + "/v1/models", headers={"Authorization": f"Bearer {token}"}, trust_env=False)
        assert r.status_code == 200
    finally:
        assert d.stop() == 0


def test_lru_eviction_when_memory_is_needed_and_idle_unload(fake_root: Path, tmp_path: Path) -> None:
    # The planner puts each tiny fake instance at ~22.5 MiB (its n-gram table alone is 16 MiB):
    # a 35 MiB budget holds one.
    d = DaemonProc(tmp_path, fake_root / "models", ["--engine", str(fake_root / "llama-server"),
                                                    "--memory-budget", "35", "--idle-ttl", "2"]).start()
    events = Events(d.url)
    try:
        with httpx.Client(base_url=d.url, timeout=30, trust_env=False) as http:
            assert http.post("/v1/completions", json={"model": "fake-ok", "prompt": "x"}).status_code == 200
            assert http.post("/v1/completions", json={"model": "fake-ok2", "prompt": "x"}).status_code == 200
            states = {i["model"]: i["state"] for i in http.get("/bostudio/instances").json()["instances"]}
            assert states == {"fake-ok": "stopped", "fake-ok2": "ready"}
            assert [e["model"] for e in events.events if e["type"] == "evict"] == ["fake-ok"]
            assert len(d.children()) == 1
            deadline = time.monotonic() + HANG_GUARD_S
            while d.instance("fake-ok2")["state"] != "stopped" and time.monotonic() < deadline:
                time.sleep(0.1)
            assert d.instance("fake-ok2")["state"] == "stopped"
            idle = [e for e in events.events if e.get("state") == "stopped" and e.get("model") == "fake-ok2"]
            assert idle and idle[-1]["reason"] == "idle"
            assert not d.children()
    finally:
        events.close()
        assert d.stop() == 0


def test_control_api_devices_catalog_plans_pairings(daemon: DaemonProc) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30, trust_env=False) as http:
        devices = http.get("/bostudio/devices").json()
        assert devices["engine"].endswith("llama-server") and devices["host"]["total_bytes"] > 0
        assert http.get("/bostudio/engine").json()["version"] == "0.5.0-dev"
        catalog = {m["model"]: m for m in http.get("/bostudio/catalog").json()["models"]}
        assert set(FAKES) <= set(catalog)
        assert catalog["fake-ok"]["architecture"] == "llama" and catalog["fake-ok"]["n_nextn"] == 0
        plan = http.get("/bostudio/plans/fake-ok").json()
        # The planner's figure: at least the n-gram table (16 MiB) on top of the tiny model (and, CPU only, so
        # without flash attention, the attention scores' buffer of a ubatch at the whole context).
        assert plan["speculation"] == "ngram-mod" and 16 << 20 < plan["bytes"] < 48 << 20
        assert plan["flash_attn"]["mode"] in ("on", "off") and plan["flash_attn"]["why"]
        assert "--spec-type" in plan["argv"] and "-m" in plan["argv"]
        pairings = http.get("/bostudio/pairings/fake-ok").json()["modes"]
        assert pairings["off"]["speculation"] == "off" and "error" in pairings["mtp"]
        missing = http.get("/bostudio/plans/no-such-model")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_daemon_start_status_stop_in_the_background(fake_root: Path, tmp_path: Path) -> None:
    env = daemon_env(tmp_path, fake_root / "models")
    port = free_port()

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bostudio", "daemon", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    started = cli("start", "--port", str(port), "--engine", str(fake_root / "llama-server"), "--json")
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    assert info["url"] == f"http://127.0.0.1:{port}"
    daemon_proc = psutil.Process(info["pid"])
    try:
        again = cli("start", "--port", str(port))  # already running: the same daemon
        assert again.returncode == 0 and f"(pid {info['pid']})" in again.stdout
        r = httpx.post(info["base_url"] + "/completions", json={"model": "fake-ok", "prompt": "x"}, trust_env=False,
                       timeout=30)
        assert r.status_code == 200
        status = cli("status", "--json")
        assert status.returncode == 0
        assert json.loads(status.stdout)["instances"] == {"fake-ok": "ready"}
        children = daemon_proc.children(recursive=True)
        assert children
        state_file = tmp_path / "state" / "bostudio" / "daemon.json"
        assert json.loads(state_file.read_text())["pid"] == info["pid"]
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0 and stopped.stdout.strip() == f"bostudio daemon (pid {info['pid']}) stopped"
    assert not daemon_proc.is_running()
    assert not [c for c in children if c.is_running()]
    assert not state_file.exists()
    assert port_is_free(port)
    assert cli("status").returncode == 3
    assert (tmp_path / "state" / "bostudio" / "logs" / "daemon.log").stat().st_size > 0
