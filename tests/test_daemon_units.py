"""The daemon's pure parts, as tables and laws: eviction and idle policy, rejected parameters,
Host/Origin/bind rules, token file, crash bookkeeping, load watch, state file, stats parsing, units."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bostudio.daemon import state
from bostudio.daemon.http import security
from bostudio.daemon.http.guard import check_request
from bostudio.daemon.service import install_unit, launchd_plist, systemd_unit
from bostudio.daemon.supervise import policy
from bostudio.daemon.supervise.stats import InstanceStats, timings_from_sse
from bostudio.errors import ConfigError, DaemonError, RequestError
from bostudio.runtime.metrics import parse_metrics
from bostudio.runtime.net import is_loopback
from bostudio.runtime.process import LoadWatch, process_matches, reap_group

MIB = policy.MIB


# ---------------------------------------------------------------- eviction and idle policy

def R(name: str, mib: int, last_used: float, busy: bool = False) -> policy.Resident:
    return policy.Resident(name, mib * MIB, last_used, busy)


@pytest.mark.parametrize("resident, need, budget, expected", [
    ([], 100, 1000, []),
    ([R("a", 400, 1)], 500, 1000, []),  # fits exactly
    ([R("a", 400, 1), R("b", 400, 2)], 300, 1000, ["a"]),  # least recently used goes first
    ([R("a", 400, 2), R("b", 400, 1)], 300, 1000, ["b"]),
    ([R("a", 100, 1), R("b", 400, 2), R("c", 400, 3)], 500, 1000, ["a", "b"]),
    ([R("a", 400, 1, busy=True), R("b", 400, 2)], 300, 1000, ["b"]),  # busy is never evicted
    ([R("a", 400, 1, busy=True), R("b", 400, 2, busy=True)], 300, 1000, None),
    ([], 2000, 1000, None),  # cannot fit at all
])
def test_choose_evictions(resident, need, budget, expected) -> None:
    assert policy.choose_evictions(resident, need * MIB, budget * MIB) == expected


@given(st.lists(st.tuples(st.integers(1, 500), st.floats(0, 100), st.booleans()), max_size=8),
       st.integers(1, 800), st.integers(100, 2000))
def test_evictions_always_make_room_or_say_they_cannot(items, need, budget) -> None:
    resident = [R(f"m{i}", mib, t, busy) for i, (mib, t, busy) in enumerate(items)]
    victims = policy.choose_evictions(resident, need * MIB, budget * MIB)
    if victims is None:
        assert sum(r.bytes for r in resident if r.busy) + need * MIB > budget * MIB
        return
    left = [r for r in resident if r.name not in victims]
    assert sum(r.bytes for r in left) + need * MIB <= budget * MIB
    assert not any(r.busy for r in resident if r.name in victims)
    # Least recently used first: no kept idle instance is older than an evicted one.
    if victims:
        newest_victim = max(r.last_used for r in resident if r.name in victims)
        assert all(r.last_used >= newest_victim for r in left if not r.busy)


def test_device_evictions_make_room_on_each_offload_device() -> None:
    """The host budget holds both, but the GPU holds one: the model on it is evicted, one elsewhere is not."""
    resident = [R("on-gpu", 10, 1), R("on-host", 10, 0)]
    on_device = {"on-gpu": {"Vulkan0": 300 * MIB, "CPU": 10 * MIB}, "on-host": {"CPU": 900 * MIB}}
    assert policy.choose_device_evictions(resident, on_device, {"Vulkan0": 300 * MIB, "CPU": 50 * MIB},
                                          {"Vulkan0": 400 * MIB}) == ["on-gpu"]
    assert policy.choose_device_evictions(resident, on_device, {"Vulkan0": 100 * MIB}, {"Vulkan0": 400 * MIB}) == []
    busy = [R("on-gpu", 10, 1, busy=True)]
    assert policy.choose_device_evictions(busy, on_device, {"Vulkan0": 300 * MIB}, {"Vulkan0": 400 * MIB}) is None
    # two devices: a victim of the first is not chosen again for the second
    on_two = {"a": {"CUDA0": 8, "CUDA1": 8}, "b": {"CUDA1": 8}}
    two = [R("a", 0, 1), R("b", 0, 2)]
    assert policy.choose_device_evictions(two, on_two, {"CUDA0": 4, "CUDA1": 4}, {"CUDA0": 10, "CUDA1": 15}) == ["a"]


def test_idle_expired() -> None:
    resident = [R("old", 1, 0.0), R("new", 1, 95.0), R("busy", 1, 0.0, busy=True)]
    assert policy.idle_expired(resident, now=100.0, ttl=10.0) == ["old"]
    assert policy.idle_expired(resident, now=100.0, ttl=0) == []


# ---------------------------------------------------------------- rejected request parameters

@pytest.mark.parametrize("body, needle", [
    ([], "JSON object"),
    ({}, "no `model`"),
    ({"model": ""}, "no `model`"),
    ({"model": "/etc/passwd"}, "not a path"),
    ({"model": "..\\x"}, "not a path"),
    ({"model": "m", "id_slot": 1}, "id_slot"),
    ({"model": "m", "lora": []}, "lora"),
    ({"model": "m", "max_tokens": -1}, "max_tokens"),
    ({"model": "m", "n_predict": -1}, "n_predict"),
    ({"model": "m", "max_tokens": "10"}, "max_tokens"),
    ({"model": "m", "max_tokens": 10 ** 9}, "max_tokens"),
    ({"model": "m", "n_probs": 100000}, "n_probs"),
    ({"model": "m", "n": 1000}, "`n`"),
    ({"model": "m", "logit_bias": {str(i): 1 for i in range(5000)}}, "logit_bias"),
    ({"model": "m", "grammar": "x" * 70000}, "grammar"),
    ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/shadow"}}]}]}, "data: URLs"),
    ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/"}}]}]}, "data: URLs"),
])
def test_harmful_requests_are_rejected(body, needle) -> None:
    with pytest.raises(RequestError) as err:
        check_request(body)
    assert needle in err.value.message


@pytest.mark.parametrize("body", [
    {"model": "gemma", "prompt": "x", "max_tokens": 16, "n_probs": 5, "stream": True},
    {"model": "gemma", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}],
     "logit_bias": {"15": -100}, "n": 2, "max_completion_tokens": 0},
])
def test_ordinary_requests_pass(body) -> None:
    assert check_request(body) == "gemma"


# ---------------------------------------------------------------- security

@pytest.mark.parametrize("header, name", [
    ("127.0.0.1:8642", "127.0.0.1"), ("localhost", "localhost"), ("LOCALHOST:1", "localhost"),
    ("[::1]:8642", "[::1]"), ("[::1]", "[::1]"), ("evil.example:80", "evil.example"), ("", ""),
    # Not a Host at all: no allowlist holds the empty name.
    ("[::1]evil.com", ""), ("127.0.0.1:8642@evil.com", ""), ("localhost:8642.evil.com", ""), ("a:1:2", ""),
    ("localhost:", ""), ("local host", ""), ("[::1", ""),
])
def test_host_name(header, name) -> None:
    assert security.host_name(header) == name


def test_host_allowlist_and_origins() -> None:
    hosts = security.allowed_hosts("127.0.0.1")
    assert {"127.0.0.1", "localhost", "[::1]"} <= hosts
    assert "evil.example" not in hosts
    lan = security.allowed_hosts("192.168.1.5", ["box.lan"])
    assert {"192.168.1.5", "box.lan"} <= lan
    assert security.origin_allowed("http://localhost:8642", hosts)
    assert not security.origin_allowed("http://evil.example", hosts)
    assert not security.origin_allowed("null", hosts)


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.5.0.1", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.2", False), ("box.lan", False)])
def test_bind_needs_a_token_beyond_loopback(host, loopback) -> None:
    assert is_loopback(host) is loopback
    if loopback:
        security.check_bind(host, None)
    else:
        with pytest.raises(DaemonError):
            security.check_bind(host, None)
        security.check_bind(host, "t" * 64)


def test_token_file_is_256_bit_user_only_and_compared_in_constant_time(tmp_path: Path) -> None:
    path = security.create_token(tmp_path / "token")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = security.read_token(path)
    assert token is not None and len(bytes.fromhex(token)) == 32
    assert security.create_token(path) and security.read_token(path) != token  # a new one each time
    token = security.read_token(path)
    assert security.token_matches(token, token)
    assert not security.token_matches(token[:-1] + ("0" if token[-1] != "0" else "1"), token)
    assert not security.token_matches(None, token)
    assert security.read_token(tmp_path / "missing") is None
    path.chmod(0o644)
    with pytest.raises(ConfigError):
        security.read_token(path)


# ---------------------------------------------------------------- load watch (crash bookkeeping: test_lifecycle.py)

def test_load_watch_progress_versus_stall() -> None:
    w = LoadWatch(stall_timeout=10, now=0)
    assert not w.stalled(0, 0)
    assert not w.stalled(100, 9)  # grew: progress
    assert not w.stalled(200, 18)
    assert not w.stalled(200, 27)
    assert w.stalled(200, 28.5)  # silent for 10.5 s
    assert w.silent_for(28.5) == pytest.approx(10.5)


# ---------------------------------------------------------------- state file and reaping

def test_state_file_round_trip_and_atomic_write(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    rec = state.DaemonRecord(pid=1, create_time=2.5, host="127.0.0.1", port=8642, started=3.0, version="x",
                             children=(state.ChildRecord("m", 10, 11.5, 4000),))
    state.save(rec, path)
    assert state.load(path) == rec
    assert rec.url == "http://127.0.0.1:8642"
    assert [p.name for p in tmp_path.iterdir()] == ["daemon.json"]  # no temp file left
    path.write_text("{half")
    assert state.load(path) is None
    assert state.running(tmp_path / "nothing.json") is None


def test_reaping_goes_by_pid_and_create_time_never_by_name() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        ct = psutil.Process(proc.pid).create_time()
        assert process_matches(proc.pid, ct) is not None
        assert not reap_group(proc.pid, ct + 5.0)  # same pid, other create time: a reused pid, left alone
        assert proc.poll() is None
        assert reap_group(proc.pid, ct)
        assert proc.wait(5) is not None
        assert not reap_group(proc.pid, ct)  # gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_recorded_live_daemon_counts_as_running(tmp_path: Path) -> None:
    me = psutil.Process()
    rec = state.DaemonRecord(pid=me.pid, create_time=me.create_time(), host="127.0.0.1", port=1, started=0,
                             version="x")
    state.save(rec, tmp_path / "d.json")
    assert state.running(tmp_path / "d.json") == rec
    state.save(state.DaemonRecord(pid=me.pid, create_time=1.0, host="h", port=1, started=0, version="x"),
               tmp_path / "d.json")
    assert state.running(tmp_path / "d.json") is None  # same pid, another process


# ---------------------------------------------------------------- stats

METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
llamacpp:spec_decode_num_draft_tokens_total 36
llamacpp:spec_decode_num_accepted_tokens_total 27
llamacpp:spec_decode_num_drafts_total 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 8
"""


