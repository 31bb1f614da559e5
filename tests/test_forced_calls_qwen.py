"""A forced tool call on the default model's own template, through the real daemon and llama-server, read by the
official clients. On the pinned llama-server, `tool_choice: required` alone does not force Qwen2.5-Coder's
template: the answer stayed free text (a fenced block, then prose until the limit). The daemon opens the
assistant turn with the template's own `<tool_call>` marker (gguf/template.py HERMES_CALL), and llama.cpp's
grammar then leaves the model only the call. The daemon's rescue asks again this way when a small model's call
comes out broken (toolrescue.forcing), so this is the path that retry takes.

What is asserted is structure, which the grammar guarantees whatever token wins on a Q4 file: calls to the one
tool offered, with JSON arguments. Exactly one call is asserted where the daemon keeps it to one (Anthropic's
disable_parallel_tool_use). On the OpenAI dialects llama-server reads `parallel_tool_calls: false` itself, and
honours it only sometimes: in one run of six the Responses answer, its prompt cached from the chat request
before it, held eight calls, the last cut by the output limit. So those are asserted as calls, not counted, and
a last call may be cut short."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import openai
import pytest

from bostudio.catalog.embedded import DEFAULT
from tests.daemon_util import DaemonProc

pytestmark = [pytest.mark.engine]

WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           # bounded, so the grammar-constrained call always ends within the output limit below
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                          "required": ["city"], "additionalProperties": False}}
ASK = "What is the weather in Paris?"
LIMIT = 200


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, qwen_gguf: Path):
    root = tmp_path_factory.mktemp("forced-qwen")
    models = root / "models"
    models.mkdir()
    (models / qwen_gguf.name).symlink_to(qwen_gguf)
    d = DaemonProc(root, models, ["--idle-ttl", "0"]).start()
    yield d
    assert d.stop() == 0
    assert not d.children()


def test_openai_chat_forced_call_on_the_default_models_template(daemon: DaemonProc) -> None:
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    r = oai.chat.completions.create(model=DEFAULT.name, messages=[{"role": "user", "content": ASK}],
                                    tools=[{"type": "function", "function": WEATHER}], tool_choice="required",
                                    parallel_tool_calls=False, max_tokens=LIMIT)
    calls = r.choices[0].message.tool_calls
    assert calls, r.choices[0].message
    # Every call but a last one the output limit may cut (when parallel_tool_calls was not honoured).
    assert all(c.function.name == "get_weather" and isinstance(json.loads(c.function.arguments).get("city"), str)
               for c in calls[:max(1, len(calls) - 1)])


def test_openai_responses_forced_call_on_the_default_models_template(daemon: DaemonProc) -> None:
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    r = oai.responses.create(model=DEFAULT.name, input=ASK, tools=[{"type": "function", **WEATHER}],
                             tool_choice="required", parallel_tool_calls=False, max_output_tokens=LIMIT)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls, r.output
    assert all(c.name == "get_weather" and isinstance(json.loads(c.arguments).get("city"), str)
               for c in calls[:max(1, len(calls) - 1)])  # a last one the output limit may cut, as above


def test_anthropic_forced_call_on_the_default_models_template(daemon: DaemonProc) -> None:
    """llama-server's Anthropic route has no switch for parallel calls: the daemon keeps
    `disable_parallel_tool_use` itself (toolrescue.one_call), streamed and whole. Forced without it, the 1.5B
    wrote get_weather calls until its output limit."""
    claude = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=600)
    ask = dict(model=DEFAULT.name, max_tokens=LIMIT, messages=[{"role": "user", "content": ASK}],
               tools=[{"name": WEATHER["name"], "description": WEATHER["description"],
                       "input_schema": WEATHER["parameters"]}],
               tool_choice={"type": "any", "disable_parallel_tool_use": True})
    r = claude.messages.create(**ask)
    with claude.messages.stream(**ask) as s:
        streamed = s.get_final_message()
    for msg in (r, streamed):
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert len(uses) == 1 and uses[0].name == "get_weather", msg.content
        assert isinstance(uses[0].input.get("city"), str)
        assert msg.stop_reason == "tool_use"
