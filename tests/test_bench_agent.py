"""`bench --workload agent|DIR`, `daemon --record DIR` and the competing load: the session JSON's fields and
totals, a session recorded through a real daemon with the official clients and replayed in order, the shipped
session's shape. Verdicts are about consistency and order, never about which configuration is faster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import anthropic
import openai
import psutil
import pytest

from bostudio.bench.agent import (TurnResult, _needed, fitted_session, prefill_spread, projection, session_ctx,
                                  session_totals, sessions_json)
from bostudio.bench.load import CompetingLoad
from bostudio.bench.runner import Bench, BenchConfig, parse_flash_attn, parse_threads
from bostudio.bench.sessions import (AGENT, ROUTES, Request, module_of_turn, recorded_session, replay_request,
                                    shipped_session)
from bostudio.daemon.http.record import Recorder
from bostudio.errors import ConfigError
from tests.daemon_util import DaemonProc

BENCH_TIMEOUT_S = 1500
GEMMA = "gemma-3-270m-q4_k_m"
TURN_FIELDS = {"session", "phase", "config", "turn", "route", "request", "ttft_s", "wall_s", "prompt_n", "cache_n",
               "predicted_n", "decode_s", "prefill_s", "drafted", "accepted", "cache_hit", "decode_tok_s"}


def _env(tmp: Path) -> dict[str, str]:
    return dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), XDG_CONFIG_HOME=str(tmp / "config"))


def _bench(gguf: Path, tmp: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bostudio", "bench", str(gguf), "--json", *args],
                          capture_output=True, text=True, env=_env(tmp), timeout=BENCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _check_consistent(doc: dict) -> None:
    """Per-turn fields present; every total is the sum of its turns; the projection matches the totals."""
    for s in doc["sessions"]:
        turns, t = s["turns"], s["totals"]
        assert [x["turn"] for x in turns] == list(range(1, len(turns) + 1))
        for x in turns:
            assert set(x) >= TURN_FIELDS
            assert x["wall_s"] > 0 and x["prompt_n"] + x["cache_n"] > 0 and 0 <= x["accepted"] <= x["drafted"]
            assert x["cache_hit"] == (x["cache_n"] > 0)
            assert x["ttft_s"] is None or 0 < x["ttft_s"] <= x["wall_s"]
        for f in ("prompt_n", "cache_n", "predicted_n", "drafted", "accepted"):
            assert t[f] == sum(x[f] for x in turns), f
        for f in ("wall_s", "decode_s", "prefill_s"):
            assert t[f] == pytest.approx(sum(x[f] for x in turns)), f
        assert t["turns"] == len(turns) and t["cache_hits"] == sum(x["cache_hit"] for x in turns)
        assert doc["projection"][s["session"]][s["phase"]][s["config"]]["wall_s"] == pytest.approx(t["wall_s"])
    for phase, rows in doc["projection"]["all"].items():
        for config, p in rows.items():
            assert p["wall_s"] == pytest.approx(sum(s["totals"]["wall_s"] for s in doc["sessions"]
                                                    if s["phase"] == phase and s["config"] == config))


# ------------------------------------------------------------------------------------------------ pure

def _turn(k: int, config: str = "off", **kw: float) -> TurnResult:
    base = dict(session="s", phase="alone", config=config, turn=k, route="/v1/chat/completions", request=f"t{k}",
                ttft_s=0.5, wall_s=1.0 + k, prompt_n=100 * k, cache_n=50 * (k - 1), predicted_n=8, decode_s=0.2,
                prefill_s=0.3, drafted=4 * k, accepted=k)
    base.update(kw)
    return TurnResult(**base)  # type: ignore[arg-type]


def test_totals_are_the_sums_of_the_turns() -> None:
    turns = [_turn(1), _turn(2), _turn(3, ttft_s=None)]
    t = session_totals(turns)
    assert (t["prompt_n"], t["cache_n"], t["predicted_n"], t["drafted"], t["accepted"]) == (600, 150, 24, 24, 6)
    assert t["wall_s"] == pytest.approx(9.0) and t["ttft_s"] == pytest.approx(1.0)
    assert t["cache_hits"] == 2 and t["turns"] == 3
    assert t["decode_tok_s"] == pytest.approx(24 / 0.6) and t["acceptance"] == pytest.approx(0.25)


def test_projection_is_measured_session_wall_time_against_off() -> None:
    doc = sessions_json([_turn(1), _turn(2), _turn(1, "ngram", wall_s=1.0), _turn(2, "ngram", wall_s=2.0)])
    p = projection(doc)["s"]["alone"]
    assert projection(doc)["all"]["alone"] == p  # one session: the whole is that session
    assert p["off"]["vs_off"] == 1.0 and p["ngram"]["wall_s"] == pytest.approx(3.0)
    assert p["ngram"]["saved_s"] == pytest.approx(5.0 - 3.0) and p["ngram"]["vs_off"] == pytest.approx(3.0 / 5.0)


def test_prefill_spread_is_between_servers_doing_the_same_work() -> None:
    """Prefill speed per configuration over the turns with a real prompt; the spread is max/min - 1; a speculator
    that prefills on its own (a draft model) is left out by the caller; short turns are overhead, not speed."""
    turns = [_turn(1, "off", prompt_n=1000, prefill_s=2.0), _turn(2, "off", prompt_n=50, prefill_s=5.0),
             _turn(1, "ngram-mod", prompt_n=1000, prefill_s=2.5), _turn(2, "ngram-mod", prompt_n=600, prefill_s=1.5),
             _turn(1, "draft", prompt_n=1000, prefill_s=9.0)]
    got = prefill_spread(turns, ["off", "ngram-mod"])
    assert got == {"prefill_tok_s": {"off": 500.0, "ngram-mod": 400.0}, "spread": 0.25}
    assert prefill_spread(turns, ["off"]) is None  # nothing to compare with
    assert prefill_spread([_turn(1, "off", prompt_n=50), _turn(1, "x", prompt_n=80)], ["off", "x"]) is None


def test_shipped_session_grows_on_one_prefix_and_is_deterministic() -> None:
    s = shipped_session(prefix_tokens=2000, turns=10)
    assert s.name == AGENT and len(s.requests) == 10
    msgs = [r.body["messages"] for r in s.requests]
    for a, b in zip(msgs, msgs[1:]):
        assert b[: len(a)] == a and len(b) == len(a) + 2  # the same prefix, one tool call and its result more
    tools = [m["tool_calls"][0]["function"]["name"] for m in msgs[-1] if m["role"] == "assistant"]
    assert {"read_file", "edit_file", "run_tests"} <= set(tools)
    assert shipped_session(prefix_tokens=2000, turns=10) == s
    assert shipped_session(prefix_tokens=2000, turns=10, variant=1).requests[0] != s.requests[0]
    # the default system prompt is of real size (~18k tokens; the bench reports the exact count)
    big = shipped_session(turns=1).requests[0].body["messages"][0]["content"]
    assert 50_000 < len(big) < 70_000


def test_bench_and_tune_passes_of_the_shipped_session_read_different_modules() -> None:
    """Turn k of pass r read module r + k before, so consecutive bench passes shared all but one module and tune
    read modules a few away: the bench's passes were one sample of the content. Now each pass reads modules
    spread over the package, bench passes (0, 1 ...) and tune's (-1, -2 ...) none in common while they are
    fewer than modules // turns together, and every pass reads `turns` different modules."""
    from bostudio.bench.tune_sessions import SESSION_VARIANT

    modules, turns = 89, 12
    read = {v: [module_of_turn(v, k, modules, turns) for k in range(turns)] for v in (0, 1, 2, 3, -1, -2, -3)}
    for v, got in read.items():
        assert len(set(got)) == turns and all(0 <= m < modules for m in got)
        assert max(got) - min(got) >= modules // 2  # spread over the package, not one corner of it
    for a in read:
        for b in read:
            if a != b:
                assert not set(read[a]) & set(read[b]), (a, b)
    assert module_of_turn(0, 3, 5, 12) == 3  # fewer modules than turns: every module in turn, still in range
    # the session itself: a tool result of turn 1 of a tune pass is a module no bench pass reads at turn 1
    bench = [shipped_session(prefix_tokens=2000, turns=3, variant=v) for v in (0, 1)]
    tune = shipped_session(prefix_tokens=2000, turns=3, variant=SESSION_VARIANT)
    first_read = [x.requests[1].body["messages"][-1]["content"] for x in (*bench, tune)]
    assert len(set(first_read)) == 3


