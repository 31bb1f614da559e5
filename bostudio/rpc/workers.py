"""RPC workers: where they are and what the plan may put on them. Pure (no network, no process).

A worker is named on the command line (`--rpc host:port,host:port`) or in config.toml:

    [[rpc]]
    host = "192.168.1.20"
    port = 50052
    budget_mib = 20000     # optional: the planner puts at most this much on the worker
    link_mbit = 1000       # optional: the link to it, for the network estimate (default 1 Gbit/s Ethernet)

llama.cpp splits an endpoint at its first ':' (ggml-rpc.cpp parse_endpoint), so IPv6 literals
cannot be used; a host name that resolves to one can.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bostudio import paths
from bostudio.config import read_config
from bostudio.errors import ConfigError

DEFAULT_PORT = 50052  # rpc-server's default (tools/rpc/rpc-server.cpp)
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$")
_KEYS = ("host", "port", "budget_mib", "link_mbit")
RPC_HINT = "write --rpc HOST:PORT[,HOST:PORT...], e.g. --rpc 192.168.1.20:50052,127.0.0.1:50053"


@dataclass(frozen=True)
class Worker:
    """One rpc-server. budget_mib: the most the planner may place on it (None: what it reports free);
    link_mbit: the network link to it (None: 1 Gbit/s Ethernet)."""

    host: str
    port: int = DEFAULT_PORT
    budget_mib: int | None = None
    link_mbit: int | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


def _check_host(host: str, where: str) -> str:
    if ":" in host or "[" in host:
        raise ConfigError(f"{where}: IPv6 address {host!r} cannot be used for an RPC worker",
                          "llama.cpp splits HOST:PORT at the first ':'; use an IPv4 address or a host name")
    if not _HOST.match(host):
        raise ConfigError(f"{where}: {host!r} is not a host name or IPv4 address", RPC_HINT)
    return host


def _check_port(port: Any, where: str) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        try:
            port = int(str(port), 10)
        except ValueError:
            raise ConfigError(f"{where}: port {port!r} is not a number",
                              "use a whole number between 1 and 65535 (rpc-server's default is 50052)") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{where}: port {port} is out of range", "use a port between 1 and 65535")
    return port


def parse_workers(value: str) -> tuple[Worker, ...]:
    """Workers from a `--rpc` value: HOST:PORT (or HOST, port 50052), comma-separated."""
    items = [v.strip() for v in value.split(",")]
    if not value.strip() or any(not v for v in items):
        raise ConfigError(f"--rpc {value!r}: an empty worker address", RPC_HINT)
    out: list[Worker] = []
    for item in items:
        where = f"--rpc {item!r}"
        if item.count(":") > 1 or item.startswith("["):
            _check_host(item, where)
        host, _, port = item.partition(":")
        w = Worker(_check_host(host, where), _check_port(port, where) if port or item.endswith(":")
                   else DEFAULT_PORT)
        out.append(w)
    return _unique(out, "--rpc")


def _unique(workers: list[Worker], where: str) -> tuple[Worker, ...]:
    seen: set[str] = set()
    for w in workers:
        if w.endpoint in seen:
            raise ConfigError(f"{where}: worker {w.endpoint} is named twice", "name each rpc-server once")
        seen.add(w.endpoint)
    return tuple(workers)


def workers_from_config(path: Path | None = None) -> tuple[Worker, ...]:
    """The `[[rpc]]` tables of config.toml (default: paths.config_file()); none when absent."""
    path = path or paths.config_file()
    data = read_config(path)
    tables = data.get("rpc", [])
    if isinstance(tables, dict):
        tables = [tables]
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path}: `rpc` must be an array of tables", "write each worker as [[rpc]] host = ... port = ...")
    out = []
    for n, t in enumerate(tables, 1):
        where = f"{path}: [[rpc]] #{n}"
        for key in t:
            if key not in _KEYS:
                near = difflib.get_close_matches(key, _KEYS, n=1)
                raise ConfigError(f"{where}: unknown key `{key}`",
                                  f"did you mean `{near[0]}`?" if near else f"valid keys: {', '.join(_KEYS)}")
        if not isinstance(t.get("host"), str):
            raise ConfigError(f"{where}: needs host = \"ADDRESS\"", 'e.g. host = "192.168.1.20"')
        budget = _positive(t, "budget_mib", "MiB", "e.g. budget_mib = 20000", where)
        link = _positive(t, "link_mbit", "Mbit/s", "e.g. link_mbit = 1000 for Gigabit Ethernet, 10000 for 10 GbE", where)
        out.append(Worker(_check_host(t["host"], where), _check_port(t.get("port", DEFAULT_PORT), where), budget,
                          link))
    return _unique(out, str(path))


def _positive(table: dict, key: str, unit: str, example: str, where: str) -> int | None:
    """An optional positive whole number from a [[rpc]] table."""
    value = table.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ConfigError(f"{where}: {key} must be a positive whole number of {unit}, not {value!r}", example)
    return value


def select_workers(cli_value: str | None, config: tuple[Worker, ...]) -> tuple[Worker, ...]:
    """The workers to use: `--rpc` names them (taking budgets from config.toml for the same
    endpoint, and link speeds); without `--rpc`, config.toml's. `--rpc none` uses none."""
    if cli_value is None:
        return config
    if cli_value.strip().lower() == "none":
        return ()
    known = {w.endpoint: w for w in config}
    return tuple(Worker(w.host, w.port, known[w.endpoint].budget_mib, known[w.endpoint].link_mbit)
                 if w.endpoint in known else w for w in parse_workers(cli_value))
