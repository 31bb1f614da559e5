"""Which chat template a model is served with. Pure: a function of the GGUF's architecture and its
`tokenizer.chat_template` text (never rendered here; llama-server renders it).

A GGUF with no template would get llama-server's ChatML fallback, which fits few architectures and has
no place for tools (llama.cpp common/chat.cpp CHATML_TEMPLATE_SRC), so tools vanish without a word. So:
- the GGUF's own template when it has one that renders tools (or, for an architecture bostudio ships no
  tool template for, when it has one at all);
- for a GGUF whose own template renders no tools, in a format bostudio ships a tool-capable Jinja
  template for (Gemma's turns; ChatML), that template, served with `--jinja --chat-template-file`: llama.cpp's template analyser derives the
  tool-call parser from it (common/chat.cpp, common_chat_templates_apply_jinja);
- for a GGUF without a template (most likely a base model, e.g. the embedded Gemma 3 270M): of a known
  non-ChatML architecture, llama.cpp's built-in template by name (src/llama-chat.cpp
  LLM_CHAT_TEMPLATES) with `--no-jinja --chat-template NAME`, which renders no tools, so requests with
  tools are refused (`renders_tools` False) instead of losing them; else ChatML with tools, with a stop
  at ChatML's markers: a base model's own turn tokens are untrained (the base Gemma writes `mendatang`
  where <end_of_turn> belongs and never ends a turn), while it writes `<|im_end|>` as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATES_DIR = Path(__file__).parent / "templates"

# Architectures (general.architecture) -> the Jinja template bostudio ships for them (renders tools).
SHIPPED = {"gemma": "gemma-tools.jinja", "gemma2": "gemma-tools.jinja", "gemma3": "gemma-tools.jinja",
           "gemma3n": "gemma-tools.jinja"}
# ChatML models (a GGUF template with <|im_start|>, or a ChatML architecture without one) get this one.
CHATML_TOOLS = "chatml-tools.jinja"
# A base model writes ChatML's markers as plain text: generation stops there (and they stay out of replies).
CHATML_STOPS = ("<|im_end|>", "<|im_start|>")
# A shipped template's tool-call opening marker: a forced call's assistant turn starts with it
# (daemon/http/normalise.py), so llama.cpp's grammar leaves the model only the call.
CALL_PREFILL = {"gemma-tools.jinja": "<tool_call>\n", CHATML_TOOLS: "<tool_call>\n"}
# A GGUF's own template whose calls are <tool_call> blocks (Hermes, Qwen2.5) gets the same opening: on the pinned
# llama-server, `tool_choice: required` alone does not force Qwen2.5-Coder's template (its answer stays free
# text: a fenced block, then prose until the limit), while the turn opened with the marker leaves the model
# only the call, which the parser reads (measured on the 1.5B, chat and Responses alike).
HERMES_CALL = "<tool_call>"

# Architectures -> llama.cpp's built-in template name for a GGUF without a template. Only where the
# architecture implies the chat format; everything else gets ChatML, as llama-server would.
BUILTIN = {"qwen2": "chatml", "qwen2moe": "chatml", "qwen3": "chatml", "qwen3moe": "chatml", "phi3": "phi3",
           "phi4": "phi4", "command-r": "command-r", "cohere2": "command-r", "deepseek2": "deepseek2",
           "chatglm": "chatglm4", "glm4": "chatglm4", "minicpm": "minicpm", "exaone": "exaone3",
           "exaone4": "exaone4", "granite": "granite", "granitemoe": "granite", "falcon3": "falcon3",
           "orion": "orion", "gpt-oss": "gpt-oss", "openai-moe": "gpt-oss", "hunyuan-moe": "hunyuan-moe",
           "hunyuan-dense": "hunyuan-dense", "rwkv6": "rwkv-world", "rwkv7": "rwkv-world", "smollm3": "chatml",
           "bailingmoe": "bailing", "bailingmoe2": "bailing2", "seed_oss": "seed_oss", "grok": "grok-2",
           "llama4": "llama4"}


@dataclass(frozen=True)
class TemplateChoice:
    """How a model's chat turns are rendered.

    source: gguf | shipped | builtin. `name` is the built-in template's name or the shipped file's
    name ('' for the GGUF's own). `file` is the shipped template's path. `is_fallback`: the GGUF's own
    template is not used (it has none, or it cannot render tools). `renders_tools`: tools in a request
    reach the model."""

    source: str
    name: str = ""
    file: Path | None = None
    is_fallback: bool = False
    renders_tools: bool = True
    reason: str = ""
    call_prefill: str = ""  # opens a forced tool call (shipped templates, and a GGUF's own with <tool_call>)
    stops: tuple[str, ...] = ()  # default stop strings (llama-server --reverse-prompt) for base models

    @property
    def label(self) -> str:
        """One line for `show`, `plan`, `up`, `ps` and the TUI."""
        what = {"gguf": "the GGUF's own", "shipped": f"bostudio's {self.name}",
                "builtin": f"llama.cpp's built-in {self.name!r}"}[self.source]
        tail = " (fallback: " + self.reason + ")" if self.is_fallback else ""
        return what + ("" if self.renders_tools else ", renders no tools") + tail

    def to_json(self) -> dict:
        return {"source": self.source, "name": self.name, "file": str(self.file) if self.file else None,
                "is_fallback": self.is_fallback, "renders_tools": self.renders_tools, "reason": self.reason,
                "stops": list(self.stops),
                "label": self.label}


def template_renders_tools(template: str) -> bool:
    """Whether a Jinja chat template looks at the request's tools (a template that never names
    `tools` drops them)."""
    return "tools" in template


def choose_template(architecture: str, chat_template: str | None, kind: str = "chat") -> TemplateChoice:
    """The template for a model of `architecture` whose GGUF carries `chat_template` (None: none)."""
    if kind != "chat":
        return TemplateChoice("gguf", renders_tools=False)
    if chat_template:
        if template_renders_tools(chat_template):
            return TemplateChoice("gguf", call_prefill=HERMES_CALL + "\n" if HERMES_CALL in chat_template else "")
        # Its own turn format with tools added: Gemma's, or ChatML's.
        shipped = SHIPPED.get(architecture) or (CHATML_TOOLS if "<|im_start|>" in chat_template else None)
        if shipped is None:
            return TemplateChoice("gguf", renders_tools=False)
        return TemplateChoice("shipped", shipped, TEMPLATES_DIR / shipped, is_fallback=True,
                              reason="the GGUF's template renders no tools", call_prefill=CALL_PREFILL[shipped])
    builtin = BUILTIN.get(architecture, "chatml")
    if builtin != "chatml":  # a known non-ChatML format: llama.cpp's built-in, which renders no tools
        return TemplateChoice("builtin", builtin, is_fallback=True, renders_tools=False,
                              reason="the GGUF has no chat template")
    # No template usually means a base model. Its own turn tokens (Gemma's <start_of_turn>, ...) were
    # never trained, so it cannot end a turn with them; ChatML's markers it has read in pretraining
    # text and writes back as text. So ChatML with tools, and a stop at the markers as text.
    return TemplateChoice("shipped", CHATML_TOOLS, TEMPLATES_DIR / CHATML_TOOLS, is_fallback=True,
                          reason="the GGUF has no chat template (a base model?)",
                          call_prefill=CALL_PREFILL[CHATML_TOOLS], stops=CHATML_STOPS)


def template_for(info) -> TemplateChoice:  # type: ignore[no-untyped-def]
    """choose_template for a ModelInfo."""
    return choose_template(info.architecture, info.chat_template, info.kind if info.kind != "model" else "chat")


__all__ = ["TemplateChoice", "choose_template", "template_for", "template_renders_tools", "SHIPPED", "BUILTIN",
           "CHATML_TOOLS",
           "TEMPLATES_DIR"]
