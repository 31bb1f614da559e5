"""Request parameters that could harm a child llama-server (or the machine) are rejected with 400
before anything is forwarded. Pure: a function of the parsed JSON body."""

from __future__ import annotations

from bostudio.errors import RequestError

MAX_TOKENS = 1 << 20
MAX_N_PROBS = 100
MAX_CHOICES = 16
MAX_LOGIT_BIAS = 4096
MAX_GRAMMAR_CHARS = 64 * 1024

# Parameters llama-server honours per request that reach past one request's own generation.
FORBIDDEN = {
    "id_slot": "pins a llama-server slot (slots are the daemon's to schedule)",
    "slot_id": "pins a llama-server slot (slots are the daemon's to schedule)",
    "lora": "changes the LoRA adapters of the shared server",
    "n_threads": "changes the threads of the shared server",
}


def _bad(message: str) -> RequestError:
    return RequestError(message, "see the bostudio README, section 'Rejected parameters'")


def _walk_urls(value: object) -> list[str]:
    """Every media URL in chat content parts (image_url.url, input_audio, ...)."""
    found: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "url" and isinstance(v, str):
                found.append(v)
            else:
                found.extend(_walk_urls(v))
    elif isinstance(value, list):
        for v in value:
            found.extend(_walk_urls(v))
    return found


def check_request(body: object) -> str:
    """Validate an OpenAI-style request body; return its `model`. Raises RequestError (HTTP 400)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _bad("the request has no `model`: name the model to run (GET /v1/models lists them)")
    if "/" in model or "\\" in model or model.startswith("."):
        raise _bad(f"`model` must be a model name, not a path: {model!r}")
    for key, why in FORBIDDEN.items():
        if key in body:
            raise _bad(f"parameter `{key}` is not allowed through the daemon: it {why}")
    for key in ("max_tokens", "max_completion_tokens", "n_predict"):
        v = body.get(key)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v > MAX_TOKENS:
            # llama-server reads -1 as "generate forever": one request could hold a slot for good.
            raise _bad(f"`{key}` must be an integer from 0 to {MAX_TOKENS}, not {v!r}")
    for key, limit in (("n_probs", MAX_N_PROBS), ("top_logprobs", MAX_N_PROBS), ("n", MAX_CHOICES),
                       ("n_cmpl", MAX_CHOICES)):
        v = body.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= limit):
            raise _bad(f"`{key}` must be an integer from 0 to {limit}, not {v!r}")
    bias = body.get("logit_bias")
    if bias is not None and (not isinstance(bias, (dict, list)) or len(bias) > MAX_LOGIT_BIAS):
        raise _bad(f"`logit_bias` must be an object with at most {MAX_LOGIT_BIAS} entries")
    for key in ("grammar", "json_schema", "response_format"):
        v = body.get(key)
        if v is not None and len(str(v)) > MAX_GRAMMAR_CHARS:
            raise _bad(f"`{key}` is larger than {MAX_GRAMMAR_CHARS} characters")
    for url in _walk_urls(body.get("messages")):
        if not url.startswith("data:"):
            # file:// would make the server read local files, http(s):// fetch from its network.
            raise _bad("media URLs must be inline data: URLs; the daemon does not let a model server "
                       "read local files or fetch URLs")
    return model.strip()
