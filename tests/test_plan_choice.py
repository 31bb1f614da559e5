"""One choice everywhere: `bostudio plan`, `bostudio pair`, `bostudio up` (bostudio.launch) and the
daemon (launching.decide_child) pick the same speculator, because all of them ask pairing.edge.pair.choose.
Checked over four kinds of model: the embedded Gemma, a synthetic NextN (MTP) model, a target whose draft
the user's pairings.toml names, and a model with no candidate of its own (no MTP head, no draft)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bostudio.cli import main
from bostudio.daemon.supervise.launching import decide_child
from bostudio.gguf import describe
from bostudio.launch import LaunchIntent, gather_and_decide
from bostudio.pairing.edge.fetch import pair_model
from bostudio.pairing.edge.pair import record_self_draft
from bostudio.speculation import SpecRequest
from bostudio.gguf.synth import tiny_glm4moe_mtp, tiny_llama


@pytest.fixture(scope="module")
def models(gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("plan-choice")
    for d in ("targets", "drafts", "nextn", "plain"):
        (tmp / d).mkdir()
    target = tiny_llama(tmp / "targets" / "paired-target.gguf", n_layer=4)
    draft = tiny_llama(tmp / "drafts" / "paired-draft.gguf", n_layer=1)
    table = tmp / "config" / "bostudio" / "pairings.toml"
    assert record_self_draft(describe(target), draft, "Q2_K", table)
    return {"embedded": gemma_gguf, "nextn": tiny_glm4moe_mtp(tmp / "nextn" / "glm-mtp.gguf"),
            "paired": target, "draft": draft, "plain": tiny_llama(tmp / "plain" / "plain.gguf", n_layer=2),
            "config": tmp / "config"}


@pytest.mark.parametrize("kind, expect", [("embedded", None), ("nextn", "draft-mtp"),
                                          ("paired", "draft-simple"), ("plain", "ngram-mod")])
def test_plan_pair_up_and_daemon_choose_the_same_speculator(kind: str, expect: str | None, models, engine,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(models["config"]))
    path = models[kind]
    info = describe(path)
    ctx = info.n_ctx_train

    paired = pair_model(path, engine, SpecRequest("auto"), ctx=ctx, probe=False).selection.speculator
    up = gather_and_decide(info, engine, LaunchIntent(spec="auto")).plan.with_spec
    daemon = decide_child(info, engine, "auto", None).plan.with_spec
    assert main(["plan", str(path), "--json"]) in (0, 1)
    planned = json.loads(capsys.readouterr().out)

    assert up is not None and daemon is not None
    assert planned["speculation"] == paired.label == up.speculator.label == daemon.speculator.label
    assert planned["reason"] == paired.reason == up.speculator.reason == daemon.speculator.reason
    draft = str(paired.draft) if paired.draft else None
    assert planned["draft"] == draft and (str(up.speculator.draft) if up.speculator.draft else None) == draft
    assert planned["with_speculation"]["spec_types"] == list(paired.spec_types)
    if expect is not None:  # the kinds differ, so the agreement above is not one default agreeing with itself
        assert expect in paired.spec_types
    if kind == "paired":
        assert paired.draft is not None and Path(paired.draft).resolve() == models["draft"].resolve()
