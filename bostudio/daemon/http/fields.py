"""Which request fields reach llama-server: one allow-list per API route family, each field with its
type and its bound. allowed_body is pure (body in, body out); filter_body adds the log note.

llama-server reads much more from a request body than any public API defines: its own internal
fields (`chat_parser`, `chat_format`, `generation_prompt`, `grammar_type`, `grammar_triggers`,
`preserved_tokens` ... tools/server/server-schema.cpp) and per-request server knobs (`speculative.*`,
`n_cache_reuse`, `sse_ping_interval` ...). Its OpenAI routes copy every field they do not know into
those parameters (server-common.cpp, "Copy remaining properties"). A crafted value for an internal
field can crash the child, so only what the API of the route defines passes, plus the llama.cpp
sampling extensions users send on purpose (SAMPLING).

Policy for a field outside the list: it is dropped, and the daemon log notes its name (once per route
and set of names). Agents send fields no local model reads (`metadata`, `store`, `user` ...): a 400
would break them for nothing. A field on the list with a value of the wrong type or out of its bound
is refused with 400 in the API's error shape: that is a client asking for something it cannot get.

Aliases llama-server reads as one parameter are bounded together: each is on the list of at most one
route family, under the same cap (`logprobs` on /v1/completions is llama-server's `n_probs`, capped as
`n_probs` and `top_logprobs` are; `n_predict` passes only on llama.cpp's own routes, where the OpenAI
names of the output limit do not).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from bostudio.daemon.http.guard import MAX_CHOICES, MAX_GRAMMAR_CHARS, MAX_LOGIT_BIAS, MAX_N_PROBS, MAX_TOKENS
from bostudio.errors import RequestError

log = logging.getLogger("bostudio.daemon")

UNBOUNDED = -1  # a field only the body-size cap (--max-body-mib) bounds: the conversation itself
SMALL_JSON = 16 << 10  # the JSON characters of a small structured field (stop, stream_options ...)
MAX_TOOLS = 1024
MAX_STOPS = 64


@dataclass(frozen=True)
class Field:
    """A field's JSON types (int, num, bool, str, list, obj), the range of a number, and the most
    characters of a string, entries of a list or object, or JSON characters of a structured value."""

    types: tuple[str, ...]
    lo: float | None = None
    hi: float | None = None
    chars: int = UNBOUNDED
    entries: int = UNBOUNDED
    json_size: int = UNBOUNDED

    def check(self, name: str, value: Any) -> str | None:
        """Why `value` does not fit, or None."""
        kind = _kind(value)
        if kind not in self.types and not (kind == "int" and "num" in self.types):
            return f"`{name}` must be {' or '.join(_NAMES[t] for t in self.types)}, not {_shown(value)}"
        if kind in ("int", "num"):
            if not math.isfinite(value) or (self.lo is not None and value < self.lo) \
                    or (self.hi is not None and value > self.hi):
                return f"`{name}` must be from {_num(self.lo)} to {_num(self.hi)}, not {_shown(value)}"
        elif kind == "str" and self.chars != UNBOUNDED and len(value) > self.chars:
            return f"`{name}` holds more than {self.chars} characters"
        elif kind in ("list", "obj") and self.entries != UNBOUNDED and len(value) > self.entries:
            return f"`{name}` holds more than {self.entries} entries"
        if self.json_size != UNBOUNDED and kind in ("list", "obj") \
                and len(json.dumps(value)) > self.json_size:
            return f"`{name}` is larger than {self.json_size} characters of JSON"
        return None


_NAMES = {"int": "an integer", "num": "a number", "bool": "true or false", "str": "a string",
          "list": "a list", "obj": "an object", "null": "null"}


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "num"
    return {str: "str", list: "list", dict: "obj"}.get(type(v), "null")


def _num(v: float | None) -> str:
    return "any" if v is None else f"{v:g}"


def _shown(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def INT(lo: int, hi: int) -> Field:
    return Field(("int",), lo, hi)


def NUM(lo: float, hi: float) -> Field:
    return Field(("num",), lo, hi)


BOOL = Field(("bool",))
TEXT = Field(("str",))  # a prompt: bounded by the body cap


def STR(n: int) -> Field:
    return Field(("str",), chars=n)


def OBJ(json_size: int = SMALL_JSON) -> Field:
    return Field(("obj",), json_size=json_size)


OUTPUT = INT(0, MAX_TOKENS)  # -1 is "forever" to llama-server: one request would hold a slot for good
STOP = Field(("str", "list"), chars=SMALL_JSON, entries=MAX_STOPS, json_size=SMALL_JSON)
CONVERSATION = Field(("list",))  # messages: bounded by the body cap
SCHEMA = Field(("obj", "bool"), json_size=MAX_GRAMMAR_CHARS)

# The llama.cpp sampling extensions users send on purpose, on every route that generates.
SAMPLING: dict[str, Field] = {
    "temperature": NUM(0, 100), "top_p": NUM(0, 1), "top_k": INT(-1, 1 << 20), "min_p": NUM(0, 1),
    "typical_p": NUM(0, 1), "top_n_sigma": NUM(-1, 100), "xtc_probability": NUM(0, 1), "xtc_threshold": NUM(0, 1),
    "repeat_penalty": NUM(0, 100), "repeat_last_n": INT(-1, 1 << 20),
    "presence_penalty": NUM(-100, 100), "frequency_penalty": NUM(-100, 100),
    "dynatemp_range": NUM(0, 100), "dynatemp_exponent": NUM(0, 100),
    "mirostat": INT(0, 2), "mirostat_tau": NUM(0, 100), "mirostat_eta": NUM(0, 1),
    "dry_multiplier": NUM(0, 100), "dry_base": NUM(0, 100), "dry_allowed_length": INT(0, 1 << 16),
    "dry_penalty_last_n": INT(-1, 1 << 20), "dry_sequence_breakers": Field(("list",), entries=64, json_size=4096),
    "seed": INT(-1, (1 << 32) - 1), "min_keep": INT(0, 1024), "ignore_eos": BOOL, "cache_prompt": BOOL,
    "grammar": STR(MAX_GRAMMAR_CHARS), "json_schema": SCHEMA,
    "logit_bias": Field(("obj", "list"), entries=MAX_LOGIT_BIAS),
    "stream": BOOL, "stream_options": OBJ(1024),
}
# What llama-server's chat template and parser take from a chat request, besides the conversation.
CHAT_TEMPLATE: dict[str, Field] = {
    "tools": Field(("list",), entries=MAX_TOOLS), "tool_choice": Field(("str", "obj"), json_size=SMALL_JSON),
    "parallel_tool_calls": BOOL, "chat_template_kwargs": OBJ(), "reasoning_format": STR(32),
    "reasoning_effort": STR(32), "response_format": OBJ(MAX_GRAMMAR_CHARS),
}

MODEL = {"model": STR(1024)}

OPENAI_CHAT = {**MODEL, **SAMPLING, **CHAT_TEMPLATE, "messages": CONVERSATION, "max_tokens": OUTPUT,
               "max_completion_tokens": OUTPUT, "n": INT(1, MAX_CHOICES), "stop": STOP, "logprobs": BOOL,
               "top_logprobs": INT(0, MAX_N_PROBS)}
OPENAI_COMPLETIONS = {**MODEL, **SAMPLING, "prompt": Field(("str", "list")), "max_tokens": OUTPUT,
                      "n": INT(1, MAX_CHOICES), "stop": STOP, "echo": BOOL, "suffix": TEXT, "best_of": INT(1, 1),
                      # llama-server reads an integer `logprobs` as `n_probs`: the same cap.
                      "logprobs": INT(0, MAX_N_PROBS)}
RESPONSES = {**MODEL, **SAMPLING, **CHAT_TEMPLATE, "input": Field(("str", "list")), "instructions": TEXT,
             "max_output_tokens": OUTPUT, "reasoning": OBJ(1024), "previous_response_id": STR(256)}
ANTHROPIC = {**MODEL, "messages": CONVERSATION, "system": Field(("str", "list")), "max_tokens": OUTPUT,
             "stop_sequences": STOP, "stream": BOOL, "temperature": NUM(0, 100), "top_p": NUM(0, 1),
             "top_k": INT(-1, 1 << 20), "tools": Field(("list",), entries=MAX_TOOLS),
             "tool_choice": OBJ(), "thinking": OBJ(1024), "chat_template_kwargs": OBJ()}
# Each input of an embeddings request and each document of a rerank is a task of its own in llama-server:
# bounded as the APIs bound them (OpenAI: 2048 inputs; Cohere and Jina: 1000 documents).
MAX_INPUTS = 2048
MAX_DOCUMENTS = 1024
EMBEDDINGS = {**MODEL, "input": Field(("str", "list"), entries=MAX_INPUTS),
              "content": Field(("str", "list"), entries=MAX_INPUTS), "encoding_format": STR(16),
              "embd_normalize": INT(-1, 2)}
RERANK = {**MODEL, "query": TEXT, "documents": Field(("list",), entries=MAX_DOCUMENTS),
          "texts": Field(("list",), entries=MAX_DOCUMENTS), "top_n": INT(0, MAX_DOCUMENTS), "return_documents": BOOL}
LLAMA_COMPLETION = {**MODEL, **SAMPLING, "prompt": Field(("str", "list", "obj")), "n_predict": OUTPUT,
                    "stop": STOP, "n_probs": INT(0, MAX_N_PROBS), "n_indent": INT(0, 1024),
                    "post_sampling_probs": BOOL, "return_tokens": BOOL, "timings_per_token": BOOL}
INFILL = {**LLAMA_COMPLETION, "input_prefix": TEXT, "input_suffix": TEXT, "input_extra": Field(("list",))}
TOKENIZE = {**MODEL, "content": TEXT, "add_special": BOOL, "parse_special": BOOL, "with_pieces": BOOL}
DETOKENIZE = {**MODEL, "tokens": Field(("list",))}

# Every route the daemon forwards, with its allow-list. Ollama's /api/* bodies are translated field by
# field (daemon/http/ollama.py: nothing else is read) into /v1/chat/completions or /v1/completions bodies, which
# then pass these lists too.
ALLOWED: dict[str, dict[str, Field]] = {
    "/v1/chat/completions": OPENAI_CHAT, "/v1/chat/completions/input_tokens": OPENAI_CHAT,
    "/apply-template": OPENAI_CHAT,
    "/v1/completions": OPENAI_COMPLETIONS,
    "/v1/responses": RESPONSES, "/v1/responses/input_tokens": RESPONSES,
    "/v1/messages": ANTHROPIC, "/v1/messages/count_tokens": ANTHROPIC,
    "/v1/embeddings": EMBEDDINGS, "/v1/rerank": RERANK,
    "/completion": LLAMA_COMPLETION, "/completions": LLAMA_COMPLETION, "/infill": INFILL,
    "/tokenize": TOKENIZE, "/detokenize": DETOKENIZE,
}

_noted: set[tuple[str, tuple[str, ...]]] = set()


def _bad(message: str) -> RequestError:
    return RequestError(message, "see docs/security.md, 'Fields that reach llama-server'")


def allowed_body(path: str, body: dict) -> tuple[dict, list[str]]:
    """(the body with only the fields `path`'s API defines, the names dropped). Raises RequestError
    (400) for an allowed field whose value has the wrong type or is out of its bound. A route without a
    list forwards nothing but `model` (a new route must be listed here to pass anything)."""
    allowed = ALLOWED.get(path, MODEL)
    out: dict = {}
    dropped: list[str] = []
    for key, value in body.items():
        spec = allowed.get(key)
        if spec is None:
            dropped.append(key)
            continue
        if value is None:
            continue  # JSON null is "not given" in every API here
        why = spec.check(key, value)
        if why is not None:
            raise _bad(why)
        out[key] = value
    return out, dropped


def filter_body(path: str, body: dict) -> dict:
    """allowed_body(), with a log note of the names dropped (once per route and set of names)."""
    out, dropped = allowed_body(path, body)
    if dropped:
        names = tuple(sorted(dropped)[:20])
        if (path, names) not in _noted and len(_noted) < 4096:
            _noted.add((path, names))
            log.info("%s: dropped fields outside its allow-list (not forwarded): %s%s", path,
                     ", ".join(repr(n[:64]) for n in names), " ..." if len(dropped) > len(names) else "")
    return out


__all__ = ["ALLOWED", "SAMPLING", "Field", "allowed_body", "filter_body"]
