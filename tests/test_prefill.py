"""Prefill progress, the pure parts: the rate and time-left arithmetic, the tracker that turns
llama-server's /slots answers and the prompts admission counted into prompts in progress, the stats kept
from a finished request's timings, and how `ps`, the TUI and `launch` say it. The /slots shapes below are
the pinned llama-server's (server-context.cpp, server_slot::to_json with only_metrics)."""

from __future__ import annotations

import pytest

from bostudio.agents.run import first_turn_note
from bostudio.cli.daemon import _print_ps
from bostudio.daemon.supervise.prefill import PrefillTracker, estimate
from bostudio.daemon.supervise.stats import InstanceStats
from bostudio.display import human_duration, prefill_line


# ---------------------------------------------------------------------------------------------- arithmetic

@pytest.mark.parametrize("total, done, cached, started, changed, now, fallback, rate, source, eta", [
    # 2,048 tokens decoded in 40 s: 51.2 tok/s; 9,664 left = 188.75 s from the change, 5 s of it gone
    (11712, 2048, 0, 100.0, 140.0, 145.0, None, 51.2, "measured", 183.75),
    # cached tokens are in the KV cache but were not decoded: they count as done, not in the rate
    (11712, 3072, 1024, 100.0, 140.0, 140.0, None, 51.2, "measured", 168.75),
    # before the first batch is done: the child's last long prefill stands in, counting from the start
    (10000, 0, 0, 100.0, 100.0, 110.0, 50.0, 50.0, "last request", 190.0),
    (10000, 0, 0, 100.0, 100.0, 110.0, None, None, None, None),  # nothing to go by
    (None, 2048, 0, 100.0, 140.0, 150.0, None, 51.2, "measured", None),  # rate, but no total: no time left
    (4096, 2048, 0, 100.0, 140.0, 500.0, None, 51.2, "measured", 0.0),  # slower than measured: never below zero
    (4096, 2048, 0, 100.0, 100.0, 120.0, 10.0, 10.0, "last request", 184.8),  # changed == started: no own rate
])
def test_estimate(total, done, cached, started, changed, now, fallback, rate, source, eta) -> None:
    est = estimate(total, done, cached, started, changed, now, fallback)
    assert est.rate == pytest.approx(rate) if rate is not None else est.rate is None
    assert est.rate_source == source
    assert est.eta_s == pytest.approx(eta) if eta is not None else est.eta_s is None


# ---------------------------------------------------------------------------------------------- tracker

def slot(sid: int, task: int | None, busy: bool, processed: int = 0, cached: int = 0, decoded: int = 0,
         batch: int = 0) -> dict:
    """One element of llama-server's GET /slots (only_metrics), as the pinned build writes it; `batch`: tokens
    of the batch being decoded (already in n_prompt_tokens)."""
    s = {"id": sid, "n_ctx": 16384, "speculative": False, "is_processing": busy}
    if task is not None:
        s.update({"id_task": task, "n_prompt_tokens": cached + processed + batch,
                  "n_prompt_tokens_processed": processed,
                  "n_prompt_tokens_cache": cached, "params": {},
                  "next_token": [{"has_next_token": True, "has_new_line": False, "n_remain": -1,
                                  "n_decoded": decoded}]})
    return s


