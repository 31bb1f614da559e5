"""RPC workers end to end, on loopback only: two real rpc-servers (`bostudio rpc serve`, CPU backend)
on 127.0.0.1 plus the local CPU, with per-worker budgets in config.toml so that the plan splits the
model across all three; `up --rpc a,b` serves it; what llama-server reports per device is held
against the plan; greedy output on the F32 copy equals a local-only run; a worker killed mid-stream;
bad worker addresses; the loopback-only bind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from bostudio.engine.discover import Engine
from bostudio.gguf import ModelInfo, describe
from bostudio.planner.memory import MIB, ContextSettings, logits_buffer_bytes
from bostudio.hardware.device import device_from_json
from bostudio.planner.reported import device_buffers
from bostudio.rpc.probe import buffer_labels
from tests.daemon_util import DaemonProc
from tests.netutil import free_port

TESTS = Path(__file__).resolve().parent
UP_TIMEOUT_S = 300
N_TOKENS = 32
PROMPT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def rpc_engine(engine: Engine) -> Engine:
    assert engine.has_rpc, f"{engine.path} has no RPC backend: rebuild with `bostudio engine build`"
    assert engine.rpc_server is not None
    return engine


@pytest.fixture(scope="module")
def gemma_f32(rpc_engine: Engine, gemma_full_precision: Path) -> Path:
    """The full-precision copy (the shared fixture): no quantized matmul whose SIMD path could differ
    between the local CPU and a worker's."""
    return gemma_full_precision


def listening(port: int) -> bool:
    """Something listens on the loopback port (a bare connect: rpc-server takes it as a client that
    leaves at once)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Worker:
    """`bostudio rpc serve` on a loopback port, in its own process group."""

    def __init__(self, engine: Engine, root: Path) -> None:
        self.port = free_port()
        self.out = root / f"rpc-{self.port}.out"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bostudio", "rpc", "serve", "--port", str(self.port), "--threads", "1",
             "--engine", str(engine.path)], stdout=open(self.out, "wb"), stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(TESTS.parent)), start_new_session=True)
        deadline = time.monotonic() + 60
        while not listening(self.port):  # rpc-server's stdout is block-buffered into the file
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"rpc serve did not start: {self.out.read_text()[-1000:]}")
            time.sleep(0.1)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pids(self) -> set[int]:
        try:
            p = psutil.Process(self.proc.pid)
            return {p.pid} | {c.pid for c in p.children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(scope="module")
def workers(rpc_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    root = tmp_path_factory.mktemp("rpc")
    ws = [Worker(rpc_engine, root), Worker(rpc_engine, root)]
    yield ws
    for w in ws:
        w.kill()


def budgets(info: ModelInfo) -> tuple[int, int]:
    """Per-worker budgets (MiB) that split the model across the first worker, the second and the host:
    the first takes a few layers, the second the output layer (the tied embedding's copy, and the
    logits of n-gram drafts of 64 tokens for 4 slots) and a few layers, the host the rest (the input
    embedding always stays there)."""
    layer = max(info.layer_bytes) / MIB
    out = (info.output_bytes or info.token_embd_bytes) / MIB
    logits = logits_buffer_bytes(info, ContextSettings(n_ctx=4096, n_outputs_max=4 * 65)) / MIB
    return int(4 * layer + 48), int(out + logits + 2 * layer + 64)


@pytest.fixture(scope="module")
def pool_env(workers: list[Worker], gemma_f32: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pool")
    b0, b1 = budgets(describe(gemma_f32))
    (root / "config" / "bostudio").mkdir(parents=True)
    (root / "config" / "bostudio" / "config.toml").write_text(
        f'[[rpc]]\nhost = "127.0.0.1"\nport = {workers[0].port}\nbudget_mib = {b0}\n\n'
        f'[[rpc]]\nhost = "127.0.0.1"\nport = {workers[1].port}\nbudget_mib = {b1}\n')
    return dict(os.environ, XDG_CONFIG_HOME=str(root / "config"), XDG_STATE_HOME=str(root / "state"),
                XDG_DATA_HOME=str(root / "data"), PYTHONPATH=str(TESTS.parent))


def bostudio(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bostudio", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


class Up:
    """`bostudio up` in the foreground as a child; ready when it prints its summary."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "bostudio", "up", *args, "--port", str(self.port)],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.summary: list[str] = []
        deadline = time.monotonic() + UP_TIMEOUT_S
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.summary.append(line.rstrip())
            if line.startswith("Press Ctrl-C"):
                break
            if time.monotonic() > deadline:
                break
        if not any("is ready" in ln for ln in self.summary):
            self.stop()
            pytest.fail(f"up did not get ready: {self.summary} {self.proc.stderr.read() if self.proc.stderr else ''}")
        self.log = Path(next(ln.split(":", 1)[1].strip() for ln in self.summary if ln.strip().startswith("log ")))
        self.base = f"http://127.0.0.1:{self.port}"

    def line(self, key: str) -> str:
        return next(ln.split(":", 1)[1].strip() for ln in self.summary if ln.strip().startswith(key))

    def greedy(self) -> str:
        client = openai.OpenAI(base_url=self.base + "/v1", api_key="none", timeout=300, max_retries=0)
        r = client.completions.create(model="m", prompt=PROMPT, max_tokens=N_TOKENS, temperature=0)
        assert r.usage is not None and r.usage.completion_tokens > 0
        return r.choices[0].text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# ---------------------------------------------------------------- the engine and the CLI