def test_shipped_session_is_fitted_to_the_models_context(tmp_path: Path) -> None:
    """18k tokens of prefix and 12 turns reached 33k tokens on the embedded 32k model, and the bench failed
    at turn 12: the prefix is shortened until the last turn fits (estimated from above), and said so."""
    notes: list[str] = []
    for variant in range(4):
        s = fitted_session(AGENT, 18000, 12, variant, 128, 32768, notes.append)
        assert len(s.requests) == 12 and _needed(s, 128) <= 32768
        assert session_ctx([s], 128, 32768, notes.append) <= 32768
        prefix = len(s.requests[0].body["messages"][0]["content"])
        assert prefix >= 15_000 * 3  # still a prefix of real size (15-20k tokens)
    assert not any("a longer request fails" in n for n in notes)
    assert all("system prompt cut from 18000 to" in n for n in notes)
    # an unknown training context, or one that holds it: as it is
    assert fitted_session(AGENT, 18000, 12, 0, 128, None, notes.append) == shipped_session(18000, 12, 0)
    assert fitted_session(AGENT, 2000, 3, 0, 128, 32768, notes.append) == shipped_session(2000, 3, 0)
    with pytest.raises(ConfigError, match="do not fit"):
        fitted_session(AGENT, 18000, 200, 0, 128, 32768, notes.append)
    # a recorded session is replayed as it was, even when it is longer
    rec = tmp_path / "rec"
    rec.mkdir()
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]}
    (rec / "000001.json").write_text(json.dumps({"seq": 1, "route": "/v1/chat/completions", "body": body}))
    assert fitted_session(str(rec), 18000, 12, 0, 128, 32768, notes.append).requests[0].body == body


