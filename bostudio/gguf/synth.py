"""Small synthetic GGUF files for the tests and the benchmarks (benchmarks/), written with gguf-py's GGUFWriter
(the reference writer).

`write_model(path, arch, kv, tensors)`: kv maps keys *without* the "{arch}." prefix when they start with
"." (".block_count" -> "llama.block_count"); ints are written as UINT32, floats FLOAT32, lists as arrays.
Tensors are F32 zeros of the given ggml shape (ne0 first) unless a ggml type name is given, or F32 values
when a numpy array is given.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

VOCAB = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(29)]


def write_model(path: Path, arch: str, kv: dict[str, object],
                tensors: dict[str, tuple[int, ...] | tuple[tuple[int, ...], str] | np.ndarray],
                vocab: list[str] | None = VOCAB, chat_template: str | None = None,
                split_max_tensors: int = 0) -> Path:
    """Write a GGUF with the given metadata and zero-filled (or given) tensors; return its path (for a split
    model, the path GGUFWriter derived the part names from)."""
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    for key, value in kv.items():
        full = f"{arch}{key}" if key.startswith(".") else key
        if isinstance(value, bool):
            w.add_bool(full, value)
        elif isinstance(value, int):
            w.add_uint32(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, (list, tuple)):
            w.add_array(full, list(value))
        else:
            raise TypeError(f"{key}: {value!r}")
    if vocab is not None:
        w.add_tokenizer_model("llama")
        w.add_token_list(vocab)
        w.add_token_scores([0.0] * len(vocab))
        w.add_token_types([1] * len(vocab))
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for name, spec in tensors.items():
        if isinstance(spec, np.ndarray):  # given values (numpy order: the last axis is ne0)
            w.add_tensor(name, spec.astype(np.float32))
            continue
        if spec and isinstance(spec[0], tuple):
            shape, type_name = spec  # type: ignore[misc]
        else:
            shape, type_name = spec, "F32"  # type: ignore[assignment]
        qtype = GGMLQuantizationType[type_name]
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, np.zeros(tuple(reversed(shape)), dtype=np.float32))
        else:
            from gguf.constants import GGML_QUANT_SIZES
            block, size = GGML_QUANT_SIZES[qtype]
            rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            raw = np.zeros((rows, shape[0] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=qtype)  # shape given in bytes per row
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def dense_layers(n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int,
                 first: int = 0) -> dict[str, tuple[int, ...]]:
    """Tensors of n_layer standard attention + SwiGLU blocks, numbered from `first`."""
    t: dict[str, tuple[int, ...]] = {}
    for i in range(first, first + n_layer):
        t[f"blk.{i}.attn_norm.weight"] = (n_embd,)
        t[f"blk.{i}.attn_q.weight"] = (n_embd, n_head * head_dim)
        t[f"blk.{i}.attn_k.weight"] = (n_embd, n_head_kv * head_dim)
        t[f"blk.{i}.attn_v.weight"] = (n_embd, n_head_kv * head_dim)
        t[f"blk.{i}.attn_output.weight"] = (n_head * head_dim, n_embd)
        t[f"blk.{i}.ffn_norm.weight"] = (n_embd,)
        t[f"blk.{i}.ffn_gate.weight"] = (n_embd, n_ff)
        t[f"blk.{i}.ffn_up.weight"] = (n_embd, n_ff)
        t[f"blk.{i}.ffn_down.weight"] = (n_ff, n_embd)
    return t


def tiny_llama(path: Path, n_layer: int = 2, chat_template: str | None = None,
               split_max_tensors: int = 0) -> Path:
    """A small llama: 32 tokens, n_embd 64, 4 heads x 16, 2 KV heads, untied output."""
    tensors: dict = {"token_embd.weight": (64, len(VOCAB)), "output_norm.weight": (64,),
                     "output.weight": (64, len(VOCAB))}
    tensors.update(dense_layers(n_layer, 64, 4, 2, 16, 128))
    kv = {".context_length": 2048, ".embedding_length": 64, ".block_count": n_layer,
          ".feed_forward_length": 128, ".attention.head_count": 4, ".attention.head_count_kv": 2,
          ".attention.layer_norm_rms_epsilon": 1e-5, ".rope.dimension_count": 16,
          ".rope.freq_base": 10000.0, "general.name": "tiny llama", "general.file_type": 0}
    return write_model(path, "llama", kv, tensors, chat_template=chat_template,
                       split_max_tensors=split_max_tensors)


def tiny_embedder(path: Path, pooling: int = 1) -> Path:
    """A tiny BERT-style header: an encoder with a pooling type (1 = mean, 2 = cls, 4 = rank)."""
    tensors: dict = {"token_embd.weight": (64, len(VOCAB)), "output_norm.weight": (64,)}
    tensors.update(dense_layers(2, 64, 4, 4, 16, 128))
    kv = {".context_length": 512, ".embedding_length": 64, ".block_count": 2, ".feed_forward_length": 128,
          ".attention.head_count": 4, ".attention.layer_norm_epsilon": 1e-12, ".pooling_type": pooling,
          ".attention.causal": False, "general.name": "tiny embedder", "general.file_type": 0}
    return write_model(path, "bert", kv, tensors)


def successor_weights(n_vocab: int, n_embd: int, first: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(token_embd, output) values for a model that, with every block's output at zero, predicts
    next(t) = the token after t in the cycle first..n_vocab-1 (never BOS/EOS): one-hot embeddings,
    and the output row of token j is the embedding of its predecessor."""
    assert n_vocab <= n_embd
    embd = np.eye(n_vocab, n_embd, dtype=np.float32)
    out = np.zeros((n_vocab, n_embd), dtype=np.float32)
    for t in range(n_vocab):
        nxt = first + (t - first + 1) % (n_vocab - first) if t >= first else first
        out[nxt] += embd[t]
    return embd, out