def test_a_prompt_is_followed_from_its_count_to_its_last_batch() -> None:
    t = PrefillTracker()
    t.observe([slot(0, 3, False), slot(1, None, False)], now=0.0, in_flight=0)  # the load's probe: not ours
    assert t.to_json(0.0) == []
    t.expect(6000, now=10.0)  # admission counted the request's prompt, then sent it
    t.observe([slot(0, 3, False), slot(1, 9, True, batch=2048)], now=11.0, in_flight=1)  # first batch running
    [p] = t.to_json(11.0)
    assert (p["slot"], p["task"], p["total"], p["done"], p["in_batch"], p["eta_s"]) == (1, 9, 6000, 0, 2048, None)
    t.observe([slot(0, 3, False), slot(1, 9, True, processed=2048, batch=2048)], now=30.0, in_flight=1)
    [p] = t.to_json(30.0, fallback_rate=999.0)  # its own rate wins once a batch is done
    assert (p["done"], p["processed"], p["in_batch"], p["rate_source"]) == (2048, 2048, 2048, "measured")
    assert p["rate_tok_s"] == pytest.approx(2048 / 20) and p["eta_s"] == pytest.approx(3952 / (2048 / 20))
    assert p["fraction"] == pytest.approx(2048 / 6000)
    t.observe([slot(1, 9, True, processed=2048)], now=31.0, in_flight=1)  # no new batch: the countdown runs
    assert t.to_json(31.0)[0]["eta_s"] == pytest.approx(3952 / (2048 / 20) - 1.0)
    t.observe([slot(1, 9, True, processed=6000, decoded=1)], now=50.0, in_flight=1)  # generating now
    assert t.to_json(50.0) == []


def test_cached_tokens_count_as_done_and_a_task_that_ended_between_polls_takes_its_count() -> None:
    t = PrefillTracker()
    t.observe([slot(0, 1, False)], now=0.0, in_flight=0)
    t.expect(100, now=1.0)  # a short request: over before the next poll (its slot is released, counts zeroed)
    t.expect(9000, now=2.0)  # then a long one that reuses 4,000 cached tokens
    t.observe([slot(0, 5, False), slot(1, 6, True, processed=1000, cached=4000)], now=10.0, in_flight=1)
    [p] = t.to_json(10.0)
    assert (p["task"], p["total"], p["done"], p["cached"], p["processed"]) == (6, 9000, 5000, 4000, 1000)


def test_counted_prompts_that_never_reached_a_slot_are_dropped_when_nothing_is_in_flight() -> None:
    t = PrefillTracker()
    t.observe([slot(0, None, False)], now=0.0, in_flight=0)
    t.expect(5000, now=1.0)  # e.g. the client hung up before llama-server took it
    t.observe([slot(0, None, False)], now=2.0, in_flight=0)
    assert not t.jobs
    t.expect(7000, now=3.0)
    t.observe([slot(0, 4, True, processed=512)], now=4.0, in_flight=1)
    assert t.to_json(4.0)[0]["total"] == 7000


def test_without_a_count_the_progress_has_no_total_and_a_wrong_count_is_not_shown() -> None:
    t = PrefillTracker()
    t.observe([slot(0, None, False), slot(1, None, False)], now=0.0, in_flight=0)
    t.observe([slot(0, 2, True, processed=2048)], now=5.0, in_flight=1)  # a route admission does not count
    [p] = t.to_json(5.0)
    assert p["total"] is None and p["fraction"] is None and p["eta_s"] is None
    t.expect(1000, now=6.0)  # a count smaller than what the slot already holds is someone else's
    t.observe([slot(0, 2, True, processed=2048), slot(1, 3, True, processed=1500)], now=7.0, in_flight=2)
    assert {p["task"]: p["total"] for p in t.to_json(7.0)} == {2: None, 3: None}


def test_progress_never_goes_back_and_a_relaunched_child_starts_a_new_tracker() -> None:
    t = PrefillTracker()
    t.observe([], now=0.0, in_flight=0)
    t.expect(8000, now=0.0)
    t.observe([slot(0, 0, True, processed=4096)], now=10.0, in_flight=1)
    t.observe([slot(0, 0, True, processed=2048)], now=11.0, in_flight=1)  # an out-of-order answer
    assert t.to_json(11.0)[0]["done"] == 4096


def test_a_garbled_slots_answer_is_ignored() -> None:
    t = PrefillTracker()
    for junk in (None, {"error": "x"}, ["x", 3], [{"id": "0", "id_task": True}]):
        t.observe(junk, now=1.0, in_flight=1)
        assert t.to_json(1.0) == []


