"""Pure parts of the agent path: the chat-template choice per architecture, request normalisation
(billing header, forced tool calls), each agent's configuration, and the argv the template adds."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from dataclasses import replace

from bostudio.agents import (CLAUDE_OWN_PROMPT, LOCAL_TIMEOUT_MS, SMALL_MODEL_PARAMS, AgentTarget, claude_compacts_at,
                             compaction_notes, configure, instructions_for, max_output_for)
from bostudio.agents.pages import CODEX_SMALL_MODEL_PAGE
from bostudio.gguf.capabilities import ModelCaps
from bostudio.daemon.http.normalise import normalise, strip_billing_header
from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.gguf.template import TEMPLATES_DIR, choose_template

TOOLS_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.mark.parametrize("arch, template, source, name, fallback, tools", [
    ("gemma3", None, "shipped", "chatml-tools.jinja", True, True),  # the embedded base model: untrained turn tokens
    ("gemma3", PLAIN_TEMPLATE, "shipped", "gemma-tools.jinja", True, True),  # Gemma 3 IT: no tools in its own
    ("gemma3", TOOLS_TEMPLATE, "gguf", "", False, True),
    ("llama", TOOLS_TEMPLATE, "gguf", "", False, True),
    ("llama", PLAIN_TEMPLATE, "gguf", "", False, False),  # its own template, tools refused
    ("qwen2", None, "shipped", "chatml-tools.jinja", True, True),
    ("llama", "<|im_start|>{% for m in messages %}{{ m.content }}{% endfor %}", "shipped", "chatml-tools.jinja",
     True, True),  # SmolLM2-Instruct: ChatML without tools
    ("phi3", None, "builtin", "phi3", True, False),
    ("some-new-arch", None, "shipped", "chatml-tools.jinja", True, True),  # what llama-server guesses, plus tools
])
def test_template_choice_by_architecture(arch, template, source, name, fallback, tools) -> None:
    c = choose_template(arch, template)
    assert (c.source, c.name, c.is_fallback, c.renders_tools) == (source, name, fallback, tools)
    assert ("fallback" in c.label) == fallback


def test_a_forced_call_opens_with_the_templates_own_call_marker() -> None:
    """A GGUF's own template whose calls are <tool_call> blocks (Qwen2.5-Coder's) opens a forced call with the
    marker, as the shipped templates do; another template's format is not guessed at."""
    hermes = TOOLS_TEMPLATE + "{{- '<tool_call>\\n' + message.content + '\\n</tool_call>' }}"
    assert choose_template("qwen2", hermes).call_prefill == "<tool_call>\n"
    assert choose_template("qwen2", hermes).source == "gguf"
    assert choose_template("llama", TOOLS_TEMPLATE).call_prefill == ""
    assert choose_template("gemma3", None).call_prefill == "<tool_call>\n"


def test_template_argv_is_threaded_through_launchspec() -> None:
    flags = frozenset({"-m", "--alias", "--host", "--port", "-c", "--metrics", "--spec-type", "--jinja",
                       "--no-jinja", "--chat-template", "--chat-template-file"})
    shipped = choose_template("gemma3", None)
    argv = build_argv(Path("/x/llama-server"), flags | {"--reverse-prompt"},
                      LaunchSpec(Path("m.gguf"), "m", 1, chat_template=shipped))
    i = argv.index("--chat-template-file")
    assert argv[i - 1] == "--jinja" and Path(argv[i + 1]) == TEMPLATES_DIR / "chatml-tools.jinja"
    assert Path(argv[i + 1]).is_file()
    assert argv[i + 2:i + 6] == ["--reverse-prompt", "<|im_end|>", "--reverse-prompt", "<|im_start|>"]
    gemma_it = choose_template("gemma3", "<start_of_turn>{{ messages }}")
    assert gemma_it.name == "gemma-tools.jinja" and not gemma_it.stops  # trained turn tokens: no stop needed
    builtin = build_argv(Path("/x/llama-server"), flags,
                         LaunchSpec(Path("m.gguf"), "m", 1, chat_template=choose_template("phi3", None)))
    assert builtin[-3:] == ["--no-jinja", "--chat-template", "phi3"]
    own = build_argv(Path("/x/llama-server"), flags,
                     LaunchSpec(Path("m.gguf"), "m", 1, chat_template=choose_template("llama", TOOLS_TEMPLATE)))
    assert "--chat-template" not in own and "--chat-template-file" not in own


