"""What a draft model costs per step, its break-even acceptance, and which local models auto-detection offers
as drafts: pure, on synthetic headers and on the two real Qwen2.5-Coder headers (1.5B target, 0.5B draft)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bostudio.engine.discover import KNOWN_SPEC_TYPES
from bostudio.gguf import describe
from bostudio.hardware.device import Device
from bostudio.pairing.core.compat import check_compatibility
from bostudio.pairing.core.cost import (CPU_VERIFY_PER_TOKEN, MAX_STEP_COST, best_draft_length, draft_break_even,
                                   draft_step_cost, expected_tokens, weight_bytes_per_token)
from bostudio.pairing.core.select import DraftFile, select
from bostudio.pairing.core.table import PairingTable, load_table_file, shipped_table_path
from bostudio.speculation import SpecRequest
from bostudio.gguf.synth import tiny_llama

GB = 10**9


def _info(path: str, blocks: int, output: int, embd: int, params: int):  # type: ignore[no-untyped-def]
    """A synthetic header: a real one's fields with the byte counts replaced."""
    base = describe(_info.base)  # type: ignore[attr-defined]
    return replace(base, path=Path(path), layer_bytes=(blocks // 4,) * 4, output_bytes=output, token_embd_bytes=embd,
                   other_bytes=0, n_params=params, tensor_bytes=blocks + output + embd)


@pytest.fixture(scope="module", autouse=True)
def _base(tmp_path_factory) -> None:
    _info.base = tiny_llama(tmp_path_factory.mktemp("cost") / "base.gguf", n_layer=4)  # type: ignore[attr-defined]


def gpu(name: str, gib: int, bw: float, index: int) -> Device:
    return Device("nvidia", "cuda", name, index, gib * 2**30, gib * 2**30, bandwidth_gbs=bw)


# ------------------------------------------------------------------ weight bytes, step cost, break-even

@pytest.mark.parametrize("blocks,output,embd,read", [
    (800, 200, 100, 1000),  # untied: every block and the output projection; the embedding reads one row
    (800, 0, 100, 900),  # tied: the output is token_embd, read whole
])
def test_weight_bytes_per_token_count_blocks_and_the_output_layer(blocks, output, embd, read) -> None:
    assert weight_bytes_per_token(_info("/m.gguf", blocks, output, embd, 10)) == read


def test_step_cost_is_the_ratio_of_bytes_read_on_one_device() -> None:
    target, draft = _info("/t.gguf", 8 * GB, GB, GB, 9), _info("/d.gguf", 2 * GB, GB, GB, 3)
    c = draft_step_cost(target, draft)
    assert c.ratio == pytest.approx(3 / 9) and not c.bandwidth_known and c.draft_device == "CPU"
    assert "0.33 of a target step" in c.text() and "verifying adds 0.35" in c.text()
    # on a CPU every drafted token adds to the verification batch; it is in the break-even
    assert c.verify(4) == pytest.approx(1 + 4 * CPU_VERIFY_PER_TOKEN)
    assert c.break_even(2) == pytest.approx(draft_break_even(3 / 9, 2, c.verify(2) * (1 + 3 / 9)))


def test_step_cost_reads_the_bandwidth_of_the_device_each_runs_on() -> None:
    target, draft = _info("/t.gguf", 8 * GB, GB, GB, 9), _info("/d.gguf", 2 * GB, GB, GB, 3)
    slow, fast = gpu("12 GB", 12, 360.0, 0), gpu("24 GB", 24, 1000.0, 1)
    c = draft_step_cost(target, draft, (Device("cpu", "cpu", "host", total_bytes=64 * 2**30), slow, fast))
    assert c.bandwidth_known and c.draft_device == "nvidia1" and c.target_device == "nvidia0+nvidia1"
    # the target's bytes: a third at 360 GB/s, two thirds at 1000 GB/s; the draft's all at 1000 GB/s
    t_time = 9 * GB * (1 / 3 / 360 + 2 / 3 / 1000)
    assert c.ratio == pytest.approx(3 * GB / 1000 / t_time)
    assert c.verify(8) == 1.0  # a GPU verifies a short batch for the price of one step


def test_the_draft_length_is_planned_for_the_device() -> None:
    target, draft = _info("/t.gguf", 8 * GB, GB, GB, 9), _info("/d.gguf", 2 * GB, GB // 2, GB // 2, 3)
    cpu = draft_step_cost(target, draft)
    on_gpu = draft_step_cost(target, draft, (gpu("24 GB", 24, 1000.0, 0),))
    assert cpu.ratio == on_gpu.ratio
    n_cpu, n_gpu = best_draft_length(cpu), best_draft_length(on_gpu)
    assert n_cpu < n_gpu and n_cpu == 1 and 2 <= n_gpu <= 4
    # the planned length is the best at the planned acceptance: one more or one less commits less per step
    for step, n in ((cpu, n_cpu), (on_gpu, n_gpu)):
        rate = [step.best_speedup(k, 0.8) for k in (n - 1, n, n + 1) if k >= 1]
        assert max(rate) == rate[-2] or (n == 1 and max(rate) == rate[0])


@pytest.mark.parametrize("n", [1, 2, 3, 8, 16])
def test_expected_tokens_of_a_round(n: int) -> None:
    assert expected_tokens(0.0, n) == 1.0 and expected_tokens(1.0, n) == n + 1
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)


@pytest.mark.parametrize("cost", [0.05, 0.2, 0.4, 0.7])
@pytest.mark.parametrize("n", [1, 3, 8, 16])
def test_break_even_is_where_a_round_commits_what_it_costs(cost: float, n: int) -> None:
    a = draft_break_even(cost, n)
    assert a is not None and 0 < a < 1
    assert expected_tokens(a, n) == pytest.approx(n * cost + 1, rel=1e-6)
    # dearer steps, longer drafts and a dearer verification all need more acceptance
    assert draft_break_even(cost * 1.2, n) > a  # type: ignore[operator]
    assert draft_break_even(cost, n, verify=1.2) > a  # type: ignore[operator]
    if n > 1:
        assert draft_break_even(cost, n - 1) < a  # type: ignore[operator]


def test_one_token_drafts_break_even_at_the_step_cost_and_a_full_step_never_pays() -> None:
    assert draft_break_even(0.3, 1) == pytest.approx(0.3)
    assert draft_break_even(MAX_STEP_COST, 1) is None and draft_break_even(1.5, 8) is None


# ------------------------------------------------------------------ candidates: every smaller compatible model

def _drafts(target, *infos) -> list[DraftFile]:  # type: ignore[no-untyped-def]
    return [DraftFile(i, check_compatibility(target, i)) for i in infos]


def on_gpu(t, d):  # type: ignore[no-untyped-def]
    """A draft step priced on one 24 GB GPU, where a short verification batch costs one step."""
    return draft_step_cost(t, d, (gpu("24 GB", 24, 1000.0, 0),))


def test_a_compatible_model_with_a_third_of_the_params_is_a_candidate_with_its_cost() -> None:
    target = _info("/m/t.gguf", 8 * GB, GB, GB, 9 * GB)
    third = _info("/m/third.gguf", 2 * GB, GB, GB, 3 * GB)  # 33% of the parameters: once never listed
    sel = select(target, PairingTable(), SpecRequest("auto"), engine_spec_types=KNOWN_SPEC_TYPES,
                 drafts=_drafts(target, third), step_cost=on_gpu)
    c = sel.considered[0]
    assert c.origin == "auto-detected" and c.usable and sel.speculator.draft == third.path
    assert c.step is not None and c.step.ratio == pytest.approx(1 / 3)
    n = best_draft_length(c.step)
    assert sel.speculator.n_max == n and c.break_even == pytest.approx(c.step.break_even(n))
    assert "pays above" in c.cost_text() and f"at n_max {n}" in c.cost_text()
    assert c.to_json()["break_even_acceptance"] == pytest.approx(c.break_even, abs=1e-4)


def test_cheapest_step_first_and_the_dear_ones_say_why_they_are_passed_over() -> None:
    target = _info("/m/t.gguf", 8 * GB, GB, GB, 9 * GB)
    cheap = _info("/m/cheap.gguf", GB // 2, GB // 4, GB // 4, GB)
    dear = _info("/m/dear.gguf", 3 * GB, GB, GB, 4 * GB)  # 0.44 of a step: pays only at a high acceptance
    fat = _info("/m/fat.gguf", 9 * GB, 2 * GB, GB, 8 * GB)  # fewer parameters, more bytes read per step
    sel = select(target, PairingTable(), SpecRequest("auto"), engine_spec_types=KNOWN_SPEC_TYPES,
                 drafts=_drafts(target, fat, dear, cheap), step_cost=on_gpu)
    by = {c.draft.path.name: c for c in sel.considered if c.draft is not None}
    assert [c.draft.path.name for c in sel.considered if c.draft] == ["cheap.gguf", "dear.gguf", "fat.gguf"]
    assert sel.speculator.draft == cheap.path
    assert not by["dear.gguf"].usable and "pays only above 76% acceptance at n_max 3" in by["dear.gguf"].why
    assert not by["fat.gguf"].usable and "no acceptance makes it pay" in by["fat.gguf"].why


def test_a_larger_or_incompatible_model_is_no_candidate(tmp_path: Path) -> None:
    target = _info("/m/t.gguf", 8 * GB, GB, GB, 9 * GB)
    bigger = _info("/m/big.gguf", 16 * GB, GB, GB, 18 * GB)
    sel = select(target, PairingTable(), SpecRequest("auto"), engine_spec_types=KNOWN_SPEC_TYPES,
                 drafts=_drafts(target, bigger))
    assert sel.considered == () and sel.speculator.kind == "none"


# ------------------------------------------------------------------ the two real headers

@pytest.fixture(scope="module")
def qwen(qwen_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """The two real files, assembled and sha256-checked by the qwen_pair fixture (never skipped)."""
    return qwen_pair


def test_real_pair_costs_and_break_even(qwen) -> None:
    target, draft = (describe(p) for p in qwen)
    assert draft.output_bytes > 0  # the 0.5B keeps its own output layer (Q8_0 in this file)
    c = draft_step_cost(target, draft)
    # 1.5B: 789 MB of blocks + 191 MB output; 0.5B: 247 MB + 145 MB: 0.40 of a step, not its 35% of parameters
    assert 0.38 < c.ratio < 0.42 and c.draft_bytes == weight_bytes_per_token(draft)
    # the bound of memory alone (verification for the price of one step): 79% at n_max 8, 61% at 3
    assert 0.77 < draft_break_even(c.ratio, 8) < 0.81  # type: ignore[operator]
    assert 0.58 < draft_break_even(c.ratio, 3) < 0.63  # type: ignore[operator]
    # on a CPU core each drafted token adds 0.35 of a step to verification, and llama-server re-evaluates the
    # verified batch in the draft: a round of n costs n x 0.40 + (1 + 0.35 n) x 1.40 target steps, more than
    # the n + 1 tokens it can commit up to n = 3; even accepting everything, 8 tokens run at most 1.06x
    assert c.round_cost(8) == pytest.approx(8 * c.ratio + (1 + 8 * CPU_VERIFY_PER_TOKEN) * (1 + c.ratio))
    assert c.break_even(1) is None and c.break_even(3) is None and c.break_even(8) > 0.98  # type: ignore[operator]
    assert 1.05 < c.best_speedup(8) < 1.07 and c.best_speedup(8, 0.93) < 0.85
    assert best_draft_length(c) == 1


def test_real_pair_is_found_without_a_table_entry(qwen) -> None:
    target, draft = (describe(p) for p in qwen)
    sel = select(target, PairingTable(), SpecRequest("auto"), engine_spec_types=KNOWN_SPEC_TYPES,
                 drafts=_drafts(target, draft))
    c = sel.considered[0]
    assert c.origin == "auto-detected" and "same tokenizer fingerprint" in c.note and c.draft == draft
    # on this CPU it is listed with its cost and passed over for its break-even: tune measures it
    assert not c.usable and "it cannot pay: accepting every drafted token, it runs at most 0.87x" in c.why
    assert "verifying adds 0.35" in c.why and "re-evaluates each verified batch" in c.why
    assert c.break_even is None and "never pays" in c.cost_text()


def test_real_pair_on_a_gpu_is_chosen_with_a_longer_draft(qwen) -> None:
    target, draft = (describe(p) for p in qwen)
    devices = (gpu("24 GB", 24, 936.0, 0), Device("cpu", "cpu", "host", total_bytes=64 * 2**30))
    sel = select(target, PairingTable(), SpecRequest("auto"), engine_spec_types=KNOWN_SPEC_TYPES,
                 drafts=_drafts(target, draft), step_cost=lambda t, d: draft_step_cost(t, d, devices))
    assert sel.speculator.kind == "draft" and sel.speculator.draft == draft.path
    c = sel.considered[sel.chosen]  # type: ignore[index]
    assert sel.speculator.n_max == 3
    assert c.break_even is not None and 0.7 < c.break_even < 0.75


def test_real_pair_from_the_shipped_table_entry(qwen) -> None:
    target, draft = (describe(p) for p in qwen)
    sel = select(target, load_table_file(shipped_table_path()), SpecRequest("auto"),
                 engine_spec_types=KNOWN_SPEC_TYPES, drafts=_drafts(target, draft))
    c = sel.considered[0]
    assert c.origin.startswith("table entry 'qwen2.5-coder'") and c.draft == draft
    assert c.step is not None and c.hub.startswith("ggml-org/Qwen2.5-Coder-0.5B")
    # found by name, not fetched; on a CPU passed over for its break-even, so n-gram speculation runs
    assert not c.fetch and not c.usable and sel.speculator.kind == "ngram"
    assert [x.origin for x in sel.considered].count("auto-detected") == 0  # listed once, not again by auto


# ------------------------------------------------------------------ the draft on a GPU, planned

def test_plan_puts_the_draft_on_the_fastest_gpu_and_spreads_the_target(qwen, tmp_path: Path, capsys) -> None:
    import json

    from bostudio.cli import main

    f = tmp_path / "devices.json"
    f.write_text(json.dumps([
        {"vendor": "nvidia", "backend": "cuda", "name": "RTX 3060 12GB", "index": 0, "total_gib": 12,
         "bandwidth_gbs": 360.0},
        {"vendor": "nvidia", "backend": "cuda", "name": "RTX 3090 24GB", "index": 1, "total_gib": 24,
         "bandwidth_gbs": 936.0},
        {"vendor": "cpu", "backend": "cpu", "name": "host", "total_gib": 64}]))
    target, draft = qwen
    assert main(["plan", str(target), "--spec", f"draft:{draft}", "--devices-file", str(f), "--ctx", "32768",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    spec = out["with_speculation"]
    assert out["chosen"] == "draft" and spec["fits"]
    assert spec["draft_device"] == "nvidia1"  # the 24 GB card has the bandwidth: the draft runs there
    assert {s["device"] for s in spec["split"] if s["layers"] > 0} == {"nvidia0", "nvidia1"}  # the target spread
    kv = [u for u in spec["uses"] if u["component"] == "draft KV cache"]
    assert [u["device"] for u in kv] == ["nvidia1"] and kv[0]["bytes"] > 0
    assert out["spec_cost_tokens"] > 0  # the draft's memory priced in tokens of the target's context
    assert "-devd" in out["llama_args"] and out["llama_args"][out["llama_args"].index("-devd") + 1] == "nvidia1"
    step = out["draft_step"]
    assert step["bandwidth_known"] and step["draft_device"] == "nvidia1" and 0 < step["ratio"] < 0.4
    assert 0 < out["draft_break_even"] < 0.8
