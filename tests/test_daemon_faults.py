"""The daemon's fault cases that need a real daemon process, against fake llama-servers
(tests/fake_llama_server.py): a crash loop of a real child, a decoy on the planned port, kill -9 of the daemon
and the reaping of its children by the next one, start/stop in the background.

What the lifecycle decides is proved without processes (tests/test_lifecycle.py); the app in this process with
real fake children covers out-of-memory, stalls vs. slow progress, eviction, idle unloading, the HTTP edge's
refusals and the control API (tests/test_daemon_supervision.py)."""

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

FAKES = ("fake-ok", "fake-ok2", "fake-crash")
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
        assert info["already_running"] is False
        # Already running: the same daemon, and the options of this command line (here a recording) are said
        # not to apply to it; nothing is recorded.
        again = cli("start", "--port", str(port), "--record", str(tmp_path / "rec"))
        assert again.returncode == 0 and f"(pid {info['pid']})" in again.stdout
        assert "already running" in again.stdout and "`bostudio daemon stop` first" in again.stdout
        assert not (tmp_path / "rec").exists()
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
