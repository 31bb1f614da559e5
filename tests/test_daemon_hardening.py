"""The daemon against hostile and heavy clients, over real sockets to a real `bostudio daemon`:
slow and idle connections, half-open floods, header and body bombs, deep JSON, path registration,
FIFOs, a foreign prompt store, and client hang-ups (fake llama-servers where the child does not
matter, the real llama-server and Gemma where it does). Every wait is a hang guard of minutes; the
verdicts are status codes, states and counters, never a time."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from bostudio.daemon.http.limits import HttpLimits, json_depth_ok, parse_json_body, BodyError
from tests.daemon_util import DaemonProc, fake_engine
from bostudio.gguf.synth import tiny_llama

GUARD_S = 120.0  # hang guard for any one wait
HEADER_S, BODY_S, KEEPALIVE_S = 2, 2, 2
MAX_CONN = 32


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hardening")
    models = root / "models"
    models.mkdir()
    for name in ("fake-ok", "fake-progress"):
        tiny_llama(models / f"{name}.gguf")
    os.mkfifo(models / "x.gguf")  # a FIFO named like a model: nothing may open it
    (models / "sub").mkdir()
    tiny_llama(models / "sub" / "fake-ok.gguf")  # same name as a catalog model, another file
    (root / "elsewhere").mkdir()
    tiny_llama(root / "elsewhere" / "outside.gguf")
    fake_engine(root)
    return root


@pytest.fixture(scope="module")
def daemon(fake_root: Path):
    d = DaemonProc(fake_root, fake_root / "models",
                   ["--engine", str(fake_root / "llama-server"), "--idle-ttl", "0", "--max-body-mib", "1",
                    "--header-timeout", str(HEADER_S), "--body-timeout", str(BODY_S),
                    "--keepalive-timeout", str(KEEPALIVE_S), "--max-connections", str(MAX_CONN),
                    "--max-header-kib", "16", "--max-headers", "50"])
    d.start()
    yield d
    assert d.stop() == 0
    assert not d.children()


def connect(d: DaemonProc) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", d.port), timeout=GUARD_S)
    s.settimeout(GUARD_S)
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything the daemon sends until it closes the connection (a reset counts as closed)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return out


def status_of(raw: bytes) -> int | None:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None


def body_of(raw: bytes) -> dict:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


def request_head(path: str, port: int, extra: str = "", method: str = "POST") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}".encode()


def still_serves(d: DaemonProc) -> None:
    r = httpx.get(d.url + "/bostudio/status", timeout=GUARD_S, trust_env=False)
    assert r.status_code == 200


# ------------------------------------------------------------------ slow, idle and half-open connections

def test_slow_headers_are_cut_off_after_the_header_timeout(daemon: DaemonProc) -> None:
    s = connect(daemon)
    s.sendall(b"GET /bostudio/status HTTP/1.1\r\n")
    got = b""
    for i in range(240):  # a header line every half second, for up to 2 minutes
        try:
            s.sendall(f"X-Slow-{i}: a\r\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            break
        s.settimeout(0.5)
        try:
            got = s.recv(65536)  # an answer, or the close
            break
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
    s.settimeout(GUARD_S)
    raw = got + read_all(s)
    s.close()
    assert status_of(raw) == 408 and "headers did not arrive" in body_of(raw)["error"]["message"]
    still_serves(daemon)


def test_an_idle_connection_is_closed_before_and_between_requests(daemon: DaemonProc) -> None:
    s = connect(daemon)  # sends nothing at all
    raw = read_all(s)
    s.close()
    assert status_of(raw) == 408
    s = connect(daemon)  # one request, then idle on a kept-alive connection
    s.sendall(request_head("/bostudio/status", daemon.port, "\r\n", "GET"))
    raw = read_all(s)  # ends only when the daemon closes the idle connection
    s.close()
    assert status_of(raw) == 200 and raw.count(b"HTTP/1.1 ") == 1


def test_half_open_connections_beyond_the_cap_are_refused_and_all_are_closed(daemon: DaemonProc) -> None:
    socks = [connect(daemon) for _ in range(MAX_CONN + 20)]
    try:
        answers = []
        for s in socks:
            answers.append(status_of(read_all(s)))  # each one is answered and closed
        # The ones over the cap at once (503), the rest once the header timeout ran out (408).
        assert answers.count(503) >= 20 and set(answers) <= {408, 503}
    finally:
        for s in socks:
            s.close()
    still_serves(daemon)


# ------------------------------------------------------------------ header and body bombs

def test_a_huge_header_value_and_many_header_lines_get_431(daemon: DaemonProc) -> None:
    s = connect(daemon)
    s.sendall(request_head("/v1/models", daemon.port, "X-Big: ", "GET"))
    try:
        for _ in range(16 * 16):  # up to 16 MiB, until the daemon stops reading
            s.sendall(b"a" * 65536)
    except (BrokenPipeError, ConnectionResetError):
        pass
    raw = read_all(s)
    s.close()
    assert status_of(raw) in (431, None)  # None: the refusal was overtaken by a reset of the unread rest
    s = connect(daemon)
    s.sendall(request_head("/v1/models", daemon.port, "".join(f"X-H{i}: v\r\n" for i in range(200)) + "\r\n", "GET"))
    raw = read_all(s)
    s.close()
    assert status_of(raw) == 431 and "more than 50 request headers" in body_of(raw)["error"]["message"]
    still_serves(daemon)


def test_oversized_bodies_are_refused_on_every_route_before_they_are_read(daemon: DaemonProc) -> None:
    for path, shape in (("/bostudio/instances", "openai"), ("/v1/chat/completions", "openai"),
                        ("/v1/messages", "anthropic"), ("/api/chat", "ollama")):
        s = connect(daemon)  # declares 80 MiB and sends none of it: answered at once
        s.sendall(request_head(path, daemon.port, "Content-Type: application/json\r\n"
                                                  f"Content-Length: {80 << 20}\r\n\r\n"))
        raw = read_all(s)
        s.close()
        assert status_of(raw) == 413, path
        err = body_of(raw)
        assert {"openai": lambda: err["error"]["message"], "anthropic": lambda: err["error"]["message"],
                "ollama": lambda: err["error"]}[shape]().startswith("the request body is larger than")
    # A control route's cap is 1 MiB whatever --max-body-mib says; a chunked body is counted as it comes.
    s = connect(daemon)
    s.sendall(request_head("/bostudio/instances", daemon.port, "Transfer-Encoding: chunked\r\n\r\n"))
    try:
        for _ in range(32):  # 2 MiB in 64 KiB chunks, until the daemon stops reading
            s.sendall(b"10000\r\n" + b"a" * 65536 + b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    raw = read_all(s)
    s.close()
    assert status_of(raw) in (413, None)  # None: the answer was overtaken by a reset of the unread rest
    still_serves(daemon)


def test_a_slow_body_is_refused_after_the_body_timeout(daemon: DaemonProc) -> None:
    s = connect(daemon)
    s.sendall(request_head("/v1/chat/completions", daemon.port, "Content-Length: 100\r\n\r\n") + b'{"model":')
    raw = read_all(s)  # 9 of 100 bytes, then silence
    s.close()
    assert status_of(raw) == 408 and "stalled" in body_of(raw)["error"]["message"]


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000,
                                  b'{"a":' * 990 + b"1" + b"}" * 990,
                                  b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
                                  b'{"model": "fake-ok", "messages": ' + b"[" * 200 + b"]" * 200 + b"}"],
                         ids=["array-100k", "object-990", "object-100k", "messages-200"])
def test_deep_json_gets_a_400_in_each_apis_shape(daemon: DaemonProc, body: bytes) -> None:
    with daemon.http(GUARD_S) as http:
        for path in ("/v1/chat/completions", "/v1/messages", "/api/chat", "/bostudio/instances"):
            r = http.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (path, r.status_code, r.text[:200])
            data = r.json()  # JSON, never a plain-text 500
            message = data["error"] if path.startswith("/api/") else data["error"]["message"]
            assert "deeper than 64 levels" in message
            if path == "/v1/messages":
                assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    still_serves(daemon)


def test_json_limits_are_pure_and_exact() -> None:
    limits = HttpLimits(max_json_depth=3, max_json_containers=10)
    assert json_depth_ok({"a": [1, {"b": 2}]}, 3) and not json_depth_ok({"a": [1, {"b": [2]}]}, 3)
    assert parse_json_body(b'{"a": [[1]]}', limits) == {"a": [[1]]}
    for raw, why in ((b"[[[[1]]]]", "deeper than 3"), (b"[" + b"{}," * 11 + b"{}]", "more than 10"),
                     (b"{nope", "not JSON")):
        with pytest.raises(BodyError, match=why):
            parse_json_body(raw, limits)


# ------------------------------------------------------------------ what the control API takes as a model

def test_the_control_api_serves_models_not_files(daemon: DaemonProc, fake_root: Path) -> None:
    secret = Path("/etc/os-release").read_bytes()[:4]
    with daemon.http(GUARD_S) as http:
        for model in ("/etc/os-release", "../../../../../../etc/os-release",
                      str(fake_root / "models" / ".." / ".." / ".." / "etc" / "os-release"),
                      str(fake_root / "elsewhere" / "outside.gguf"), str(fake_root / "models" / "x.gguf")):
            r = http.post("/bostudio/instances", json={"model": model})
            assert r.status_code in (400, 404), (model, r.status_code)
            assert secret.decode() not in r.text and repr(secret) not in r.text  # no file bytes echoed
        assert "outside the model directories" in http.post(
            "/bostudio/instances", json={"model": "/etc/os-release"}).json()["error"]["message"]
        fifo = http.post("/bostudio/instances", json={"model": str(fake_root / "models" / "x.gguf")}).json()
        assert "not a regular file" in fifo["error"]["message"]
        # A path whose name matches a catalog model is refused, never silently swapped for the catalog file.
        r = http.post("/bostudio/instances", json={"model": str(fake_root / "models" / "sub" / "fake-ok.gguf")})
        assert r.status_code == 400 and "already served from" in r.json()["error"]["message"]
        # ctx is bounded: by the schema, then by what the model was trained for; a refusal changes nothing.
        assert http.post("/bostudio/instances", json={"model": "fake-ok", "ctx": 10 ** 12}).status_code == 400
        r = http.post("/bostudio/instances", json={"model": "fake-ok", "ctx": 1 << 20})
        assert r.status_code == 400 and "trained for" in r.json()["error"]["message"]
        ids = {m["id"] for m in http.get("/v1/models").json()["data"]}
        assert "os-release" not in ids and "outside" not in ids and "x" not in ids
        r = http.post("/bostudio/instances", json={"model": "fake-ok"})
        assert r.status_code == 200 and r.json()["state"] == "ready" and r.json()["ctx"] not in (10 ** 12, 1 << 20)


def test_a_fifo_in_the_models_dir_blocks_nothing(daemon: DaemonProc, fake_root: Path) -> None:
    fifo = fake_root / "models" / "x.gguf"
    with daemon.http(GUARD_S) as http:
        for path in ("/api/tags", "/v1/models", "/bostudio/status", "/bostudio/catalog"):
            r = http.get(path)
            assert r.status_code == 200 and "x.gguf" not in r.text, path
        # Many what-if plans with the FIFO as the draft: each refused, no worker thread left blocked.
        results: list[int] = []

        def plan() -> None:
            results.append(httpx.get(f"{daemon.url}/bostudio/plans/fake-ok", params={"spec": f"draft:{fifo}"},
                                     timeout=GUARD_S, trust_env=False).status_code)

        threads = [threading.Thread(target=plan) for _ in range(48)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GUARD_S)
        assert results == [400] * 48
        r = http.put("/bostudio/instances/fake-ok/speculation", json={"mode": f"draft:{fifo}"})
        assert r.status_code == 400 and "not a regular file" in r.json()["error"]["message"]
        r = http.post("/v1/chat/completions", json={"model": "fake-ok", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200


# ------------------------------------------------------------------ small gaps

def test_duplicate_host_and_another_loopback_origin_are_refused(daemon: DaemonProc) -> None:
    s = connect(daemon)
    s.sendall(request_head("/bostudio/status", daemon.port, f"Host: 127.0.0.1:{daemon.port}\r\n\r\n", "GET"))
    raw = read_all(s)
    s.close()
    assert status_of(raw) == 400 and "more than one Host" in body_of(raw)["error"]["message"]
    own = f"http://127.0.0.1:{daemon.port}"
    with daemon.http(GUARD_S) as http:
        assert http.get("/bostudio/status", headers={"Origin": own}).status_code == 200
        other = http.get("/bostudio/status", headers={"Origin": f"http://127.0.0.1:{daemon.port + 1}"})
        assert other.status_code == 403


def test_request_guards_close_the_small_gaps(daemon: DaemonProc) -> None:
    with daemon.http(GUARD_S) as http:
        r = http.post("/v1/responses", json={"model": "fake-ok", "input": "hi", "max_output_tokens": -1})
        assert r.status_code == 400 and "max_output_tokens" in r.json()["error"]["message"]
        r = http.post("/v1/responses", json={"model": "fake-ok", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "file:///etc/shadow"}]}]})
        assert r.status_code == 400 and "data: URLs" in r.json()["error"]["message"]
        r = http.post("/v1/completions", json={"model": "fake-ok", "prompt": [f"p{i}" for i in range(200)],
                                               "max_tokens": 1})
        assert r.status_code == 400 and "at most 16" in r.json()["error"]["message"]
        for calls in ("x", [1, 2], [{"function": "f"}]):
            r = http.post("/api/chat", json={"model": "fake-ok", "stream": False, "messages": [
                {"role": "assistant", "content": "", "tool_calls": calls}]})
            assert r.status_code == 400 and "tool_calls" in r.json()["error"], calls


# ------------------------------------------------------------------ hang-ups while a model loads

def abandon_while_loading(d: DaemonProc, route: str, body: dict, clients: int) -> dict:
    """`clients` send `body` to `route` and hang up while its model loads; the instance once ready."""
    model = body["model"]
    raw = json.dumps(body).encode()
    socks = []
    for _ in range(clients):
        s = connect(d)
        s.sendall(request_head(route, d.port, "Content-Type: application/json\r\n"
                                              f"Content-Length: {len(raw)}\r\n\r\n") + raw)
        socks.append(s)
    deadline = time.monotonic() + GUARD_S
    while d.instance(model).get("state") != "loading" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.instance(model)["state"] == "loading"
    for s in socks:
        s.close()  # every client gives up while the model loads (the fake loads for 3 s)
    while d.instance(model)["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    inst = d.instance(model)
    assert inst["state"] == "ready"
    time.sleep(1.0)  # (not a measure: would a dropped request still arrive, it would have by now)
    return d.instance(model)


def test_requests_abandoned_while_a_model_loads_are_dropped(daemon: DaemonProc) -> None:
    inst = abandon_while_loading(daemon, "/v1/completions", {"model": "fake-progress", "prompt": "x",
                                                             "max_tokens": 4}, 5)
    assert inst["stats"]["requests"] == 0 and inst["active_requests"] == 0


def test_an_ollama_embed_abandoned_while_its_model_loads_is_dropped(daemon: DaemonProc, fake_root: Path) -> None:
    from bostudio.gguf.synth import tiny_embedder

    # /api/embed passed the client's request where Router.open takes the body: a hang-up cancelled nothing.
    tiny_embedder(fake_root / "models" / "fake-progress-embed.gguf")  # "progress": the fake loads for 3 s
    inst = abandon_while_loading(daemon, "/api/embed", {"model": "fake-progress-embed", "input": "x"}, 3)
    assert inst["stats"]["requests"] == 0 and inst["active_requests"] == 0


# ------------------------------------------------------------------ the real llama-server: hang-ups, the prompt store

GEMMA = "gemma-3-270m-q4_k_m"
REAL_CTX = 16384
GEN_TOKENS = 16000  # more than any machine generates before a hang-up is noticed
LOAD = {"model": GEMMA, "ctx": REAL_CTX, "spec": "off"}


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path):
    root = tmp_path_factory.mktemp("hardening-real")
    (root / "models").mkdir()
    (root / "models" / gemma_gguf.name).symlink_to(gemma_gguf)
    store = root / "prompts"
    store.mkdir(mode=0o700)
    # Files the store did not write: a sidecar-named list, a non-sidecar name, a sidecar of another user.
    (store / ("0" * 32 + ".json")).write_text("[1, 2, 3]")
    (store / "notes.json").write_text('{"key": 5, "slots": "no"}')
    foreign = store / ("f" * 32 + ".json")
    foreign.write_text('{"key": {}, "slots": {"0": {"tokens": 10**9}}}')
    if os.getuid() == 0:
        os.chown(foreign, 65534, 65534)
    d = DaemonProc(root, root / "models", ["--idle-ttl", "0", "--prompt-store-dir", str(store)])
    d.start()
    yield d
    assert d.stop() == 0
    assert not d.children()


def child_slots(d: DaemonProc, model: str) -> list[dict]:
    """The child llama-server's own /slots, with the key the daemon gave it (from its environment)."""
    inst = d.instance(model)
    env = Path(f"/proc/{inst['pid']}/environ").read_bytes().split(b"\0")
    key = next(e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"LLAMA_API_KEY="))
    r = httpx.get(f"http://127.0.0.1:{inst['port']}/slots", headers={"Authorization": f"Bearer {key}"},
                  timeout=GUARD_S, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


def wait_slots(d: DaemonProc, model: str, busy: bool) -> list[dict]:
    # Polled every 3 s while waiting for idle: llama-server checks a non-streamed request's connection
    # only after 1 s without any result in its queue, and each /slots answer is such a result.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        slots = child_slots(d, model)
        if any(s["is_processing"] for s in slots) == busy:
            return slots
        time.sleep(0.1 if busy else 3.0)
    pytest.fail(f"the child's slots were not {'busy' if busy else 'idle'} within 600 s")


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
def test_a_client_that_hangs_up_cancels_its_generation(real: DaemonProc, stream: bool) -> None:
    with real.http(600) as http:
        assert http.post("/bostudio/instances", json=LOAD).status_code == 200
    body = json.dumps({"model": GEMMA, "prompt": "Count: 1, 2, 3,", "max_tokens": GEN_TOKENS, "ignore_eos": True,
                       "temperature": 0, "stream": stream}).encode()
    s = connect(real)
    s.sendall(request_head("/v1/completions", real.port, "Content-Type: application/json\r\n"
                                                       f"Content-Length: {len(body)}\r\n\r\n") + body)
    busy = [sl for sl in wait_slots(real, GEMMA, busy=True) if sl["is_processing"]]
    assert len(busy) == 1 and busy[0]["params"]["n_predict"] == GEN_TOKENS
    if stream:
        assert s.recv(65536).startswith(b"HTTP/1.1 200")  # tokens flow, then the client goes
    s.close()
    slots = wait_slots(real, GEMMA, busy=False)
    ours = next(sl for sl in slots if sl["id"] == busy[0]["id"])
    decoded = ours["next_token"][0]["n_decoded"] if ours.get("id_task") == busy[0]["id_task"] else 0
    # Left alone it would stop at GEN_TOKENS (ignore_eos; the slot's context holds that many).
    assert ours["n_ctx"] >= GEN_TOKENS + 64
    assert decoded < GEN_TOKENS // 2, decoded  # stopped by the hang-up, not by its end
    assert real.instance(GEMMA)["active_requests"] == 0
    with real.http(600) as http:  # and the model serves the next request
        r = http.post("/v1/completions", json={"model": GEMMA, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200


def test_a_foreign_prompt_store_file_neither_breaks_status_nor_wedges_a_stop(real: DaemonProc) -> None:
    prompt = "You are a careful assistant. " * 30  # well over the 64 tokens worth saving
    with real.http(600) as http:
        assert http.post("/bostudio/instances", json=LOAD).status_code == 200
        assert http.post("/v1/completions", json={"model": GEMMA, "prompt": prompt, "max_tokens": 2}).status_code == 200
        status = http.get("/bostudio/status")
        assert status.status_code == 200
        ignored = {i["file"] for i in status.json()["prompt_store"]["ignored"]}
        assert {"0" * 32 + ".json", "notes.json"} <= ignored
        if os.getuid() == 0:
            assert "f" * 32 + ".json" in ignored
        pid = real.instance(GEMMA)["pid"]
        r = http.post(f"/bostudio/instances/{GEMMA}/stop")  # saves the slots: the store is read and written
        assert r.status_code == 200 and r.json()["state"] == "stopped"
        assert not Path(f"/proc/{pid}").exists() or b"llama-server" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        usage = http.get("/bostudio/status").json()["prompt_store"]
        assert len(usage["entries"]) == 1 and usage["entries"][0]["slots"] >= 1  # ours, saved
        r = http.post("/v1/completions", json={"model": GEMMA, "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 200  # reloaded, the saved prompt restored
        assert real.instance(GEMMA)["prompts"]["restored_slots"] >= 1


def test_plan_and_pair_never_print_control_characters_from_a_file_name(engine, tmp_path: Path) -> None:
    import subprocess
    import sys

    model = tiny_llama(tmp_path / "evil\x1b[31m\x07name.gguf")
    for args in (["plan", str(model), "--ctx", "512"], ["pair", str(model), "--no-probe", "--ctx", "512"]):
        proc = subprocess.run([sys.executable, "-m", "bostudio", *args], capture_output=True, timeout=GUARD_S,
                              env=dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state")))
        out = proc.stdout + proc.stderr
        assert b"\x1b" not in out and b"\x07" not in out, (args, out[-500:])
        assert b"evil\\x1b[31m\\x07name" in proc.stdout, (args, proc.stdout[-500:], proc.stderr[-500:])


# ------------------------------------------------------------------ pieces, without a daemon

def test_gguf_reads_refuse_a_fifo_before_opening_it(tmp_path: Path) -> None:
    from bostudio.errors import GGUFFormatError
    from bostudio.gguf.split import read_header

    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            read_header(fifo)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            done.append(exc)

    t = threading.Thread(target=read, daemon=True)  # an open() of a FIFO would block for good
    t.start()
    t.join(GUARD_S)
    assert done and isinstance(done[0], GGUFFormatError) and "not a regular file (a FIFO)" in str(done[0])


def test_the_prompt_store_reads_only_what_it_wrote(tmp_path: Path) -> None:
    from bostudio.daemon.supervise.slots import SlotStore, StoreError, state_key

    store = SlotStore(tmp_path / "store", cap_bytes=1 << 20)
    key = state_key(tiny_llama(tmp_path / "m.gguf"), "e", 1024)
    (store.ensure() / store.filename(key.digest, 0)).write_bytes(b"\0" * 100)
    store.record(key, {0: {"tokens": 500, "bytes": 100}})
    for name, text in (("0" * 32 + ".json", "[1, 2]"), ("1" * 32 + ".json", '{"key": {}, "slots": {"0": 7}}'),
                       ("2" * 32 + ".json", "{" * 5000), ("notes.json", "{}")):
        (store.root / name).write_text(text)
    (store.root / ("3" * 32 + ".json")).symlink_to(store.root / f"{key.digest}.json")
    usage = store.usage()  # never raises
    assert [e["digest"] for e in usage["entries"]] == [key.digest]
    assert {i["file"] for i in usage["ignored"]} == {"0" * 32 + ".json", "1" * 32 + ".json", "2" * 32 + ".json",
                                                     "notes.json", "3" * 32 + ".json"}
    assert store.for_key(key) == {0: 500} and store.enforce_cap() == []
    os.chmod(store.root, 0o777)  # writable by anyone: not trusted
    with pytest.raises(StoreError, match="writable by other users"):
        store.ensure()
    assert "writable by other users" in store.usage()["error"]


def test_the_token_is_checked_before_any_body_is_read(tmp_path: Path, fake_root: Path) -> None:
    import subprocess
    import sys

    from tests.daemon_util import daemon_env

    env = daemon_env(tmp_path, fake_root / "models")
    subprocess.run([sys.executable, "-m", "bostudio", "daemon", "token", "--new"], env=env, check=True,
                   timeout=GUARD_S, capture_output=True)
    d = DaemonProc(tmp_path, fake_root / "models", ["--engine", str(fake_root / "llama-server"), "--require-token"])
    d.start()
    try:
        s = connect(d)  # declares a body and never sends it: the refusal does not wait for it
        s.sendall(request_head("/v1/chat/completions", d.port, "Content-Length: 1000000\r\n\r\n"))
        raw = read_all(s)  # ... and the connection is closed, not kept for the next try
        s.close()
        assert status_of(raw) == 401 and b"connection: close" in raw.lower()
    finally:
        assert d.stop() == 0


# ------------------------------------------------------------------ second pass: what the first one missed

def test_setting_speculation_by_path_takes_the_same_model_path_check(daemon: DaemonProc, fake_root: Path) -> None:
    (fake_root / "elsewhere" / "notes.txt").write_text("not a model")
    with daemon.http(GUARD_S) as http:
        for path in (fake_root / "elsewhere" / "notes.txt", fake_root / "elsewhere" / "outside.gguf"):
            r = http.put(f"/bostudio/instances/{path}/speculation", json={"mode": "off"})
            assert r.status_code == 400 and "outside the model directories" in r.json()["error"]["message"], r.text
        ids = {m["id"] for m in http.get("/v1/models").json()["data"]}
        assert "notes.txt" not in ids and "notes" not in ids and "outside" not in ids
        # A model of the catalog still takes a mode.
        assert http.put("/bostudio/instances/fake-ok/speculation", json={"mode": "off"},
                        params={"wait": "false"}).status_code == 200


def test_a_lying_model_file_gets_422_at_once_not_the_crash_loop(daemon: DaemonProc, fake_root: Path) -> None:
    from bostudio.gguf.synth import VOCAB, dense_layers, write_model

    # A header whose own numbers rule out every plan: a KV cache of 2^20 heads of 2^20 values per layer.
    tensors: dict = {"token_embd.weight": (64, len(VOCAB)), "output_norm.weight": (64,),
                     "output.weight": (64, len(VOCAB)), **dense_layers(2, 64, 4, 2, 16, 128)}
    write_model(fake_root / "models" / "liar.gguf", "llama",
                {".context_length": 2048, ".embedding_length": 64, ".block_count": 2, ".feed_forward_length": 128,
                 ".attention.head_count": 4, ".attention.head_count_kv": 1 << 20, ".attention.key_length": 1 << 20,
                 ".attention.value_length": 1 << 20, ".attention.layer_norm_rms_epsilon": 1e-5,
                 ".rope.dimension_count": 16, ".rope.freq_base": 10000.0, "general.file_type": 0}, tensors)
    with daemon.http(GUARD_S) as http:
        for _ in range(2):  # and again: still the file's fault, not "failed" for a cool-down
            r = http.post("/v1/completions", json={"model": "liar", "prompt": "hi", "max_tokens": 1})
            assert r.status_code == 422 and "liar" in r.json()["error"]["message"], r.text
        r = http.post("/v1/messages", json={"model": "liar", "max_tokens": 1, "messages": [{"role": "user",
                                                                                           "content": "hi"}]})
        assert r.status_code == 422 and r.json()["type"] == "error"
    inst = daemon.instance("liar")
    assert inst["crashes_recent"] == 0 and inst["loads"] == 0  # nothing was started, nothing counted


@pytest.mark.parametrize("host", ["[::1]evil.com", "127.0.0.1:{port}@evil.com", "localhost:{port}.evil.com",
                                  "localhost:{port}:1", "127.0.0.1 :{port}"])
def test_a_malformed_host_header_is_refused(daemon: DaemonProc, host: str) -> None:
    s = connect(daemon)
    s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: {host.format(port=daemon.port)}\r\n\r\n".encode())
    raw = read_all(s)
    s.close()
    assert status_of(raw) in (400, 403), raw[:200]  # (400: uvicorn's parser may refuse it first)


def test_sockets_without_the_token_cannot_lock_the_token_holder_out(tmp_path: Path, fake_root: Path) -> None:
    from bostudio.daemon.http.security import create_token, read_token

    token_file = create_token(tmp_path / "config" / "bostudio" / "token")
    token = read_token(token_file)
    cap = 16
    d = DaemonProc(tmp_path, fake_root / "models", ["--engine", str(fake_root / "llama-server"), "--require-token",
                                                    "--max-connections", str(cap), "--header-timeout", "600"])
    d.start()
    idle = []
    try:
        idle = [connect(d) for _ in range(cap + 8)]  # connect and say nothing (the header timeout is long)
        for _ in range(3):  # the holder gets in each time (a new connection each time)
            r = httpx.get(d.url + "/bostudio/status", headers={"Authorization": f"Bearer {token}"},
                          timeout=GUARD_S, trust_env=False)
            assert r.status_code == 200, r.text
        # Made room for by closing idle sockets without the token, never by refusing the holder.
        closed = 0
        for s in idle:
            s.settimeout(0.5)
            try:
                closed += s.recv(65536).startswith(b"HTTP/1.1 503")
            except socket.timeout:
                pass
        assert closed >= 8
    finally:
        for s in idle:
            s.close()
        assert d.stop() == 0


def test_recordings_are_owner_only_and_follow_no_planted_link(tmp_path: Path) -> None:
    from bostudio.daemon.http.record import Recorder
    from bostudio.errors import ConfigError

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    rec_dir = tmp_path / "rec"
    recorder = Recorder(rec_dir)
    assert (rec_dir.stat().st_mode & 0o777) == 0o700
    path, data = recorder.entry("/v1/messages", {"authorization": "Bearer x"}, {"prompt": "secret"})
    path.with_suffix(".json.tmp").symlink_to(victim)  # at the temporary name the recorder used to write through
    Recorder.write(path, data)
    assert victim.read_text() == "keep me"
    assert (path.stat().st_mode & 0o777) == 0o600 and json.loads(path.read_text())["body"] == {"prompt": "secret"}
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by other users"):
        Recorder(shared)


def test_agent_files_with_the_token_become_owner_only(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from bostudio.agents.run import write_files

    config = tmp_path / "agents" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text("{}")
    config.chmod(0o644)  # a world-readable file from before
    write_files(SimpleNamespace(files={str(config): '{"apiKey": "TOKEN"}'}))  # type: ignore[arg-type]
    assert (config.stat().st_mode & 0o777) == 0o600 and "TOKEN" in config.read_text()


def test_the_suite_reads_nothing_of_the_users_own_dirs() -> None:
    from bostudio import paths

    run = Path(os.environ["XDG_CONFIG_HOME"]).parent  # the run's own dirs (tests/conftest.py)
    assert not run.is_relative_to(Path.home())
    for d in (paths.config_dir(), paths.state_dir(), paths.data_dir(), paths.cache_dir(), paths.hf_cache_dir(),
              *paths.lmstudio_models_dirs(), *paths.ollama_models_dirs()):
        assert d.is_relative_to(run), d
    # ... apart from the engine build, shared with the user's cache.
    assert paths.engines_dir().is_symlink()


def test_saved_prompt_states_are_owner_only(tmp_path: Path) -> None:
    from bostudio.daemon.supervise.slots import SlotStore, state_key
    from bostudio.runtime.process import ServerProcess

    # What a child llama-server writes (the slot files it saves: the prompts) is created under umask 077.
    child = ServerProcess(["/bin/sh", "-c", f"echo prompt > {tmp_path / 'slot0'}"], 1, tmp_path / "child.log")
    child.start()
    assert child.proc is not None and child.proc.wait(GUARD_S) == 0
    assert ((tmp_path / "slot0").stat().st_mode & 0o777) == 0o600
    # The store's own sidecar, rewritten over a world-readable one, is 0600 too.
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    store = SlotStore(tmp_path / "store", 1 << 30)
    store.ensure()
    key = state_key(model, "abc", 4096)
    store.record(key, {0: {"tokens": 100, "bytes": 10}})
    sidecar = store.root / f"{key.digest}.json"
    sidecar.chmod(0o644)
    store.record(key, {1: {"tokens": 200, "bytes": 10}})
    assert (sidecar.stat().st_mode & 0o777) == 0o600
