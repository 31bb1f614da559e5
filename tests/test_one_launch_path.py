"""One launch path: `bostudio up`, `bostudio plan`, the daemon (a child's load and the plans route the TUI's
plan view reads) and bench state only what was asked; everything about the model itself (its kind, its
template, its flags, its paired drafter) is gathered from its header by bostudio.launch. So for a chat
model, an embedding model and a model with a drafter from the pairing table, they run the same llama-server
argv, apart from port, alias, key and paths. Pure decisions on tiny GGUF headers: nothing is started."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bostudio.bench.runner import Bench, BenchConfig, bench_decision, resolve_config
from bostudio.catalog.resolve import model_name
from bostudio.cli import main
from bostudio.daemon.http import plans
from bostudio.daemon.supervise import supervisor as sv
from bostudio.daemon.supervise.events import EventBus
from bostudio.daemon.supervise.instance import Instance, ModelConfig
from bostudio.daemon.supervise.launching import decide_child
from bostudio.daemon.supervise.lifecycle import READY, Life
from bostudio.planner.fit import Use
from bostudio.gguf import describe
from bostudio.pairing.edge.pair import record_self_draft
from bostudio.speculation import Speculator
from bostudio.up import UpOptions, prepare_launch
from tests.argv_util import comparable
from bostudio.gguf.synth import tiny_embedder, tiny_llama
from tests.netutil import free_port

# The speculator's own flags (engine/argv.py writes them from the chosen Speculator).
SPEC_FLAGS = ("--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min")


def spec_flags(argv: list[str]) -> dict[str, str]:
    out = {f: argv[argv.index(f) + 1] for f in SPEC_FLAGS if f in argv}
    if "-md" in argv:
        out["-md"] = Path(argv[argv.index("-md") + 1]).name
    return out


def plan_argv(model: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["plan", str(model), "--json", *args]) in (0, 1)
    return json.loads(capsys.readouterr().out)["argv"]


def daemon_argvs(model: Path, engine) -> tuple[list[str], list[str]]:  # type: ignore[no-untyped-def]
    """(a child's load, the plans route) for `model` under the default model config, prompt reuse off (as
    `up` runs: no prompt store)."""
    sup = sv.Supervisor(sv.SupervisorOptions(prompt_reuse=False), EventBus())
    sup._engine = engine
    name = model_name(model)
    sup.configs[name] = cfg = ModelConfig(name, model, None, "auto")
    # what EffectsRunner.launch_once decides for it, nothing else resident
    load = decide_child(describe(model), engine, cfg.spec, cfg.ctx, cfg.cache_type,
                           workload=cfg.resolved_workload(), devices=sup.planning_devices(engine, name),
                           children=1).argv(port=1234, alias=name)
    return load, plans.plan_for(sup, name)["argv"]


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A chat model, an embedding model, and a model whose pairing table entry names a drafter."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for d in ("chat", "embed", "target", "draft"):
        (tmp_path / d).mkdir()
    target = tiny_llama(tmp_path / "target" / "paired-target.gguf", n_layer=4)
    draft = tiny_llama(tmp_path / "draft" / "paired-draft.gguf", n_layer=1)
    assert record_self_draft(describe(target), draft, "Q2_K", tmp_path / "config" / "bostudio" / "pairings.toml")
    return {"chat": tiny_llama(tmp_path / "chat" / "tiny-chat.gguf", chat_template="{{ messages }}"),
            "embedding": tiny_embedder(tmp_path / "embed" / "tiny-embed.gguf"),
            "drafter": target}


@pytest.mark.parametrize("kind", ["chat", "embedding", "drafter"])
def test_up_plan_the_daemon_and_bench_run_the_same_argv(kind: str, models: dict[str, Path], engine,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    model = models[kind]
    up = prepare_launch(UpOptions(model=str(model), port=free_port(), pull="never"), note=lambda _: None).argv
    planned = plan_argv(model, capsys=capsys)
    load, view = daemon_argvs(model, engine)
    assert comparable(up) == comparable(planned) == comparable(load) == comparable(view)
    if kind == "embedding":  # the kind comes from the header, whoever launches it
        assert up[up.index("--embeddings"):up.index("--embeddings") + 3] == ["--embeddings", "--pooling", "mean"]
        assert up[up.index("--spec-type") + 1] == "none" and "--chat-template-file" not in up
    else:
        assert "--embeddings" not in up
    if kind == "drafter":  # the pairing table's drafter, chosen alike by all of them
        assert spec_flags(up)["-md"] == "paired-draft.gguf" and "draft-simple" in spec_flags(up)["--spec-type"]

    # bench: every side runs the baseline's memory plan (one slot, speculation off) with its own speculator
    info = describe(model)
    ctx = 1024
    auto = resolve_config("auto", info, engine, ctx, lambda _: None)
    sides = [BenchConfig("off", Speculator("none", reason="baseline")), auto]
    bench = Bench(info, engine, sides, ctx, lambda _: None, decision=bench_decision(info, engine, ctx))
    off_side, auto_side = (bench.argv(c, 1) for c in sides)
    assert comparable(off_side) == comparable(plan_argv(model, "--spec", "off", "--parallel", "1", "--ctx",
                                                        str(ctx), capsys=capsys))
    assert ("--embeddings" in off_side) == (kind == "embedding")
    if kind == "drafter":  # auto@code on the bench picks what `up` runs
        assert spec_flags(auto_side) == spec_flags(up)


def test_the_plans_route_shows_the_threads_and_draft_length_the_load_runs(models: dict[str, Path], engine,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The TUI's plan view of a model beside another resident child, after the acceptance check settled on a
    draft length: the -t/-tb split between the two children and that length, as the load runs them."""
    from bostudio.hardware.device import GIB, Device, ProbeResult

    host = Device("cpu", "cpu", "host", 0, 64 * GIB, free_bytes=60 * GIB, cores=8)
    monkeypatch.setattr(sv, "discover_devices", lambda **_: ProbeResult((host,)))
    model = models["drafter"]
    sup = sv.Supervisor(sv.SupervisorOptions(prompt_reuse=False), EventBus())
    sup._engine = engine
    name = model_name(model)
    sup.configs[name] = cfg = ModelConfig(name, model, None, "auto", draft_len=3,
                                             draft_len_reason="acceptance 40% at 8")
    other = Instance(ModelConfig("other", Path("/m/other.gguf"), None, "auto"), life=Life("other", state=READY))
    # What planning_devices reads of a resident child's Decision: its total and its bytes per device.
    chosen = SimpleNamespace(uses=[Use("CPU", "weights", GIB)])
    other.decision = SimpleNamespace(bytes=GIB, plan=SimpleNamespace(chosen=chosen))  # type: ignore[assignment]
    sup.instances["other"] = other
    view = plans.plan_for(sup, name)["argv"]
    # what EffectsRunner.launch_once decides for it with `other` resident (it asks the same two helpers)
    assert (sup.children_beside(name), cfg.settled_draft_len()) == (1, (3, cfg.draft_len_reason))
    load = decide_child(describe(model), engine, cfg.spec, cfg.ctx, cfg.cache_type,
                           workload=cfg.resolved_workload(), devices=sup.planning_devices(engine, name),
                           children=2, draft_len=(3, cfg.draft_len_reason)).argv(port=1234, alias=name)
    assert comparable(view) == comparable(load)
    assert (view[view.index("-t") + 1], view[view.index("-tb") + 1]) == ("3", "3")  # 8 cores - 2 headroom, halved
    assert view[view.index("--spec-draft-n-max") + 1] == "3"