def test_stats_from_timings_and_metrics() -> None:
    m = parse_metrics(METRICS)
    assert m["prompt_tokens_total"] == 120
    assert m["spec_decode_num_accepted_tokens_per_pos_total"] == 17
    s = InstanceStats()
    s.add_timings({"predicted_n": 11, "predicted_ms": 100.0, "predicted_per_second": 100.0,
                   "draft_n": 8, "draft_n_accepted": 6})
    s.add_timings({"predicted_n": 21, "predicted_ms": 400.0, "predicted_per_second": 50.0})
    assert s.tokens_generated == 32
    assert s.decode_tok_s == 50.0
    assert s.decode_tok_s_avg == pytest.approx(1000 * 30 / 500)
    assert s.acceptance_rate == 0.75
    s.add_metrics(m)
    assert s.acceptance_rate == 0.75 and s.mean_accepted_length == 4.0  # 1 + 27 / 9
    assert "_decode_ms" not in s.to_json()


def test_a_request_ending_after_a_scrape_keeps_the_metrics_rate() -> None:
    """Once /metrics gave the rate, a request whose timings land before the next scrape leaves it alone:
    the rate must not flip between the sum of timings and the child's own count."""
    s = InstanceStats()
    s.add_timings({"predicted_n": 4, "predicted_ms": 40.0, "draft_n": 4, "draft_n_accepted": 4})
    assert s.acceptance_rate == 1.0
    s.add_metrics({"spec_decode_num_draft_tokens_total": 10.0, "spec_decode_num_accepted_tokens_total": 8.0,
                   "spec_decode_num_drafts_total": 4.0})
    assert s.acceptance_rate == pytest.approx(0.8)
    s.add_timings({"predicted_n": 4, "predicted_ms": 40.0, "draft_n": 4, "draft_n_accepted": 2})
    assert s.acceptance_rate == pytest.approx(0.8)
    assert (s.draft_tokens, s.draft_accepted) == (8, 6)  # the per-request sums still count