def test_engine_list_says_the_engine_has_rpc(rpc_engine: Engine, pool_env: dict[str, str]) -> None:
    data = json.loads(bostudio(pool_env, "engine", "list", "--json").stdout)
    chosen = next(e for e in data if e["chosen"])
    assert chosen["rpc"] is True and Path(chosen["rpc_server"]).name == "ggml-rpc-server"
    assert "RPC workers: yes" in bostudio(pool_env, "engine", "list").stdout


def test_devices_lists_each_worker_probed_through_the_engine(workers: list[Worker], pool_env: dict[str, str],
                                                             gemma_f32: Path) -> None:
    data = json.loads(bostudio(pool_env, "devices", "--json").stdout)
    rpc = [d for d in data["devices"] if d["backend"] == "rpc"]
    assert [d["engine_name"] for d in rpc] == ["RPC0", "RPC1"]
    assert [d["endpoint"] for d in rpc] == [w.endpoint for w in workers]
    b0, b1 = budgets(describe(gemma_f32))
    assert [d["budget_bytes"] for d in rpc] == [b0 * MIB, b1 * MIB]
    assert all(d["total_bytes"] > 0 for d in rpc)
    text = bostudio(pool_env, "devices").stdout
    assert f"(worker {workers[0].endpoint}, budget" in text


def test_the_plan_splits_the_model_across_both_workers_and_the_host(pool_env: dict[str, str],
                                                                   gemma_f32: Path) -> None:
    proc = bostudio(pool_env, "plan", str(gemma_f32), "--ctx", "4096", "--spec", "ngram", "--json")
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    split = dict((s["device"], s["layers"]) for s in p["with_speculation"]["split"])
    info = describe(gemma_f32)
    assert split["RPC0"] > 0 and split["RPC1"] > 0
    assert sum(split.values()) < info.n_block + 1  # the host keeps layers too
    for dev, budget in p["with_speculation"]["budgets"].items():
        assert p["with_speculation"]["devices"][dev] <= budget
    assert p["network"]["split_points"] >= 2
    assert "-ts" in p["llama_args"] and "-dev" in p["llama_args"]


# ---------------------------------------------------------------- serving split over the workers

@pytest.fixture(scope="module")
def split_run(workers: list[Worker], pool_env: dict[str, str], gemma_f32: Path) -> Iterator[dict]:
    """One `up --rpc a,b` on the F32 copy with n-gram speculation: its summary, log, greedy text, and
    the plan made just before (an rpc-server serves one client at a time: while the server runs,
    the workers cannot be probed)."""
    plan = bostudio(pool_env, "plan", str(gemma_f32), "--ctx", "4096", "--spec", "ngram", "--json")
    assert plan.returncode == 0, plan.stderr
    up = Up(pool_env, str(gemma_f32), "--rpc", ",".join(w.endpoint for w in workers), "--ctx", "4096",
            "--spec", "ngram")
    try:
        data = {"summary": up.summary, "log": up.log.read_text(errors="replace"), "text": up.greedy(),
               "spec": up.line("speculation"), "pid": up.proc.pid, "workers": [w.endpoint for w in workers],
               "plan": json.loads(plan.stdout)}
    finally:
        up.stop()  # frees the workers: an rpc-server serves one client at a time
    yield data


