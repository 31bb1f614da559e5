"""`bostudio launch AGENT`: each coding agent's configuration for the daemon. Pure: a function of the
daemon's URL and token, the model's name, its real context window and its output limit, and of the
directory bostudio owns for the agent's generated files. Nothing here touches the user's own files:
Claude Code gets environment variables, Codex a CODEX_HOME of bostudio's, opencode an OPENCODE_CONFIG
of bostudio's (its own config still loads; ours adds a provider)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from bostudio.agents.pages import CODEX_SMALL_MODEL_PAGE

# The versions bostudio is tested with (scripts/setup_agents.sh installs exactly these).
PINNED = {"claude": ("@anthropic-ai/claude-code", "2.1.332"), "codex": ("@openai/codex", "0.171.0"),
          "opencode": ("opencode-ai", "1.18.33")}
BINARIES = {"claude": "claude", "codex": "codex", "opencode": "opencode"}
# Telemetry and non-essential traffic off for every agent.
COMMON_ENV = {"DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}
# How long an agent waits for a reply's first byte and between streamed chunks. A local model prefills a
# 20k-token agent prompt in about a minute on a quiet desktop CPU and several beside a build; the agents'
# cloud defaults (5-10 min, then a retry that starts the prefill again) cut such a turn short.
LOCAL_TIMEOUT_MS = 30 * 60 * 1000


@dataclass(frozen=True)
class AgentTarget:
    url: str  # the daemon's base URL, without /v1
    token: str | None  # the daemon's token (None: the daemon needs none; a placeholder is sent)
    model: str
    ctx: int  # the model's real context window, as the daemon runs it
    max_output: int  # the output limit the agent may ask for
    n_params: int | None = None  # the model's parameter count (None: unknown), for instructions_for
    instructions: str = "auto"  # auto | short | own (INSTRUCTIONS)


@dataclass(frozen=True)
class AgentConfig:
    agent: str
    binary: str
    npm_package: str  # PKG@VERSION
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)  # absolute path -> content (bostudio-owned)
    args: tuple[str, ...] = ()  # argv after the binary, before the user's arguments
    notes: tuple[str, ...] = ()  # how the agent stays inside the model's context (compaction_notes)
    first_turn_tokens: int | None = None  # its first request's prompt, where measured (first_turn_tokens)

    def to_json(self) -> dict:
        return {"agent": self.agent, "binary": self.binary, "npm_package": self.npm_package,
                "install": f"npm install -g {self.npm_package}", "env": dict(self.env), "files": dict(self.files),
                "args": list(self.args), "context_notes": list(self.notes)}


def max_output_for(ctx: int) -> int:
    """The output limit the agent gets: an eighth of the window, at most 32k. The agents compact at the
    window less this limit (less a buffer of their own), so a larger one leaves a small model's session no
    room: Claude Code's own prompt is about 12k tokens, and with 32k of context and 8k of output it compacted
    at 11.6k, before its first answer. 4k is still more than any one turn of a coding agent writes."""
    return max(256, min(32768, ctx // 8))


# Claude Code 2.1 compacts when the conversation reaches its window (CLAUDE_CODE_MAX_CONTEXT_TOKENS for a
# model it does not know) less min(output limit, 20k) less this buffer (measured against the CLI: with a
# 32,768 window and a 4,000 output limit it compacted between 12k and 18k reported tokens; its code: 13,000).
CLAUDE_COMPACT_BUFFER = 13_000
CLAUDE_OWN_PROMPT = 11_712  # its system prompt and tool schemas: 2.1.332 on Qwen2.5's tokenizer (measured)
# Codex 0.171's first request with bostudio's short page and launch's tool set, on Qwen2.5's tokenizer (measured)
CODEX_PAGE_PROMPT = 1_168


def claude_compacts_at(ctx: int, max_output: int) -> int:
    """The conversation size at which Claude Code compacts, for a window `ctx` and output limit."""
    return ctx - min(max_output, 20_000) - CLAUDE_COMPACT_BUFFER


def compaction_notes(agent: str, target: AgentTarget) -> list[str]:
    """How the agent stays inside the model's context: what bostudio sets and what the CLI then does."""
    ctx, out = target.ctx, target.max_output
    if agent == "claude":
        at = claude_compacts_at(ctx, out)
        notes = [f"Claude Code compacts the conversation at about {at:,} of {ctx:,} tokens (its window less the "
                 f"{min(out, 20_000):,}-token output limit and its own {CLAUDE_COMPACT_BUFFER:,}-token buffer), and "
                 f"when the daemon answers that a prompt is too long it compacts and sends it again."]
        if at < CLAUDE_OWN_PROMPT + 2_000:
            notes.append(f"! at {ctx:,} tokens of context Claude Code's own prompt (about {CLAUDE_OWN_PROMPT:,} "
                         f"tokens) leaves no room before it compacts: it would compact on every turn. Give the model "
                         f"more context (--ctx {CLAUDE_OWN_PROMPT + 2_000 + CLAUDE_COMPACT_BUFFER + out} or more).")
        return notes
    if agent == "codex":
        page = (f"Codex gets bostudio's short instructions page in place of its own (a model under "
                f"{SMALL_MODEL_PARAMS / 1e9:.0f}B parameters; --instructions own keeps Codex's)"
                if instructions_for(agent, target) == "short" else "Codex keeps its own instructions")
        return [f"{page}.",
                f"Codex compacts at {codex_compact_limit(ctx):,} of {ctx:,} tokens (model_auto_compact_token_limit); "
                f"it sends no output limit, so the daemon gives each request one.",
                f"Codex keeps your own messages whole through a compaction (up to about {CODEX_KEPT_USER_TOKENS:,} "
                f"tokens of them): a request that then overflows has the middle of its longest earlier texts "
                f"elided by the daemon (--context-overflow trim; `bostudio ps` counts them)."]
    return [f"opencode compacts at {opencode_compact_at(ctx, out):,} of {ctx:,} tokens (its input limit less the "
            f"reserved {out:,} tokens); when a request overflows it compacts with the whole conversation, which "
            f"the daemon shortens to fit (--context-overflow trim)."]