def test_replay_request_rewrites_for_the_child() -> None:
    chat = replay_request(Request("/v1/chat/completions", {"model": "m", "messages": [], "max_completion_tokens": 9000,
                                                          "n": 2}), "alias", 16)
    assert chat[0] == "/v1/chat/completions"
    assert chat[1]["model"] == "alias" and chat[1]["max_tokens"] == 16 and chat[1]["stream"] is True
    assert "max_completion_tokens" not in chat[1] and "n" not in chat[1]
    route, body = replay_request(Request("/v1/messages", {"model": "claude", "max_tokens": 32000, "system": "x",
                                                          "messages": []}), "alias", 16)
    assert route == "/v1/messages" and body["max_tokens"] == 16 and body["system"] == "x"
    route, body = replay_request(Request("/v1/responses", {"model": "gpt", "input": "hi"}), "alias", 16)
    assert route == "/v1/responses" and body["max_output_tokens"] == 16
    route, body = replay_request(Request("/api/chat", {"model": "x", "messages": [{"role": "user", "content": "a"}],
                                                       "options": {"num_predict": 5}}), "alias", 16)
    assert route == "/v1/chat/completions" and body["messages"][0]["content"] == "a" and "options" not in body


def test_recorder_numbers_in_order_drops_credentials_and_replays_in_order(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "rec")
    for i, route in enumerate(["/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions"]):
        path, data = rec.entry(route, {"Authorization": "Bearer s3cret", "x-api-key": "k", "user-agent": "agent/1"},
                               {"model": "m", "i": i})
        rec.write(path, data)
    saved = sorted((tmp_path / "rec").glob("*.json"))
    assert [p.name for p in saved] == ["000001.json", "000002.json", "000003.json"]
    for p in saved:
        text = p.read_text()
        assert "s3cret" not in text and '"k"' not in text and "agent/1" in text
    assert Recorder(tmp_path / "rec").seq == 3  # a second daemon appends after what is there
    s = recorded_session(tmp_path / "rec")
    assert [r.note for r in s.requests] == ["000001.json", "000003.json"]
    assert [r.body["i"] for r in s.requests] == [0, 2] and s.skipped == ("000002.json (/v1/messages/count_tokens)",)