def test_up_serves_gemma_split_with_speculation_active(split_run: dict) -> None:
    assert "active" in split_run["spec"] and "INACTIVE" not in split_run["spec"]
    summary = "\n".join(split_run["summary"])
    assert "rpc workers" in summary and "placement       : target: CPU:" in summary
    log = split_run["log"]
    # llama.cpp names an RPC buffer by the device's index on its own server and the server
    for w in split_run["workers"]:
        assert f"RPC0[{w}] model buffer size" in log


def assert_buffers_match_the_plan(p: dict, log: str) -> dict[str, dict[str, int]]:
    """Weights and KV cache that llama-server reports per device are within 5% of the plan (`plan --json`)."""
    planned: dict[str, dict[str, int]] = {}
    for u in p["with_speculation"]["uses"]:
        planned.setdefault(u["device"], {})
        planned[u["device"]][u["component"]] = planned[u["device"]].get(u["component"], 0) + u["bytes"]
    rpc = [device_from_json(d) for d in p["devices"] if d["backend"] == "rpc"]
    reported = device_buffers(log, buffer_labels(rpc))
    assert set(reported) >= {"RPC0", "RPC1", "CPU"}, reported
    for dev in ("RPC0", "RPC1", "CPU"):
        for comp in ("weights", "KV cache"):
            want, got = planned[dev].get(comp, 0), reported[dev].get(comp, 0)
            if want == 0 and got == 0:
                continue
            assert abs(got - want) <= 0.05 * max(want, got), (dev, comp, want, got)
    return reported


def test_reported_buffers_are_within_5_percent_of_the_plan(split_run: dict) -> None:
    assert_buffers_match_the_plan(split_run["plan"], split_run["log"])


def test_greedy_output_equals_a_local_only_run(split_run: dict, pool_env: dict[str, str], gemma_f32: Path) -> None:
    local = Up(pool_env, str(gemma_f32), "--rpc", "none", "--ctx", "4096", "--spec", "ngram")
    try:
        assert "rpc workers" not in "\n".join(local.summary)
        assert local.greedy() == split_run["text"]
    finally:
        local.stop()


def test_an_output_too_large_for_any_worker_is_pinned_to_the_host(workers: list[Worker], split_run: dict,
                                                                 gemma_f32: Path, tmp_path: Path) -> None:
    """Budgets that hold layers but not the output projection (the tied 262k x 640 embedding, 640 MiB in
    F32): without -ot llama.cpp would put it on the last worker, so nothing could be offloaded; pinned to
    the host, every layer goes to the workers. Served for real, the buffers match the plan and the text
    equals the other split's."""
    info = describe(gemma_f32)
    layer = max(info.layer_bytes) / MIB
    budget = int(info.n_layer / 2 * layer + 48)
    assert budget * MIB < (info.output_bytes or info.token_embd_bytes)
    (tmp_path / "config" / "bostudio").mkdir(parents=True)
    (tmp_path / "config" / "bostudio" / "config.toml").write_text(
        f'[[rpc]]\nhost = "127.0.0.1"\nport = {workers[0].port}\nbudget_mib = {budget}\n\n'
        f'[[rpc]]\nhost = "127.0.0.1"\nport = {workers[1].port}\nbudget_mib = {budget}\n')
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_STATE_HOME=str(tmp_path / "state"),
               XDG_DATA_HOME=str(tmp_path / "data"), PYTHONPATH=str(TESTS.parent))
    proc = bostudio(env, "plan", str(gemma_f32), "--ctx", "4096", "--spec", "ngram", "--json")
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    o = p["with_speculation"]
    # the layers go to the workers (as many as their budgets hold with KV and compute), the output stays
    assert o["output_on_host"] and o["n_gpu_layers"] >= info.n_layer // 2
    assert all(s["layers"] > 0 for s in o["split"])
    args = p["llama_args"]
    assert args[args.index("-ot") + 1] == r"^(output|token_embd)\.weight$=CPU"
    assert any("pinned with -ot" in ln for ln in p["placement"])
    up = Up(env, str(gemma_f32), "--rpc", ",".join(w.endpoint for w in workers), "--ctx", "4096", "--spec", "ngram")
    try:
        spec, text, log = up.line("speculation"), up.greedy(), up.log.read_text(errors="replace")
    finally:
        up.stop()
    assert "active" in spec and "INACTIVE" not in spec, spec
    reported = assert_buffers_match_the_plan(p, log)
    # the last worker holds its layers and the output norm, not the 640 MiB projection
    assert reported["RPC1"]["weights"] < budget * MIB
    assert text == split_run["text"]