def test_tools_are_refused_not_dropped_when_the_template_cannot_render_them() -> None:
    body = {"model": "m", "messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}
    caps = ModelCaps("chat", None, False, choose_template("phi3", None))
    err = caps.tool_refusal(body, "m")
    assert err is not None and "cannot render tools" in err.message
    assert caps.tool_refusal(dict(body, tools=[]), "m") is None
    assert ModelCaps("chat", None, False, choose_template("gemma3", None)).tool_refusal(body, "m") is None
    assert ModelCaps("chat", None, False, choose_template("llama", PLAIN_TEMPLATE)).tool_refusal(body, "m")


BILLING = "x-anthropic-billing-header: cc_version=2.1.332.68e; cc_entrypoint=sdk-cli; cch=00000;"


@pytest.mark.parametrize("system", [
    [{"type": "text", "text": BILLING}, {"type": "text", "text": "You are Claude Code."}],
    BILLING + "\nYou are Claude Code.",
])
def test_billing_header_is_stripped_from_system_and_midway_system_messages(system) -> None:
    body = {"model": "m", "system": system, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": BILLING.replace("68e", "417")},
                                       {"type": "text", "text": "reminder"}]}]}
    out = normalise("/v1/messages", body)
    assert out is not None and BILLING[:20] not in json.dumps(out)
    assert "You are Claude Code." in json.dumps(out["system"]) and "reminder" in json.dumps(out["messages"])
    # two sessions whose billing suffixes differ forward the same prefix
    other = json.loads(json.dumps(body).replace("68e", "9f0").replace("417", "abc"))
    assert normalise("/v1/messages", other) == out
    assert strip_billing_header({"model": "m", "system": "plain", "messages": []}) is None
    assert normalise("/v1/chat/completions", body) is None  # only the Anthropic route carries it


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("path, body, forced", [
    ("/v1/chat/completions", {"messages": [], "tools": TOOLS, "tool_choice": "required"}, True),
    ("/v1/chat/completions", {"messages": [], "tools": TOOLS,
                              "tool_choice": {"type": "function", "function": {"name": "f"}}}, True),
    ("/v1/chat/completions", {"messages": [], "tools": TOOLS, "tool_choice": "auto"}, False),
    ("/v1/chat/completions", {"messages": [], "tools": TOOLS}, False),
    ("/v1/messages", {"messages": [], "tools": [{"name": "f"}], "tool_choice": {"type": "any"}}, True),
    ("/v1/messages", {"messages": [], "tools": [{"name": "f"}], "tool_choice": {"type": "auto"}}, False),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}, True),
])
def test_forced_tool_calls_open_the_call(path, body, forced) -> None:
    out = normalise(path, body, "<tool_call>\n")
    assert (out is not None) == forced
    if forced:
        last = (out.get("messages") or out.get("input"))[-1]
        assert last["role"] == "assistant" and last["content"] == "<tool_call>\n"
    plain = normalise(path, body, "")  # no prefill for templates without one
    assert plain is None or not any(m.get("role") == "assistant" for m in plain.get("messages", []))


TARGET = AgentTarget("http://127.0.0.1:8642", "tok", "gemma-3-270m-q4_k_m", 32768, max_output_for(32768))