# llama-server's launch flags that bostudio writes ("-c" is left out: `python -c` shares it).
LAUNCH_FLAGS = {"-ngl", "-np", "-kvu", "-ctk", "-ctv", "-fit", "-fa", "-dev", "-ts", "-ot", "-ngld", "-devd", "-ctkd",
                "-ctvd", "-t", "-tb", "-cram", "--swa-full", "--embeddings", "--pooling", "--reranking", "--jinja",
                "--no-jinja", "--chat-template-file", "--chat-template", "--reverse-prompt", "--spec-type", "-md",
                "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min", "--slot-save-path", "-lv",
                "--metrics", "--alias", "--cache-ram"}
# Where they may be written: the launch decision and the argv builder; engine discovery reads them from
# `llama-server --help` (what the binary supports) and writes none.
FLAG_HOMES = ("launch/", "engine/argv.py", "engine/discover.py")


def test_launch_flags_are_written_only_by_the_launch_decision_and_the_argv_builder() -> None:
    import ast

    root = Path(__file__).resolve().parent.parent / "bostudio"
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(FLAG_HOMES):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in LAUNCH_FLAGS:
                found.append(f"bostudio/{rel}:{node.lineno}: {node.value}")
    assert not found, "llama-server flags written outside bostudio/launch and engine/argv.py:\n" + "\n".join(found)
