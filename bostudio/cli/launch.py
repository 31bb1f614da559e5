"""`bostudio launch AGENT [MODEL] [-- agent args]`: a coding agent configured for the daemon."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys

from bostudio.agents import AGENTS, BINARIES, INSTRUCTIONS, PINNED, SMALL_MODEL_PARAMS
from bostudio.cli.options import add_ctx

LAUNCH_HELP = (
    "Run a coding agent (claude = Claude Code, codex = Codex CLI, opencode) against bostudio's daemon. It starts the "
    "daemon if none runs, loads MODEL (default: the embedded model) with the context the memory plan gives, and runs "
    "the agent in the foreground with its configuration: the daemon's URL and token, the model name, the model's real "
    "context window and an output limit (so the agent compacts before it overflows), telemetry and non-essential "
    "traffic off, Claude Code's attribution header off. Nothing of yours is touched: Claude Code gets environment "
    "variables; Codex a CODEX_HOME and opencode an OPENCODE_CONFIG under bostudio's state dir. Arguments after `--` "
    "go to the agent. --print shows the configuration (environment and files) without running the agent. "
    "A missing agent: the exact `npm install -g PKG@VERSION` command is printed. Tested versions: "
    + ", ".join(f"{p}@{v}" for p, v in PINNED.values()) + ".")


def _options(p: argparse.ArgumentParser) -> None:
    add_ctx(p, "context size (default: what the memory plan gives, as `bostudio plan MODEL` shows)")
    p.add_argument("--max-output", type=int, default=None, metavar="N",
                   help="the output limit the agent asks for (default: an eighth of the context, at most 32768; the agent "
                        "compacts below the context less this)")
    p.add_argument("--instructions", choices=INSTRUCTIONS, default=None,
                   help=f"the agent's instructions (Codex only): own = Codex's; short = bostudio's short page, "
                        f"written for small local models; auto (default) = short for a model under "
                        f"{SMALL_MODEL_PARAMS / 1e9:.0f}B parameters")
    p.add_argument("--port", type=int, default=None, help="the daemon's port, when it has to be started")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="show the configuration (environment, files, command) instead of running the agent")
    p.add_argument("--json", action="store_true", help="with --print: print JSON")


def add_parsers(sub) -> None:  # type: ignore[no-untyped-def]
    p = sub.add_parser("launch", help="run a coding agent (claude, codex, opencode) against the daemon",
                       description=LAUNCH_HELP)
    p.add_argument("agent", choices=AGENTS, metavar="AGENT", help="claude | codex | opencode")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="[MODEL] [OPTIONS] [-- ARGS]",
                   help="a model name (`bostudio ls`) or GGUF path; after `--`, arguments for the agent")
    _options(p)
    p.set_defaults(func=cmd_launch)


def split_rest(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """MODEL, the options after AGENT (into `args`) and the agent's arguments (after `--`)."""
    head, tail = list(args.rest), list(getattr(args, "agent_args", []))  # ARGS: cut off by cli.parse_args
    p = argparse.ArgumentParser(prog="bostudio launch AGENT", add_help=False)
    p.add_argument("model", nargs="?")
    _options(p)
    parsed = p.parse_args(head)
    for k in ("ctx", "port", "max_output", "instructions"):
        if getattr(parsed, k) is not None:
            setattr(args, k, getattr(parsed, k))
    args.print_only = args.print_only or parsed.print_only
    args.json = args.json or parsed.json
    return parsed.model, tail


def cmd_launch(args: argparse.Namespace) -> int:
    from bostudio.agents.run import exec_agent, first_turn_note, prepare
    from bostudio.errors import BostudioError

    model, user_args = split_rest(args)
    if not args.print_only and shutil.which(BINARIES[args.agent]) is None:
        pkg, ver = PINNED[args.agent]
        raise BostudioError(f"{BINARIES[args.agent]} is not installed (bostudio launches it, it does not install "
                            f"it)", f"install it with: npm install -g {pkg}@{ver}")
    cfg, inst = prepare(args.agent, model, ctx=args.ctx, port=args.port, max_output=args.max_output,
                        instructions=args.instructions or "auto")
    if args.print_only:
        data = dict(cfg.to_json(), model=inst["model"], ctx=inst["ctx"],
                    command=[cfg.binary, *cfg.args, *user_args])
        if args.json:
            print(json.dumps(data, indent=2))
            return 0
        print(f"# bostudio launch {args.agent}: {inst['model']}, {inst['ctx']} tokens of context")
        for k, v in cfg.env.items():
            print(f"export {k}={shlex.quote(v)}")
        for path, content in cfg.files.items():
            print(f"# file {path}:")
            print("".join(f"#   {line}\n" for line in content.splitlines()), end="")
        print("".join(f"# {note}\n" for note in cfg.notes), end="")
        print(shlex.join([cfg.binary, *cfg.args, *user_args]))
        print(f"# not installed? npm install -g {cfg.npm_package}")
        return 0
    for note in cfg.notes:
        if note.startswith("!"):  # a context too small for the agent: say so before it starts
            print(f"bostudio: {note[2:]}", file=sys.stderr)
    print(first_turn_note(cfg, inst), file=sys.stderr, flush=True)  # the slow first turn, and where to watch it
    exec_agent(cfg, user_args)
    return 0  # not reached: exec replaces this process
