"""The tokenizer part of a GGUF header: model, ids, flags and a fingerprint of the vocabulary.

The fingerprint is a sha256 over the raw bytes of the tokenizer arrays (tokens, token_type, merges, scores):
two files with the same fingerprint tokenize identically, whatever else differs. The token list itself is
located, not parsed; `TokenizerInfo.token_texts()` reads texts from the file on demand.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from bostudio.gguf.reader import ArrayRef, Header, ValueType

FINGERPRINT_ARRAYS = ("tokens", "token_type", "merges", "scores")

# BPE pre-tokenizers for which llama.cpp adds a BOS token by default (llama-vocab.cpp, load()).
_BPE_ADD_BOS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                          "lfm2", "jina-v5-nano", "tekken", "chameleon", "gemma4"})
# tokenizer.ggml.model -> (add_bos, add_eos) llama.cpp assumes when the GGUF does not say
_DEFAULT_FLAGS = {"llama": (True, False), "bert": (True, False), "t5": (False, True), "rwkv": (False, False)}


@dataclass(frozen=True)
class TokenizerInfo:
    """What a draft/target pairing needs to know about a model's tokenizer."""

    model: str | None  # tokenizer.ggml.model: llama (SPM), gpt2 (BPE), bert, t5, rwkv, ...
    pre: str | None  # tokenizer.ggml.pre
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool  # as llama.cpp will apply it: the GGUF key, else llama.cpp's default for the model
    add_eos: bool
    fingerprint: str  # sha256 hex over the tokenizer arrays' raw bytes; "" when there are none
    tokens: ArrayRef | None = field(default=None, repr=False)

    def token_texts(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The texts of tokens [start, stop), read lazily from the (local) model file."""
        if self.tokens is None:
            return []
        return self.tokens.read_strings(start, stop)


def fingerprint(header: Header) -> str:
    """sha256 over (name, element type, count, raw-bytes sha256) of each tokenizer array present."""
    h = hashlib.sha256()
    found = False
    for name in FINGERPRINT_ARRAYS:
        ref = header.array_value(f"tokenizer.ggml.{name}")
        if ref is None:
            continue
        found = True
        h.update(f"{name}:{ref.elem_type.name}:{ref.count}:{ref.sha256};".encode())
    return h.hexdigest() if found else ""


def describe_tokenizer(header: Header, arch_vocab_size: int | None) -> TokenizerInfo:
    """Build TokenizerInfo from a header (pure)."""
    model = header.str_value("tokenizer.ggml.model")
    pre = header.str_value("tokenizer.ggml.pre")
    tokens = header.array_value("tokenizer.ggml.tokens", frozenset({ValueType.STRING}))
    if model == "gpt2":
        default_bos, default_eos = (pre in _BPE_ADD_BOS), False
    else:
        default_bos, default_eos = _DEFAULT_FLAGS.get(model or "", (False, False))
    add_bos = header.bool_value("tokenizer.ggml.add_bos_token")
    add_eos = header.bool_value("tokenizer.ggml.add_eos_token")
    if pre == "gemma4":
        add_bos = True  # llama.cpp forces it for Gemma 4
    vocab = tokens.count if tokens is not None else (arch_vocab_size or 0)
    return TokenizerInfo(
        model=model, pre=pre, vocab_size=vocab,
        bos_id=header.int_value("tokenizer.ggml.bos_token_id"),
        eos_id=header.int_value("tokenizer.ggml.eos_token_id"),
        unk_id=header.int_value("tokenizer.ggml.unknown_token_id"),
        pad_id=header.int_value("tokenizer.ggml.padding_token_id"),
        add_bos=default_bos if add_bos is None else add_bos,
        add_eos=default_eos if add_eos is None else add_eos,
        fingerprint=fingerprint(header),
        tokens=tokens,
    )
