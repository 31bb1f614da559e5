"""Coding agents end to end, as users run them: the real Claude Code, Codex and opencode CLIs (pinned, from
npm, installed into .agents/ by scripts/setup_agents.sh) against the daemon on the embedded Gemma 3 270M,
each in its own HOME and configured only from `bostudio launch AGENT --print --json`. And with each
official client library (openai chat and responses, anthropic, ollama) a tool call comes back in that
client's format, its result goes back, and the model continues.

The model is a 270M base model: no test asserts what it says, only that each agent gets an answer
without an error, how many prompt tokens reached llama-server (its own log), and shapes. Agent runs take
minutes on a loaded 2-core machine; the hang guards are 15 minutes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from tests import agent_util
from tests.agent_util import agent_env
from tests.daemon_util import DaemonProc
from bostudio.agents.pages import CODEX_SMALL_MODEL_PAGE
from bostudio.gguf.synth import tiny_llama

GEMMA = "gemma-3-270m-q4_k_m"
NO_TOOLS = "tiny-no-tools"
HANG_GUARD_S = 900
MAX_OUTPUT = 200
PROMPT_EVAL = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")
# A task llama-server took up: printed when it starts (at the default verbosity), so a task the daemon's loop
# guard stopped (no timings follow a cancelled task) counts too.
TASK_STARTED = re.compile(r"launch_slot_: id +\d+ \| task \d+ \| processing task")
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           # bounded, so the grammar-constrained first call always ends within the tests' max_tokens
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path):
    root = tmp_path_factory.mktemp("agents")
    models = root / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    # A model whose own template renders no tools and is no format bostudio has a tool template for.
    tiny_llama(models / f"{NO_TOOLS}.gguf", chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    d = DaemonProc(root, models, ["--idle-ttl", "0", "--record", str(root / "record")]).start()
    d.record = root / "record"  # type: ignore[attr-defined]
    yield d
    assert d.stop() == 0
    assert not d.children()


def launch_print(daemon: DaemonProc, agent: str) -> dict:
    # A base model rarely ends its turn: a small output limit keeps each run to its prompt's prefill.
    # Gemma named: the small fixture, not the default (the larger Qwen2.5-Coder-1.5B).
    return agent_util.launch_print(daemon, agent, GEMMA, "--max-output", str(MAX_OUTPUT))


def child_log(daemon: DaemonProc) -> str:
    return Path(daemon.instance(GEMMA)["log"]).read_text(errors="replace")


def evaluated_prompt_tokens(log: str) -> list[int]:
    """Prompt tokens llama-server evaluated per finished task (cached ones not counted), from its log."""
    return [int(n) for n in PROMPT_EVAL.findall(log)]


def run_agent(daemon: DaemonProc, agent: str, argv: list[str], home: Path,
              ok=lambda out: out.returncode == 0) -> tuple[subprocess.CompletedProcess, list[int], str]:
    """The agent run as a user runs it; returns its result, the prompt tokens llama-server evaluated
    for each of its requests, and llama-server's log of the run."""
    cfg = launch_print(daemon, agent)
    assert cfg["model"] == GEMMA and cfg["ctx"] >= 16384  # the planned context, not the daemon's 4096
    before = len(child_log(daemon))
    pid_before = daemon.instance(GEMMA).get("pid")
    errors = daemon.instance(GEMMA)["stats"]["errors"]
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([cfg["binary"], *argv], env=agent_env(cfg, home, work), cwd=work, capture_output=True,
                         text=True, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL)
    log = child_log(daemon)
    # The daemon may relaunch the child at an idle moment (auto's acceptance check), and the new child's log
    # starts afresh: then the whole new log is the run's.
    relaunched = daemon.instance(GEMMA).get("pid") != pid_before or len(log) < before
    log = log if relaunched else log[before:]
    evaluated = evaluated_prompt_tokens(log)
    # What the base model answers is its Q4 arithmetic on this CPU: it may end its turn at once, and the
    # agent then prints an empty answer. Asserted: the agent finished its turn without an error, its
    # requests reached llama-server, and the daemon failed none of them.
    assert ok(out), f"{agent} failed ({out.returncode}): {out.stderr[-3000:]}\n{out.stdout[-2000:]}"
    assert evaluated or TASK_STARTED.search(log), (
        f"{agent}'s requests never reached llama-server (child relaunched: {relaunched}): "
        f"{out.stderr[-2000:]}\n{out.stdout[-1000:]}")
    assert daemon.instance(GEMMA)["stats"]["errors"] == errors, "the daemon failed a request"
    return out, evaluated, log