# ---------------------------------------------------------------------------------------------- stats

def test_a_finished_request_leaves_its_prefill_and_a_long_one_its_rate() -> None:
    st = InstanceStats()
    st.add_timings({"cache_n": 100, "prompt_n": 11612, "prompt_ms": 232240.0, "prompt_per_second": 50.0,
                    "predicted_n": 10, "predicted_ms": 1000.0})
    assert st.last_prefill == {"total": 11712, "cached": 100, "processed": 11612, "seconds": pytest.approx(232.24),
                               "rate_tok_s": 50.0}
    assert st.long_prefill_tok_s == 50.0
    st.add_timings({"cache_n": 11700, "prompt_n": 12, "prompt_ms": 40.0, "prompt_per_second": 300.0})
    assert st.last_prefill["total"] == 11712 and st.long_prefill_tok_s == 50.0  # 12 tokens: no guide
    assert "long_prefill_tok_s" in st.to_json() and "last_prefill" in st.to_json()


# ---------------------------------------------------------------------------------------------- showing it

@pytest.mark.parametrize("seconds, text", [(0, "0s"), (0.4, "0s"), (44.6, "45s"), (59.4, "59s"), (60, "1m00s"),
                                           (85, "1m25s"), (3599, "59m59s"), (3600, "1h00m"), (3720, "1h02m"),
                                           (-5, "0s")])