# Codex's compaction keeps the most recent user messages up to this many tokens (codex-rs core compact.rs,
# COMPACT_USER_MESSAGE_MAX_TOKENS); measured here: the first log (~18k tokens) survived its compaction whole.
CODEX_KEPT_USER_TOKENS = 20_000


def codex_compact_limit(ctx: int) -> int:
    """Codex's auto-compact limit: room for the daemon's output limit (a quarter) and a margin beside it."""
    return ctx - ctx // 4 - ctx // 16


def opencode_compact_at(ctx: int, out: int) -> int:
    return ctx - 2 * out


# Which instructions an agent gets: its own, or bostudio's short page for a small model (agents.pages; only
# Codex has one). auto: the page below SMALL_MODEL_PARAMS, measured on the 1.5B (Codex finished 11 of 18 runs
# with it, 3 of 26 without); a larger model, or one of unknown size, keeps the agent's own.
INSTRUCTIONS = ("auto", "short", "own")
SMALL_MODEL_PARAMS = 4_000_000_000
HAS_SHORT_PAGE = ("codex",)


def instructions_for(agent: str, target: AgentTarget) -> str:
    """`short` (bostudio's page) or `own` (the agent's), for `agent` on `target`."""
    if agent not in HAS_SHORT_PAGE or target.instructions == "own":
        return "own"
    if target.instructions == "short":
        return "short"
    return "short" if target.n_params is not None and target.n_params < SMALL_MODEL_PARAMS else "own"


def _key(target: AgentTarget) -> str:
    return target.token or "bostudio"


def claude_config(target: AgentTarget, config_dir: Path) -> AgentConfig:
    """Claude Code: environment only (Anthropic Messages API at the daemon)."""
    env = {
        **COMMON_ENV,
        "ANTHROPIC_BASE_URL": target.url,
        "ANTHROPIC_AUTH_TOKEN": _key(target),
        "ANTHROPIC_MODEL": target.model,
        "ANTHROPIC_SMALL_FAST_MODEL": target.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": target.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": target.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": target.model,
        "CLAUDE_CODE_SUBAGENT_MODEL": target.model,
        # the volatile billing block would defeat the prompt cache (the daemon strips it too)
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # the real window of a model it does not know: it compacts below it (claude_compacts_at)
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(target.ctx),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(target.max_output),
        "API_TIMEOUT_MS": str(LOCAL_TIMEOUT_MS),
        # no response headers come before the prompt is processed: Claude Code gave up on its first request
        # after 20 min of a busy CPU's prefill (10 tok/s) and sent it again; the stream's own idle limit too
        "CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS": str(LOCAL_TIMEOUT_MS),
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(LOCAL_TIMEOUT_MS),
    }
    if target.ctx >= 100_000:  # Claude Code reads a smaller auto-compact window as its 100k minimum (2.1)
        env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(target.ctx)
    pkg, ver = PINNED["claude"]
    return AgentConfig("claude", BINARIES["claude"], f"{pkg}@{ver}", env)


