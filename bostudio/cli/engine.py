"""`bostudio engine build|list`: the llama-server builds."""

from __future__ import annotations

import argparse
import sys

from bostudio.cli.options import json_flag
from bostudio.cli.output import print_json


def cmd_engine_build(args: argparse.Namespace) -> int:
    from bostudio.engine.build import build_engine

    eng = build_engine(args.backend, jobs=args.jobs, force=args.force, portable=args.portable or None,
                       log=lambda m: print(m, file=sys.stderr))
    print(eng.server)
    return 0


def cmd_engine_list(args: argparse.Namespace) -> int:
    from bostudio.engine.discover import choose_engine, discover_engines

    engines = discover_engines()
    chosen = choose_engine(engines) if engines else None
    if args.json:
        print_json([dict(e.to_json(), chosen=(e is chosen)) for e in engines])
        return 0
    if not engines:
        print("no llama-server found: run `bostudio engine build`, put one on PATH or set LLAMA_SERVER")
        return 1
    for e in engines:
        mark = "*" if e is chosen else " "
        devs = ", ".join(f"{d.name} ({d.total_mib} MiB{', software' if d.software else ''})"
                         for d in e.devices) or "CPU only"
        print(f"{mark} {e.path}")
        print(f"    source: {e.source}  version: {e.version} (build {e.build}, commit {e.commit})")
        print(f"    backends: {', '.join(e.backends) or 'unknown'}  devices: {devs}")
        print(f"    spec types: {', '.join(e.spec_types) or 'none'}")
        rpc = ("yes, rpc-server: " + str(e.rpc_server)) if e.has_rpc and e.rpc_server else \
            "yes (no rpc-server beside it)" if e.has_rpc else "no (rebuild with `bostudio engine build`)"
        print(f"    RPC workers: {rpc}")
        if e.problem:
            print(f"    unusable: {e.problem}")
        for note in e.notes():
            print(f"    note: {note}")
    print("* = the engine bostudio uses on this machine")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """engine build/list: the llama-server builds."""
    p = sub.add_parser("engine", help="build and list llama-server engines",
                       description="Build llama-server from the pinned llama.cpp source, or list the "
                                   "engines bostudio can use.")
    esub = p.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    from bostudio.engine.build import BACKENDS

    b = esub.add_parser("build", help="build llama-server for a backend (cached)",
                        description="Build llama-server, llama-quantize, llama-fit-params and ggml-rpc-server (RPC backend) from the "
                                    "llama.cpp source vendored in the pinned llama-cpp-python sdist. "
                                    "Cached under the XDG cache dir by commit, backend and flags: a "
                                    "second run returns at once. On a CPU with AMX it first checks that the "
                                    "compiler builds ggml's AMX kernels correctly, and leaves them out where "
                                    "it does not (docs/engine.md).")
    b.add_argument("--backend", choices=("auto", *BACKENDS), default="cpu",
                   help="GPU/CPU backend (default cpu; auto = the backend of this machine's GPU "
                        "when its toolkit is installed)")
    b.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel compile jobs (default: all cores)")
    b.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    b.add_argument("--portable", action="store_true",
                   help="build without -march=native (ggml's default instruction set: AVX2 on x86-64), "
                        "cached separately and ranked below the native build; also "
                        "BOSTUDIO_ENGINE_PORTABLE=1. Use it with LLAMA_SERVER=... or --engine")
    b.set_defaults(func=cmd_engine_build)
    b = esub.add_parser("list", parents=[json_flag()], help="list usable llama-server engines",
                        description="Show every llama-server bostudio can use (built ones, one on PATH, "
                                    "one named by LLAMA_SERVER) with version, backends, devices and the "
                                    "speculative types it supports; * marks the one it would choose.")
    b.set_defaults(func=cmd_engine_list)