# An SPM vocabulary that can spell any text: byte-fallback tokens <0x00>..<0xFF> after <unk>, <s>, </s>.
BYTE_VOCAB = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
BYTE_VOCAB_TYPES = [2, 3, 3] + [6] * 256  # unknown, control, control, byte


def tiny_glm4moe_mtp(path: Path, n_layer: int = 2, vocab: list[str] | None = VOCAB,
                     token_types: list[int] | None = None, arch: str = "glm4moe") -> Path:
    """A small GLM-4.5-style model (`glm4moe`) with one NextN/MTP block, loadable with `--spec-type draft-mtp`.

    The trunk is dense (leading_dense_block_count = n_layer); the MTP block is the last block and, as
    llama.cpp's glm4moe MTP graph requires (src/models/glm4-moe.cpp), a MoE block with a shared expert.
    Attention and FFN outputs are zero, so the trunk predicts `successor_weights`' next token from the last
    token alone; the MTP head's eh_proj passes the (normed) embedding of the token it is given straight
    through, so it predicts the same function one step ahead: its drafts are the target's own choices.
    """
    n_vocab = len(vocab or VOCAB)
    n_embd = max(64, -(-n_vocab // 64) * 64)  # one-hot embeddings need n_embd >= n_vocab
    n_head, n_head_kv, n_ff, n_expert, n_ff_exp = 4, 2, 128, 2, 32
    head_dim = n_embd // n_head
    embd, out = successor_weights(n_vocab, n_embd)
    eh_proj = np.zeros((n_embd, 2 * n_embd), dtype=np.float32)
    eh_proj[:, :n_embd] = np.eye(n_embd)  # concat(enorm(embedding), hnorm(h)) -> the embedding part
    ones = np.ones(n_embd, dtype=np.float32)
    tensors: dict = {"token_embd.weight": embd, "output_norm.weight": ones, "output.weight": out}
    for i in range(n_layer + 1):
        tensors.update({
            f"blk.{i}.attn_norm.weight": (n_embd,),
            f"blk.{i}.attn_q.weight": (n_embd, n_head * head_dim),
            f"blk.{i}.attn_k.weight": (n_embd, n_head_kv * head_dim),
            f"blk.{i}.attn_v.weight": (n_embd, n_head_kv * head_dim),
            f"blk.{i}.attn_output.weight": (n_head * head_dim, n_embd),
            f"blk.{i}.post_attention_norm.weight": (n_embd,),
        })
        if i < n_layer:
            tensors.update({f"blk.{i}.ffn_gate.weight": (n_embd, n_ff), f"blk.{i}.ffn_up.weight": (n_embd, n_ff),
                            f"blk.{i}.ffn_down.weight": (n_ff, n_embd)})
        else:
            tensors.update({
                f"blk.{i}.ffn_gate_inp.weight": (n_embd, n_expert),
                f"blk.{i}.exp_probs_b.bias": (n_expert,),
                f"blk.{i}.ffn_gate_exps.weight": (n_embd, n_ff_exp, n_expert),
                f"blk.{i}.ffn_up_exps.weight": (n_embd, n_ff_exp, n_expert),
                f"blk.{i}.ffn_down_exps.weight": (n_ff_exp, n_embd, n_expert),
                f"blk.{i}.ffn_gate_shexp.weight": (n_embd, n_ff_exp),
                f"blk.{i}.ffn_up_shexp.weight": (n_embd, n_ff_exp),
                f"blk.{i}.ffn_down_shexp.weight": (n_ff_exp, n_embd),
                f"blk.{i}.nextn.eh_proj.weight": eh_proj,
                f"blk.{i}.nextn.enorm.weight": ones,
                f"blk.{i}.nextn.hnorm.weight": ones,
                f"blk.{i}.nextn.shared_head_norm.weight": ones,
            })
    kv = {".context_length": 2048, ".embedding_length": n_embd, ".block_count": n_layer + 1,
          ".nextn_predict_layers": 1, ".feed_forward_length": n_ff, ".attention.head_count": n_head,
          ".attention.head_count_kv": n_head_kv, ".attention.layer_norm_rms_epsilon": 1e-5,
          ".rope.dimension_count": head_dim, ".rope.freq_base": 10000.0, ".expert_count": n_expert,
          ".expert_used_count": 1, ".expert_shared_count": 1, ".expert_feed_forward_length": n_ff_exp,
          ".leading_dense_block_count": n_layer, "general.name": "tiny glm4moe mtp", "general.file_type": 0}
    if token_types is None:
        return write_model(path, arch, kv, tensors, vocab=vocab)
    kv.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": vocab, "tokenizer.ggml.token_type": token_types,
               "tokenizer.ggml.scores": [0.0] * n_vocab, "tokenizer.ggml.bos_token_id": 1,
               "tokenizer.ggml.eos_token_id": 2})
    return write_model(path, "glm4moe", kv, tensors, vocab=None)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: the 256 symbols byte-level BPE vocabularies start with."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def bpe_vocab() -> tuple[list[str], list[str]]:
    """(tokens, merges) of a small byte-level BPE vocabulary: the 256 byte symbols, every two-digit number
    (so pre-tokenizers that group digits and ones that split them tokenize differently), <|endoftext|>."""
    digits = [f"{a}{b}" for a in "0123456789" for b in "0123456789"]
    return _bytes_to_unicode() + digits + ["<|endoftext|>"], [f"{d[0]} {d[1]}" for d in digits]


