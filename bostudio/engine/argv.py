"""LaunchSpec → llama-server argv, checked against what the probed binary supports. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bostudio.errors import EngineError
from bostudio.gguf.template import TemplateChoice
from bostudio.speculation import Speculator


@dataclass(frozen=True)
class LaunchSpec:
    model: Path
    alias: str
    port: int
    host: str = "127.0.0.1"
    ctx: int = 4096
    speculator: Speculator = field(default_factory=lambda: Speculator("none"))
    api_key: str | None = None
    n_parallel: int | None = None  # None: llama-server's auto (4 slots, unified KV)
    metrics: bool = True
    verbosity: int | None = None  # -lv; 4 shows memory sizes and spec statistics
    extra_args: tuple[str, ...] = ()  # planner-chosen args (-ngl, -ctk, ...), checked like the rest
    chat_template: TemplateChoice | None = None  # None or the GGUF's own: no template flags (gguf/template.py)
    rpc: str | None = None  # RPC workers, HOST:PORT,... (their devices are RPC0.. in -dev/-ts/-devd)


def build_argv(server: Path, flags: frozenset[str], spec: LaunchSpec) -> list[str]:
    """The argv for `spec`. Raises EngineError when the binary lacks an option the spec needs."""
    # --rpc first: it registers the RPC devices that -dev and -devd name later in the argv
    argv = [str(server), *(["--rpc", spec.rpc] if spec.rpc else []), "-m", str(spec.model), "--alias", spec.alias,
            "--host", spec.host, "--port", str(spec.port), "-c", str(spec.ctx)]
    if spec.n_parallel is not None:
        argv += ["-np", str(spec.n_parallel)]
    if spec.metrics:
        argv.append("--metrics")
    if spec.api_key:
        argv += ["--api-key", spec.api_key]
    if spec.verbosity is not None:
        argv += ["-lv", str(spec.verbosity)]
    sp = spec.speculator
    if sp.kind == "none":
        # Explicit: also stops llama.cpp from inferring a type from the GGUF (reference 1.2).
        argv += ["--spec-type", "none"] if "--spec-type" in flags else []
    else:
        argv += ["--spec-type", ",".join(sp.spec_types)]
        if sp.draft is not None:
            argv += ["-md", str(sp.draft)]
        if sp.n_max is not None:
            argv += ["--spec-draft-n-max", str(sp.n_max)]
        if sp.n_min is not None:
            argv += ["--spec-draft-n-min", str(sp.n_min)]
        if sp.p_min is not None:
            argv += ["--spec-draft-p-min", f"{sp.p_min:g}"]
        if sp.cache_type_k_draft is not None:
            argv += ["-ctkd", sp.cache_type_k_draft]
        if sp.cache_type_v_draft is not None:
            argv += ["-ctvd", sp.cache_type_v_draft]
        for variant, name, value in sp.ngram_params:
            argv += [f"--spec-{variant}-{name.replace('_', '-')}", str(value)]
    if spec.chat_template is not None:
        argv += list(spec.chat_template.argv())
    argv += list(spec.extra_args)
    used = [a for a in argv[1:] if a.startswith("-") and not _is_number(a)]
    missing = sorted({a for a in used if a not in flags})
    if missing:
        raise EngineError(f"{server} does not support {', '.join(missing)}",
                          "build the pinned engine with `bostudio engine build`, or pass a newer --engine")
    return argv


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
