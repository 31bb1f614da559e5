"""The Textual TUI (`bostudio` with no arguments, or `bostudio tui`). The only package that imports
textual; it talks to the daemon through bostudio.daemon.client and nothing else."""

from __future__ import annotations

import sys


def run_tui(host: str | None = None, port: int | None = None, extra_args: list[str] | None = None) -> int:
    """Open the TUI on the running daemon, starting one in the background first if none runs."""
    from bostudio.daemon import DEFAULT_HOST, DEFAULT_PORT, state
    from bostudio.daemon.client import AsyncDaemonClient
    from bostudio.daemon.service import DaemonOptions, start_background
    from bostudio.tui.app import BostudioApp

    rec = state.running()
    note = ""
    if rec is None:
        print("bostudio: no daemon runs; starting one in the background ...", file=sys.stderr, flush=True)
        rec = start_background(DaemonOptions(host=host or DEFAULT_HOST, port=port or DEFAULT_PORT), extra_args)
        note = f"started the bostudio daemon in the background (pid {rec.pid}) at {rec.url}; `bostudio daemon stop` stops it"
    BostudioApp(AsyncDaemonClient(rec.url), note=note).run()
    return 0
