"""Running the daemon: in the foreground, in the background (start/stop/status), or as a generated
systemd user unit / launchd agent."""

from __future__ import annotations

import logging
import logging.handlers
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import psutil

from bostudio import __version__, paths
from bostudio.daemon import DEFAULT_HOST, DEFAULT_PORT, state
from bostudio.daemon.http.limits import HttpLimits, guarded_protocol
from bostudio.daemon.http.security import allowed_hosts, check_bind, read_token
from bostudio.daemon.supervise.supervisor import SupervisorOptions
from bostudio.errors import DaemonError
from bostudio.files import write_atomic
from bostudio.runtime.net import check_port_free, is_loopback
from bostudio.runtime.process import tail

log = logging.getLogger("bostudio.daemon")
START_TIMEOUT_S = 120.0  # a loaded machine starts Python slowly: a hang guard, not a speed target
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DaemonOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    require_token: bool = False  # always on when bound beyond loopback
    allow_hosts: tuple[str, ...] = ()
    supervisor: SupervisorOptions = SupervisorOptions()
    limits: HttpLimits = HttpLimits()  # connection and body discipline (daemon/http/limits.py)
    record: str | None = None  # save every request body here, in order (`bench --workload DIR` replays them)


def _setup_logging() -> Path:
    path = state.daemon_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=5 << 20, backupCount=3)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request is noise
    return path


def run_daemon(opts: DaemonOptions) -> int:
    """Serve in the foreground until SIGINT/SIGTERM; every instance is stopped on the way out."""
    import uvicorn

    from bostudio.daemon.http.app import build_app
    from bostudio.daemon.http.routes.control import DaemonInfo

    token = read_token()
    check_bind(opts.host, token)
    require_token = opts.require_token or not is_loopback(opts.host)
    if require_token and not token:
        raise DaemonError("--require-token needs a token file", "create one with `bostudio daemon token --new`")
    alive = state.running()
    if alive is not None:
        raise DaemonError(f"a daemon is already running at {alive.url} (pid {alive.pid})",
                          "stop it with `bostudio daemon stop`, or use it")
    from bostudio.daemon.http.record import start_recording

    recorder = start_recording(Path(opts.record) if opts.record else None)
    log_path = _setup_logging()
    left = state.load()
    if left is not None:
        # A daemon killed with SIGKILL could not stop its children: they die with it (PDEATHSIG),
        # and whatever is still there and provably ours (pid + create time) is reaped here.
        for child in state.reap_leftovers(left):
            log.warning("reaped %s (pid %d, port %d) left by a previous daemon", child.name, child.pid, child.port)
        state.remove()
    check_port_free(opts.host, opts.port)

    me = psutil.Process()
    record = state.DaemonRecord(pid=me.pid, create_time=me.create_time(), host=opts.host, port=opts.port,
                                started=time.time(), version=__version__)

    def on_children(children) -> None:
        nonlocal record
        record = replace(record, children=tuple(children))
        state.save(record)

    info = DaemonInfo(opts.host, opts.port, require_token, record.started)
    app = build_app(opts.supervisor, info, allowed_hosts(opts.host, opts.allow_hosts), token, on_children,
                    opts.limits)
    state.save(record)
    print(f"bostudio daemon {__version__} on {record.url} (OpenAI base URL {record.url}/v1; log {log_path})"
          + (f"; recording request bodies to {recorder.dir}" if recorder is not None else ""),
          file=sys.stderr, flush=True)
    # The guarded protocol times each request head and caps its size and the open connections;
    # uvicorn closes a connection idle between requests after the keep-alive timeout.
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_config=None, access_log=False,
                            lifespan="on", timeout_graceful_shutdown=5, server_header=False,
                            http=guarded_protocol(opts.limits, token if require_token else None), timeout_keep_alive=opts.limits.keepalive_timeout)
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it has shut down; a stop we asked for is a
    # clean exit (status 0, state file removed), so that re-raise must find a handler, not the default.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    try:
        server.run()
    finally:
        current = state.load()
        if current is not None and current.pid == me.pid:
            state.remove()
    return 0 if server.started else 1


