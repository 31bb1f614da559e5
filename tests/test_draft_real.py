"""The real pair end to end: `bostudio up` launches the Qwen2.5-Coder 1.5B with its 0.5B as a draft-simple
draft, and the verification probe sees it draft and accept tokens."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

import tests.test_up as up_tests
from tests.netutil import free_port
from tests.test_up import Up


def test_draft_simple_launch_of_the_real_pair_drafts_and_accepts(engine, tmp_state: Path, qwen_pair: tuple[Path, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = qwen_pair
    monkeypatch.setattr(up_tests, "READY_TIMEOUT_S", 600)  # two models at -t 1 on a busy 2-core machine
    up = Up([str(target), "--spec", f"draft:{draft}", "--ctx", "4096", "--port", str(free_port())],
            dict(os.environ))
    try:
        fields = up.wait_ready()
        # the probe (runtime.verify) drafted with the 0.5B and the 1.5B accepted some of it
        status = fields["speculation"]
        assert status.startswith("draft-simple - active: the probe drafted"), status
        m = re.search(r"drafted (\d+) tokens, (\d+) accepted", status)
        assert m, status
        drafted, accepted = int(m.group(1)), int(m.group(2))
        assert drafted > 0 and 0 < accepted <= drafted
        argv = " ".join(p for s in up.servers() for p in s.cmdline())
        assert "--spec-type draft-simple" in argv and f"-md {draft}" in argv
    finally:
        rc, err = up.stop(signal.SIGINT)
    assert rc == 0 and "Traceback" not in err, err


def test_pair_shows_what_tune_refused_and_by_how_much(engine, tmp_state: Path, tmp_path: Path) -> None:
    """A tuned profile decides the speculator; `pair` lists the configurations tune refused beside it, each with
    how much it lost against the choice."""
    import time as _time

    from bostudio.bench.tune import Candidate, Tally, choose_config, ranked_profile
    from bostudio.bench.measure import OFF, Sample
    from bostudio.pairing.edge.pair import choose
    from bostudio.profiles import ModelIdentity, Profile, engine_identity, save_profile
    from bostudio.gguf import describe
    from bostudio.speculation import SpecRequest, Speculator
    from bostudio.gguf.synth import tiny_llama

    model = tiny_llama(tmp_path / "m.gguf", n_layer=2)

    def tally(label: str, variant: str, ratio: float) -> Tally:
        t = Tally(Candidate(label, Speculator("ngram", (variant,), reason=f"tuned: {label}")))
        for i in range(6):
            t.samples.append(Sample("edit", None, label, i, 40 * ratio, None, 100, 40, 30))
            t.baseline.append(Sample("edit", None, OFF, i, 40.0, None, 100, 0, 0))
        return t

    pool = [tally("ngram-mod", "ngram-mod", 1.2), tally("ngram-simple", "ngram-simple", 1.1),
            tally("ngram-cache", "ngram-cache", 0.9)]
    choice = choose_config(pool)
    ident = ModelIdentity.of(model)
    save_profile(Profile(ident.name, ident.size, ident.mtime, engine_identity(engine), "edit",
                         choice.chosen.measured(), 40.0, choice.noise, choice.why, None, created=_time.time(),
                         ranking=ranked_profile(choice, pool)))
    sel, _ = choose(describe(model), SpecRequest("auto"), engine, workload="edit")
    assert sel.speculator.spec_types == ("ngram-mod",) and sel.considered[0].usable
    refused = {c.label: c.why for c in sel.considered[1:]}
    assert set(refused) == {"ngram-simple", "ngram-cache"}
    assert "1.10x of off, 8% slower than ngram-mod" in refused["ngram-simple"]
    assert "0.90x of off, 25% slower than ngram-mod" in refused["ngram-cache"]
    assert "not above off" in refused["ngram-cache"]


def test_tune_sweeps_the_draft_the_pairing_finds_even_when_auto_passes_it_over(engine, tmp_state: Path,
                                                                               qwen_pair: tuple[Path, Path]) -> None:
    from bostudio.cli.bench import _paired_draft

    target, draft = qwen_pair

    found = _paired_draft(target, engine)
    assert found is not None and found.resolve() == draft.resolve()