def test_claude_code_gets_environment_only(tmp_path: Path) -> None:
    cfg = configure("claude", TARGET, tmp_path)
    assert cfg.files == {}
    env = cfg.env
    assert env["ANTHROPIC_BASE_URL"] == TARGET.url and env["ANTHROPIC_AUTH_TOKEN"] == "tok"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == TARGET.model
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0" and env["DISABLE_TELEMETRY"] == "1"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768"
    assert int(env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == TARGET.max_output < TARGET.ctx
    assert int(env["API_TIMEOUT_MS"]) == LOCAL_TIMEOUT_MS  # a local prefill outlasts the cloud default


def test_codex_is_left_the_tools_a_local_model_can_use(tmp_path: Path) -> None:
    """OpenAI's hosted tools, sub-agents, goals, images, apps, plugins and the skills catalogue off (what the
    CLI then sends is checked on the real Codex in test_agents_real.test_codex_exec)."""
    toml = tomllib.loads(next(iter(configure("codex", TARGET, tmp_path).files.values())))
    assert toml["web_search"] == "disabled"
    assert not any(toml["features"][k] for k in ("goals", "view_image", "image_generation", "apps", "plugins"))
    assert toml["agents"]["enabled"] is False
    assert toml["skills"]["include_instructions"] is False and toml["skills"]["bundled"]["enabled"] is False


def test_codex_gets_a_provider_in_a_codex_home_of_bostudios(tmp_path: Path) -> None:
    cfg = configure("codex", TARGET, tmp_path)
    assert cfg.env["CODEX_HOME"] == str(tmp_path / "codex") and cfg.env["BOSTUDIO_API_KEY"] == "tok"
    ((path, text),) = cfg.files.items()
    assert Path(path).parent == tmp_path / "codex"
    toml = tomllib.loads(text)
    assert toml["model_provider"] == "bostudio" and toml["model"] == TARGET.model
    assert toml["model_context_window"] == 32768 and toml["model_auto_compact_token_limit"] < 32768
    prov = toml["model_providers"]["bostudio"]
    assert prov["base_url"] == TARGET.url + "/v1" and prov["wire_api"] == "responses"
    assert prov["env_key"] == "BOSTUDIO_API_KEY"
    assert prov["stream_idle_timeout_ms"] == LOCAL_TIMEOUT_MS


@pytest.mark.parametrize("agent, n_params, asked, got", [
    ("codex", 1_540_000_000, "auto", "short"),  # the default model
    ("codex", 268_000_000, "auto", "short"),  # the Gemma fixture
    ("codex", SMALL_MODEL_PARAMS, "auto", "own"),
    ("codex", 30_000_000_000, "auto", "own"),
    ("codex", None, "auto", "own"),  # a size not known: the agent's own
    ("codex", 1_540_000_000, "own", "own"),
    ("codex", 30_000_000_000, "short", "short"),
    ("claude", 1_540_000_000, "auto", "own"),  # only Codex has a page
    ("opencode", 1_540_000_000, "short", "own"),
])
def test_which_instructions_an_agent_gets(agent, n_params, asked, got) -> None:
    assert instructions_for(agent, replace(TARGET, n_params=n_params, instructions=asked)) == got


def test_codex_on_a_small_model_reads_bostudios_page(tmp_path: Path) -> None:
    """Codex's model_instructions_file names the page, written beside its config in bostudio's CODEX_HOME;
    --print says so. A large model's config names none and keeps Codex's own instructions."""
    small = configure("codex", replace(TARGET, n_params=1_540_000_000), tmp_path)
    toml = tomllib.loads(small.files[str(tmp_path / "codex" / "config.toml")])
    assert toml["model_instructions_file"] == str(tmp_path / "codex" / "instructions.md")
    assert small.files[toml["model_instructions_file"]] == CODEX_SMALL_MODEL_PAGE
    assert "short instructions page" in small.notes[0]
    large = configure("codex", replace(TARGET, n_params=30_000_000_000), tmp_path)
    assert list(large.files) == [str(tmp_path / "codex" / "config.toml")]
    assert "model_instructions_file" not in tomllib.loads(large.files[str(tmp_path / "codex" / "config.toml")])
    assert "its own instructions" in large.notes[0]


def test_the_codex_page_shows_a_call_the_daemon_reads() -> None:
    """The page's example calls are fenced json blocks naming exec_command with a `cmd` only: the form the tool
    rescue turns into a call (a whole answer of one such block), so a model that copies them makes a real call.
    The schema is Codex 0.171's exec_command, its properties' descriptions left out."""
    from bostudio.daemon.http.toolrescue import near_miss_call

    props = ("cmd", "justification", "login", "max_output_tokens", "prefix_rule", "sandbox_permissions", "shell",
             "tty", "workdir", "yield_time_ms")
    schema = {"type": "object", "required": ["cmd"], "additionalProperties": False,
              "properties": {k: {"type": "string"} for k in props}}
    blocks = CODEX_SMALL_MODEL_PAGE.split("```json\n")[1:]
    assert len(blocks) == 2
    for block in blocks:
        call = near_miss_call("```json\n" + block.split("```")[0] + "```", {"exec_command": schema})
        assert call is not None and call[0] == "exec_command" and list(call[1]) == ["cmd"]


def test_opencode_gets_an_openai_compatible_provider(tmp_path: Path) -> None:
    cfg = configure("opencode", TARGET, tmp_path)
    ((path, text),) = cfg.files.items()
    assert cfg.env["OPENCODE_CONFIG"] == path and Path(path).is_relative_to(tmp_path)
    data = json.loads(text)
    prov = data["provider"]["bostudio"]
    assert prov["npm"] == "@ai-sdk/openai-compatible"
    assert prov["options"] == {"baseURL": TARGET.url + "/v1", "apiKey": "tok", "timeout": LOCAL_TIMEOUT_MS,
                               "headerTimeout": LOCAL_TIMEOUT_MS, "chunkTimeout": LOCAL_TIMEOUT_MS}
    # opencode compacts at limit.input less compaction.reserved (SessionCompaction.isOverflow in its code)
    assert prov["models"][TARGET.model]["limit"] == {"context": 32768, "input": 32768 - TARGET.max_output,
                                                     "output": TARGET.max_output}
    assert data["compaction"] == {"auto": True, "reserved": TARGET.max_output}
    assert data["model"] == f"bostudio/{TARGET.model}"


def test_each_agent_compacts_with_room_for_its_next_turn(tmp_path: Path) -> None:
    """At 32k of context every agent compacts above its own prompt (Claude Code's is about 12k tokens) and
    early enough that the compaction request and its answer still fit; --print says where."""
    claude = configure("claude", TARGET, tmp_path)
    at = claude_compacts_at(32768, int(claude.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]))
    assert CLAUDE_OWN_PROMPT + 2000 < at < 32768 - TARGET.max_output
    assert f"{at:,}" in claude.notes[0] and not any(n.startswith("!") for n in claude.notes)
    codex = tomllib.loads(next(iter(configure("codex", TARGET, tmp_path).files.values())))
    assert 16384 < codex["model_auto_compact_token_limit"] <= 32768 - 32768 // 4  # room for the daemon's limit
    assert "compacts at" in configure("opencode", TARGET, tmp_path).notes[0]