def vocab_model(path: Path, tokens: list[str], *, tokenizer: str = "llama", pre: str | None = None,
                bos: int = 1, eos: int = 2, add_bos: bool | None = None, add_eos: bool | None = None,
                merges: list[str] | None = None, token_types: list[int] | None = None, n_layer: int = 1,
                arch: str = "llama", extra_kv: dict[str, object] | None = None) -> Path:
    """A tiny loadable llama whose tokenizer is given in full: for compatibility tests, one rule at a time."""
    kv: dict[str, object] = {
        ".context_length": 2048, ".embedding_length": 64, ".block_count": n_layer, ".feed_forward_length": 128,
        ".attention.head_count": 4, ".attention.head_count_kv": 2, ".attention.layer_norm_rms_epsilon": 1e-5,
        ".rope.dimension_count": 16, "general.name": path.stem, "general.file_type": 0,
        "tokenizer.ggml.model": tokenizer, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types or [1] * len(tokens),
        "tokenizer.ggml.bos_token_id": bos, "tokenizer.ggml.eos_token_id": eos,
    }
    if tokenizer == "llama":
        kv["tokenizer.ggml.scores"] = [0.0] * len(tokens)
    if pre is not None:
        kv["tokenizer.ggml.pre"] = pre
    if merges is not None:
        kv["tokenizer.ggml.merges"] = merges
    if add_bos is not None:
        kv["tokenizer.ggml.add_bos_token"] = add_bos
    if add_eos is not None:
        kv["tokenizer.ggml.add_eos_token"] = add_eos
    kv.update(extra_kv or {})
    tensors: dict = {"token_embd.weight": (64, len(tokens)), "output_norm.weight": (64,),
                     "output.weight": (64, len(tokens))}
    if arch == "llama":
        tensors.update(dense_layers(n_layer, 64, 4, 2, 16, 128))
    return write_model(path, arch, kv, tensors, vocab=None)


def tiny_drafter(path: Path, arch: str, target_layers: list[int], *, block_size: int = 16, dspark: bool = False,
                 target_hidden: int = 64, vocab: list[str] | None = VOCAB) -> Path:
    """A DFlash/DSpark/EAGLE3-marked drafter GGUF (metadata and a few tensors: enough to be recognised and
    paired, not to run), with the target's vocabulary as `convert_hf_to_gguf.py --target-model-dir` gives it."""
    kv: dict[str, object] = {".block_count": 1, ".embedding_length": 64, ".attention.head_count": 4,
                             ".target_layers": target_layers, "general.name": path.stem}
    if arch == "dflash":
        kv[".block_size"] = block_size
    if arch == "eagle3":
        kv[".target_hidden_size"] = target_hidden
    # fc reads the concatenated hidden states of the target layers: its width names the target's hidden size
    tensors: dict = {"fc.weight": (len(target_layers) * target_hidden, 64), "blk.0.attn_norm.weight": (64,)}
    if dspark:
        tensors.update({"markov_w1.weight": (64, 64), "markov_w2.weight": (64, 64)})
    return write_model(path, arch, kv, tensors, vocab=vocab)