def test_human_duration(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


LIVE = {"total": 11712, "done": 4096, "cached": 0, "rate_tok_s": 48.2, "rate_source": "measured", "eta_s": 158.4}


@pytest.mark.parametrize("p, text", [
    (LIVE, "prefill 4,096/11,712 tokens (35%), 48 tok/s, ~2m38s left"),
    ({**LIVE, "cached": 1024}, "prefill 4,096/11,712 tokens (35%, 1,024 from cache), 48 tok/s, ~2m38s left"),
    ({**LIVE, "in_batch": 2048}, "prefill 4,096/11,712 tokens (35%), a batch of 2,048 running, 48 tok/s, ~2m38s left"),
    ({**LIVE, "rate_source": "last request"},
     "prefill 4,096/11,712 tokens (35%), 48 tok/s (the last prompt's rate), ~2m38s left"),
    ({**LIVE, "eta_s": 0.0}, "prefill 4,096/11,712 tokens (35%), 48 tok/s, ~0s left (slower than estimated)"),
    ({**LIVE, "total": None, "eta_s": None}, "prefill 4,096 tokens so far (total unknown), 48 tok/s"),
    ({**LIVE, "done": 0, "rate_tok_s": None, "rate_source": None, "eta_s": None, "in_batch": 2048},
     "prefill 0/11,712 tokens (0%), a batch of 2,048 running, time left known after its first batch"),
    ({**LIVE, "done": 0, "rate_tok_s": None, "rate_source": None, "eta_s": None, "in_batch": 2048, "elapsed_s": 95},
     "prefill 0/11,712 tokens (0%), a batch of 2,048 running, 1m35s so far, time left known after its first batch"),
])
def test_prefill_line(p: dict, text: str) -> None:
    assert prefill_line(p) == text


def test_ps_prints_a_prompt_in_progress_under_its_model(capsys: pytest.CaptureFixture) -> None:
    row = {"model": "qwen2.5-coder-1.5b", "state": "ready", "pid": 42, "port": 4000, "speculation": "off",
           "stats": {"requests": 1}, "prompts": None, "prefill": [LIVE]}
    assert _print_ps([row]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("qwen2.5-coder-1.5b")
    assert lines[2] == "  prefill 4,096/11,712 tokens (35%), 48 tok/s, ~2m38s left"


@pytest.mark.parametrize("agent, n_params, inst, parts", [
    ("claude", None, {"model": "m", "stats": {"long_prefill_tok_s": 60.0}},
     ["Claude Code's first request", "about 11.7k tokens", "60 tok/s", "~3m15s", "bostudio ps --watch"]),
    # Codex's own instructions: not measured on this tokenizer
    ("codex", 30_000_000_000, {"model": "m", "stats": {}},
     ["Codex's first request", "thousands of tokens", "can take minutes"]),
    # a small model: bostudio's short page, about 1.2k tokens with Codex's tools
    ("codex", 1_540_000_000, {"model": "m", "stats": {"long_prefill_tok_s": 40.0}},
     ["Codex's first request", "about 1.2k tokens", "40 tok/s", "~29s"]),
    ("claude", None,
     {"model": "m\x1b[2J", "stats": {"long_prefill_tok_s": 60.0}, "prompts": {"restored_tokens": 11000}},
     ["m\\x1b[2J", "11,000 prompt tokens restored"]),
])
def test_launch_says_the_first_turn_is_slow_and_where_to_watch_it(tmp_path, agent: str, n_params: int | None,
                                                                  inst: dict, parts: list[str]) -> None:
    from bostudio.agents import AgentTarget, configure

    cfg = configure(agent, AgentTarget("http://x", None, "m", 32768, 4096, n_params=n_params), tmp_path)
    note = first_turn_note(cfg, inst)
    for part in parts:
        assert part in note
    assert "\x1b" not in note


def test_the_tui_takes_progress_events_into_its_instance_view() -> None:
    from bostudio.tui.app import Store

    store = Store(instances={"m": {"model": "m", "state": "ready"}})
    assert store.apply({"type": "progress", "model": "m", "prefill": [LIVE]}) == "m"
    assert store.instances["m"]["prefill"] == [LIVE] and store.instances["m"]["state"] == "ready"
    store.apply({"type": "progress", "model": "m", "prefill": []})  # the prompt is in: the line goes
    assert store.instances["m"]["prefill"] == []


def test_an_instance_that_is_not_ready_shows_no_prompt_in_progress(tmp_path) -> None:
    from bostudio.daemon.supervise.instance import Instance, ModelConfig
    from bostudio.daemon.supervise.lifecycle import READY, RESTARTING, Life

    inst = Instance(ModelConfig("m", tmp_path / "m.gguf", None, "off"), life=Life("m", state=READY))
    inst.prefill.observe([], now=0.0, in_flight=0)
    inst.prefill.expect(5000, now=0.0)
    inst.prefill.observe([slot(0, 1, True, processed=2048)], now=1.0, in_flight=1)
    assert [p["done"] for p in inst.prefill_json()] == [2048]
    inst.life = Life("m", state=RESTARTING)  # the child crashed mid-prompt: its report must not linger
    assert inst.prefill_json() == []


def test_launch_prints_the_note_on_stderr_before_it_hands_over_to_the_agent(monkeypatch, capsys) -> None:
    from bostudio.agents import AgentConfig
    from bostudio.agents import run as agent_run
    from bostudio.cli import build_parser, parse_args
    from bostudio.cli.launch import cmd_launch

    order: list[str] = []
    cfg = AgentConfig("claude", "claude", "@anthropic-ai/claude-code@2.1.332", {}, first_turn_tokens=11_712)
    inst = {"model": "m", "ctx": 32768, "stats": {"long_prefill_tok_s": 50.0}}
    monkeypatch.setattr("shutil.which", lambda name: f"/bin/{name}")
    monkeypatch.setattr(agent_run, "prepare", lambda *a, **kw: (cfg, inst))
    monkeypatch.setattr(agent_run, "exec_agent", lambda c, args: order.append(f"exec {args}"))
    cmd_launch(parse_args(build_parser(), ["launch", "claude", "--", "-p", "hi"]))
    captured = capsys.readouterr()
    assert order == ["exec ['-p', 'hi']"] and captured.out == ""  # stdout stays the agent's
    assert captured.err.strip() == first_turn_note(cfg, inst) and "~3m54s" in captured.err
