"""What would make a plan fit (the Plan screen's warning): one change at a time, each checked by the
planner itself. On the Gemma header and a synthetic 1400 MiB host, so nothing depends on this machine."""

from __future__ import annotations

from pathlib import Path

from bostudio.gguf import describe
from bostudio.hardware.device import MIB, Device
from bostudio.planner import NGRAM_SPEC, Intent, plan, what_would_fit


def test_a_plan_that_does_not_fit_gets_changes_that_do(gemma_gguf: Path) -> None:
    model = describe(gemma_gguf)
    host = (Device("cpu", "cpu", "host", 0, 1400 * MIB),)
    intent = Intent(ctx=32768)
    assert not plan(model, host, intent, NGRAM_SPEC).chosen.fits
    changes = what_would_fit(model, host, intent, NGRAM_SPEC)
    by = {c.change: c for c in changes}
    assert set(by) == {"a smaller context", "a q8_0 KV cache", "a q4_0 KV cache"}
    assert by["a smaller context"].option.n_ctx < 32768
    assert by["a q8_0 KV cache"].option.n_ctx == by["a q4_0 KV cache"].option.n_ctx == 32768
    assert by["a q4_0 KV cache"].option.total < by["a q8_0 KV cache"].option.total
    for c in changes:  # each suggestion is a plan the planner accepts as it stands
        again = plan(model, host, c.intent, c.option.speculator)
        assert again.chosen.fits and again.chosen.total == c.option.total


def test_nothing_is_suggested_when_nothing_fits(gemma_gguf: Path) -> None:
    model = describe(gemma_gguf)
    tiny = (Device("cpu", "cpu", "host", 0, 1024 * MIB),)  # all of it is the reserve
    assert what_would_fit(model, tiny, Intent(ctx=32768), NGRAM_SPEC) == []
