"""What reaches a child llama-server, over real sockets to a real `bostudio daemon` whose children are
fake llama-servers that record every body they are sent (tests/fake_llama_server.py, FAKE_LLAMA_BODIES):
only the fields each API defines, never llama-server's internal ones; every generating request with an
output limit; and a request that kills its child harms only itself. The verdicts are the recorded bodies,
status codes and counters, never a time."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from bostudio.daemon.http.fields import ALLOWED, allowed_body
from bostudio.daemon.http.normalise import OUTPUT_FIELD, default_output_limit
from bostudio.errors import RequestError
from tests.daemon_util import DaemonProc, fake_engine
from tests.fake_llama_server import KILL_WORD
from bostudio.gguf.synth import tiny_llama

GUARD_S = 120.0  # hang guard for any one request
# Fields llama-server reads from a request body that no public API defines (tools/server/server-schema.cpp):
# one crafted value of the first six crashed a child; the rest are per-request server knobs.
INTERNAL = {"chat_parser": "not a parser", "chat_format": 987654, "generation_prompt": "<|evil|>",
            "grammar_type": "tool_calls", "grammar_triggers": [{"type": 0, "value": "x"}],
            "preserved_tokens": ["<|x|>"], "grammar_lazy": True, "message_delimiters": {"x": 1},
            "speculative.n_max": 1 << 20, "speculative.type": "none", "n_cache_reuse": 1, "sse_ping_interval": 0,
            "t_max_predict_ms": 1, "verbose": True, "backend_sampling": True, "response_fields": ["x"]}
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fields")
    (root / "models").mkdir()
    for name in ("fake-ok", "fake-victim"):
        tiny_llama(root / "models" / f"{name}.gguf", chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    fake_engine(root)
    return root


@pytest.fixture(scope="module")
def daemon(root: Path):
    d = DaemonProc(root, root / "models", ["--engine", str(root / "llama-server"), "--idle-ttl", "0"])
    d.env["FAKE_LLAMA_BODIES"] = str(root / "bodies.jsonl")  # the children inherit the daemon's environment
    d.start()
    yield d
    assert d.stop() == 0
    assert not d.children()


def forwarded(root: Path) -> list[dict]:
    """Every POST the fake children got so far: {"pid", "path", "body"}."""
    path = root / "bodies.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def post(d: DaemonProc, route: str, body: dict) -> httpx.Response:
    return httpx.post(d.url + route, json=body, timeout=GUARD_S, trust_env=False)


# ------------------------------------------------------------------ the allow-list

ROUTE_BODIES = [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "top_k": 5, "min_p": 0.1, "metadata": {"a": 1}}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "top_k": 5, "logprobs": 2}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "top_k": 5, "store": False}),
    ("/v1/messages", {"messages": CHAT, "max_tokens": 4, "top_k": 5}),
    ("/v1/messages/count_tokens", {"messages": CHAT}),
    ("/v1/chat/completions/input_tokens", {"messages": CHAT}),
    ("/v1/responses/input_tokens", {"input": "hi"}),
    ("/tokenize", {"content": "hi"}),
    ("/detokenize", {"tokens": [1, 2]}),
    ("/apply-template", {"messages": CHAT}),
    ("/api/chat", {"messages": CHAT, "stream": False, "options": {"top_k": 5}}),
    ("/api/generate", {"prompt": "hi", "stream": False, "options": {"top_k": 5}}),
]


def test_no_internal_field_reaches_the_child_on_any_route(daemon: DaemonProc, root: Path) -> None:
    before = len(forwarded(root))
    for route, body in ROUTE_BODIES:
        r = post(daemon, route, {"model": "fake-ok", **body, **INTERNAL})
        assert r.status_code == 200, (route, r.text)
    sent = forwarded(root)[before:]
    routes = {s["path"] for s in sent}
    # Every route got through (Ollama's as chat and completions), with the daemon's own prompt counts.
    assert {r for r, _ in ROUTE_BODIES if not r.startswith("/api/")} <= routes
    for s in sent:
        assert not set(INTERNAL) & set(s["body"]), s
        assert not {"metadata", "store"} & set(s["body"]), s  # unknown API fields are dropped too
    # The sampling extensions users send on purpose pass, on every generating route.
    generated = [s["body"] for s in sent if s["path"] in ("/v1/chat/completions", "/v1/completions", "/v1/responses",
                                                         "/v1/messages")]
    assert len(generated) == 6 and all(b["top_k"] == 5 for b in generated)


@pytest.mark.parametrize("route, body, shape", [
    # llama-server reads an integer `logprobs` as `n_probs`: 1000 returned 1001 probabilities per token.
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "logprobs": 1000}, "openai"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "logprobs": 1000}, "openai"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "logprobs": True, "top_logprobs": 101}, "openai"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "mirostat": 7}, "openai"),
    ("/v1/messages", {"messages": CHAT, "max_tokens": 1, "temperature": "hot"}, "anthropic"),
    ("/api/chat", {"messages": CHAT, "stream": False, "options": {"top_k": "many"}}, "ollama"),
    ("/api/generate", {"prompt": "hi", "stream": False, "options": {"num_predict": 1 << 30}}, "ollama"),
])
def test_a_value_past_its_type_or_bound_gets_400_in_the_apis_shape(daemon: DaemonProc, root: Path, route: str,
                                                                   body: dict, shape: str) -> None:
    before = len(forwarded(root))
    r = post(daemon, route, {"model": "fake-ok", **body})
    assert r.status_code == 400, r.text
    err = r.json()
    message = {"openai": lambda: err["error"]["message"], "anthropic": lambda: err["error"]["message"],
               "ollama": lambda: err["error"]}[shape]()
    assert isinstance(message, str) and "must be" in message
    if shape == "anthropic":
        assert err["type"] == "error"
    assert len(forwarded(root)) == before  # refused before anything reached a child


def test_every_route_has_an_allow_list_without_internal_fields() -> None:
    from bostudio.daemon.http.routes.models import PASSTHROUGH_ROUTES

    assert {p for p, *_ in PASSTHROUGH_ROUTES} <= set(ALLOWED)
    for route, fields in ALLOWED.items():
        assert not set(INTERNAL) & set(fields), route
        assert not {"id_slot", "lora", "n_threads", "n_cmpl"} & set(fields), route
        kept, dropped = allowed_body(route, {"model": "m", **INTERNAL})
        assert kept == {"model": "m"} and set(dropped) == set(INTERNAL)
    # The output limit's aliases pass on one family each: the limit admission reserves is the one used.
    assert "n_predict" not in ALLOWED["/v1/completions"] and "n_probs" not in ALLOWED["/v1/chat/completions"]
    with pytest.raises(RequestError, match="seed"):
        allowed_body("/v1/completions", {"seed": 1.5})
    with pytest.raises(RequestError, match="from 0 to 1"):
        allowed_body("/v1/completions", {"top_p": float("inf")})
    assert allowed_body("/v1/completions", {"top_k": None}) == ({}, [])  # null is "not given"
    # Each embeddings input and rerank document is a task of its own in llama-server: bounded in number.
    assert allowed_body("/v1/embeddings", {"input": "x" * 100_000})[0]["input"]  # (a long text is one input)
    with pytest.raises(RequestError, match="2048 entries"):
        allowed_body("/v1/embeddings", {"input": ["x"] * 2049})
    with pytest.raises(RequestError, match="1024 entries"):
        allowed_body("/v1/rerank", {"query": "q", "texts": ["x"] * 1025})


# ------------------------------------------------------------------ output limits

def test_every_generating_route_gets_an_output_limit_and_a_large_one_is_kept() -> None:
    for route, key in OUTPUT_FIELD.items():
        assert default_output_limit(route, {"model": "m"}, 1000) == {"model": "m", key: 1000}, route
        assert default_output_limit(route, {"model": "m", key: 50_000}, 1000) is None, route
    assert default_output_limit("/v1/chat/completions", {"max_completion_tokens": 9}, 1000) is None
    assert default_output_limit("/tokenize", {"content": "x"}, 1000) is None


@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/messages", {"messages": CHAT}),
    ("/api/generate", {"prompt": "hi", "stream": False}),  # Ollama clients send no num_predict
    ("/api/chat", {"messages": CHAT, "stream": False}),
])
def test_a_request_without_an_output_limit_reaches_the_child_with_one(daemon: DaemonProc, root: Path, route: str,
                                                                    body: dict) -> None:
    assert post(daemon, "/v1/completions", {"model": "fake-ok", "prompt": "warm", "max_tokens": 1}).status_code == 200
    limit = max(256, daemon.instance("fake-ok")["ctx"] // 4)
    before = len(forwarded(root))
    assert post(daemon, route, {"model": "fake-ok", **body}).status_code == 200
    generated = [s["body"] for s in forwarded(root)[before:] if s["path"] in ("/v1/completions", "/v1/messages",
                                                                             "/v1/chat/completions")]
    assert len(generated) == 1 and generated[0]["max_tokens"] == limit


def test_an_agents_large_output_limit_is_kept(daemon: DaemonProc, root: Path) -> None:
    before = len(forwarded(root))
    assert post(daemon, "/v1/messages", {"model": "fake-ok", "messages": CHAT, "max_tokens": 64000}).status_code == 200
    sent = [s["body"] for s in forwarded(root)[before:] if s["path"] == "/v1/messages"]
    assert len(sent) == 1 and sent[0]["max_tokens"] == 64000


# ------------------------------------------------------------------ a request that kills its child

def test_a_request_that_kills_its_child_harms_only_itself(daemon: DaemonProc, root: Path) -> None:
    assert post(daemon, "/v1/completions", {"model": "fake-victim", "prompt": "warm", "max_tokens": 1}).status_code == 200
    first_loads = daemon.instance("fake-victim")["loads"]
    killers = 6  # more than the crash loop's 5 deaths in 60 s
    for i in range(killers):
        r = post(daemon, "/v1/completions", {"model": "fake-victim", "prompt": f"{KILL_WORD} {i}", "max_tokens": 1})
        assert r.status_code == 502 and "not sent again" in r.json()["error"]["message"], r.text
        # Another client is served: it waits for the relaunch if it comes while the child is down.
        ok = post(daemon, "/v1/completions", {"model": "fake-victim", "prompt": "hello", "max_tokens": 1})
        assert ok.status_code == 200, ok.text
    inst = daemon.instance("fake-victim")
    assert inst["state"] == "ready" and inst["crashes_recent"] == 0 and inst["error"] is None
    assert inst["loads"] == first_loads + killers  # one relaunch per killing request, no retry's extra death
    sent = forwarded(root)
    for i in range(killers):  # each killing request reached a child once: never sent again
        assert sum(f"{KILL_WORD} {i}" in json.dumps(s["body"]) for s in sent) == 1, i


# ------------------------------------------------------------------ the real llama-server, through a real client

GEMMA = "gemma-3-270m-q4_k_m"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path):
    root = tmp_path_factory.mktemp("fields-real")
    (root / "models").mkdir()
    (root / "models" / gemma_gguf.name).symlink_to(gemma_gguf)
    d = DaemonProc(root, root / "models", ["--idle-ttl", "0", "--no-prompt-reuse"])
    d.start()
    with d.http(600) as http:
        assert http.post("/bostudio/instances", json={"model": GEMMA, "ctx": 2048, "spec": "off"}).status_code == 200
    yield d
    assert d.stop() == 0
    assert not d.children()


def test_llama_servers_own_fields_never_reach_the_real_child(real: DaemonProc) -> None:
    import openai

    client = openai.OpenAI(base_url=real.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    # `verbose` is one of llama-server's internal fields: a child that reads it adds `__verbose` (its
    # whole internal view of the request) to the answer. `n_probs` is the native name of chat's
    # top_logprobs. Both are dropped; the sampling extensions users send on purpose still apply.
    extra = {"verbose": True, "n_probs": 2, "top_k": 1, "min_p": 0.0}
    chat = client.chat.completions.create(model=GEMMA, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                          extra_body=extra)
    assert chat.choices[0].message.content is not None and "__verbose" not in (chat.model_extra or {})
    assert chat.choices[0].logprobs is None
    text = client.completions.create(model=GEMMA, prompt="Hi", max_tokens=2, extra_body=extra)
    assert isinstance(text.choices[0].text, str) and "__verbose" not in (text.model_extra or {})
    # The alias llama-server reads as n_probs is capped as n_probs is: 1000 returned 1001 per token.
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model=GEMMA, prompt="Hi", max_tokens=2, logprobs=1000)
    assert real.instance(GEMMA)["loads"] == 1