def test_a_context_too_small_for_claude_code_is_said() -> None:
    small = AgentTarget("http://x", None, "m", 16384, max_output_for(16384))
    notes = compaction_notes("claude", small)
    assert notes[1].startswith("!") and "--ctx" in notes[1]


def test_requests_without_an_output_limit_get_one() -> None:
    assert normalise("/v1/responses", {"input": "hi"}, output_limit=8192)["max_output_tokens"] == 8192
    assert normalise("/v1/chat/completions", {"messages": []}, output_limit=8192)["max_tokens"] == 8192
    assert normalise("/v1/chat/completions", {"messages": [], "max_tokens": 5}, output_limit=8192) is None
    assert normalise("/v1/chat/completions", {"messages": [], "max_completion_tokens": 5}, output_limit=8192) is None
    assert normalise("/v1/responses", {"input": "hi", "max_output_tokens": 9}, output_limit=8192) is None


def test_a_named_tool_choice_becomes_required_over_that_tool() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}}]
    out = normalise("/v1/chat/completions", {"messages": [], "max_tokens": 5, "tools": tools,
                                             "tool_choice": {"type": "function", "function": {"name": "g"}}})
    assert out["tool_choice"] == "required" and out["tools"] == tools[1:]
    rtools = [{"type": "function", "name": "f"}, {"type": "function", "name": "g"}]
    out = normalise("/v1/responses", {"input": "x", "max_output_tokens": 5, "tools": rtools,
                                      "tool_choice": {"type": "function", "name": "f"}})
    assert out["tool_choice"] == "required" and out["tools"] == rtools[:1]
    unknown = {"messages": [], "max_tokens": 5, "tools": tools,
               "tool_choice": {"type": "function", "function": {"name": "zzz"}}}
    assert normalise("/v1/chat/completions", unknown) is None