# ---------------------------------------------------------------- background

def daemon_out_path() -> Path:
    return paths.logs_dir() / "daemon.out"


def start_background(opts: DaemonOptions, extra_args: list[str] | None = None) -> state.DaemonRecord:
    """Start `bostudio daemon` detached and wait until it answers."""
    alive = state.running()
    if alive is not None:
        return alive
    out = daemon_out_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "bostudio", "daemon", "--host", opts.host, "--port", str(opts.port),
            *(extra_args or [])]
    with open(out, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = [ln for ln in tail(out, 5) if ln.strip()]
            raise DaemonError("the daemon exited at start: " + (lines[-1] if lines else f"code {proc.returncode}"),
                              f"see {out}")
        rec = state.running()
        if rec is not None and rec.pid == proc.pid:
            try:
                if httpx.get(rec.url + "/bostudio/status", timeout=1.0, trust_env=False,
                             headers=_auth_headers()).status_code < 500:
                    return rec
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    raise DaemonError(f"the daemon did not answer within {START_TIMEOUT_S:.0f} s", f"see {out}")


def _auth_headers() -> dict[str, str]:
    token = read_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def stop_daemon(timeout: float = STOP_TIMEOUT_S) -> state.DaemonRecord | None:
    """SIGTERM the recorded daemon (it stops its instances), SIGKILL if it does not exit in time."""
    rec = state.running()
    if rec is None:
        return None
    proc = psutil.Process(rec.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except psutil.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    return rec


# ---------------------------------------------------------------- user unit / agent

def systemd_unit(python: str, host: str, port: int) -> str:
    cmd = shlex.join([python, "-m", "bostudio", "daemon", "--host", host, "--port", str(port)])
    return f"""[Unit]
Description=bostudio daemon: OpenAI-compatible endpoint for llama-server with speculative decoding
After=network.target

[Service]
Type=simple
ExecStart={cmd}
Restart=on-failure
RestartSec=2
# SIGTERM stops every llama-server instance before the daemon exits.
KillSignal=SIGTERM
TimeoutStopSec=30
Environment=PYTHONUNBUFFERED=1

[Install]
WantedBy=default.target
"""


LAUNCHD_LABEL = "dev.bostudio.daemon"


def launchd_plist(python: str, host: str, port: int, log_path: Path) -> str:
    args = "".join(f"\n    <string>{a}</string>" for a in
                   [python, "-m", "bostudio", "daemon", "--host", host, "--port", str(port)])
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>{LAUNCHD_LABEL}</string>
  <key>ProgramArguments</key>
  <array>{args}
  </array>
  <key>RunAtLoad</key>
  <true/>
  <key>KeepAlive</key>
  <dict>
    <key>SuccessfulExit</key>
    <false/>
  </dict>
  <key>StandardErrorPath</key>
  <string>{log_path}</string>
</dict>
</plist>
"""


def install_unit(platform: str, host: str, port: int, write: bool = True) -> tuple[Path, str, str]:
    """(path, text, how to enable it) of the user unit for `platform` ("linux" | "macos")."""
    python = sys.executable
    if platform == "linux":
        path = paths.systemd_user_dir() / "bostudio.service"
        text = systemd_unit(python, host, port)
        how = "systemctl --user daemon-reload && systemctl --user enable --now bostudio"
    elif platform == "macos":
        path = paths.launch_agents_dir() / f"{LAUNCHD_LABEL}.plist"
        text = launchd_plist(python, host, port, daemon_out_path())
        how = f"launchctl bootstrap gui/{os.getuid()} {path}"
    else:
        raise DaemonError(f"no user service format for {platform!r}", "use --platform linux or --platform macos")
    if write:
        write_atomic(path, text)
    return path, text, how
