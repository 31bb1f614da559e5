"""A fake llama-server for the daemon's fault tests: same probes (--version, --list-devices, --help),
same endpoints and log lines, and a behaviour chosen by the model file's name:

    *crash*     prints a few load lines and exits 1
    *oom*       prints llama.cpp's allocation failure and exits 1
    *silent*    binds, answers 503 and prints nothing more (a stalled loader)
    *progress*  prints a progress line every 0.2 s for PROGRESS_S seconds, then serves
    *stall*     serves, but a streamed response stops after its first chunk (a wedged child)
    anything    loads in 0.3 s, then serves /health, /slots, /metrics, /completion and /v1/*

With FAKE_LLAMA_BODIES=FILE in its environment it appends every POST it gets to FILE, one JSON line
{"pid", "path", "body"} each (what the daemon forwarded, byte for byte parsed). A POST whose body holds
KILL_WORD anywhere exits the server at once, mid-request (a request that crashes its child); one with
BROKEN_CALL_WORD gets a broken tool call, or a real one when the request forces it; a streamed chat request
with LOOP_WORD gets the same line over and over (a runaway model) until the client closes the connection,
which it logs (LOOP_STOPPED), or until LOOP_CAP lines.

`--decoy PORT` runs a decoy instead: it answers 200 to everything on PORT and appends each
request path to the file named by --decoy-log.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HELP = Path(__file__).with_name("data") / "llama-server-help.txt"
KILL_WORD = "KILL-THE-CHILD"
# A chat request whose body holds BROKEN_CALL_WORD is answered with a get_weather call written in a form
# nobody can read (a value that is no JSON), and as a real call when it forces one.
BROKEN_CALL_WORD = "ANSWER-WITH-A-BROKEN-CALL"
BROKEN_CALL = "<function name=\"get_weather\" arguments='{\"city\": Paris}'>"
LOOP_WORD = "ANSWER-IN-A-LOOP"
LOOP_LINE = "x = x + 1\n"
LOOP_CAP = 5000  # lines: far past what the daemon's loop guard lets through (loopguard.LOOP_CHARS)
LOOP_STOPPED = "loop: the client closed the connection"
PROGRESS_S = 3.0
T0 = time.monotonic()


def log(msg: str, level: str = "I") -> None:
    t = time.monotonic() - T0
    sys.stderr.write(f"0.{int(t):02d}.{int(t * 1000) % 1000:03d}.000 {level} {msg}\n")
    sys.stderr.flush()


def arg(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


class State:
    ready = False
    model = ""
    key = os.environ.get("LLAMA_API_KEY")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:
        pass

    def send_json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def gate(self) -> bool:
        if not State.ready:
            self.send_json(503, {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}})
            return False
        if self.path not in ("/health", "/v1/health") and State.key and \
                self.headers.get("Authorization") != f"Bearer {State.key}":
            self.send_json(401, {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}})
            return False
        return True

    def do_GET(self) -> None:
        if not self.gate():
            return
        if self.path in ("/health", "/v1/health"):
            self.send_json(200, {"status": "ok"})
        elif self.path == "/slots":
            self.send_json(200, [{"id": 0, "speculative": True, "is_processing": False}])
        elif self.path == "/metrics":
            text = ("llamacpp:spec_decode_num_draft_tokens_total 10\nllamacpp:spec_decode_num_accepted_tokens_total 8\n"
                    "llamacpp:spec_decode_num_drafts_total 4\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self.send_json(404, {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw or b"{}")
        if not self.gate():
            return
        if os.environ.get("FAKE_LLAMA_BODIES"):
            with open(os.environ["FAKE_LLAMA_BODIES"], "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "path": self.path, "body": body}) + "\n")
        if KILL_WORD.encode() in raw:
            os._exit(139)  # as a segfault would: no answer, the connection drops
        timings = {"predicted_n": 4, "predicted_ms": 30.0, "predicted_per_second": 100.0, "draft_n": 4,
                   "draft_n_accepted": 3}
        if BROKEN_CALL_WORD.encode() in raw and not body.get("stream"):
            call = {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]} \
                if body.get("tool_choice") == "required" else {"role": "assistant", "content": BROKEN_CALL}
            self.send_json(200, {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"
                                              if message["content"] is None else "stop"}],
                                 "model": body.get("model"), "timings": timings})
            return
        if body.get("stream") and LOOP_WORD.encode() in raw and self.path == "/v1/chat/completions":
            self.loop(body)
            return
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(int(body.get("max_tokens", 4))):
                if i == 1 and "stall" in State.model:
                    time.sleep(3600)
                self.chunk(f'data: {json.dumps({"choices": [{"index": 0, "text": f"t{i}"}]})}\n\n')
                time.sleep(0.05)
            self.chunk(f'data: {json.dumps({"choices": [], "timings": timings})}\n\ndata: [DONE]\n\n')
            self.chunk("")
            return
        self.send_json(200, {"choices": [{"index": 0, "text": "fake", "message": {"role": "assistant",
                                                                                 "content": "fake"}}],
                             "model": body.get("model"), "timings": timings})

    def loop(self, body: dict) -> None:
        """LOOP_LINE streamed as chat deltas, a line every 2 ms (a fast child), until the client leaves."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        head = {"id": "chatcmpl-loop", "model": body.get("model"), "object": "chat.completion.chunk"}

        def event(delta: dict, finish: str | None = None) -> str:
            return f'data: {json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **head})}\n\n'
        sent = 0
        try:
            for sent in range(LOOP_CAP):
                self.chunk(event({"role": "assistant", "content": LOOP_LINE} if sent == 0 else {"content": LOOP_LINE}))
                time.sleep(0.002)
            self.chunk(event({}, "length") + "data: [DONE]\n\n")
            self.chunk("")
            log(f"loop: all {LOOP_CAP} lines sent")
        except (BrokenPipeError, ConnectionResetError):
            log(f"{LOOP_STOPPED} after {sent} lines; generation stopped")
            self.close_connection = True

    def chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class DecoyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_file: str = ""

    def log_message(self, *a) -> None:
        pass

    def answer(self) -> None:
        with open(self.log_file, "a") as f:
            f.write(f"{self.command} {self.path}\n")
        data = b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = answer


