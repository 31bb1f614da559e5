"""The daemon against the real llama-server: the official `openai` client through one endpoint,
routing between Gemma 3 270M and SmolLM2 135M (loaded on demand), queued requests during a load,
streaming, cancellation, a child killed mid-stream, speculation switch, stats, logs, events, CLI."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.daemon_util import DaemonProc

GEMMA = "gemma-3-270m-q4_k_m"
SMOL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path, smollm2_gguf: Path):
    root = tmp_path_factory.mktemp("daemon")
    models = root / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    (models / smollm2_gguf.name).symlink_to(smollm2_gguf)
    d = DaemonProc(root, models, ["--idle-ttl", "0"]).start()
    yield d
    assert d.stop() == 0
    assert not d.children()


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def llama_servers(d: DaemonProc) -> list[psutil.Process]:
    return [p for p in d.children() if "llama-server" in p.name()]


def test_models_list_with_the_openai_client(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {GEMMA, SMOL}
    assert all(m.owned_by == "bostudio" and m.object == "model" for m in models.values())
    assert models[GEMMA].model_extra["state"] == "stopped"  # nothing is loaded before it is asked for


def test_twenty_concurrent_requests_while_loading_are_all_answered_by_one_load(
        daemon: DaemonProc, client: openai.OpenAI) -> None:
    results: list[object] = [None] * 20

    def ask(i: int) -> None:
        try:
            results[i] = client.completions.create(model=GEMMA, prompt=f"{i} + {i} =", max_tokens=2, temperature=0)
        except Exception as exc:  # recorded, asserted below
            results[i] = exc

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    errors = [r for r in results if not isinstance(r, openai.types.Completion)]
    assert not errors, errors[:3]
    assert all(r.choices[0].text for r in results)
    inst = daemon.instance(GEMMA)
    assert inst["loads"] == 1
    assert inst["stats"]["requests"] == 20
    assert len(llama_servers(daemon)) == 1


def test_completions_with_the_openai_client(client: openai.OpenAI) -> None:
    r = client.completions.create(model=GEMMA, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text.strip()
    assert r.usage.completion_tokens == 8


def test_chat_routes_to_a_second_model_that_loads_on_demand(daemon: DaemonProc, client: openai.OpenAI) -> None:
    assert {m.id: m.model_extra["state"] for m in client.models.list()}[SMOL] == "stopped"
    r = client.chat.completions.create(model=SMOL, max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": "Say hello."}])
    assert r.object == "chat.completion"
    assert r.model == SMOL
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content.strip()
    # Both models now serve side by side, each on its own child; Gemma was not reloaded.
    states = {m.id: m.model_extra["state"] for m in client.models.list()}
    assert states == {GEMMA: "ready", SMOL: "ready"}
    assert daemon.instance(GEMMA)["loads"] == 1
    assert len(llama_servers(daemon)) == 2
    g = client.completions.create(model=GEMMA, prompt="One, two,", max_tokens=4, temperature=0)
    assert g.model == GEMMA


def test_streaming_chat_passes_through_unbuffered(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=SMOL, max_tokens=16, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": "Count from one to ten."}])
    text = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    assert len(text) >= 8 and "".join(text).strip()


MAX_TOKENS = 2048
# Long generations that take seconds on any CPU: sampled text gives n-gram speculation nothing to draft
# (greedy text soon repeats, and then whole runs of drafted tokens are accepted in a few steps).
UNPREDICTABLE = {"temperature": 1.0, "seed": 7, "ignore_eos": True}


def test_the_first_streamed_token_arrives_while_the_child_still_generates(daemon: DaemonProc) -> None:
    """Unbuffered, without a clock: when the first chunk reaches the client, the child's slot is still
    processing the same request (a buffering proxy would deliver it only after the generation ended)."""
    inst = daemon.instance(SMOL)
    child = httpx.Client(base_url=f"http://127.0.0.1:{inst['port']}", trust_env=False, timeout=10,
                         headers={"Authorization": f"Bearer {_child_key(inst['pid'])}"})
    body = {"model": SMOL, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "stream": True, **UNPREDICTABLE}
    with child, httpx.Client(base_url=daemon.url, timeout=120, trust_env=False) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            # Keep the line iterator referenced: a closed one (a `for` over r.iter_lines() left by break,
            # once collected) closes the connection, and the daemon then rightly cancels the generation.
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data:") and '"text"' in line:
                    break
            busy = [s for s in child.get("/slots").json() if s["is_processing"]]
            del lines
    assert busy, "the whole generation had ended before its first token reached the client"
    assert busy[0]["next_token"][0]["n_decoded"] < MAX_TOKENS


def _child_key(pid: int) -> str:
    env = psutil.Process(pid).environ()
    return env["LLAMA_API_KEY"]


def predicted_total(child: httpx.Client) -> float:
    m = re.search(r"^llamacpp:tokens_predicted_total (\S+)$", child.get("/metrics").text, re.M)
    assert m, "no tokens_predicted_total in /metrics"
    return float(m.group(1))
HANG_S = 120  # only a guard against a hang: verdicts never depend on how fast the machine is


def test_client_disconnect_cancels_the_upstream_generation(daemon: DaemonProc) -> None:
    inst = daemon.instance(GEMMA)
    child = httpx.Client(base_url=f"http://127.0.0.1:{inst['port']}", trust_env=False, timeout=5,
                         headers={"Authorization": f"Bearer {_child_key(inst['pid'])}"})
    before = predicted_total(child)
    with httpx.Client(base_url=daemon.url, timeout=60, trust_env=False) as http:
        with http.stream("POST", "/v1/completions", json={"model": GEMMA, "prompt": "Once upon a time",
                                                          "max_tokens": MAX_TOKENS, "stream": True,
                                                          **UNPREDICTABLE}) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data:")
                if seen == 3:
                    break
            assert any(s["is_processing"] for s in child.get("/slots").json())
    # Without a clock: the slot stops, and it stopped well short of the tokens it was asked for.
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and any(s["is_processing"] for s in child.get("/slots").json()):
        time.sleep(0.05)
    assert not any(s["is_processing"] for s in child.get("/slots").json())
    decoded = predicted_total(child) - before  # llama-server counts a slot's tokens when it is released
    assert 0 < decoded < MAX_TOKENS // 2, f"the generation ran on to {decoded:.0f} of {MAX_TOKENS} tokens"
    assert daemon.instance(GEMMA)["active_requests"] == 0
    child.close()


def test_stats_logs_and_events(daemon: DaemonProc) -> None:
    with httpx.Client(base_url=daemon.url, timeout=60, trust_env=False) as http:
        text = "for i in range(10):\n    print(i)\n" * 6
        r = http.post("/v1/completions", json={"model": GEMMA, "prompt": text, "max_tokens": 16, "temperature": 0})
        assert r.json()["timings"]["draft_n"] > 0  # auto on a CPU: n-gram speculation, active
        deadline = time.monotonic() + HANG_S  # the stats loop scrapes /metrics every couple of seconds
        st = http.get(f"/bostudio/instances/{GEMMA}/stats").json()
        while st.get("mean_accepted_length") is None and time.monotonic() < deadline:
            time.sleep(0.2)
            st = http.get(f"/bostudio/instances/{GEMMA}/stats").json()
        assert st["requests"] >= 22 and st["tokens_generated"] > 0
        assert st["decode_tok_s"] == r.json()["timings"]["predicted_per_second"]  # the last request's
        assert st["decode_tok_s_avg"] > 0
        assert 0 < st["acceptance_rate"] <= 1
        assert st["mean_accepted_length"] >= 1
        lines = http.get(f"/bostudio/instances/{GEMMA}/log", params={"lines": 400}).json()["lines"]
        assert any("model loaded" in ln for ln in lines)
        with http.stream("GET", f"/bostudio/instances/{GEMMA}/log/stream", params={"lines": 5}) as s:
            got = []
            for line in s.iter_lines():
                if line.startswith("data:"):
                    got.append(json.loads(line[5:])["line"])
                if len(got) == 5:
                    break
        # the stream opens with the log's last 5 lines as of its start: the child may write more (its slot's
        # release comes after the response) between the read above and the stream, so they are read again
        after = http.get(f"/bostudio/instances/{GEMMA}/log", params={"lines": 400}).json()["lines"]
        start = after.index(got[0])
        assert after[start:start + 5] == got and start + 5 > after.index(lines[-1])
        with http.stream("GET", "/bostudio/events") as s:
            first = next(ln for ln in s.iter_lines() if ln.startswith("data:"))
        snap = json.loads(first[5:])
        assert snap["type"] == "snapshot"
        assert {i["model"]: i["state"] for i in snap["instances"]} == {GEMMA: "ready", SMOL: "ready"}
        spec = http.get("/openapi.json").json()
        assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/bostudio/events",
                "/bostudio/instances/{model}/speculation"} <= set(spec["paths"])


def test_speculation_switch_relaunches_the_instance(daemon: DaemonProc) -> None:
    with httpx.Client(base_url=daemon.url, timeout=120, trust_env=False) as http:
        loads = daemon.instance(SMOL)["loads"]
        r = http.put(f"/bostudio/instances/{SMOL}/speculation", json={"mode": "off"})
        assert r.status_code == 200, r.text
        inst = r.json()
        assert inst["state"] == "ready" and inst["loads"] == loads + 1
        assert inst["speculation"] == "off" and inst["spec_status"]["detail"] == "off"
        text = "for i in range(10):\n    print(i)\n" * 6
        r = http.post("/v1/completions", json={"model": SMOL, "prompt": text, "max_tokens": 16, "temperature": 0})
        assert "draft_n" not in r.json()["timings"]
        inst = http.put(f"/bostudio/instances/{SMOL}/speculation", json={"mode": "on"}).json()
        assert inst["speculation"] == "ngram-mod" and inst["spec_status"]["active"]
        r = http.put(f"/bostudio/instances/{SMOL}/speculation", json={"mode": "sideways"})
        assert r.status_code == 400
        assert "unknown --spec value" in r.json()["error"]["message"]


def run_cli(daemon: DaemonProc, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bostudio", *args], env=daemon.env, capture_output=True,
                          text=True, timeout=180)


def test_cli_ps_stop_and_up_daemon(daemon: DaemonProc) -> None:
    ps = run_cli(daemon, "ps", "--json")
    assert ps.returncode == 0, ps.stderr
    assert {r["model"]: r["state"] for r in json.loads(ps.stdout)} == {GEMMA: "ready", SMOL: "ready"}
    table = run_cli(daemon, "ps")
    assert table.stdout.splitlines()[0].split()[:3] == ["MODEL", "STATE", "PID"]
    stop = run_cli(daemon, "stop", SMOL)
    assert stop.returncode == 0 and stop.stdout.strip() == f"{SMOL}: stopped"
    assert len(llama_servers(daemon)) == 1
    up = run_cli(daemon, "up", "--daemon", SMOL, "--spec", "ngram", "--port", str(daemon.port))
    assert up.returncode == 0, up.stderr
    fields = {k.strip(): v.strip() for k, v in (ln.split(" : ", 1) for ln in up.stdout.splitlines() if " : " in ln)}
    assert fields["OpenAI base URL"] == daemon.url + "/v1"
    assert fields["model"] == SMOL
    assert fields["speculation"].startswith("ngram-mod - active")
    missing = run_cli(daemon, "stop", "no-such-model")
    assert missing.returncode == 1
    assert missing.stderr.startswith("bostudio: daemon error: model 'no-such-model' is not running (hint: ")


def test_child_killed_mid_stream_errors_in_band_and_the_next_request_reloads(
        daemon: DaemonProc, client: openai.OpenAI) -> None:
    inst = daemon.instance(GEMMA)
    stream = client.completions.create(model=GEMMA, prompt="Once upon a time", max_tokens=512, stream=True)
    killed = False
    # The in-band error event, not the client's read timeout (also an APIError), ends the stream.
    with pytest.raises(openai.APIError) as err:
        for n, _chunk in enumerate(stream):
            if n == 2:
                os.kill(inst["pid"], signal.SIGKILL)
                killed = True
    assert killed
    assert not isinstance(err.value, openai.APITimeoutError)
    assert "failed mid-stream" in str(err.value)
    r = client.completions.create(model=GEMMA, prompt="Hello", max_tokens=4, temperature=0)
    assert r.choices[0].text
    after = daemon.instance(GEMMA)
    assert after["loads"] == inst["loads"] + 1 and after["pid"] != inst["pid"]
    assert after["state"] == "ready"
