"""The httpx client of the daemon's control API, for the CLI (and the TUI, bench and autotune)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx

from bostudio.daemon import DEFAULT_HOST, DEFAULT_PORT, state
from bostudio.daemon.security import read_token
from bostudio.errors import DaemonError

TIMEOUT = httpx.Timeout(30.0, connect=2.0)
LOAD_TIMEOUT = httpx.Timeout(900.0, connect=2.0)


def daemon_url() -> str:
    rec = state.running()
    return rec.url if rec else f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"


class DaemonClient:
    def __init__(self, url: str | None = None, token: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url or daemon_url()
        token = token if token is not None else read_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT, trust_env=False,
                                 transport=transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "DaemonClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, timeout: httpx.Timeout = TIMEOUT, **kw) -> dict:
        try:
            r = self.http.request(method, path, timeout=timeout, **kw)
        except httpx.ConnectError as exc:
            raise DaemonError(f"the bostudio daemon is not running at {self.url}",
                              "start it with `bostudio daemon start`") from exc
        except httpx.HTTPError as exc:
            raise DaemonError(f"the daemon did not answer {method} {path}: {exc}", "see `bostudio daemon status`") from exc
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code >= 400:
            err = body.get("error", {}) if isinstance(body, dict) else {}
            raise DaemonError(err.get("message") or f"HTTP {r.status_code} for {method} {path}",
                              err.get("hint") or "see `bostudio daemon status` and the daemon log")
        return body

    def status(self) -> dict:
        return self._call("GET", "/bostudio/status")

    def instances(self) -> list[dict]:
        return self._call("GET", "/bostudio/instances")["instances"]

    def start(self, model: str, spec: str | None = None, ctx: int | None = None, wait: bool = True,
              workload: str | None = None) -> dict:
        body = {"model": model, "spec": spec, "ctx": ctx, "wait": wait, "workload": workload}
        return self._call("POST", "/bostudio/instances", LOAD_TIMEOUT, json={k: v for k, v in body.items() if v is not None})

    def stop(self, model: str) -> dict:
        return self._call("POST", f"/bostudio/instances/{model}/stop", LOAD_TIMEOUT)

    def restart(self, model: str) -> dict:
        return self._call("POST", f"/bostudio/instances/{model}/restart", LOAD_TIMEOUT)

    def set_speculation(self, model: str, mode: str) -> dict:
        return self._call("PUT", f"/bostudio/instances/{model}/speculation", LOAD_TIMEOUT, json={"mode": mode})

    def stats(self, model: str) -> dict:
        return self._call("GET", f"/bostudio/instances/{model}/stats")

    def log(self, model: str, lines: int = 100) -> list[str]:
        return self._call("GET", f"/bostudio/instances/{model}/log", params={"lines": lines})["lines"]

    def events(self) -> Iterator[dict]:
        """The event stream: a snapshot, then every state change and stats update, until closed."""
        try:
            with self.http.stream("GET", "/bostudio/events", timeout=httpx.Timeout(30.0, connect=2.0, read=None)) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        yield json.loads(line[5:])
        except httpx.ConnectError as exc:
            raise DaemonError(f"the bostudio daemon is not running at {self.url}",
                              "start it with `bostudio daemon start`") from exc