def main(argv: list[str]) -> int:
    if "--version" in argv:
        sys.stderr.write("version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with fake for Linux x86_64\n")
        return 0
    if "--list-devices" in argv:
        print("Available devices:\n  (none)")
        return 0
    if "--help" in argv:
        print(HELP.read_text())
        return 0
    if "--decoy" in argv:
        DecoyHandler.log_file = arg(argv, "--decoy-log") or os.devnull
        ThreadingHTTPServer(("127.0.0.1", int(arg(argv, "--decoy"))), DecoyHandler).serve_forever()
        return 0
    model = Path(arg(argv, "-m", "model.gguf")).name
    State.model = model
    port = int(arg(argv, "--port", "8080"))
    host = arg(argv, "--host", "127.0.0.1")
    log("build: 1 (0c1e570) with fake for Linux x86_64")
    log(f"srv    load_model: loading model '{model}'")
    if "crash" in model:
        time.sleep(0.1)
        log("llama_model_load: error loading model: fake crash", "E")
        log("srv    load_model: failed to load model", "E")
        return 1
    if "oom" in model:
        log("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate CPU buffer of size 99999999999", "E")
        log("llama_model_load: error loading model: unable to allocate CPU buffer", "E")
        return 1
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError:
        log(f"srv          start: couldn't bind HTTP server socket, hostname: {host}, port: {port}", "E")
        return 1
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if "silent" in model:
        time.sleep(3600)
        return 0
    if "progress" in model:
        while time.monotonic() - T0 < PROGRESS_S:
            log("load_tensors: loading ...")
            time.sleep(0.2)
    else:
        time.sleep(0.3)
    State.ready = True
    log("srv  llama_server: model loaded")
    log(f"srv  llama_server: listening on http://{host}:{port}")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