def test_the_agents_setup_installs_the_pinned_versions() -> None:
    from bostudio.agents import PINNED

    script = (Path(__file__).resolve().parent.parent / "scripts" / "setup_agents.sh").read_text()
    for pkg, version in PINNED.values():
        assert f'"{pkg}@{version}"' in script


@pytest.mark.parametrize("argv, model, ctx, print_only, agent_args", [
    # Claude Code's own --print (and -p) after `--` go to the agent, not to launch.
    (["launch", "claude", "--", "--print", "hi", "--allowedTools", "Read", "Grep"], None, None, False,
     ["--print", "hi", "--allowedTools", "Read", "Grep"]),
    (["launch", "claude", "--print", "--", "-p", "x y"], None, None, True, ["-p", "x y"]),
    (["launch", "codex", "smollm2", "--ctx", "8192", "--", "exec", "--json", "hi"], "smollm2", 8192, False,
     ["exec", "--json", "hi"]),
    (["launch", "opencode", "--ctx", "4096", "--print"], None, 4096, True, []),
    (["launch", "claude", "--", "--"], None, None, False, ["--"]),  # only the first `--` separates
])
def test_launch_passes_the_agents_arguments_verbatim(argv, model, ctx, print_only, agent_args) -> None:
    from bostudio.cli import build_parser, parse_args
    from bostudio.cli.launch import split_rest

    args = parse_args(build_parser(), argv)
    got_model, got_args = split_rest(args)
    assert (got_model, args.ctx, args.print_only, got_args) == (model, ctx, print_only, agent_args)


def test_easy_assistant_inputs_of_the_responses_api_get_their_type() -> None:
    """The OpenAI client sends `{"role": "assistant", "content": "..."}` in a Responses input; llama-server reads
    an assistant turn only with `"type": "message"`. Other items and other routes pass as they are."""
    body = {"input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
                      {"type": "function_call_output", "call_id": "x", "output": "d"}]}
    out = normalise("/v1/responses", body)
    assert out is not None and out["input"][1] == {"role": "assistant", "content": "b", "type": "message"}
    assert out["input"][0] == body["input"][0] and out["input"][2:] == body["input"][2:]
    assert "type" not in body["input"][1]  # the client's body is not changed in place
    assert normalise("/v1/chat/completions", {"messages": body["input"]}) is None
    assert normalise("/v1/responses", {"input": "plain text"}) is None


def test_the_agent_runs_with_pwd_its_own_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """opencode takes its project directory from PWD: a stale one (a script that changed directory without
    a shell) made the model write into another directory. launch gives the agent PWD = where it runs; a PWD
    that already names it (a symlinked path, as the shell keeps it) is left as it is."""
    from bostudio.agents import AgentConfig, run as agent_run

    seen: list[dict] = []
    monkeypatch.setattr(agent_run.os, "execvpe", lambda binary, argv, env: seen.append(env))
    cfg = AgentConfig("opencode", "sh", "opencode-ai@1", {"X": "1"})
    work, link = tmp_path / "work", tmp_path / "link"
    work.mkdir()
    link.symlink_to(work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("PWD", str(tmp_path))
    agent_run.exec_agent(cfg, [])
    monkeypatch.setenv("PWD", str(link))
    agent_run.exec_agent(cfg, [])
    assert [e["PWD"] for e in seen] == [str(work), str(link)] and seen[0]["X"] == "1"
