"""One launch decision (bostudio.launch): for the same inputs, `bostudio up` (prepare_launch), a daemon
child and `bostudio plan --json` run the same llama-server argv, apart from port, alias, key and paths:
for a local plan, a plan over a real loopback RPC worker, and a plan whose draft has a cache type from
pairings.toml (run once, at the value it is priced at). Then the daemon itself on the embedded model,
fresh and without settings: the context it loads with by default holds a 4.5k-token chat, three
concurrent 2.2k-token chats are answered (queued in the KV pool, never a 500), the child runs the flags
`up` runs, and a prompt that cannot fit gets a 400 in the client's API shape."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import anthropic
import openai
import psutil
import pytest

from bostudio.profiles import default_workload
from bostudio.catalog.resolve import model_name
from bostudio.cli import main
from bostudio.daemon.supervise.launching import decide_child
from bostudio.gguf import describe
from bostudio.pairing.edge.pair import record_self_draft
from bostudio.rpc.probe import discover_pool
from bostudio.rpc.workers import workers_from_config
from bostudio.up import UpOptions, prepare_launch
from tests.argv_util import comparable
from tests.daemon_util import DaemonProc
from bostudio.gguf.synth import tiny_llama
from tests.netutil import free_port

GEMMA = "gemma-3-270m-q4_k_m"
FLAGS = ("-c", "-ngl", "-np", "-fit", "-kvu", "-ctk", "-ctv", "--spec-type")


def flag_values(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for f in FLAGS:
        assert argv.count(f) == 1, f"{f} appears {argv.count(f)} times in {argv}"
        i = argv.index(f)
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        out[f] = None if nxt is None or nxt.startswith("-") else nxt
    return out


def three_ways(model: Path, engine, capsys: pytest.CaptureFixture[str], extra: list[str] = ()):  # type: ignore[no-untyped-def]
    """(up's argv, the daemon child's argv, plan --json's argv) for `model` with no settings."""
    up = prepare_launch(UpOptions(model=str(model), port=free_port(), pull="never"), note=lambda _: None).argv
    info = describe(model)
    workers = workers_from_config()
    pool = discover_pool(engine, workers) if workers else None
    kw = {"pool": pool} if pool is not None else {}
    # what EffectsRunner.launch_once decides for a model with the default config (spec auto, ctx None)
    workload = default_workload(model_name(model))
    daemon = decide_child(info, engine, "auto", None, "f16", workload=workload, **kw).argv(port=1234, alias="x")
    assert main(["plan", str(model), "--json", *extra]) == 0
    planned = json.loads(capsys.readouterr().out)
    return up, daemon, planned


def test_up_daemon_and_plan_run_the_same_argv_locally(gemma_gguf: Path, engine, tmp_state,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    up, daemon, planned = three_ways(gemma_gguf, engine, capsys)
    assert comparable(up) == comparable(daemon) == comparable(planned["argv"])
    assert int(flag_values(up)["-c"] or 0) == planned["ctx"] == describe(gemma_gguf).n_ctx_train  # largest fit
    assert planned["layout"] == {"slots": 4, "pool_ctx": planned["ctx"], "slot_ctx": planned["ctx"], "unified": True}
    assert flag_values(up)["-fit"] == "off" and flag_values(up)["-np"] == "4"


def test_a_draft_with_a_cache_type_from_pairings_runs_it_once(engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    target = tiny_llama(tmp_path / "t" / "paired-target.gguf", n_layer=4)
    draft = tiny_llama(tmp_path / "d" / "paired-draft.gguf", n_layer=1)
    table = tmp_path / "config" / "bostudio" / "pairings.toml"
    assert record_self_draft(describe(target), draft, "Q2_K", table)
    text = table.read_text()
    table.write_text(text.replace("self_draft = true\n", 'self_draft = true\ncache_type_k_draft = "q8_0"\n'
                                                         'cache_type_v_draft = "q8_0"\n'))
    up, daemon, planned = three_ways(target, engine, capsys)
    assert comparable(up) == comparable(daemon) == comparable(planned["argv"])
    for argv in (up, daemon, planned["argv"]):
        assert "draft-simple" in argv[argv.index("--spec-type") + 1]
        # llama.cpp keeps the last -ctkd: one, at the pairing's value, which is what the plan priced
        assert argv.count("-ctkd") == 1 and argv[argv.index("-ctkd") + 1] == "q8_0"
        assert argv.count("-ctvd") == 1 and argv[argv.index("-ctvd") + 1] == "q8_0"


def test_up_daemon_and_plan_run_the_same_argv_over_an_rpc_worker(gemma_gguf: Path, engine, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_rpc import Worker

    assert engine.has_rpc, "the engine has no RPC backend: rebuild with `bostudio engine build`"
    w = Worker(engine, tmp_path)
    try:
        info = describe(gemma_gguf)
        budget = int((sum(info.layer_bytes) / 2) / (1 << 20)) + 64  # about half the layers go to the worker
        (tmp_path / "config" / "bostudio").mkdir(parents=True)
        (tmp_path / "config" / "bostudio" / "config.toml").write_text(
            f'[[rpc]]\nhost = "127.0.0.1"\nport = {w.port}\nbudget_mib = {budget}\n')
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        up, daemon, planned = three_ways(gemma_gguf, engine, capsys)
    finally:
        w.kill()
    assert comparable(up) == comparable(daemon) == comparable(planned["argv"])
    assert up[1:3] == ["--rpc", w.endpoint]
    assert "-dev" in up and "RPC0" in up[up.index("-dev") + 1]


# ---------------------------------------------------------------- the daemon, fresh, on the embedded model

@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path):
    root = tmp_path_factory.mktemp("launch-daemon")
    models = root / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    d = DaemonProc(root, models, ["--idle-ttl", "0"]).start()
    yield d
    assert d.stop() == 0
    assert not d.children()


@pytest.fixture(scope="module")
def oai(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def words(n: int, seed: int = 0) -> str:
    """About n tokens of varied text (numbered lines, so no n-gram repeats a whole line)."""
    return "\n".join(f"line {seed}-{i}: the value of item {i} is {i * 7 % 13} units" for i in range(n // 20))  # ~20 tokens a line


def test_an_on_demand_load_answers_a_4_5k_token_chat(daemon: DaemonProc, oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model=GEMMA, max_tokens=8, temperature=0,
                                    messages=[{"role": "user", "content": words(4900) + "\nWhat is item 3?"}])
    assert r.usage is not None and r.usage.prompt_tokens > 4500  # above the old default context of 4096
    assert r.choices[0].finish_reason in ("stop", "length")


def test_three_concurrent_2_2k_token_chats_are_all_answered(daemon: DaemonProc, oai: openai.OpenAI) -> None:
    results: list[object] = [None] * 3

    def ask(i: int) -> None:
        try:
            results[i] = oai.chat.completions.create(
                model=GEMMA, max_tokens=8, temperature=0,
                messages=[{"role": "user", "content": words(2250, seed=i) + f"\nWhat is item {i}?"}])
        except Exception as exc:  # recorded, asserted below
            results[i] = exc

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    assert not any(t.is_alive() for t in threads)
    for r in results:
        assert not isinstance(r, Exception), repr(r)
        assert r.usage.prompt_tokens > 2000  # type: ignore[union-attr]


def test_the_daemon_child_runs_the_flags_up_runs(daemon: DaemonProc, oai: openai.OpenAI, gemma_gguf: Path,
                                                 tmp_state) -> None:
    oai.completions.create(model=GEMMA, prompt="1 + 1 =", max_tokens=1)  # loaded (it is, after the tests above)
    inst = daemon.instance(GEMMA)
    child = psutil.Process(inst["pid"]).cmdline()
    up = prepare_launch(UpOptions(model=str(gemma_gguf), port=free_port(), pull="never"), note=lambda _: None).argv
    assert flag_values(child) == flag_values(up)
    assert inst["ctx"] == int(flag_values(child)["-c"] or 0) == describe(gemma_gguf).n_ctx_train
    assert inst["plan"]["layout"]["slots"] == 4
    # the plan the daemon evicts by is the plan it runs, and the plans route (the TUI's view) shows that argv
    with daemon.http() as http:
        shown = http.get(f"/bostudio/plans/{GEMMA}").json()
    assert shown["bytes"] == inst["plan"]["bytes"] and shown["ctx"] == inst["ctx"]
    assert comparable(shown["argv"]) == comparable(child)


def test_a_prompt_that_cannot_fit_is_a_400_in_the_clients_shape(daemon: DaemonProc, oai: openai.OpenAI) -> None:
    oai.completions.create(model=GEMMA, prompt="1 + 1 =", max_tokens=1)  # loaded on demand
    ctx = daemon.instance(GEMMA)["ctx"]
    huge = words(ctx + 2000)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=GEMMA, max_tokens=8, messages=[{"role": "user", "content": huge}])
    err = e.value.body if isinstance(e.value.body, dict) else {}
    assert e.value.status_code == 400 and f"context of {ctx} tokens" in err.get("message", "")
    assert "shorten the conversation" in err.get("hint", "")
    # Anthropic's own wording, which Claude Code reads to compact and retry; the OpenAI code Codex reads
    found = re.match(r"prompt is too long: (\d+) tokens > (\d+) maximum", err["message"])
    assert found and int(found[1]) > ctx and int(found[2]) == ctx
    assert err.get("code") == "context_length_exceeded"

    claude = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=600)
    with pytest.raises(anthropic.BadRequestError) as a:
        claude.messages.create(model=GEMMA, max_tokens=8, messages=[{"role": "user", "content": huge}])
    body = a.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and f"context of {ctx} tokens" in body["error"]["message"]
    assert re.match(r"prompt is too long: \d+ tokens > \d+ maximum", body["error"]["message"])

    with pytest.raises(openai.BadRequestError) as rsp:  # the Responses API, same OpenAI shape
        oai.responses.create(model=GEMMA, input=huge, max_output_tokens=16)
    assert f"context of {ctx} tokens" in str(rsp.value)
    import ollama

    with pytest.raises(ollama.ResponseError) as oll:
        ollama.Client(host=daemon.url, timeout=600).chat(model=GEMMA, messages=[{"role": "user", "content": huge}])
    assert oll.value.status_code == 400 and f"context of {ctx} tokens" in oll.value.error

    # a prompt the daemon cannot count (token ids): llama-server's own 400 comes back in the same shape
    with pytest.raises(openai.BadRequestError) as t:
        oai.completions.create(model=GEMMA, max_tokens=1, prompt=[[100] * (ctx + 100)])
    assert f"context of {ctx} tokens" in str(t.value)

    # the model is still there and answers
    assert oai.completions.create(model=GEMMA, prompt="2 + 2 =", max_tokens=1).choices


def test_at_a_small_context_concurrent_chats_queue_instead_of_failing(daemon: DaemonProc, oai: openai.OpenAI) -> None:
    """The measured failure: three concurrent ~2.2k-token chats at -c 4096 all got 500 "Context size has been
    exceeded" from llama-server's shared KV pool. Through the daemon they wait their turn and all succeed."""
    with daemon.http(timeout=600) as http:
        assert http.post("/bostudio/instances", json={"model": GEMMA, "ctx": 4096}).status_code == 200
        r = http.post(f"/bostudio/instances/{GEMMA}/restart")
        assert r.status_code == 200, r.text
    inst = daemon.instance(GEMMA)
    assert inst["ctx"] == 4096 and inst["ctx_asked"] == 4096
    test_three_concurrent_2_2k_token_chats_are_all_answered(daemon, oai)
    after = daemon.instance(GEMMA)["admission"]
    assert after["queued"] == 0 and after["reserved_tokens"] == 0 and after["pool_tokens"] == 4096
