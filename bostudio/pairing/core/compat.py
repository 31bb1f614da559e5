"""Can a draft model speculate for a target? llama.cpp's draft-simple rules, from metadata alone.

`common_speculative_are_compatible` (common/speculative.cpp:67-127, reference 1.9) refuses a pair whose
vocab types, BOS/EOS settings, vocabulary sizes (more than 128 apart) or token texts (from id 5 on) differ;
llama-server then runs *without* speculation and says so only in its log. This module applies the same rules
before launch and explains each mismatch: which token differs, by how much.

Beyond llama.cpp: a different pre-tokenizer (`tokenizer.ggml.pre`) with identical token texts passes
llama.cpp's check but splits text differently, so drafts are rejected more often. That is a warning here;
`bostudio.pairing.edge.probe` measures it by tokenizing a small corpus with both models.

Pure except that token texts are read lazily from the two (local) files when the fingerprints differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from bostudio.gguf import ModelInfo

SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128  # common/speculative.cpp:30
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5  # common/speculative.cpp:31
_TEXT_CHUNK = 8192

# tokenizer.ggml.model -> llama_vocab_type (include/llama.h:73-80); unknown names count as their own type
VOCAB_TYPES = {"no_vocab": "none", "none": "none", "llama": "SPM", "gpt2": "BPE", "bert": "WPM", "t5": "UGM",
               "rwkv": "RWKV", "plamo2": "PLaMo-2"}


@dataclass(frozen=True)
class Mismatch:
    """One rule a pair breaks. `fatal`: llama.cpp refuses the pair; otherwise it costs acceptance only."""

    rule: str  # vocab-type | bos | eos | vocab-size | token-text | pre-tokenizer | tokenization
    message: str
    fatal: bool = True


@dataclass(frozen=True)
class CompatReport:
    target: str
    draft: str
    mismatches: tuple[Mismatch, ...] = ()
    checked: str = ""  # how: "same tokenizer fingerprint" or "token texts compared"

    @property
    def compatible(self) -> bool:
        return not any(m.fatal for m in self.mismatches)

    @property
    def warnings(self) -> tuple[Mismatch, ...]:
        return tuple(m for m in self.mismatches if not m.fatal)

    def summary(self) -> str:
        if self.compatible and not self.mismatches:
            return f"compatible ({self.checked})"
        if self.compatible:
            return "compatible, but: " + "; ".join(m.message for m in self.warnings)
        return "incompatible: " + "; ".join(m.message for m in self.mismatches if m.fatal)

    def to_json(self) -> dict:
        return {"compatible": self.compatible, "checked": self.checked,
                "mismatches": [{"rule": m.rule, "message": m.message, "fatal": m.fatal} for m in self.mismatches]}


def _vocab_type(model: str | None) -> str:
    return VOCAB_TYPES.get(model or "none", model or "none")


def _first_text_difference(target: ModelInfo, draft: ModelInfo, stop: int) -> tuple[int, str, str] | None:
    for start in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, stop, _TEXT_CHUNK):
        end = min(stop, start + _TEXT_CHUNK)
        a = target.tokenizer.token_texts(start, end)
        b = draft.tokenizer.token_texts(start, end)
        if a != b:
            for i, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    return start + i, x, y
    return None


def check_compatibility(target: ModelInfo, draft: ModelInfo) -> CompatReport:
    """Apply llama.cpp's draft-simple rules (in its order) plus the pre-tokenizer warning."""
    t, d = target.tokenizer, draft.tokenizer
    out: list[Mismatch] = []
    tv, dv = _vocab_type(t.model), _vocab_type(d.model)
    if tv != dv:
        out.append(Mismatch("vocab-type", f"vocab types differ: the target's is {tv} ({t.model}), "
                                          f"the draft's {dv} ({d.model})"))
    for rule, name, t_add, d_add, t_id, d_id in (("bos", "BOS", t.add_bos, d.add_bos, t.bos_id, d.bos_id),
                                                 ("eos", "EOS", t.add_eos, d.add_eos, t.eos_id, d.eos_id)):
        if t_add != d_add:
            out.append(Mismatch(rule, f"the target {'adds' if t_add else 'does not add'} a {name} token, "
                                      f"the draft {'does' if d_add else 'does not'}"))
        elif t_add and t_id != d_id:
            out.append(Mismatch(rule, f"{name} token ids differ: target {t_id}, draft {d_id}"))
    diff = abs(t.vocab_size - d.vocab_size)
    if diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        out.append(Mismatch("vocab-size", f"vocabulary sizes differ by {diff} (target {t.vocab_size}, draft "
                                          f"{d.vocab_size}; llama.cpp allows {SPEC_VOCAB_MAX_SIZE_DIFFERENCE})"))
    if t.fingerprint and t.fingerprint == d.fingerprint:
        checked = "same tokenizer fingerprint"
    else:
        checked = "token texts compared"
        if tv == dv and diff <= SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
            first = _first_text_difference(target, draft, min(t.vocab_size, d.vocab_size))
            if first is not None:
                i, a, b = first
                out.append(Mismatch("token-text", f"token {i} differs: the target has {a!r}, the draft {b!r}"))
    if t.pre != d.pre and not out:
        out.append(Mismatch("pre-tokenizer",
                            f"pre-tokenizers differ (target {t.pre or 'default'}, draft {d.pre or 'default'}): "
                            "the same text can split into different tokens, which costs acceptance", fatal=False))
    return CompatReport(str(target.path), str(draft.path), tuple(out), checked)
