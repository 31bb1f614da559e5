"""Options more than one command takes, written once: the same flag, type, default and metavar everywhere;
each command keeps its own help text where its meaning differs."""

from __future__ import annotations

import argparse


RPC_HELP = ("RPC workers HOST:PORT[,HOST:PORT...] (machines running `bostudio rpc serve`) whose devices join "
            "this one's; default: the [[rpc]] tables of config.toml; `none`: no workers")


def json_flag() -> argparse.ArgumentParser:
    """The parent parser of every command whose --json means just "print JSON"."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print JSON")
    return parent


def model_or_default() -> argparse.ArgumentParser:
    """The parent parser of the commands that take one model and default to the embedded one (up, pair, bench,
    tune)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("model", nargs="?", default=None, metavar="MODEL",
                        help="a GGUF path or a model name `bostudio ls` shows (default: the embedded "
                             "Qwen2.5-Coder-1.5B-Instruct)")
    return parent


def add_flash_attn(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"),
                   help="llama-server's -fa, always passed (default auto: the plan chooses; off on a CPU alone, "
                        "where it slows prefill and decode, unless its memory costs context; on with a GPU or a "
                        "quantized V cache)")


def add_engine(p: argparse.ArgumentParser, help: str) -> None:
    """--engine PATH: the llama-server binary (default: the best one found)."""
    p.add_argument("--engine", default=None, metavar="PATH", help=help)


def add_stall_timeout(p: argparse.ArgumentParser, default: float | None) -> None:
    """--stall-timeout S: how long a loading llama-server may stay silent (`default` None: 120, see up)."""
    p.add_argument("--stall-timeout", type=float, default=default, metavar="S",
                   help="kill a loading llama-server silent for S seconds (default 120; a software GPU such as "
                        "lavapipe compiles its pipelines silently for minutes); one that prints progress is "
                        "never killed for slowness")


def add_rpc(p: argparse.ArgumentParser, also: str = "") -> None:
    """--rpc HOST:PORT,...: RPC workers whose devices join this machine's (`also`: what the command adds)."""
    p.add_argument("--rpc", default=None, metavar="HOST:PORT,...", help=RPC_HELP + also)


def add_pull(p: argparse.ArgumentParser, help: str, ask: bool = False) -> None:
    """--pull: may a drafter the pairing table names be downloaded from the hub (`ask` only where a person
    can answer)."""
    p.add_argument("--pull", choices=("ask", "always", "never") if ask else ("always", "never"), default=None,
                   help=help)


def add_ctx(p: argparse.ArgumentParser, help: str) -> None:
    """--ctx N: a context in tokens (default None: what the memory plan gives)."""
    p.add_argument("--ctx", type=int, default=None, metavar="N", help=help)


def add_spec(p: argparse.ArgumentParser, help: str, metavar: str = "MODE") -> None:
    """--spec: the speculator asked for (default auto)."""
    p.add_argument("--spec", default="auto", metavar=metavar, help=help)


def add_workload(p: argparse.ArgumentParser, help: str, metavar: str = "NAME") -> None:
    """--workload: whose tuned profile auto uses (default None: config.toml's [workload], else code)."""
    p.add_argument("--workload", default=None, metavar=metavar, help=help)


def add_cache_type(p: argparse.ArgumentParser, help: str, metavar: str = "TYPE") -> None:
    """--cache-type: the KV cache type for -ctk/-ctv (default f16)."""
    p.add_argument("--cache-type", default="f16", metavar=metavar, help=help)


def add_daemon_address(p: argparse.ArgumentParser, host_help: str, port_help: str, defaults: bool = True) -> None:
    """--host H --port P of the daemon (`defaults` False: None, for a daemon that may already run)."""
    from bostudio.daemon import DEFAULT_HOST, DEFAULT_PORT

    p.add_argument("--host", default=DEFAULT_HOST if defaults else None, metavar="H", help=host_help)
    p.add_argument("--port", type=int, default=DEFAULT_PORT if defaults else None, metavar="P", help=port_help)
