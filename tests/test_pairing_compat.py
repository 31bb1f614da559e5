"""llama.cpp's draft-simple compatibility rules on synthetic GGUF pairs: one rule per row, passing and failing;
and the tokenization probe that catches what those rules let through (a different pre-tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bostudio.gguf import describe
from bostudio.pairing.core.compat import check_compatibility
from bostudio.pairing.edge.probe import compare_ids, probe_tokenization
from bostudio.gguf.synth import VOCAB, bpe_vocab, vocab_model

BASE = dict(tokens=VOCAB)


def changed(i: int, text: str) -> list[str]:
    v = list(VOCAB)
    v[i] = text
    return v


# name, target kwargs, draft kwargs, compatible, the rule broken (None: none), words the explanation must use
CASES = [
    ("identical", {}, {}, True, None, ()),
    ("vocab type: both SPM", {}, {"tokenizer": "llama"}, True, None, ()),
    ("vocab type: SPM vs BPE", {}, {"tokenizer": "gpt2", "merges": [], "add_bos": True}, False, "vocab-type", ("SPM", "BPE")),
    ("BOS: both add it, same id", {"add_bos": True}, {"add_bos": True}, True, None, ()),
    ("BOS: only the target adds it", {"add_bos": True}, {"add_bos": False}, False, "bos", ("adds a BOS",)),
    ("BOS: both add it, ids differ", {"add_bos": True}, {"add_bos": True, "bos": 3}, False, "bos", ("target 1", "draft 3")),
    ("BOS: ids differ, neither adds it", {"add_bos": False}, {"add_bos": False, "bos": 3}, True, None, ()),
    ("EOS: both add it, ids differ", {"add_eos": True}, {"add_eos": True, "eos": 3}, False, "eos", ("target 2", "draft 3")),
    ("EOS: only the draft adds it", {"add_eos": False}, {"add_eos": True}, False, "eos", ("does not add",)),
    ("EOS: ids differ, neither adds it", {"add_eos": False}, {"add_eos": False, "eos": 3}, True, None, ()),
    ("vocab size: 128 more", {}, {"tokens": VOCAB + [f"x{i}" for i in range(128)]}, True, None, ()),
    ("vocab size: 129 more", {}, {"tokens": VOCAB + [f"x{i}" for i in range(129)]}, False, "vocab-size",
     ("differ by 129", "allows 128")),
    ("token text: id 7 differs", {}, {"tokens": changed(7, "other")}, False, "token-text",
     ("token 7", "'tok4'", "'other'")),
    ("token text: id 4 differs (ids 0-4 are not checked)", {}, {"tokens": changed(4, "other")}, True, None, ()),
    ("pre-tokenizer differs: a warning, not a refusal", {"pre": "default"}, {"pre": "llama3"}, True,
     "pre-tokenizer", ("default", "llama3", "acceptance")),
]


@pytest.mark.parametrize("name, target_kw, draft_kw, compatible, rule, words", CASES, ids=[c[0] for c in CASES])
def test_draft_simple_rules(tmp_path: Path, name: str, target_kw: dict, draft_kw: dict, compatible: bool,
                            rule: str | None, words: tuple[str, ...]) -> None:
    target = describe(vocab_model(tmp_path / "target.gguf", **{**BASE, **target_kw}))
    draft = describe(vocab_model(tmp_path / "draft.gguf", **{**BASE, **draft_kw}))
    report = check_compatibility(target, draft)
    assert report.compatible is compatible, report.summary()
    assert [m.rule for m in report.mismatches] == ([rule] if rule else [])
    for word in words:
        assert word in report.summary()


def test_same_fingerprint_needs_no_text_comparison(tmp_path: Path) -> None:
    a = describe(vocab_model(tmp_path / "a.gguf", tokens=VOCAB))
    b = describe(vocab_model(tmp_path / "b.gguf", tokens=VOCAB, n_layer=2))
    assert check_compatibility(a, b).checked == "same tokenizer fingerprint"
    c = describe(vocab_model(tmp_path / "c.gguf", tokens=changed(1, "<bos>")))
    assert check_compatibility(a, c).checked == "token texts compared"
    assert check_compatibility(a, c).compatible  # id 1 is below the checked range


@pytest.fixture(scope="module")
def bpe_pair(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("bpe")
    tokens, merges = bpe_vocab()
    end = len(tokens) - 1
    kw = dict(tokenizer="gpt2", merges=merges, bos=end, eos=end, token_types=[1] * end + [3])
    # gpt-2 keeps runs of digits together (so the two-digit merges apply), qwen2 splits every digit
    return (vocab_model(tmp / "gpt2.gguf", tokens, pre="gpt-2", **kw),
            vocab_model(tmp / "qwen2.gguf", tokens, pre="qwen2", **kw))


def test_probe_finds_a_pre_tokenizer_difference_the_rules_let_through(bpe_pair) -> None:
    a, b = bpe_pair
    report = check_compatibility(describe(a), describe(b))
    assert report.compatible and [m.rule for m in report.mismatches] == ["pre-tokenizer"]
    result = probe_tokenization(a, b)
    assert not result.error
    assert not result.ok
    assert 0 < result.differing < result.texts  # the texts with numbers differ, plain prose does not
    assert "splits differently" in result.first


def test_probe_of_identical_tokenizers_is_clean(bpe_pair) -> None:
    a, _ = bpe_pair
    result = probe_tokenization(a, a)
    assert result.ok and result.differing == 0 and not result.error


def test_probe_failure_is_a_result_not_a_crash(tmp_path: Path, bpe_pair) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    result = probe_tokenization(bpe_pair[0], bad)
    assert result.error and not result.ok


def test_compare_ids() -> None:
    corpus = ("a", "b")
    assert compare_ids([[1, 2], [3]], [[1, 2], [3]], corpus).ok
    r = compare_ids([[1, 2, 3], [3]], [[1, 5, 3], [3]], corpus)
    assert r.differing == 1 and "from token 1" in r.first
