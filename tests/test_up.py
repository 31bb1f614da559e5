"""`bostudio up` end to end: the real CLI launching the real llama-server on real models: the default
(Qwen2.5-Coder-1.5B-Instruct) answers a question; the small Gemma serves the tests that need speed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.netutil import free_port, port_is_free

READY_TIMEOUT_S = 300  # a hang guard: the 1.5B loads and plans in well under a minute on a quiet 2-core machine


def _as_a_background_job() -> None:
    """A shell starts `bostudio up &` with SIGINT ignored, and Python then installs no handler of its
    own: up must still stop on SIGINT (whatever way this pytest itself was started)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Up:
    """A `bostudio up` child process and what it printed."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bostudio", "up", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=_as_a_background_job)
        self.lines: list[str] = []

    def wait_ready(self) -> dict[str, str]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                self.kill()
                pytest.fail(f"bostudio up exited before ready: {''.join(self.lines)}{err}")
            self.lines.append(line)
            if line.startswith("Press Ctrl-C"):
                fields = {}
                for ln in self.lines:
                    m = re.match(r"^\s+([\w ]+?)\s+: (.*)$", ln)
                    if m:
                        fields[m.group(1)] = m.group(2)
                return fields
        self.kill()
        pytest.fail(f"bostudio up was not ready within {READY_TIMEOUT_S} s")

    def kill(self) -> None:
        """Stop it (and so its llama-server, which dies with it) when a test gives up on it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def servers(self) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.proc.pid).children(recursive=True)
                if "llama-server" in p.name()]

    def stop(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return self.proc.returncode, err


@pytest.fixture
def env(tmp_state: Path) -> dict[str, str]:
    return dict(os.environ)


def _gone(procs: list[psutil.Process], timeout: float = 5.0) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return not alive


def test_up_serves_openai_api_with_speculation_and_stops_on_sigint(
        engine, gemma_gguf, env) -> None:
    port = free_port()
    up = Up(["gemma-3-270m-q4_k_m", "--port", str(port)], env)  # the small fixture (the default is the 1.5B)
    try:
        fields = up.wait_ready()
        base = fields["OpenAI base URL"]
        assert base == f"http://127.0.0.1:{port}/v1"
        model = fields["model"]
        assert model == "gemma-3-270m-q4_k_m"
        # auto on a CPU picks n-gram speculation, and the probe proved it active.
        assert fields["speculation"].startswith("ngram-mod - active")
        servers = up.servers()
        assert len(servers) == 1

        with httpx.Client(base_url=base, timeout=60, trust_env=False) as http:
            r = http.post("/completions", json={"model": model, "prompt": "The capital of France is",
                                                "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "text_completion"
            assert body["choices"][0]["text"].strip()

            r = http.post("/chat/completions", json={
                "model": model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hello."}]})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["role"] == "assistant"
            assert body["usage"]["completion_tokens"] > 0

            # Speculation on: a repetitive continuation drafts and reports the draft counters.
            text = "for i in range(10):\n    print(i)\n" * 8
            r = http.post("/completions", json={"model": model, "prompt": text, "max_tokens": 32,
                                                "temperature": 0})
            timings = r.json()["timings"]
            assert timings["draft_n"] > 0
            assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    finally:
        rc, err = up.stop(signal.SIGINT)
    assert rc == 0, err
    assert "Traceback" not in err
    assert _gone(servers)
    assert port_is_free(port)


def test_up_without_a_model_serves_the_default_and_it_answers(engine, qwen_gguf, env) -> None:
    """A new user's `scripts/up.sh`: no model named, the instruction-tuned default answers a chat request with
    an answer (it ends its turn), asked through the official openai client."""
    import openai

    from bostudio.catalog.embedded import DEFAULT_NAME

    port = free_port()
    up = Up(["--port", str(port)], env)
    try:
        fields = up.wait_ready()
        assert fields["model"] == DEFAULT_NAME
        servers = up.servers()
        client = openai.OpenAI(base_url=fields["OpenAI base URL"], api_key="unused", max_retries=0, timeout=300)
        r = client.chat.completions.create(
            model=DEFAULT_NAME, max_tokens=32, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France? Answer with one word."}])
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        assert choice.message.role == "assistant" and choice.message.content and choice.message.content.strip()
    finally:
        rc, err = up.stop(signal.SIGINT)
    assert rc == 0, err
    assert _gone(servers)
    assert port_is_free(port)


def test_up_spec_off_has_no_draft_counters_and_stops_on_sigterm(engine, gemma_gguf, env) -> None:
    port = free_port()
    up = Up([str(gemma_gguf), "--spec", "off", "--port", str(port), "--ctx", "2048"], env)
    try:
        fields = up.wait_ready()
        assert fields["speculation"] == "off - off"
        servers = up.servers()
        assert len(servers) == 1
        text = "for i in range(10):\n    print(i)\n" * 8
        r = httpx.post(fields["OpenAI base URL"] + "/completions", trust_env=False, timeout=60,
                       json={"prompt": text, "max_tokens": 32, "temperature": 0})
        assert r.status_code == 200
        timings = r.json()["timings"]
        assert timings["predicted_n"] > 0
        assert "draft_n" not in timings and "draft_n_accepted" not in timings
    finally:
        rc, err = up.stop(signal.SIGTERM)
    assert rc == 0, err
    assert _gone(servers)
    assert port_is_free(port)


def test_up_by_name_from_models_dir(engine, gemma_gguf, env) -> None:
    """A name in models/ resolves to the file; the speculation mode can be asked for explicitly."""
    port = free_port()
    up = Up(["gemma-3-270m-q4_k_m", "--spec", "ngram", "--port", str(port)], env)
    try:
        fields = up.wait_ready()
        assert fields["model"] == "gemma-3-270m-q4_k_m"
        assert fields["speculation"].startswith("ngram-mod - active")
        servers = up.servers()
    finally:
        rc, _ = up.stop(signal.SIGINT)
    assert rc == 0
    assert _gone(servers)


def test_up_auto_uses_the_mtp_head_pairing_finds(engine, env, tmp_path: Path) -> None:
    """Launch integration: auto on a NextN target picks its MTP head, launches draft-mtp and proves it."""
    from bostudio.gguf.synth import BYTE_VOCAB, BYTE_VOCAB_TYPES, tiny_glm4moe_mtp

    model = tiny_glm4moe_mtp(tmp_path / "glm-mtp.gguf", vocab=BYTE_VOCAB, token_types=BYTE_VOCAB_TYPES)
    env = dict(env, XDG_CONFIG_HOME=str(tmp_path / "config"))
    port = free_port()
    up = Up([str(model), "--port", str(port), "--ctx", "1024"], env)
    try:
        fields = up.wait_ready()
        assert fields["speculation"].startswith("draft-mtp - active: the probe drafted")
        assert "MTP head" in fields["why"]
        servers = up.servers()
        assert "--spec-type draft-mtp" in " ".join(servers[0].cmdline())
    finally:
        rc, err = up.stop(signal.SIGINT)
    assert rc == 0, err
    assert _gone(servers)


def test_up_stops_a_silent_loader_at_its_stall_timeout_and_says_so(env, tmp_path: Path) -> None:
    """`up --stall-timeout S`: a llama-server that binds and then stays silent (a fake that never loads) is
    stopped after S seconds with a message that says so, and nothing of it is left running. (The default,
    120 s, is too short for a software GPU that compiles its pipelines silently: docs/vulkan.md.)"""
    from bostudio.gguf.synth import tiny_llama
    from tests.daemon_util import fake_engine

    model = tiny_llama(tmp_path / "fake-silent.gguf")
    engine = fake_engine(tmp_path)
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "bostudio", "up", str(model), "--engine", str(engine), "--spec", "off",
                           "--stall-timeout", "2", "--port", str(port)], env=env, capture_output=True, text=True,
                          timeout=READY_TIMEOUT_S, preexec_fn=_as_a_background_job)
    assert proc.returncode == 1, proc.stderr
    silent = re.search(r"did not become ready in \d+ s \(silent for (\d+) s\)", proc.stderr)
    assert silent, proc.stderr
    assert 2 <= int(silent[1]) < 120  # stopped at the 2 s asked, not at the default
    assert port_is_free(port)
