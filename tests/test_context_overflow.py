"""A conversation longer than the model's context (daemon/http/overflow.py, `daemon --context-overflow`):
the middle of its longest earlier texts is elided until it fits, and it is answered instead of refused; the
last turn, the system prompt and tool calls' arguments are never cut; `refuse` keeps the 400.

First the pure cut on each API's body shape, then the real daemon on Gemma 3 270M at a 2048-token context
through the official openai and anthropic clients (each conversation ~3.5k tokens: it cannot fit whole)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import anthropic
import openai
import pytest

from bostudio.daemon.http.overflow import KEEP, cuttable, elide
from tests.daemon_util import DaemonProc

GEMMA = "gemma-3-270m-q4_k_m"
CTX = 2048


def log_lines(tag: str, n: int) -> str:
    """A build log the user pasted: n distinct lines (~23 Gemma tokens each)."""
    return "\n".join(f"[{tag} {i:04d}] module {tag}{i} built, {i % 7 + 1} checks passed in {i % 13 + 2}.{i % 10}s"
                     for i in range(n))


LOG = log_lines("alpha", 150)
QUESTION = "Which module was built last? Answer with its name."


def chat_body() -> dict:
    return {"model": "m", "max_tokens": 16, "messages": [
        {"role": "system", "content": "You are terse. " * 40},
        {"role": "user", "content": f"Here is my build log:\n{LOG}"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": json.dumps({"p": LOG})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": log_lines("tool", 40)},
        {"role": "user", "content": [{"type": "text", "text": QUESTION + " " + log_lines("beta", 20)}]}]}


# ------------------------------------------------------------------ the cut itself (pure)

def test_the_longest_earlier_texts_lose_their_middle_and_the_rest_stays_whole() -> None:
    body = chat_body()
    before = copy.deepcopy(body)
    out, cut = elide("/v1/chat/completions", body, 3000, CTX)
    assert body == before, "the request the daemon read is not changed in place"
    assert cut >= 3000
    msgs = out["messages"]
    assert msgs[0] == body["messages"][0], "the system prompt is never cut"
    assert msgs[-1] == body["messages"][-1], "the last turn (the question) is never cut"
    assert msgs[2]["tool_calls"] == body["messages"][2]["tool_calls"], "a tool call's arguments are never cut"
    text = msgs[1]["content"]
    assert len(text) < len(body["messages"][1]["content"])
    assert text.startswith("Here is my build log:\n[alpha 0000]"), "the head stays"
    assert text.endswith(LOG[-40:]), "the tail stays"
    assert "characters elided here by bostudio" in text and f"context of {CTX:,} tokens" in text
    # The shorter tool output is cut only as far as the common length asks: one length for all cut texts.
    assert len(json.dumps(out)) <= len(json.dumps(body)) - 3000


def test_a_small_need_cuts_only_the_longest_text() -> None:
    out, cut = elide("/v1/chat/completions", chat_body(), 200, CTX)
    assert 200 <= cut < 2000
    assert out["messages"][3] == chat_body()["messages"][3], "the shorter tool output is kept whole"


def test_more_than_there_is_cuts_everything_down_to_the_kept_ends() -> None:
    body = chat_body()
    out, cut = elide("/v1/chat/completions", body, 10**9, CTX)
    assert 0 < cut < 10**9
    assert len(out["messages"][1]["content"]) < KEEP + 200  # its ends and the marker
    assert out["messages"][-1] == body["messages"][-1]


def test_nothing_to_cut_gives_the_body_back() -> None:
    one = {"messages": [{"role": "user", "content": LOG}]}  # the last turn alone: never cut
    assert elide("/v1/chat/completions", one, 5000, CTX) == (one, 0)
    assert elide("/completion", {"prompt": LOG}, 5000, CTX)[1] == 0  # no conversation on this route
    assert cuttable("/v1/chat/completions", {"messages": "not a list"}) == []
    assert elide("/v1/chat/completions", chat_body(), 0, CTX)[1] == 0


def test_anthropic_and_responses_shapes() -> None:
    messages = {"model": "m", "max_tokens": 16, "system": "S " * 500, "messages": [
        {"role": "user", "content": [{"type": "text", "text": LOG}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "read", "input": {"p": LOG}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": [{"type": "text", "text": log_lines("out", 120)}]}]},
        {"role": "user", "content": QUESTION}]}
    out, cut = elide("/v1/messages", messages, 4000, CTX)
    assert cut >= 4000 and out["system"] == messages["system"]
    assert out["messages"][1] == messages["messages"][1], "tool_use input is never cut"
    assert "elided here by bostudio" in out["messages"][0]["content"][0]["text"]
    assert "elided here by bostudio" in out["messages"][2]["content"][0]["content"][0]["text"]

    responses = {"model": "m", "instructions": "I " * 500, "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": LOG}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": LOG}]},
        {"type": "function_call", "call_id": "f", "name": "sh", "arguments": json.dumps({"cmd": LOG})},
        {"type": "function_call_output", "call_id": "f", "output": log_lines("sh", 120)},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]}
    out, cut = elide("/v1/responses", responses, 4000, CTX)
    assert cut >= 4000 and out["instructions"] == responses["instructions"]
    assert out["input"][0] == responses["input"][0], "the developer message is the system prompt: kept"
    assert out["input"][2] == responses["input"][2], "a function call's arguments are never cut"
    assert "elided here by bostudio" in out["input"][1]["content"][0]["text"]
    assert out["input"][-1] == responses["input"][-1]


def test_the_option_reaches_the_supervisor_and_a_background_daemon(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    from bostudio.cli import build_parser
    from bostudio.cli.daemon import _daemon_args, _daemon_options

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert _daemon_options(build_parser().parse_args(["daemon"])).supervisor.context_overflow == "trim"
    args = build_parser().parse_args(["daemon", "--context-overflow", "refuse"])
    assert _daemon_options(args).supervisor.context_overflow == "refuse"
    passed = _daemon_args(args)  # `daemon start` and `launch` pass it on to the daemon they start
    assert passed[passed.index("--context-overflow") + 1] == "refuse"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["daemon", "--context-overflow", "drop"])


# ------------------------------------------------------------------ the real daemon, real clients

def _daemon(tmp_path_factory: pytest.TempPathFactory, gemma_gguf: Path, name: str, policy: list[str]):
    root = tmp_path_factory.mktemp(name)
    (root / "models").mkdir()
    (root / "models" / gemma_gguf.name).symlink_to(gemma_gguf)
    d = DaemonProc(root, root / "models", ["--idle-ttl", "0", "--no-prompt-reuse", *policy]).start()
    with d.http(600) as http:
        r = http.post("/bostudio/instances", json={"model": GEMMA, "ctx": CTX, "spec": "off"})
        assert r.status_code == 200, r.text
    return d


@pytest.fixture(scope="module")
def trimming(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path):
    d = _daemon(tmp_path_factory, gemma_gguf, "overflow-trim", [])
    yield d
    assert d.stop() == 0
    assert not d.children()


def conversation() -> list[dict]:
    return [{"role": "user", "content": f"Here is my build log:\n{LOG}"},
            {"role": "assistant", "content": "It built 150 modules."},
            {"role": "user", "content": QUESTION}]


@pytest.mark.engine
def test_a_conversation_over_the_context_is_answered_with_its_middle_elided(trimming: DaemonProc) -> None:
    oai = openai.OpenAI(base_url=trimming.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    n = oai.chat.completions.create(model=GEMMA, max_tokens=1, messages=conversation())
    # the count the child gives the request as sent; the whole conversation was over the context
    assert 0 < n.usage.prompt_tokens < CTX
    r = oai.chat.completions.create(model=GEMMA, max_tokens=8, messages=conversation())
    assert r.choices[0].finish_reason in ("stop", "length")
    stats = trimming.instance(GEMMA)["stats"]
    assert stats["context_trims"] == 2

    claude = anthropic.Anthropic(base_url=trimming.url, api_key="unused", max_retries=0, timeout=600)
    m = claude.messages.create(model=GEMMA, max_tokens=8, messages=conversation())
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.input_tokens < CTX

    rsp = oai.responses.create(model=GEMMA, max_output_tokens=8, input=conversation())
    assert rsp.status == "completed" or rsp.incomplete_details is not None
    assert rsp.usage is not None and rsp.usage.input_tokens < CTX
    assert trimming.instance(GEMMA)["stats"]["context_trims"] == 4
    log = (trimming.root / "state" / "bostudio" / "logs" / "daemon.log").read_text()
    assert log.count("characters elided from the middle of earlier turns") == 4


@pytest.mark.engine
def test_a_last_turn_longer_than_the_context_is_still_refused(trimming: DaemonProc) -> None:
    oai = openai.OpenAI(base_url=trimming.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=GEMMA, max_tokens=8, messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": log_lines("only", 150)}])
    assert e.value.status_code == 400 and f"context of {CTX} tokens" in str(e.value)


@pytest.mark.engine
def test_refuse_keeps_the_400(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path) -> None:
    d = _daemon(tmp_path_factory, gemma_gguf, "overflow-refuse", ["--context-overflow", "refuse"])
    try:
        oai = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model=GEMMA, max_tokens=8, messages=conversation())
        assert e.value.status_code == 400 and "prompt is too long" in str(e.value)
        assert d.instance(GEMMA)["stats"]["context_trims"] == 0
    finally:
        assert d.stop() == 0
    assert not d.children()