def test_the_self_draft_layout_is_planned_and_launched(workers: list[Worker], pool_env: dict[str, str],
                                                       gemma_gguf: Path) -> None:
    """The seeds' layout: a Q2_K copy of the model drafts for it, whole on the fastest local device
    (here the host: -devd none keeps it off the workers), while the target is split over the pool."""
    plan = json.loads(bostudio(pool_env, "plan", str(gemma_gguf), "--ctx", "2048", "--spec", "self-draft:Q2_K",
                               "--spec-mode", "on", "--json").stdout)
    assert plan["with_speculation"]["draft_device"] == "none"
    assert any(line.startswith("draft: ") and "self-Q2_K" in line and "whole on CPU" in line
               for line in plan["placement"])
    up = Up(pool_env, str(gemma_gguf), "--rpc", ",".join(w.endpoint for w in workers), "--ctx", "2048",
            "--spec", "self-draft:Q2_K")
    try:
        spec = up.line("speculation")
        assert spec.startswith("draft-simple") and "active" in spec and "INACTIVE" not in spec, spec
        summary = "\n".join(up.summary)
        assert "placement       : draft: " in summary and "whole on CPU" in summary
        assert up.greedy()
    finally:
        up.stop()


# ---------------------------------------------------------------- failures

def test_a_worker_that_does_not_answer_is_one_line_and_the_plan_goes_on(pool_env: dict[str, str],
                                                                        gemma_gguf: Path) -> None:
    dead = free_port()
    proc = bostudio(pool_env, "plan", str(gemma_gguf), "--ctx", "2048", "--rpc", f"127.0.0.1:{dead}")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"rpc worker 127.0.0.1:{dead} cannot be reached" in lines[0], proc.stderr
    assert "planned without it" in lines[0] and "choice:" in proc.stdout


def test_a_port_that_is_not_an_rpc_server_is_one_line(pool_env: dict[str, str], gemma_gguf: Path) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def answer_like_http() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer_like_http, daemon=True).start()
    try:
        proc = bostudio(pool_env, "devices", "--rpc", f"127.0.0.1:{port}")
    finally:
        srv.close()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr + proc.stdout
    notes = [ln for ln in proc.stdout.splitlines() if f"127.0.0.1:{port}" in ln]
    assert len(notes) == 1 and "not an rpc-server" in notes[0], proc.stdout


@pytest.mark.parametrize("value,needle", [("127.0.0.1:notaport", "is not a number"),
                                          ("127.0.0.1:70000", "out of range"),
                                          ("127.0.0.1:1,,127.0.0.1:2", "empty worker address"),
                                          ("[::1]:50052", "IPv6"), ("bad host:1", "not a host name")])
def test_a_malformed_rpc_value_is_one_line(pool_env: dict[str, str], gemma_gguf: Path, value: str, needle: str) -> None:
    one_line_error(bostudio(pool_env, "plan", str(gemma_gguf), "--rpc", value), needle)


