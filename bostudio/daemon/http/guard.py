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
    return RequestError(message, "see docs/security.md, 'Rejected parameters'")


URL_KEYS = frozenset({"url", "image_url", "file_url", "audio_url", "video_url"})


def _walk_urls(value: object) -> list[str]:
    """Every media URL in content parts: chat's image_url.url, the Responses API's input_image
    image_url (a string there), Anthropic's source.url. Iterative: no depth makes it recurse."""
    found: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, child in v.items():
                if k in URL_KEYS and isinstance(child, str):
                    found.append(child)
                elif isinstance(child, (dict, list)):
                    stack.append(child)
        elif isinstance(v, list):
            stack.extend(c for c in v if isinstance(c, (dict, list)))
    return found


def _prompt_count(prompt: object) -> int:
    """How many prompts a /v1/completions `prompt` holds: a string or one token list is one; a list of
    strings or of token lists is one each (llama-server runs each as its own task)."""
    if isinstance(prompt, list) and prompt and not any(isinstance(p, int) for p in prompt):
        return len(prompt)  # (a list mixing tokens and strings is one prompt, as llama-server reads it)
    return 1


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
    for key in ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens"):
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
    n = body.get("n") if isinstance(body.get("n"), int) else 1
    prompts = _prompt_count(body.get("prompt"))
    if prompts * max(1, n) > MAX_CHOICES:
        # Each prompt of a list is its own generation: 200 prompts are 200 requests in one.
        raise _bad(f"the request asks for {prompts * max(1, n)} generations (prompts x n); at most "
                   f"{MAX_CHOICES} per request")
    bias = body.get("logit_bias")
    if bias is not None and (not isinstance(bias, (dict, list)) or len(bias) > MAX_LOGIT_BIAS):
        raise _bad(f"`logit_bias` must be an object with at most {MAX_LOGIT_BIAS} entries")
    for key in ("grammar", "json_schema", "response_format"):
        v = body.get(key)
        if v is not None and len(str(v)) > MAX_GRAMMAR_CHARS:
            raise _bad(f"`{key}` is larger than {MAX_GRAMMAR_CHARS} characters")
    for url in _walk_urls([body.get("messages"), body.get("input"), body.get("system")]):
        if not url.startswith("data:"):
            # file:// would make the server read local files, http(s):// fetch from its network.
            raise _bad("media URLs must be inline data: URLs; the daemon does not let a model server "
                       "read local files or fetch URLs")
    return model.strip()
