"""Every API agents speak, through the daemon, against the real llama-server on real models (Gemma 3
270M and SmolLM2 135M), with the official clients: `anthropic` (messages, streamed, count_tokens),
`openai` (responses, streamed, chat, completions), `ollama` (list, chat, streamed, generate), plus
llama.cpp's own routes (infill on a model with FIM tokens, tokenize, detokenize, apply-template,
token counting) and a clear 400 for an embedding request to a chat model.

On Q4 weights no test asserts which token wins: only shapes, counters and states."""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.daemon_util import DaemonProc
from tests.synth_models import with_fim_tokens

GEMMA = "gemma-3-270m-q4_k_m"
SMOL = "SmolLM2-135M-Instruct.Q4_1"
FIM = "SmolLM2-fim"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path, smollm2_gguf: Path):
    root = tmp_path_factory.mktemp("apis")
    models = root / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    (models / smollm2_gguf.name).symlink_to(smollm2_gguf)
    # SmolLM2 with three of its special tokens named as FIM tokens in the header (it has none).
    with_fim_tokens(smollm2_gguf, models / f"{FIM}.gguf", pre=6, suf=7, mid=8)
    d = DaemonProc(root, models, ["--idle-ttl", "0", "--prompt-store-dir", str(root / "prompts")]).start()
    yield d
    assert d.stop() == 0
    assert not d.children()


@pytest.fixture(scope="module")
def claude(daemon: DaemonProc) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def oai(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def olla(daemon: DaemonProc) -> ollama.Client:
    return ollama.Client(host=daemon.url, timeout=180)


# ------------------------------------------------------------------ anthropic

@pytest.mark.parametrize("model", [GEMMA, SMOL])
def test_anthropic_messages_plain(claude: anthropic.Anthropic, model: str) -> None:
    msg = claude.messages.create(model=model, max_tokens=8, messages=HELLO)
    assert msg.type == "message" and msg.role == "assistant"
    # A base model may end its turn at once (the template's stop marker is its first output): which token
    # wins on a Q4 file is the CPU's arithmetic, so the text may be empty; its shape may not vary.
    assert all(block.type == "text" for block in msg.content)
    assert 0 < msg.usage.output_tokens <= 8 and msg.usage.input_tokens > 0
    assert msg.stop_reason in ("end_turn", "max_tokens", "stop_sequence")


def test_anthropic_messages_streamed(claude: anthropic.Anthropic) -> None:
    kinds = []
    with claude.messages.stream(model=GEMMA, max_tokens=8, messages=HELLO,
                                system="You are terse.") as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "message_delta" in kinds  # the stop reason and usage, streamed
    # Text may be empty when the base model ends its turn at once (see above); what came is text, in deltas.
    assert final.usage.output_tokens > 0 and all(block.type == "text" for block in final.content)
    assert ("content_block_delta" in kinds) == any(block.text for block in final.content)


def test_anthropic_count_tokens(claude: anthropic.Anthropic) -> None:
    short = claude.messages.count_tokens(model=GEMMA, messages=HELLO)
    longer = claude.messages.count_tokens(model=GEMMA, messages=[{"role": "user", "content": "Say hello. " * 20}])
    assert 0 < short.input_tokens < longer.input_tokens


def test_anthropic_errors_come_in_anthropic_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=HELLO)
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "not_found_error"


# ------------------------------------------------------------------ openai

def test_openai_responses_plain(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=GEMMA, input="Say hello.", max_output_tokens=8, temperature=0)
    assert r.status == "completed" and isinstance(r.output_text, str)
    assert r.usage.output_tokens > 0 and r.usage.input_tokens > 0


def test_openai_responses_streamed(oai: openai.OpenAI) -> None:
    kinds = [e.type for e in oai.responses.create(model=SMOL, input="Say hello.", max_output_tokens=8, stream=True)]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds


def test_openai_chat_and_completions_on_the_second_model(oai: openai.OpenAI) -> None:
    chat = oai.chat.completions.create(model=SMOL, messages=HELLO, max_tokens=6, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens > 0
    comp = oai.completions.create(model=SMOL, prompt="1, 2, 3,", max_tokens=4, temperature=0)
    assert comp.usage.completion_tokens > 0


def test_token_counting_routes(daemon: DaemonProc) -> None:
    with daemon.http() as http:
        r = http.post("/v1/chat/completions/input_tokens", json={"model": GEMMA, "messages": HELLO})
        assert r.status_code == 200, r.text
        chat_tokens = r.json()["input_tokens"]
        r = http.post("/v1/responses/input_tokens", json={"model": GEMMA, "input": "Say hello."})
        assert r.status_code == 200, r.text
        assert r.json()["input_tokens"] > 0 and chat_tokens > 0


def test_llama_cpp_routes_tokenize_detokenize_apply_template(daemon: DaemonProc) -> None:
    with daemon.http() as http:
        toks = http.post("/tokenize", json={"model": SMOL, "content": "hello world"}).json()["tokens"]
        assert toks and all(isinstance(t, int) for t in toks)
        text = http.post("/detokenize", json={"model": SMOL, "tokens": toks}).json()["content"]
        assert "hello world" in text
        r = http.post("/apply-template", json={"model": SMOL, "messages": HELLO})
        assert r.status_code == 200 and "Say hello." in r.json()["prompt"]


def test_infill_on_a_model_with_fim_tokens(daemon: DaemonProc) -> None:
    """A test-written GGUF with FIM token ids in its header; Gemma and SmolLM2 have none."""
    with daemon.http() as http:
        r = http.post("/infill", json={"model": FIM, "input_prefix": "def add(a, b):\n    return ",
                                       "input_suffix": "\n", "n_predict": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] > 0
        for model in (GEMMA, SMOL):
            r = http.post("/infill", json={"model": model, "input_prefix": "x", "input_suffix": "y"})
            assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]
        assert http.post("/bostudio/instances/" + FIM + "/stop").status_code == 200  # one model fewer on 2 cores


def test_embeddings_from_a_chat_model_get_a_clear_400(oai: openai.OpenAI, daemon: DaemonProc) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai.embeddings.create(model=GEMMA, input="hello")
    assert "embedding model" in err.value.message
    assert daemon.instance(GEMMA)["state"] == "ready"  # refused before reaching the child


# ------------------------------------------------------------------ ollama

def test_ollama_list_and_version(olla: ollama.Client, daemon: DaemonProc) -> None:
    names = {m.model for m in olla.list().models}
    assert names == {GEMMA, SMOL, FIM}
    assert httpx.get(daemon.url + "/api/version", trust_env=False).json()["version"]
    assert olla.generate(model=GEMMA).done_reason == "load"  # an empty generate loads the model
    loaded = {m.model for m in olla.ps().models}
    assert GEMMA in loaded


def test_ollama_chat_plain_and_streamed(olla: ollama.Client, daemon: DaemonProc) -> None:
    r = olla.chat(model=GEMMA, messages=HELLO, options={"temperature": 0, "num_predict": 6})
    assert r.message.role == "assistant" and r.done and r.eval_count > 0 and r.prompt_eval_count > 0
    parts = list(olla.chat(model=SMOL, messages=HELLO, stream=True, options={"temperature": 0, "num_predict": 6}))
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert not any(p.done for p in parts[:-1]) and parts[-1].eval_count > 0
    assert daemon.instance(GEMMA)["speculation"]  # the same instance, speculation as configured


def test_ollama_generate_and_show(olla: ollama.Client) -> None:
    r = olla.generate(model=SMOL, prompt="1, 2, 3,", options={"temperature": 0, "num_predict": 4})
    assert r.done and r.eval_count > 0 and isinstance(r.response, str)
    raw = olla.generate(model=SMOL, prompt="1, 2, 3,", raw=True, options={"num_predict": 4})
    assert raw.done and raw.eval_count > 0
    shown = olla.show(SMOL)
    # SmolLM2's own ChatML template renders no tools: it is served with bostudio's ChatML-with-tools one.
    assert shown.capabilities == ["completion", "tools"] and shown.details.format == "gguf"
    assert "insert" in olla.show(FIM).capabilities
    with pytest.raises(ollama.ResponseError) as err:
        olla.generate(model=SMOL, prompt="x", template="{{ .Prompt }}")
    assert err.value.status_code == 400 and "template" in err.value.error
