"""Who may talk to the daemon: loopback by default, a 256-bit token for anything else, a Host
allowlist against DNS rebinding, and no cross-origin browser access."""

from __future__ import annotations

import hmac
import json
import re
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from bostudio import paths
from bostudio.errors import ConfigError, DaemonError
from bostudio.files import write_private
from bostudio.runtime.net import is_loopback

TOKEN_BYTES = 32  # 256 bits


def token_path() -> Path:
    return paths.config_dir() / "token"


def create_token(path: Path | None = None) -> Path:
    """Write a fresh 256-bit token to a file only the user can read (mode 0600), atomically."""
    path = path or token_path()
    write_private(path, secrets.token_hex(TOKEN_BYTES) + "\n")
    return path


def read_token(path: Path | None = None) -> str | None:
    """The token, or None when there is no token file. Refuses a file others can read."""
    path = path or token_path()
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"the token file {path} is readable by other users",
                          f"run `chmod 600 {path}` or make a new one with `bostudio daemon token --new`")
    token = path.read_text().strip()
    if len(token) < 2 * TOKEN_BYTES:
        raise ConfigError(f"the token file {path} holds no 256-bit token",
                          "make a new one with `bostudio daemon token --new`")
    return token


def given_token(headers: dict[bytes, bytes]) -> str | None:
    """The token a request presents: `Authorization: Bearer TOKEN`, or Anthropic clients' `x-api-key`."""
    auth = headers.get(b"authorization", b"").decode("latin-1")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else None
    if given is None and b"x-api-key" in headers:
        given = headers[b"x-api-key"].decode("latin-1").strip()
    return given


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison (no early exit on the first differing byte)."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def check_bind(host: str, token: str | None) -> None:
    """Binding beyond loopback needs a token: refuse otherwise."""
    if not is_loopback(host) and not token:
        raise DaemonError(f"refusing to listen on {host} without a token: anyone who can reach it could "
                          "run models on this machine",
                          "create one with `bostudio daemon token --new` (clients then send it as "
                          "`Authorization: Bearer TOKEN`), or bind 127.0.0.1")


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """Host header names (without port) the daemon answers to. A DNS-rebinding page arrives with its
    own domain in Host, so only loopback names, the bound address and configured names pass."""
    names = {"127.0.0.1", "localhost", "::1", "[::1]"}
    if bind_host not in ("0.0.0.0", "::", ""):
        names.add(bind_host)
        names.add(f"[{bind_host}]" if ":" in bind_host else bind_host)
    names.update(h.lower() for h in extra)
    return frozenset(names)


# RFC 9110 Host: a name or IPv4 address, or an IPv6 address in brackets, then an optional numeric port.
# Nothing else: no user info ("127.0.0.1:1@evil.com"), nothing after the brackets ("[::1]evil.com"), no
# name after the port ("localhost:1.evil.com").
_HOST = re.compile(r"([a-z0-9](?:[a-z0-9.-]*[a-z0-9])?|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?")


def host_name(header: str) -> str:
    """The name part of a Host header: 'a:1' -> 'a', '[::1]:8' -> '[::1]'; '' when it is not a
    well-formed Host (which no allowlist holds)."""
    m = _HOST.fullmatch(header.strip().lower())
    return m.group(1) if m else ""


def origin_allowed(origin: str, hosts: frozenset[str], host: str | None = None) -> bool:
    """Browsers send Origin on cross-site requests: only the daemon's own origin may call it. With
    `host` (the request's Host header) the origin must name that very host and port: a page served
    by another program on another loopback port is another origin."""
    if "://" not in origin:
        return False
    netloc = origin.split("://", 1)[1].split("/", 1)[0].strip().lower()
    if host_name(netloc) not in hosts:
        return False
    if host is None:
        return True
    scheme = origin.split("://", 1)[0].lower()
    default = {"http": ":80", "https": ":443"}.get(scheme, "")
    want = host.strip().lower()
    return netloc == want or netloc + default == want or netloc == want + default


def _deny(status: int, message: str, type_: str, path: str = "") -> tuple[int, bytes]:
    """A refusal in the shape of the API the path belongs to (Anthropic, Ollama, else OpenAI)."""
    if path.startswith("/v1/messages"):
        body: dict = {"type": "error", "error": {"type": type_, "message": message}}
    elif path.startswith("/api/"):
        body = {"error": message}
    else:
        body = {"error": {"message": message, "type": type_, "code": status}}
    return status, json.dumps(body).encode()


class SecurityMiddleware:
    """Plain ASGI middleware (no buffering, so streams pass straight through)."""

    def __init__(self, app, hosts: frozenset[str], token: str | None, require_token: bool) -> None:
        self.app = app
        self.hosts = hosts
        self.token = token
        self.require_token = require_token

    def check(self, headers: dict[bytes, bytes], path: str = "", hosts_seen: int = 1) -> tuple[int, bytes] | None:
        if hosts_seen > 1:  # which one a proxy or the app would take differs: refuse instead of guessing
            return _deny(400, "more than one Host header", "invalid_request_error", path)
        host = headers.get(b"host", b"").decode("latin-1")
        if host_name(host) not in self.hosts:
            return _deny(403, f"Host {host!r} is not allowed (DNS rebinding protection)", "permission_error", path)
        origin = headers.get(b"origin")
        if origin is not None and not origin_allowed(origin.decode("latin-1"), self.hosts, host):
            return _deny(403, "cross-origin requests are not allowed", "permission_error", path)
        if self.require_token:
            assert self.token is not None
            if not token_matches(given_token(headers), self.token):
                return _deny(401, "missing or wrong token (send Authorization: Bearer TOKEN, or x-api-key: TOKEN)",
                             "authentication_error", path)
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            hosts_seen = sum(1 for k, _ in scope["headers"] if k == b"host")
            denied = self.check(dict(scope["headers"]), scope.get("path", ""), hosts_seen)
            if denied is not None:
                status, body = denied
                # A refused client keeps no connection open (and sends no body we would read).
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