def claude_answered(out: subprocess.CompletedProcess) -> bool:
    """Claude Code got its answer. The embedded base model may not end its turn within the output limit:
    Claude Code then reports that the reply exceeded it (a property of the model, not of the daemon);
    any other error fails."""
    if out.returncode == 0:
        return True
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return "output token maximum" in result.get("result", "") and "API Error: 4" not in result["result"] \
        and "API Error: 5" not in result["result"]


def test_launch_print_says_what_it_sets(daemon: DaemonProc) -> None:
    cfg = launch_print(daemon, "claude")
    assert cfg["env"]["ANTHROPIC_BASE_URL"] == daemon.url
    assert cfg["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(cfg["ctx"])
    assert daemon.instance(GEMMA)["ctx"] == cfg["ctx"]
    missing = subprocess.run([sys.executable, "-m", "bostudio", "launch", "codex"], capture_output=True, text=True,
                             env=dict(daemon.env, PATH="/nonexistent"), timeout=120)
    assert missing.returncode == 1 and "npm install -g @openai/codex@" in missing.stderr


def test_claude_code_tools_reach_the_model_and_the_prefix_is_reused(daemon: DaemonProc, tmp_path: Path) -> None:
    # Two sessions of one user in one project (same HOME and directory), with different prompts.
    home = tmp_path / "claude"
    _, first, _ = run_agent(daemon, "claude", ["-p", "Say hello in one word.", "--output-format", "json"], home,
                         ok=claude_answered)
    # The system prompt plus ~21 tool schemas: far more than a tool-less prompt (~3k, as the issue saw).
    assert first[0] > 10_000, f"only {first[0]} prompt tokens reached the model: tools dropped?"
    # A second session with another prompt re-evaluates only its tail (billing header stripped).
    _, second, _ = run_agent(daemon, "claude", ["-p", "Name one colour.", "--output-format", "json"], home,
                          ok=claude_answered)
    # Its first request evaluates only what differs from the first session's (the prompt and after).
    assert second[0] <= first[0] // 10, f"second session evaluated {second[0]} of {first[0]} prompt tokens again"


def test_codex_exec(daemon: DaemonProc, tmp_path: Path) -> None:
    out, _, _ = run_agent(daemon, "codex", ["exec", "--skip-git-repo-check", "Say hello in one word."],
                          tmp_path / "codex")
    assert "tokens used" in out.stderr, out.stderr[-3000:]  # codex exec closes a finished turn with its usage
    # What launch's config leaves the model (agents.CODEX_TOOLS_OFF): the shell, none of OpenAI's hosted
    # tools, sub-agents, goals, images or Plan mode's question to the user; no skills catalogue in the prompt.
    sent = [json.loads(p.read_text()) for p in sorted(daemon.record.glob("*.json"))]
    bodies = [r["body"] for r in sent if r["route"].endswith("/responses") and r["body"].get("tools")]
    assert bodies, [r["route"] for r in sent]
    tools = {t.get("name") or t.get("type") for t in bodies[-1]["tools"]}
    assert tools == {"exec_command", "write_stdin"}, tools
    assert "<skills_instructions>" not in json.dumps(bodies[-1]["input"])
    # A model under 4B parameters (this 270M) gets bostudio's short page in place of Codex's own instructions:
    # the first message Codex sends is that page (agents.instructions_for).
    first = bodies[0]["input"][0]
    assert first["role"] == "developer" and first["content"][0]["text"].strip() == CODEX_SMALL_MODEL_PAGE.strip()


def test_opencode_run(daemon: DaemonProc, tmp_path: Path) -> None:
    requests = daemon.instance(GEMMA)["stats"]["requests"]
    _, _, log = run_agent(daemon, "opencode", ["run", "Say hello in one word."], tmp_path / "opencode")
    # opencode sends its title request and its main request at once. What the daemon guarantees: both are
    # admitted and forwarded (each counted), and none failed (run_agent). Not asserted: that they overlapped
    # in the slots, nor that both finished: whether the title's prompt was evaluated before opencode cancels
    # it is the CPU's speed (a loaded machine's fresh-clone run failed on the overlap).
    assert daemon.instance(GEMMA)["stats"]["requests"] - requests >= 2, log[-3000:]


# ------------------------------------------------------------------ client libraries: forced tool calls

def test_openai_chat_forced_tool_call_and_its_result(daemon: DaemonProc) -> None:
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    messages: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"type": "function", "function": WEATHER}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = oai.chat.completions.create(model=GEMMA, messages=messages, tools=tools, tool_choice=choice,
                                        max_tokens=120)
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather"
        json.loads(calls[0].function.arguments)  # arguments are JSON (grammar-constrained)
    # The first call goes back with its result (the last of several calls may be cut by max_tokens).
    follow = messages + [{"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
                         {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21 C"}]
    r2 = oai.chat.completions.create(model=GEMMA, messages=follow, tools=tools, max_tokens=20)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens  # the call and its result reached the model


def test_openai_responses_forced_tool_call_and_its_result(daemon: DaemonProc) -> None:
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    tools = [{"type": "function", **WEATHER}]
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = oai.responses.create(model=GEMMA, input="What is the weather in Paris?", tools=tools,
                                 tool_choice=choice, max_output_tokens=120)
        calls = [o for o in r.output if o.type == "function_call"]
        assert calls and calls[0].name == "get_weather"
        json.loads(calls[0].arguments)
    follow = [{"role": "user", "content": "What is the weather in Paris?"},
              {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
               "arguments": calls[0].arguments},
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}]
    r2 = oai.responses.create(model=GEMMA, input=follow, tools=tools, max_output_tokens=20)
    assert r2.status in ("completed", "incomplete") and r2.usage.input_tokens > r.usage.input_tokens


def test_anthropic_forced_tool_call_and_its_result(daemon: DaemonProc) -> None:
    claude = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=300)
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    messages: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        r = claude.messages.create(model=GEMMA, max_tokens=120, messages=messages, tools=tools, tool_choice=choice)
        uses = [b for b in r.content if b.type == "tool_use"]
        assert uses and uses[0].name == "get_weather" and isinstance(uses[0].input, dict)
    follow = messages + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in uses[:1]]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                       "content": "sunny, 21 C"}]}]
    r2 = claude.messages.create(model=GEMMA, max_tokens=20, messages=follow, tools=tools)
    assert r2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert r2.usage.input_tokens > r.usage.input_tokens


