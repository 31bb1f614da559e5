"""Request bodies made fit for the model before they are forwarded. Pure: body in, body out.

- Claude Code puts a volatile `x-anthropic-billing-header: cc_version=X.Y.Z.<suffix>; ...` block first in
  its system prompt; the suffix changes with the kind of request and the version, and wherever it changes
  the whole ~20k-token prefix misses llama-server's prompt cache from its first token. It carries nothing
  for a local model, so it is stripped (from `system`, a string or a list of blocks, and from any
  `role: system` message inside `messages`).
- A request without an output limit gets one (`output_limit`, a quarter of the model's context), on every
  route that generates (OUTPUT_FIELD).
- A named tool_choice (OpenAI chat and Responses) becomes `required` over the named tool alone: llama-server
  reads an object tool_choice as `auto`.
- A forced tool call (`tool_choice` required/any or one named tool) on a model served with a template
  that has a call prefill (gguf/template.py): the assistant turn is started with the call's opening
  marker. llama.cpp's tool grammar allows free text before the first call (common/chat-auto-parser-
  generator.cpp, content_before_tools); a continued assistant message that already opened the call
  leaves the grammar only the call itself, so a forced call is a call whatever the model.
"""

from __future__ import annotations

from typing import Any

BILLING_PREFIX = "x-anthropic-billing-header:"


def _is_billing_text(text: Any) -> bool:
    return isinstance(text, str) and text.lstrip().lower().startswith(BILLING_PREFIX)


def _strip_billing(content: Any) -> tuple[Any, bool]:
    """`content` (a string or a list of blocks) without the billing-header block or line."""
    if isinstance(content, str):
        if not _is_billing_text(content):
            return content, False
        _, _, rest = content.lstrip().partition("\n")
        return rest.lstrip("\n"), True
    if isinstance(content, list):
        kept = [b for b in content if not (isinstance(b, dict) and b.get("type", "text") == "text"
                                           and _is_billing_text(b.get("text")))]
        if len(kept) != len(content):
            return kept, True
    return content, False


def strip_billing_header(body: dict) -> dict | None:
    """The Anthropic Messages body without Claude Code's billing-header block, or None when it has none."""
    changed = False
    out = dict(body)
    if "system" in body:
        out["system"], changed = _strip_billing(body["system"])
    messages = body.get("messages")
    if isinstance(messages, list):
        new_messages = []
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "system":
                content, did = _strip_billing(m.get("content"))
                if did:
                    m = dict(m, content=content)
                    changed = True
            new_messages.append(m)
        out["messages"] = new_messages
    return out if changed else None


def forces_tool_call(api: str, body: dict) -> bool:
    """Whether the request's tool_choice forces a call (required / any / a named tool)."""
    if not body.get("tools"):
        return False
    choice = body.get("tool_choice")
    if api == "anthropic":
        return isinstance(choice, dict) and choice.get("type") in ("any", "tool")
    if choice == "required":
        return True
    return isinstance(choice, dict) and choice.get("type") == "function"


def prefill_forced_call(path: str, body: dict, prefill: str) -> dict | None:
    """The body with the assistant turn opened by `prefill`, for a forced tool call on the chat
    routes llama-server continues a final assistant message on; None when nothing changes."""
    if not prefill:
        return None
    if path == "/v1/chat/completions" and isinstance(body.get("messages"), list) \
            and forces_tool_call("openai", body):
        return dict(body, messages=[*body["messages"], {"role": "assistant", "content": prefill}])
    if path == "/v1/messages" and isinstance(body.get("messages"), list) and forces_tool_call("anthropic", body):
        return dict(body, messages=[*body["messages"], {"role": "assistant", "content": prefill}])
    if path == "/v1/responses" and forces_tool_call("openai", body):
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
        return dict(body, input=[*items, {"type": "message", "role": "assistant", "content": prefill}])
    return None


# Where each generating route takes its output limit (llama-server reads them all as `n_predict`).
OUTPUT_FIELD = {"/v1/chat/completions": "max_tokens", "/v1/completions": "max_tokens",
                "/v1/responses": "max_output_tokens", "/v1/messages": "max_tokens",
                "/completion": "n_predict", "/completions": "n_predict", "/infill": "n_predict"}


def default_output_limit(path: str, body: dict, limit: int) -> dict | None:
    """The body with an output limit when it has none, on every route that generates (Codex sends none,
    nor do Ollama clients without num_predict): a model that never ends its turn (a base model) would
    otherwise generate until the context is full, and its KV reservation would hold the whole pool. A
    limit the client set is kept (admission reserves it as far as it fits the context)."""
    key = OUTPUT_FIELD.get(path)
    if limit <= 0 or key is None:
        return None
    if body.get(key) is not None or (key == "max_tokens" and body.get("max_completion_tokens") is not None):
        return None
    return dict(body, **{key: limit})


def tool_name(tool: Any) -> str | None:
    """A tool definition's name, in the OpenAI chat, Responses or Anthropic shape."""
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function")
    return fn.get("name") if isinstance(fn, dict) else tool.get("name")


def named_tool_choice(path: str, body: dict) -> dict | None:
    """A named tool_choice as llama-server understands it: the named tool only, and `required`.
    llama-server reads tool_choice as a string and takes an object for `auto` (tools/server/
    server-common.cpp: json_value(body, "tool_choice", "auto")), so a named call would not be forced."""
    choice = body.get("tool_choice")
    if path not in ("/v1/chat/completions", "/v1/responses") or not isinstance(choice, dict) \
            or choice.get("type") != "function" or not isinstance(body.get("tools"), list):
        return None
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
    tools = [t for t in body["tools"] if tool_name(t) == name]
    if not isinstance(name, str) or not tools:
        return None  # llama-server answers an unknown name itself
    return dict(body, tools=tools, tool_choice="required")


def typed_assistant_inputs(path: str, body: dict) -> dict | None:
    """A Responses `input` whose assistant turns are easy input messages (`{"role": "assistant", "content":
    ...}`, no `type`, as the OpenAI API accepts and its clients send) with `"type": "message"`: llama-server
    reads an assistant turn only with it (tools/server/server-chat.cpp, "Cannot determine type of 'item'")."""
    items = body.get("input")
    if path != "/v1/responses" or not isinstance(items, list):
        return None
    fixed = [dict(it, type="message") if isinstance(it, dict) and it.get("role") == "assistant" and "type" not in it
             else it for it in items]
    return dict(body, input=fixed) if fixed != items else None


def normalise(path: str, body: dict, call_prefill: str = "", output_limit: int = 0) -> dict | None:
    """The body to forward instead of the client's, or None to forward it unchanged."""
    out = body
    changed = False
    limited = default_output_limit(path, out, output_limit)
    if limited is not None:
        out, changed = limited, True
    typed = typed_assistant_inputs(path, out)
    if typed is not None:
        out, changed = typed, True
    named = named_tool_choice(path, out)
    if named is not None:
        out, changed = named, True
    if path.startswith("/v1/messages"):
        stripped = strip_billing_header(out)
        if stripped is not None:
            out, changed = stripped, True
    forced = prefill_forced_call(path, out, call_prefill)
    if forced is not None:
        out, changed = forced, True
    return out if changed else None


__all__ = ["normalise", "typed_assistant_inputs", "default_output_limit", "OUTPUT_FIELD", "named_tool_choice", "strip_billing_header", "prefill_forced_call", "forces_tool_call", "BILLING_PREFIX"]
