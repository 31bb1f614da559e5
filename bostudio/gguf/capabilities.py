"""What a model can serve, read from its GGUF header before anything is launched: a chat/completion
model, an embedding model or a reranker (`{arch}.pooling_type`), and whether it has the
fill-in-the-middle tokens /infill needs. The router answers 400 for a route the model cannot serve
instead of launching it; the launch decision gives an embedding or rerank model the flags its kind needs
(bostudio.engine.argv.kind_args)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bostudio.errors import RequestError
from bostudio.gguf.template import TemplateChoice, choose_template

# llama.cpp's enum llama_pooling_type (include/llama.h) as stored in `{arch}.pooling_type`.
POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
# Encoder-only architectures: llama.cpp runs them only as embedding models.
ENCODER_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert",
                           "neo-bert", "eurobert", "t5encoder", "gemma-embedding"})
# Token texts llama.cpp's vocab loader recognises as FIM prefix/suffix/middle when the GGUF does
# not name them (src/llama-vocab.cpp, "auto-detect FIM tokens").
FIM_TEXTS = {
    "pre": {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"},
    "suf": {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"},
    "mid": {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"},
}
FIM_KEYS = {"pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
            "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
            "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id")}

# Routes by what they need: generation, embeddings, reranking, FIM; the rest (tokenize,
# detokenize, apply-template, token counting) every model serves.
GENERATE = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/infill"})
EMBED = frozenset({"/v1/embeddings"})
RERANK = frozenset({"/v1/rerank"})
TEMPLATE = frozenset({"/v1/messages/count_tokens", "/v1/responses/input_tokens",
                      "/v1/chat/completions/input_tokens", "/apply-template"})


@dataclass(frozen=True)
class ModelCaps:
    kind: str  # chat | embedding | rerank
    pooling: str | None  # llama.cpp pooling name from the header, None when absent
    fim: bool  # has FIM prefix, suffix and middle tokens
    template: TemplateChoice = TemplateChoice("gguf")  # the chat template it is served with (gguf/template.py)

    def tool_refusal(self, body: dict, model: str) -> RequestError | None:
        """Why `model` cannot take the tools of a request (HTTP 400), or None: tools are refused,
        never dropped, when its chat template cannot render them."""
        if not body.get("tools") or self.template.renders_tools:
            return None
        return RequestError(f"{model}'s chat template ({self.template.label}) cannot render tools, so the "
                            "request's tools would never reach the model",
                            "send the request without tools, or use a model whose GGUF has a tool-capable chat "
                            "template (`bostudio show MODEL --template`)")

    def refusal(self, route: str, model: str) -> RequestError | None:
        """Why `model` cannot serve `route` (HTTP 400), or None."""
        hint = "GET /bostudio/catalog lists each model's kind"
        if route in GENERATE and self.kind != "chat":
            return RequestError(f"{model} is an {self.kind} model: it cannot generate text ({route})",
                                f"send {'/v1/rerank' if self.kind == 'rerank' else '/v1/embeddings'} to it, "
                                f"or {route} to a chat model; {hint}")
        if route in TEMPLATE and self.kind != "chat":
            return RequestError(f"{model} is an {self.kind} model: it has no chat template for {route}",
                                f"send {route} to a chat model; {hint}")
        if route in EMBED and self.kind != "embedding":
            return RequestError(f"{model} is a {'chat' if self.kind == 'chat' else 'rerank'} model: embeddings "
                                f"need an embedding model (a GGUF with a pooling type, e.g. nomic-embed, bge)",
                                f"send /v1/embeddings to an embedding model; {hint}")
        if route in RERANK and self.kind != "rerank":
            return RequestError(f"{model} is not a reranker: /v1/rerank needs a model with pooling type `rank` "
                                f"(e.g. bge-reranker)", f"send /v1/rerank to a rerank model; {hint}")
        if route == "/infill" and not self.fim:
            return RequestError(f"{model} has no fill-in-the-middle tokens: /infill needs a code model with FIM "
                                "tokens (e.g. Qwen2.5-Coder, StarCoder2, CodeLlama)",
                                "use /v1/completions with this model, or /infill with a FIM model")
        return None


def caps_from_header(header) -> ModelCaps:
    """Pure: the capabilities of a model from its parsed GGUF Header."""
    arch = header.architecture
    code = header.int_value(f"{arch}.pooling_type")
    pooling = POOLING.get(code, "none") if code is not None else None
    if pooling == "rank":
        kind = "rerank"
    elif arch in ENCODER_ARCHS or (pooling not in (None, "none") and header.bool_value(f"{arch}.causal_attention")
                                   is False):
        kind = "embedding"
    else:
        kind = "chat"
    fim = all(any(header.int_value(k) is not None for k in FIM_KEYS[part]) for part in FIM_KEYS)
    if not fim and kind == "chat":
        tokens = header.array_value("tokenizer.ggml.tokens")
        if tokens is not None:
            texts = set(tokens.read_strings())
            fim = all(texts & FIM_TEXTS[part] for part in FIM_TEXTS)
    return ModelCaps(kind, pooling, fim, choose_template(arch, header.str_value("tokenizer.chat_template"), kind))


_CACHE: dict[tuple[str, int, int], ModelCaps] = {}


def model_caps(path: Path) -> ModelCaps:
    """The capabilities of the GGUF at `path`, cached by path, size and mtime (reads the header
    once; the token list is scanned only when the GGUF names no FIM tokens)."""
    from bostudio.gguf.split import read_header

    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        _CACHE[key] = caps_from_header(read_header(path))
    return _CACHE[key]