def test_ollama_tool_call_result_goes_back(daemon: DaemonProc) -> None:
    # Ollama's API has no tool_choice: the tools reach the model, and a call and its result go back.
    olla = ollama.Client(host=daemon.url, timeout=300)
    tools = [{"type": "function", "function": WEATHER}]
    r = olla.chat(model=GEMMA, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=tools,
                  options={"num_predict": 40})
    assert r.message.role == "assistant" and r.prompt_eval_count > 100  # the tool list is in the prompt
    follow = [{"role": "user", "content": "What is the weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                                "arguments": {"city": "Paris"}}}]},
              {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}]
    r2 = olla.chat(model=GEMMA, messages=follow, tools=tools, options={"num_predict": 20})
    assert r2.message.role == "assistant" and r2.prompt_eval_count > r.prompt_eval_count


def test_tools_to_a_model_whose_template_cannot_render_them_are_refused(daemon: DaemonProc) -> None:
    """Never dropped silently: refused before any launch, in each client's error shape, saying why."""
    tools = [{"type": "function", "function": WEATHER}]
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError, match="cannot render tools"):
        oai.chat.completions.create(model=NO_TOOLS, messages=[{"role": "user", "content": "hi"}], tools=tools)
    claude = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError, match="cannot render tools"):
        claude.messages.create(model=NO_TOOLS, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                               tools=[{"name": "f", "input_schema": {"type": "object"}}])
    r = httpx.post(daemon.url + "/api/chat", json={"model": NO_TOOLS, "messages": [{"role": "user", "content": "hi"}],
                                                   "tools": tools, "stream": False}, timeout=60, trust_env=False)
    assert r.status_code == 400 and "cannot render tools" in r.json()["error"]
    assert daemon.instance(NO_TOOLS).get("state") in (None, "stopped")  # refused before any launch