def test_timings_found_in_the_last_sse_event() -> None:
    chunk = (b'data: {"choices":[{"delta":{}}]}\n\n'
             b'data: {"choices":[],"timings":{"predicted_n":3}}\n\ndata: [DONE]\n\n')
    assert timings_from_sse(chunk) == {"predicted_n": 3}
    assert timings_from_sse(b'data: {"choices":[{"delta":{"content":"timings"}}]}\n\n') is None


# ---------------------------------------------------------------- user units

def test_systemd_unit_and_launchd_agent_run_the_daemon() -> None:
    unit = systemd_unit("/opt/py/bin/python", "127.0.0.1", 8642)
    assert "ExecStart=/opt/py/bin/python -m bostudio daemon --host 127.0.0.1 --port 8642" in unit
    assert "[Install]\nWantedBy=default.target" in unit
    plist = launchd_plist("/opt/py/bin/python", "127.0.0.1", 8642, Path("/tmp/x.log"))
    assert "<string>dev.bostudio.daemon</string>" in plist
    assert "<string>-m</string>\n    <string>bostudio</string>\n    <string>daemon</string>" in plist


def test_daemon_install_writes_the_user_unit(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "bostudio", "daemon", "install", "--platform", "linux"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "bostudio.service"
    assert proc.stdout.startswith(f"wrote {unit}\n")
    assert "systemctl --user enable --now bostudio" in proc.stdout
    assert f"ExecStart={sys.executable} -m bostudio daemon" in unit.read_text()
    path, text, _ = install_unit("macos", "127.0.0.1", 8642, write=False)
    assert path.name == "dev.bostudio.daemon.plist" and not path.exists() and "<plist" in text


def test_cli_without_a_daemon_says_how_to_start_one(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    status = subprocess.run([sys.executable, "-m", "bostudio", "daemon", "status", "--json"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert status.returncode == 3 and json.loads(status.stdout) == {"running": False}
    # The default port may be in use by a real daemon on this machine: point the client elsewhere.
    from tests.netutil import free_port

    state.save(state.DaemonRecord(pid=os.getpid(), create_time=psutil.Process().create_time(), host="127.0.0.1",
                                  port=free_port(), started=time.time(), version="x"),
               tmp_path / "state" / "bostudio" / "daemon.json")
    ps = subprocess.run([sys.executable, "-m", "bostudio", "ps"], env=env, capture_output=True, text=True,
                        timeout=30)
    assert ps.returncode == 1
    assert ps.stderr.startswith("bostudio: daemon error: the bostudio daemon is not running at http://127.0.0.1:")
    assert "(hint: start it with `bostudio daemon start`)" in ps.stderr