def test_recorded_session_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        recorded_session(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no recorded requests"):
        recorded_session(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "000001.json").write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        recorded_session(bad)


def test_calibration_restarts_the_servers_off_the_median_until_they_agree() -> None:
    """Bench.even_out's rule on scripted speeds (no server): those more than 1.5% from the median of the
    servers that prefill alike are restarted and everyone is measured again; a draft-model configuration is
    never compared; one as fast as its predecessor is its configuration's own speed and stays; it gives up after
    its tries and reports the last measurement."""
    from bostudio.bench.runner import Bench, BenchConfig, _Server
    from bostudio.speculation import Speculator

    class Proc:
        pid = None

        def stop(self) -> None:
            pass

    configs = [BenchConfig("off", Speculator("none")), BenchConfig("ngram-mod", Speculator("ngram", ("ngram-mod",))),
               BenchConfig("ngram-simple", Speculator("ngram", ("ngram-simple",))),
               BenchConfig("draft", Speculator("draft", ("draft-simple",), draft=Path("d.gguf")))]

    def bench(script: list[dict[str, float]], configs: list[BenchConfig] = configs) -> tuple[Bench, list[list[str]]]:
        b = Bench.__new__(Bench)
        b.configs, b.progress = configs, lambda _msg: None
        b.servers = [_Server(c, Proc()) for c in configs]  # type: ignore[arg-type]
        starts: list[list[str]] = []
        speeds = iter(script)
        now: dict[str, float] = {}

        def rate(server: _Server, variant: int) -> float:
            if not now or server.config.label == "off":
                now.clear()
                now.update(next(speeds))
            return now[server.config.label]

        b.prefill_rate = rate  # type: ignore[method-assign]
        b._start = lambda order: starts.append([configs[i].label for i in order])  # type: ignore[method-assign]
        b.hold_cores = lambda held: None  # type: ignore[method-assign]
        return b, starts

    b, starts = bench([{"off": 480, "ngram-mod": 440, "ngram-simple": 441},
                       {"off": 441, "ngram-mod": 440, "ngram-simple": 442}])
    got = b.even_out()
    assert starts == [["off"]]  # 480 is 8.8% above the median; 440 and 441 agree
    assert got == {"prefill_tok_s": {"off": 441, "ngram-mod": 440, "ngram-simple": 442}, "spread": 0.0045,
                   "restarted": ["off"]}
    b, starts = bench([{"off": 500, "ngram-mod": 400, "ngram-simple": 450}, {"off": 430, "ngram-mod": 470,
                                                                             "ngram-simple": 450},
                       {"off": 470, "ngram-mod": 450, "ngram-simple": 450}])
    got = b.even_out()
    assert starts == [["off", "ngram-mod"]] * 2 and got["spread"] == 0.0444  # 3 tries, then the last is reported
    # a configuration that is faster on every restart is that configuration: restarted once, then accepted
    b, starts = bench([{"off": 465, "ngram-mod": 487, "ngram-simple": 465}, {"off": 466, "ngram-mod": 486,
                                                                             "ngram-simple": 465}])
    got = b.even_out()
    assert starts == [["ngram-mod"]] and got["restarted"] == ["ngram-mod"] and got["spread"] == 0.0452
    b, starts = bench([{"off": 450, "ngram-mod": 451, "ngram-simple": 449}])
    assert b.even_out()["restarted"] == [] and starts == []
    # settings under test (--flash-attn, --threads) are meant to differ: each is compared with its own kind only
    fa = [replace(c, label=f"{c.label} fa=on", flash_attn="on") for c in configs[:2]]
    b, starts = bench([{"off": 440, "ngram-mod": 441, "off fa=on": 390, "ngram-mod fa=on": 389}],
                      configs[:2] + fa)
    assert b.even_out() == {"prefill_tok_s": {"off": 440, "ngram-mod": 441, "off fa=on": 390, "ngram-mod fa=on": 389},
                            "spread": 0.0026, "restarted": []} and starts == []
    b, starts = bench([{"off": 440, "ngram-mod": 441, "off fa=on": 390, "ngram-mod fa=on": 350},
                       {"off": 440, "ngram-mod": 441, "off fa=on": 390, "ngram-mod fa=on": 391}], configs[:2] + fa)
    assert b.even_out()["restarted"] == ["off fa=on", "ngram-mod fa=on"] and starts == [["off fa=on", "ngram-mod fa=on"]]


def test_flash_attention_settings() -> None:
    assert parse_flash_attn(None) == ["planned"] and parse_flash_attn("on,off") == ["on", "off"]
    for bad in ("auto", "yes", "on,on"):
        with pytest.raises(ConfigError):
            parse_flash_attn(bad)
    from bostudio.bench.service import with_settings
    from bostudio.speculation import Speculator
    got = with_settings([BenchConfig("off", Speculator("none"))], "planned,1", "on,off")
    assert [(c.label, c.threads, c.flash_attn) for c in got] == [
        ("off fa=on", "planned", "on"), ("off t=1 fa=on", "1", "on"), ("off fa=off", "planned", "off"),
        ("off t=1 fa=off", "1", "off")]


def test_threads_settings() -> None:
    assert parse_threads(None) == ["planned"] and parse_threads("planned,all,1,2/4") == ["planned", "all", "1", "2/4"]
    for bad in ("none", "0", "1/2/3", "planned,planned"):
        with pytest.raises(ConfigError):
            parse_threads(bad)


def _flag(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def test_settings_under_test_are_asked_of_the_plan_not_edited_into_the_argv(tmp_path: Path, engine) -> None:
    """Each side's -fa and -t/-tb come from the launch decision planned with that setting (Decision.varied);
    the rest of its argv is the baseline's, and a cold session's slot flags come from the decision too."""
    from bostudio.gguf import describe
    from bostudio.hardware.device import GIB, Device
    from bostudio.launch import LaunchInputs, bench_intent, decide
    from bostudio.speculation import Speculator
    from bostudio.gguf.synth import tiny_llama

    info = describe(tiny_llama(tmp_path / "m.gguf"))
    host = (Device("cpu", "cpu", "host", 0, 64 * GIB, cores=8),)
    decision = decide(LaunchInputs(info, engine, host, Speculator("none"), intent=bench_intent(1024)))
    off = Speculator("none", reason="baseline")
    configs = [BenchConfig("off", off), BenchConfig("off fa=on", off, flash_attn="on"),
               BenchConfig("off t=all", off, threads="all"), BenchConfig("off t=3/6 fa=off", off, "3/6", "off")]
    bench = Bench(info, engine, configs, 1024, lambda _: None, decision=decision)
    planned, fa_on, every, asked = (bench.argv(c, 1) for c in configs)
    assert (_flag(planned, "-fa"), _flag(planned, "-t"), _flag(planned, "-tb")) == ("off", "6", "6")  # CPU: off
    assert _flag(fa_on, "-fa") == "on" and _flag(fa_on, "-t") == "6"
    assert (_flag(every, "-t"), _flag(every, "-tb"), _flag(every, "-fa")) == ("8", "8", "off")
    assert (_flag(asked, "-t"), _flag(asked, "-tb"), _flag(asked, "-fa")) == ("3", "6", "off")
    assert all(_flag(a, "-np") == "1" and _flag(a, "-c") == "1024" for a in (planned, fa_on, every, asked))
    assert "-cram" not in planned and "--slot-save-path" not in planned
    cold = Bench(info, engine, configs[:1], 1024, lambda _: None, tmp_path / "slots", decision).argv(configs[0], 1)
    assert _flag(cold, "-cram") == "0" and _flag(cold, "--slot-save-path") == str(tmp_path / "slots")
    i, j = cold.index("-cram"), cold.index("--slot-save-path")
    assert [a for k, a in enumerate(cold) if k not in (i, i + 1, j, j + 1)] == planned


def test_competing_load_is_paused_resumed_and_gone_after() -> None:
    with CompetingLoad(2) as load:
        procs = [psutil.Process(p) for p in load.pids()]
        assert len(procs) == 2 and not load.running
        time.sleep(0.2)
        assert all(p.status() == psutil.STATUS_STOPPED for p in procs)
        load.resume()
        time.sleep(0.2)
        assert all(p.status() != psutil.STATUS_STOPPED for p in procs)
    for p in procs:
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    with pytest.raises(ConfigError):
        CompetingLoad(10_000)


# ------------------------------------------------------------------------------------------------ real

def test_agent_bench_json_per_turn_and_totals(gemma_gguf: Path, engine, tmp_path: Path) -> None:
    """The shipped session (small), off vs ngram-simple, alone and beside one busy process."""
    doc = _bench(gemma_gguf, tmp_path, "--workload", "agent", "--prefix-tokens", "400", "--session-turns", "2",
                 "--tokens", "4", "--spec", "ngram-simple", "--runs", "1", "--load", "1")
    assert doc["workload"] == ["agent"] and doc["tokens_per_turn"] == 4 and doc["load"] == 1
    keys = {(s["phase"], s["config"]) for s in doc["sessions"]}
    assert keys == {("alone", "off"), ("alone", "ngram-simple"), ("load 1", "off"), ("load 1", "ngram-simple")}
    assert all(len(s["turns"]) == 2 for s in doc["sessions"])
    _check_consistent(doc)
    for s in doc["sessions"]:
        first, second = s["turns"]
        assert first["cache_n"] == 0  # each pass starts cold (slots erased, no host prompt cache)
        assert second["cache_hit"] and second["cache_n"] >= first["prompt_n"] - 8  # the prefix was reused
        assert all(x["predicted_n"] == 4 for x in s["turns"])
    assert doc["threads"] is None or doc["threads"]["threads"] >= 1
    for cfg in doc["configs"].values():
        assert "-cram" in cfg["argv"] and ("-t" in cfg["argv"]) == (doc["threads"] is not None)
    # Every pass on fresh servers, started in a rotated order; alone they were held on the same cores
    # (where this machine has more cores than a server's threads), beside the load they were not.
    passes = doc["passes"]
    assert [(p["session"], p["phase"]) for p in passes] == [("agent", "alone"), ("agent", "load 1")]
    assert [p["start_order"] for p in passes] == [["off", "ngram-simple"], ["ngram-simple", "off"]]
    logs = [p.name for p in (tmp_path / "state").rglob("*.log") if p.parent.parent.name == "bench"]
    for config in ("off", "ngram-simple"):  # a server per pass, and one per restart the calibration asked for
        restarts = sum(p["calibration"]["restarted"].count(config) for p in passes)
        assert sum(1 for n in logs if n.split(".")[0] == config) == len(passes) + restarts
    for p in passes:  # both prefill the same: both calibrated, on the last measurement
        cal = p["calibration"]
        speeds = cal["prefill_tok_s"]
        assert set(speeds) == {"off", "ngram-simple"} and all(v > 0 for v in speeds.values())
        assert cal["spread"] == pytest.approx(max(speeds.values()) / min(speeds.values()) - 1, abs=1e-3)
    alone, loaded = passes
    assert loaded["cores"] is None
    threads = doc["threads"]["threads"] if doc["threads"] else None
    if threads is not None and hasattr(os, "sched_getaffinity") and threads < len(os.sched_getaffinity(0)):
        assert alone["cores"] and len(alone["cores"]) <= threads
    for p in passes:  # the spread is the servers' prefill speeds on the pass's own turns
        rates = p["prefill"]["prefill_tok_s"]
        for config, rate in rates.items():
            (s,) = [s for s in doc["sessions"] if s["phase"] == p["phase"] and s["config"] == config]
            big = [t for t in s["turns"] if t["prompt_n"] >= 256]
            assert rate == pytest.approx(sum(t["prompt_n"] for t in big) / sum(t["prefill_s"] for t in big), rel=1e-3)
        assert p["prefill"]["spread"] == pytest.approx(max(rates.values()) / min(rates.values()) - 1, abs=1e-3)


def test_session_recorded_through_the_daemon_replays_in_order(gemma_gguf: Path, engine, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    rec = tmp_path / "session"
    d = DaemonProc(tmp_path, models, ["--idle-ttl", "0", "--record", str(rec)]).start()
    try:
        oai = openai.OpenAI(base_url=d.url + "/v1", api_key="sk-secret-openai", max_retries=0, timeout=600)
        claude = anthropic.Anthropic(base_url=d.url, api_key="sk-secret-anthropic", max_retries=0, timeout=600)
        history = [{"role": "user", "content": "List three prime numbers."}]
        oai.chat.completions.create(model=GEMMA, messages=history, max_tokens=4)  # type: ignore[arg-type]
        claude.messages.create(model=GEMMA, max_tokens=4, system="You are terse.",
                               messages=[{"role": "user", "content": "Name a colour."}])
        history += [{"role": "assistant", "content": "2, 3, 5"}, {"role": "user", "content": "Three more."}]
        oai.chat.completions.create(model=GEMMA, messages=history, max_tokens=4)  # type: ignore[arg-type]
    finally:
        assert d.stop() == 0
    files = sorted(rec.glob("*.json"))
    assert [f.name for f in files] == ["000001.json", "000002.json", "000003.json"]
    saved = [json.loads(f.read_text()) for f in files]
    assert [s["route"] for s in saved] == ["/v1/chat/completions", "/v1/messages", "/v1/chat/completions"]
    assert [s["seq"] for s in saved] == [1, 2, 3] and saved[0]["time"] <= saved[1]["time"] <= saved[2]["time"]
    assert all("sk-secret" not in f.read_text() for f in files)
    assert saved[2]["body"]["messages"][-1]["content"] == "Three more."

    doc = _bench(gemma_gguf, tmp_path, "--workload", str(rec), "--tokens", "4", "--spec", "ngram-simple",
                 "--runs", "1")
    assert {s["config"] for s in doc["sessions"]} == {"off", "ngram-simple"}
    for s in doc["sessions"]:
        assert [t["request"] for t in s["turns"]] == ["000001.json", "000002.json", "000003.json"]
        assert [t["route"] for t in s["turns"]] == [x["route"] for x in saved]
        assert all(t["predicted_n"] > 0 for t in s["turns"])
    _check_consistent(doc)
    assert set(ROUTES) >= {x["route"] for x in saved}


def test_session_tune_budget_is_estimated_from_measured_passes() -> None:
    from bostudio.bench.tune_sessions import pass_fits, passes_this_round

    assert pass_fits(0, 10, [])  # nothing measured: the first pass runs
    assert pass_fits(50, 100, [30, 50]) and not pass_fits(51, 100, [30, 50])  # the most expensive pass counts
    assert passes_this_round(1, 0, 100, 8, []) == 1
    assert passes_this_round(3, 0, 1000, 2, [10]) == 4  # 1, 2, 4 ... while the round fits
    assert passes_this_round(3, 0, 50, 2, [10]) == 2  # 2 survivors x 2 passes x 10 s = 40 s fits in 50
    assert passes_this_round(2, 95, 100, 2, [10]) == 0  # not even one pass each: the sweep stops


def test_session_tune_keeps_room_to_confirm_its_leader() -> None:
    """A choice needs MIN_PAIRED passes: at 210 s a pass and 900 s, round 1 measures three candidates (not four,
    which would leave none choosable) and the leader then runs its second pass alone."""
    from bostudio.bench.measure import Sample
    from bostudio.bench.tune import Candidate, Tally
    from bostudio.bench.tune_sessions import confirm_reserve, pass_fits, survivors
    from bostudio.profiles import MIN_PAIRED
    from bostudio.speculation import Speculator

    assert MIN_PAIRED == 2 and confirm_reserve(1, [210.0, 200.0]) == 210.0 and confirm_reserve(2, [210.0]) == 0
    assert confirm_reserve(1, []) == 0
    elapsed, measured = 210.0, 1  # the first candidate's pass
    while pass_fits(elapsed + confirm_reserve(1, [210.0]), 900, [210.0]):
        elapsed, measured = elapsed + 210, measured + 1
    assert (measured, elapsed) == (3, 630.0) and pass_fits(elapsed, 900, [210.0])  # room for the leader's second

    def tally(label: str, tok_s: list[float]) -> Tally:
        t = Tally(Candidate(label, Speculator("ngram", (label,))))
        t.samples += [Sample("agent", None, label, i, v, None, 100, 0, 0) for i, v in enumerate(tok_s)]
        t.baseline += [Sample("agent", None, "off", i, 1.0, None, 100, 0, 0) for i in range(len(tok_s))]
        return t

    a, b, c = tally("a", [1.05]), tally("b", [1.03]), tally("c", [1.04])
    assert [t.candidate.label for t in survivors([a, b, c])] == ["a", "c"]  # halving, the leader first
    assert survivors([a]) == [a]  # alone with one pass: measured again
    assert survivors([tally("a", [1.05, 1.04])]) == [] and survivors([]) == []  # confirmed: done


def test_session_tune_screens_every_ngram_type_in_one_pass() -> None:
    """The screen holds llama.cpp's default of each n-gram type (not their variants, not draft or MTP), takes a
    turn while the budget keeps room for the leader's whole-session confirmation, and hands on its leader, the
    other kinds' first candidates and the leader's own variants."""
    from bostudio.bench.measure import Sample
    from bostudio.bench.tune import Tally, candidates
    from bostudio.bench.tune_sessions import after_screen, screen_estimate, screen_goes_on, screened
    from bostudio.engine.discover import KNOWN_SPEC_TYPES

    pool = [Tally(c) for c in candidates(KNOWN_SPEC_TYPES, True, Path("d.gguf"))]
    screen = screened(pool)
    assert {t.candidate.label for t in screen} == {"ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v",
                                                  "ngram-cache"}
    for i, t in enumerate(screen):  # ngram-map-k leads
        v = 1.2 if t.candidate.label == "ngram-map-k" else 1.0 + i / 100
        t.samples.append(Sample("agent", None, t.candidate.label, 0, v, None, 100, 10, 5))
        t.baseline.append(Sample("agent", None, "off", 0, 1.0, None, 100, 0, 0))
    nxt = [t.candidate.label for t in after_screen(pool, screen)]
    assert nxt[0] == "ngram-map-k" and nxt[1:3] == ["mtp n_max=3", "draft-simple n_max=3"]
    assert nxt[3:] == ["ngram-map-k size_n=6 size_m=16"]

    # 6 servers: a cold round of 360 s, warm rounds of 60 s, 12 turns: a pair pass is 2/6 x (360 + 11 x 60) s
    assert screen_estimate([360.0, 60.0], 12, 6) == 340.0 and screen_estimate([360.0], 1, 6) == 120.0
    assert screen_goes_on([], 12, 6, 0, 1)  # the cold turn always runs
    # the first warm turn while it fits at the cold turn's cost (the 1.5B's screen ran a 493 s warm turn from
    # 1,280 s of a 1,200 s budget: 1,773 s in all)
    assert screen_goes_on([360.0], 12, 6, 400, 760) and not screen_goes_on([360.0], 12, 6, 400, 759)
    assert not screen_goes_on([874.0], 6, 6, 1280, 1200)
    assert screen_goes_on([360.0, 60.0, 60.0], 12, 6, 480, 480 + 60 + 340)
    assert not screen_goes_on([360.0, 60.0, 60.0], 12, 6, 481, 480 + 60 + 340)
    # a cold turn late in a recording counts once, not for every turn after it (else 2,600 s for a 554 s pass)
    assert screen_estimate([480.0] + [50.0] * 13 + [380.0], 21, 6) == pytest.approx(2 / 6 * (1510 + 6 * 1030 / 14))


def test_session_tune_retimes_off_with_the_candidates_decode() -> None:
    """An n-gram type's session figure is off's session with each turn's decode at the candidate's speed: the
    prefill gap between the two servers (the same work) drops out, so does a different output length; the
    noise floor is MIN_NOISE on off's decode share. A draft's figure stays its own wall time."""
    from bostudio.bench.agent import TurnResult
    from bostudio.bench.measure import Sample
    from bostudio.bench.tune import Candidate, Tally, choose_config
    from bostudio.bench.tune_sessions import retimed_wall, session_floor, session_samples
    from bostudio.profiles import MIN_NOISE
    from bostudio.speculation import Speculator

    def turn(config: str, k: int, wall: float, prefill: float, tokens: int, decode: float, acc: int = 0) -> TurnResult:
        return TurnResult("agent", "alone", config, k, "openai", f"turn {k}", 1.0, wall, 100, 0, tokens, decode,
                          prefill, 2 * acc, acc)

    off = [turn("off", 1, 70.0, 60.0, 100, 10.0), turn("off", 2, 12.0, 2.0, 100, 10.0)]
    # the candidate's server prefilled 10% slower (its own speed) and decoded twice as fast, 50 tokens on turn 2
    cand = [turn("c", 1, 71.0, 66.0, 100, 5.0, 40), turn("c", 2, 4.7, 2.2, 50, 2.5, 20)]
    assert retimed_wall(off, cand) == 60.0 + 5.0 + 2.0 + 5.0 == 72.0
    base, c = session_samples("agent", "c", 3, off, cand, same_prefill=True)
    assert c.tok_s / base.tok_s == pytest.approx(82.0 / 72.0) and (c.drafted, c.accepted, c.run) == (120, 60, 3)
    assert c.decode_rate == pytest.approx(150 / 7.5) and base.decode_rate == pytest.approx(10.0)
    base, c = session_samples("agent", "c", 0, off, cand, same_prefill=False)  # a draft: its own wall and tokens
    assert c.tok_s == pytest.approx(150 / 75.7) and base.tok_s == pytest.approx(200 / 82.0)
    assert session_floor(0.17) == pytest.approx(MIN_NOISE * 0.17) and session_floor(2.0) == MIN_NOISE

    t = Tally(Candidate("ngram-simple", Speculator("ngram", ("ngram-simple",))))
    for i, (r, d) in enumerate([(1.026, 1.15), (1.032, 1.17)]):  # a measured shipped session, retimed
        t.baseline.append(Sample("agent", None, "off", i, 1.0, None, 100, 0, 0, 30.0))
        t.samples.append(Sample("agent", None, "ngram-simple", i, r, None, 100, 50, 40, 30.0 * d))
    assert choose_config([t]).chosen is None  # 2.6% is under the 3% floor of a figure timed whole
    assert choose_config([t], lambda _: session_floor(0.17)).chosen is t
    assert "5.1% noise floor" in choose_config([t], lambda _: 0.051).why


def test_session_tune_alternates_which_server_starts_first() -> None:
    """A candidate's passes start off first, then the candidate first, and so on (the first started also takes
    the first turn), so that its two passes, the fewest a choice rests on, weigh both orders alike."""
    from bostudio.bench.tune_sessions import pair_order

    assert pair_order("off", "ngram-mod", 0) == ["off", "ngram-mod"]
    assert pair_order("off", "ngram-mod", 1) == ["ngram-mod", "off"]
    assert pair_order("off", "ngram-mod", 2) == ["off", "ngram-mod"]


def test_tune_on_a_session_stays_within_its_budget(gemma_gguf: Path, engine, tmp_path: Path) -> None:
    """With a budget the screen already spends, tune measures every n-gram type once, in the screen's one pass
    (its cold first turn always runs), starts nothing more and still writes a profile for the session."""
    proc = subprocess.run([sys.executable, "-m", "bostudio", "tune", str(gemma_gguf), "--json", "--workload", "agent",
                           "--budget-s", "10", "--prefix-tokens", "300", "--session-turns", "2", "--tokens", "4"],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=BENCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = json.loads(proc.stdout)
    ngram = {t for t in engine.spec_types if t.startswith("ngram-")}
    assert res["rounds"] == 1 and {s["label"] for s in res["sweep"]} == ngram, res["sweep"]
    assert all(s["samples"] == 1 for s in res["sweep"])
    assert res["profile"]["workload"] == "agent" and Path(res["path"]).is_file()
    assert "round 1 (screen)" in proc.stderr and "does not fit" in proc.stderr


def test_prompt_bench_beside_a_load_with_thread_settings(gemma_gguf: Path, engine, tmp_path: Path) -> None:
    """`--load 1 --threads planned,all` on a prompt workload: every configuration once per thread setting, every
    prompt alone and beside the load (workload chat+load1), the thread flags in each configuration's argv."""
    doc = _bench(gemma_gguf, tmp_path, "--workload", "chat", "--spec", "ngram-simple", "--runs", "1", "--tokens", "4",
                 "--threads", "planned,all", "--load", "1")
    rows = {(r["workload"], r["config"]) for r in doc["results"]}
    configs = {"off", "ngram-simple", "off t=all", "ngram-simple t=all"}
    assert rows == {(w, c) for w in ("chat", "chat+load1") for c in configs}
    assert doc["load"] == 1 and set(doc["configs"]) == configs
    argv = doc["configs"]["off t=all"]["argv"]
    cores = argv[argv.index("-t") + 1]
    assert argv[argv.index("-tb") + 1] == cores and int(cores) >= 1
    if doc["threads"] is not None:  # the planned setting is the plan's
        planned = doc["configs"]["off"]["argv"]
        assert planned[planned.index("-t") + 1] == str(doc["threads"]["threads"])
