"""`bostudio rpc serve`: run ggml's rpc-server so another machine's llama-server can use this
machine's devices (`--rpc HOST:PORT`), in the foreground or as a systemd user unit.

The RPC protocol has no authentication and no encryption (llama.cpp's own warning, printed by
rpc-server for any address but 127.0.0.1): anyone who reaches the port can run code on the
device's memory. So it binds loopback unless --allow-network is given. This build's rpc-server
has no memory cap: budgets live on the planning side (`[[rpc]] budget_mib`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bostudio import paths
from bostudio.engine.discover import find_engine
from bostudio.errors import ConfigError, EngineError
from bostudio.files import write_atomic
from bostudio.rpc.workers import DEFAULT_PORT
from bostudio.runtime.net import check_port_free, is_loopback
from bostudio.runtime.process import _die_with_parent

NETWORK_WARNING = ("the RPC protocol has no authentication and no encryption: anyone who can reach "
                   "this port can use this machine's devices and memory")
TUNNEL_HINT = ("keep the default 127.0.0.1 and reach it through an SSH tunnel from the main machine "
               "(ssh -N -L {port}:127.0.0.1:{port} THIS-HOST, then --rpc 127.0.0.1:{port}), or on a "
               "trusted LAN only, pass --allow-network")
UNIT_NAME = "bostudio-rpc.service"


@dataclass(frozen=True)
class RpcServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    devices: str | None = None  # rpc-server -d: comma-separated device names (default: all)
    threads: int | None = None  # -t: CPU threads for the CPU device
    cache: bool = False  # -c: keep received tensors in a local file cache (faster reloads)
    allow_network: bool = False
    engine: str | None = None


def check_rpc_bind(host: str, port: int, allow_network: bool) -> str | None:
    """Refuse a non-loopback address without --allow-network; with it, the warning to print."""
    if is_loopback(host):
        return None
    if not allow_network:
        raise ConfigError(f"refusing to bind rpc-server to {host}: {NETWORK_WARNING}",
                          TUNNEL_HINT.format(port=port))
    return (f"WARNING: rpc-server listens on {host}:{port}; {NETWORK_WARNING}. Use it on a trusted LAN "
            f"only, or an SSH tunnel (ssh -N -L {port}:127.0.0.1:{port} THIS-HOST).")


def serve_argv(rpc_server: Path, opts: RpcServeOptions) -> list[str]:
    if opts.threads is not None and opts.threads <= 0:
        raise ConfigError(f"--threads {opts.threads} must be at least 1", "leave it out for rpc-server's default")
    return [str(rpc_server), *_server_options(opts)]


def _server_options(opts: RpcServeOptions) -> list[str]:
    """The options rpc-server and `bostudio rpc serve` share (same names in both)."""
    out = ["--host", opts.host, "--port", str(opts.port)]
    if opts.devices:
        out += ["--device", opts.devices]
    if opts.threads:
        out += ["--threads", str(opts.threads)]
    if opts.cache:
        out.append("--cache")
    return out


def find_rpc_server(engine: str | None) -> Path:
    eng = find_engine(engine)
    tool = eng.rpc_server
    if tool is None or not eng.has_rpc:
        raise EngineError(f"no ggml-rpc-server beside {eng.path} (built without the RPC backend)",
                          "build the engine with `bostudio engine build` (GGML_RPC=ON), or pass --engine")
    return tool


def run_rpc_serve(opts: RpcServeOptions, out=sys.stdout) -> int:  # type: ignore[no-untyped-def]
    """Run rpc-server in the foreground until Ctrl-C/SIGTERM; its output goes to ours."""
    warning = check_rpc_bind(opts.host, opts.port, opts.allow_network)
    check_port_free(opts.host, opts.port)
    argv = serve_argv(find_rpc_server(opts.engine), opts)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    print(f"bostudio rpc serve: {shlex.join(argv)}", file=out, flush=True)
    print(f"  use it from the main machine with: bostudio up MODEL --rpc {opts.host}:{opts.port} "
          f"(or [[rpc]] host = \"{opts.host}\" port = {opts.port} in config.toml)", file=out, flush=True)
    proc = subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent,
                            stdin=subprocess.DEVNULL)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        rc = proc.wait()
        if rc != 0:
            print(f"rpc-server exited with status {rc}", file=sys.stderr)
        return rc if rc > 0 else 1
    except KeyboardInterrupt:
        return 0
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(5)
        for s, h in previous.items():
            signal.signal(s, h)


def rpc_unit(python: str, opts: RpcServeOptions) -> str:
    args = [python, "-m", "bostudio", "rpc", "serve", *_server_options(opts)]
    if opts.allow_network:
        args.append("--allow-network")
    if opts.engine:
        args += ["--engine", opts.engine]
    return f"""[Unit]
Description=bostudio rpc-server: this machine's devices for another machine's llama-server (--rpc)
After=network.target

[Service]
Type=simple
ExecStart={shlex.join(args)}
Restart=on-failure
RestartSec=2
KillSignal=SIGTERM
TimeoutStopSec=10
Environment=PYTHONUNBUFFERED=1

[Install]
WantedBy=default.target
"""


def install_rpc_unit(opts: RpcServeOptions, write: bool = True) -> tuple[Path, str, str]:
    """(path, text, how to enable it) of the systemd user unit; the bind is checked first."""
    check_rpc_bind(opts.host, opts.port, opts.allow_network)
    path = paths.systemd_user_dir() / UNIT_NAME
    text = rpc_unit(sys.executable, opts)
    if write:
        write_atomic(path, text)
    return path, text, "systemctl --user daemon-reload && systemctl --user enable --now bostudio-rpc"
