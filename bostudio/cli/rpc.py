"""`bostudio rpc serve|install`: lend this machine's devices to another's llama-server."""

from __future__ import annotations

import argparse

from bostudio.cli.options import add_engine
from bostudio.cli.output import report_unit


def _rpc_options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from bostudio.rpc.serve import RpcServeOptions
    from bostudio.rpc.workers import _check_port

    return RpcServeOptions(host=args.host, port=_check_port(args.port, "--port"), devices=args.device,
                           threads=args.threads, cache=args.cache, allow_network=args.allow_network,
                           engine=args.engine)


def cmd_rpc_serve(args: argparse.Namespace) -> int:
    from bostudio.rpc.serve import run_rpc_serve

    return run_rpc_serve(_rpc_options(args))


def cmd_rpc_install(args: argparse.Namespace) -> int:
    from bostudio.rpc.serve import install_rpc_unit

    return report_unit(*install_rpc_unit(_rpc_options(args), write=not args.print), args.print)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """rpc serve/install: lend this machine's devices to another's llama-server."""
    p = sub.add_parser("rpc", help="share this machine's devices with another machine's llama-server (RPC)",
                       description="Run ggml's rpc-server (built with the engine) so that `bostudio up/plan/"
                                   "daemon --rpc HOST:PORT` on another machine can put layers on this "
                                   "machine's devices. The RPC protocol has no authentication and no "
                                   "encryption: it binds 127.0.0.1 unless --allow-network is given.")
    rsub = p.add_subparsers(dest="rpc_command", metavar="ACTION", required=True)
    rpc_common = argparse.ArgumentParser(add_help=False)
    rpc_common.add_argument("--host", default="127.0.0.1", metavar="H",
                            help="address to bind (default 127.0.0.1; any other needs --allow-network)")
    rpc_common.add_argument("--port", default=50052, metavar="P", help="port (default 50052)")
    rpc_common.add_argument("--device", default=None, metavar="NAMES",
                            help="only these devices, comma-separated as `engine list` names them (default: all)")
    rpc_common.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for the CPU device")
    rpc_common.add_argument("--cache", action="store_true",
                            help="keep received tensors in a local file cache (faster reloads of the same model)")
    rpc_common.add_argument("--allow-network", action="store_true",
                            help="allow a non-loopback --host: anyone who reaches the port can use this "
                                 "machine; use a trusted LAN or an SSH tunnel")
    add_engine(rpc_common, "llama-server whose ggml-rpc-server to run (default: the chosen engine)")
    r = rsub.add_parser("serve", parents=[rpc_common], help="run rpc-server in the foreground",
                        description="Run ggml-rpc-server until Ctrl-C / SIGTERM. This build's rpc-server has "
                                    "no memory cap: give the main machine a budget with [[rpc]] budget_mib.")
    r.set_defaults(func=cmd_rpc_serve)
    r = rsub.add_parser("install", parents=[rpc_common], help="write a systemd user unit that runs rpc serve",
                        description="Write ~/.config/systemd/user/bostudio-rpc.service running `bostudio rpc "
                                    "serve` with these options at login.")
    r.add_argument("--print", action="store_true", help="print the unit instead of writing it")
    r.set_defaults(func=cmd_rpc_install)
