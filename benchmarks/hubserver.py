"""A tiny stand-in for the Hugging Face hub on 127.0.0.1, serving the endpoints bostudio's hub code uses:

    GET /api/models/{org}/{name}/revision/{rev}    repo info with files metadata (sizes, LFS sha256)
    GET /{org}/{name}/resolve/{rev}/{path}         file bytes, with Range support (206)

Tests point HF_ENDPOINT at it. It records every request (method, path, Range header, bytes sent) and can
misbehave on purpose: `cut_after[path] = n` sends the first n bytes of the next whole-file GET of that file, then
drops the connection and answers 503 to the retries; `corrupt.add(path)` serves flipped bytes;
`corrupt_tail.add(path)` flips the last 64 bytes only (tensor data: a header read still succeeds).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    sent: int = 0


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo -> {path: content}
    requests: list[Request] = field(default_factory=list)
    cut_after: dict[str, int] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    corrupt: set[str] = field(default_factory=set)
    corrupt_tail: set[str] = field(default_factory=set)
    url: str = ""

    def add_file(self, repo: str, path: str, source: Path | bytes) -> None:
        data = source if isinstance(source, bytes) else source.read_bytes()
        self.repos.setdefault(repo, {})[path] = data

    def bytes_sent(self, path_suffix: str) -> int:
        return sum(r.sent for r in self.requests if r.path.endswith(path_suffix))


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, obj: object) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            req = Request("GET", unquote(urlparse(self.path).path), self.headers.get("Range"))
            hub.requests.append(req)
            m = re.match(r"^/api/models/([^/]+/[^/]+)/revision/([^/]+)$", req.path)
            if m:
                return self._info(m.group(1))
            m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", req.path)
            if m and m.group(1) in hub.repos and m.group(3) in hub.repos[m.group(1)]:
                return self._file(req, m.group(3), hub.repos[m.group(1)][m.group(3)])
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound" if m else "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _info(self, repo: str) -> None:
            if repo not in hub.repos:
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            siblings = [{"rfilename": p, "size": len(d), "blobId": hashlib.sha1(d).hexdigest(),
                         "lfs": {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 134}}
                        for p, d in sorted(hub.repos[repo].items())]
            self._json(200, {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings})

        def _file(self, req: Request, path: str, data: bytes) -> None:
            if path in hub.failing:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path in hub.corrupt:
                data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
            if path in hub.corrupt_tail:
                data = data[:-64] + bytes(b ^ 0xFF for b in data[-64:])
            start, end = 0, len(data) - 1
            status = 200
            if req.range:
                rm = re.match(r"bytes=(\d+)-(\d*)$", req.range)
                assert rm, req.range
                start = int(rm.group(1))
                end = min(int(rm.group(2)), len(data) - 1) if rm.group(2) else len(data) - 1
                status = 206
            body = data[start:end + 1]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.end_headers()
            cut = hub.cut_after.pop(path, None) if req.range is None else None  # header reads pass
            if cut is not None:
                hub.failing.add(path)  # the retries get 503: the pull fails, a later one resumes
                req.sent = cut
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            req.sent = len(body)  # before writing: the client may look as soon as it has the bytes
            self.wfile.write(body)

    return Handler


class HubServer:
    """Run a FakeHub on 127.0.0.1 in a thread (context manager)."""

    def __init__(self, hub: FakeHub) -> None:
        self.hub = hub
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
        hub.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self.hub

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def use_hub(hub: FakeHub, tmp_path: Path, monkeypatch: "pytest.MonkeyPatch", *, own_cache: bool = True) -> None:
    """Point huggingface-hub and bostudio at `hub` with private dirs under tmp_path. own_cache=False keeps
    XDG_CACHE_HOME (the shared engine cache) for tests that need the built engine."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    # huggingface-hub reads HF_ENDPOINT at import; background requests (agent registry) use this copy.
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    if own_cache:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("BOSTUDIO_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("LMSTUDIO_MODELS_DIR", str(tmp_path / "lmstudio"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
