"""Command line: parses arguments, calls services, prints. No logic of its own.

One module per group of commands (serve, daemon, rpc, engine, models, bench, launch), each with the
`add_parsers` that registers them; the options several commands share are written once (options.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from bostudio import __version__
from bostudio.cli import bench, daemon, engine, launch, models, rpc, serve
from bostudio.errors import BostudioError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bostudio",
        description="Speculative decoding for llama.cpp, one switch: find or build llama-server, "
                    "pair models with speculators, launch and verify. Without a COMMAND it opens the "
                    "terminal UI (`bostudio tui`).")
    parser.add_argument("--version", action="version", version=f"bostudio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve.add_parsers(sub)
    daemon.add_parsers(sub)
    rpc.add_parsers(sub)
    daemon.add_instance_parsers(sub)
    engine.add_parsers(sub)
    models.add_parsers(sub)
    bench.add_parsers(sub)
    launch.add_parsers(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """argv parsed; no arguments is the TUI. In `launch AGENT ... -- ARGS`, ARGS belong to the agent verbatim
    (Claude Code's own --print among them), so argparse never sees them: they land in `agent_args`."""
    agent_args = None
    if argv and argv[0] == "launch" and "--" in argv:
        cut = argv.index("--")
        argv, agent_args = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv or ["tui"])
    if agent_args is not None:
        args.agent_args = agent_args
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(parser, argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BostudioError as exc:
        # One line: what went wrong, then what to do about it.
        hint = f" (hint: {exc.hint})" if exc.hint else ""
        print(f"bostudio: {exc.title}: {exc.message}{hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