# What Codex offers a model that a local server cannot serve or a local model does not need. Codex 0.171's
# first request otherwise carries eight tools (41k characters) where these leave three (25k): web search and
# image generation are OpenAI's hosted tools; sub-agents (an 11k-character tool namespace), goals, apps,
# plugins and the bundled skills' catalogue cost every turn's prefill, and a 1.5B model picked among them
# poorly (BENCHMARKS.md, "Coding agents on this machine"). view_image needs a vision model.
# request_user_input says of itself that it works only in Plan mode; Qwen2.5-Coder-1.5B called it anyway.
# What stays: exec_command and write_stdin (`features.unified_exec = false` does not take in 0.171).
# Checked with a recording server (tests/test_agents_real.py).
CODEX_TOOLS_OFF = ('web_search = "disabled"',)
CODEX_TABLES_OFF = ("[features]", "goals = false", "view_image = false", "image_generation = false",
                    "apps = false", "plugins = false", "", "[agents]", "enabled = false", "",
                    "[skills]", "include_instructions = false", "", "[skills.bundled]", "enabled = false", "",
                    "[tools.experimental_request_user_input]", "enabled = false", "")


def codex_config(target: AgentTarget, config_dir: Path) -> AgentConfig:
    """Codex: a CODEX_HOME owned by bostudio with a `bostudio` provider speaking the Responses API. (Codex
    0.171 ignores `model_max_output_tokens` and sends no output limit.)"""
    home = config_dir / "codex"
    page = home / "instructions.md"
    short = instructions_for("codex", target) == "short"
    toml = "\n".join([
        "# Written by `bostudio launch codex`; regenerated on every launch.",
        'model_provider = "bostudio"',
        *([f"model_instructions_file = {json.dumps(str(page))}"] if short else []),
        f"model = {json.dumps(target.model)}",
        f"model_context_window = {target.ctx}",
        f"model_auto_compact_token_limit = {codex_compact_limit(target.ctx)}",
        'approval_policy = "on-request"',
        "check_for_update_on_startup = false",
        *CODEX_TOOLS_OFF,
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[otel]",
        'exporter = "none"',
        "log_user_prompt = false",
        "",
        "[model_providers.bostudio]",
        'name = "bostudio"',
        f"base_url = {json.dumps(target.url + '/v1')}",
        'env_key = "BOSTUDIO_API_KEY"',
        'wire_api = "responses"',
        "request_max_retries = 1",
        "stream_max_retries = 1",
        f"stream_idle_timeout_ms = {LOCAL_TIMEOUT_MS}",
        "",
        *CODEX_TABLES_OFF,
    ])
    pkg, ver = PINNED["codex"]
    return AgentConfig("codex", BINARIES["codex"], f"{pkg}@{ver}",
                       {**COMMON_ENV, "CODEX_HOME": str(home), "BOSTUDIO_API_KEY": _key(target)},
                       {str(home / "config.toml"): toml, **({str(page): CODEX_SMALL_MODEL_PAGE} if short else {})})


def opencode_config(target: AgentTarget, config_dir: Path) -> AgentConfig:
    """opencode: OPENCODE_CONFIG naming a bostudio-owned file with an OpenAI-compatible provider."""
    path = config_dir / "opencode" / "opencode.json"
    cfg = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"bostudio/{target.model}",
        "small_model": f"bostudio/{target.model}",
        "share": "disabled",
        "autoupdate": False,
        # opencode compacts at limit.input less compaction.reserved (its SessionCompaction.isOverflow)
        "compaction": {"auto": True, "reserved": target.max_output},
        "provider": {"bostudio": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "bostudio",
            "options": {"baseURL": target.url + "/v1", "apiKey": _key(target), "timeout": LOCAL_TIMEOUT_MS,
                        "headerTimeout": LOCAL_TIMEOUT_MS, "chunkTimeout": LOCAL_TIMEOUT_MS},
            "models": {target.model: {"name": target.model, "tool_call": True,
                                      "limit": {"context": target.ctx, "input": target.ctx - target.max_output,
                                                "output": target.max_output}}},
        }},
    }
    pkg, ver = PINNED["opencode"]
    env = {**COMMON_ENV, "OPENCODE_CONFIG": str(path), "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}
    return AgentConfig("opencode", BINARIES["opencode"], f"{pkg}@{ver}", env,
                       {str(path): json.dumps(cfg, indent=2) + "\n"})


CONFIGURE = {"claude": claude_config, "codex": codex_config, "opencode": opencode_config}
AGENTS = tuple(CONFIGURE)


def first_turn_tokens(agent: str, target: AgentTarget) -> int | None:
    """The prompt of the agent's first request (its instructions and tools), where it was measured."""
    if agent == "claude":
        return CLAUDE_OWN_PROMPT
    if agent == "codex" and instructions_for(agent, target) == "short":
        return CODEX_PAGE_PROMPT
    return None


def configure(agent: str, target: AgentTarget, config_dir: Path) -> AgentConfig:
    """The configuration for `agent` (claude | codex | opencode). Raises KeyError for another name."""
    return replace(CONFIGURE[agent](target, config_dir), notes=tuple(compaction_notes(agent, target)),
                   first_turn_tokens=first_turn_tokens(agent, target))


__all__ = ["AgentTarget", "AgentConfig", "AGENTS", "PINNED", "BINARIES", "LOCAL_TIMEOUT_MS", "configure",
           "max_output_for"]