def test_a_non_loopback_bind_is_refused_without_allow_network(pool_env: dict[str, str]) -> None:
    port = free_port()
    line = one_line_error(bostudio(pool_env, "rpc", "serve", "--host", "0.0.0.0", "--port", str(port)),
                          "refusing to bind rpc-server to 0.0.0.0", "no authentication", "--allow-network",
                          "ssh -N -L")
    assert line.startswith("bostudio: ")
    with socket.socket() as s:  # nothing was started
        assert s.connect_ex(("127.0.0.1", port)) != 0
    unit = bostudio(pool_env, "rpc", "install", "--print", "--host", "192.168.1.2", "--allow-network")
    assert unit.returncode == 0 and "rpc serve --host 192.168.1.2 --port 50052 --allow-network" in unit.stdout
    one_line_error(bostudio(pool_env, "rpc", "install", "--print", "--host", "192.168.1.2"), "refusing")


def test_a_worker_killed_mid_stream(rpc_engine: Engine, pool_env: dict[str, str], gemma_f32: Path,
                                    tmp_path: Path) -> None:
    """The daemon's child uses two fresh workers; the second dies mid-stream: the client gets an
    error, the model is marked failed with the reason and relaunched without that worker, and the
    old llama-server is gone."""
    a, b = Worker(rpc_engine, tmp_path), Worker(rpc_engine, tmp_path)
    models = tmp_path / "models"
    models.mkdir()
    (models / "gemma-f32.gguf").symlink_to(gemma_f32)
    b0, b1 = budgets(describe(gemma_f32))
    conf = tmp_path / "config" / "bostudio"
    conf.mkdir(parents=True)
    conf.joinpath("config.toml").write_text(
        f'[[rpc]]\nhost = "127.0.0.1"\nport = {a.port}\nbudget_mib = {b0}\n\n'
        f'[[rpc]]\nhost = "127.0.0.1"\nport = {b.port}\nbudget_mib = {b1}\n')
    daemon = DaemonProc(tmp_path, models, ["--engine", str(rpc_engine.path)]).start()
    try:
        with daemon.http(timeout=UP_TIMEOUT_S) as http:
            r = http.post("/bostudio/instances", json={"model": "gemma-f32", "spec": "ngram", "ctx": 4096})
            assert r.status_code == 200, r.text
            inst = r.json()
            assert inst["rpc"]["workers"] == f"{a.endpoint},{b.endpoint}"
            first_pid = inst["pid"]
            got_error = False
            with http.stream("POST", "/v1/completions", json={
                    "model": "gemma-f32", "prompt": PROMPT, "max_tokens": 400, "temperature": 0,
                    "stream": True}) as resp:
                chunks = 0
                try:
                    for line in resp.iter_lines():
                        if line.startswith("data: ") and '"error"' in line:
                            got_error = True
                        elif line.startswith("data: {"):
                            chunks += 1
                            if chunks == 2:
                                b.kill()
                except httpx.HTTPError:
                    got_error = True
            assert chunks >= 2 and got_error
            deadline = time.monotonic() + UP_TIMEOUT_S
            seen_failed = False
            while time.monotonic() < deadline:
                inst = daemon.instance("gemma-f32")
                if inst["error"] and "stopped answering" in inst["error"]["message"]:
                    seen_failed = True
                if inst["state"] == "ready" and inst["pid"] != first_pid:
                    break
                time.sleep(0.5)
            assert seen_failed or b.endpoint in inst["rpc"]["lost"]
            assert inst["state"] == "ready", inst
            assert inst["rpc"]["workers"] == a.endpoint and inst["rpc"]["lost"] == [b.endpoint]
            assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE
            # the relaunched model serves
            r = http.post("/v1/completions", json={"model": "gemma-f32", "prompt": PROMPT, "max_tokens": 4})
            assert r.status_code == 200, r.text
            # the plan the TUI shows is the running child's: over the worker left, with its placement
            view = http.get("/bostudio/plans/gemma-f32").json()
            argv = view["argv"]
            assert argv[argv.index("--rpc") + 1] == a.endpoint and "-dev" in argv, argv
            assert any(ln.startswith("target: ") and "RPC0" in ln for ln in view["placement"]), view["placement"]
    finally:
        daemon.stop()
        a.kill()
        b.kill()
    assert daemon.children() == []
