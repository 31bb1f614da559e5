"""The draft length auto moves at run time: the controller (policy.adapt_draft_length), the lengths a
speculator proposes (speculation.draft_length / with_draft_length -> the argv), and what ps/TUI show. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from bostudio.daemon.supervise.policy import (KEEP, LONGER, OFF, SHORTER, adapt_draft_length, judge_acceptance)
from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.speculation import Speculator, draft_length, draft_length_ceiling, with_draft_length
from bostudio.tui.format import draft_length_line, speculation_banner

NGRAM_MOD = Speculator("ngram", ("ngram-mod",))
DRAFT = Speculator("draft", ("draft-simple",), draft=Path("d.gguf"), n_max=8)


def verdict(drafted: int, accepted: int, break_even: float = 0.55, requests: int = 10):  # type: ignore[no-untyped-def]
    return judge_acceptance(drafted, accepted, requests, break_even)


# n_max, drafted, accepted, accepted per draft, failed_at -> action, new n_max
TABLE = [
    (64, 10, 1, 0.5, None, KEEP, 64),          # too little drafted to judge
    (64, 6400, 640, 4.0, None, SHORTER, 8),    # 10% accepted: twice what a draft gets accepted
    (64, 6400, 640, None, None, SHORTER, 16),  # per-draft unknown: a quarter of the length
    (64, 6400, 640, 60.0, None, SHORTER, 32),  # never more than half the current length
    (4, 4000, 400, 0.2, None, SHORTER, 2),     # never below the floor
    (2, 4000, 400, 0.2, None, OFF, 2),         # at the floor: speculation goes off
    (8, 800, 700, 7.0, None, LONGER, 16),      # accepted nearly whole: twice as long
    (16, 800, 700, 15.0, None, KEEP, 16),      # at the ceiling (16 for a draft model)
    (8, 800, 700, 7.0, 24, LONGER, 12),        # below half the length that failed
    (12, 800, 700, 11.0, 24, KEEP, 12),        # ... and no further
    (8, 800, 500, 3.0, None, KEEP, 8),         # above break-even, drafts not full: keep
]


@pytest.mark.parametrize("n,drafted,accepted,per_draft,failed,action,new", TABLE)
def test_draft_length_controller(n: int, drafted: int, accepted: int, per_draft: float | None,
                                 failed: int | None, action: str, new: int) -> None:
    advice = adapt_draft_length(n, verdict(drafted, accepted), per_draft, 16, failed)
    assert (advice.action, advice.n_max) == (action, new)
    assert advice.detail and advice.to_json()["action"] == action


def test_lengths_settle_instead_of_swinging() -> None:
    """Below break-even at 64, shorter; then full drafts at the shorter length grow, but stay below half of 64."""
    n, failed = 64, None
    seen = []
    for per_draft, acc in [(4.0, 640), (7.5, 7000), (15.5, 7000), (15.5, 7000), (15.5, 7000)]:
        a = adapt_draft_length(n, verdict(8000, acc), per_draft, 64, failed)
        if a.action == SHORTER:
            failed = n
        n = a.n_max
        seen.append(n)
    assert seen == [8, 16, 32, 32, 32] and max(seen[1:]) <= 64 // 2


@pytest.mark.parametrize("sp,length,ceiling", [
    (NGRAM_MOD, 64, 64), (Speculator("ngram", ("ngram-simple",)), 48, 48), (DRAFT, 8, 16),
    (Speculator("mtp", ("draft-mtp",), n_max=3), 3, 16), (Speculator("ngram", ("ngram-cache",)), None, 64),
    (Speculator("none"), None, 16)])
def test_draft_length_of_each_speculator(sp: Speculator, length: int | None, ceiling: int) -> None:
    assert draft_length(sp) == length and draft_length_ceiling(sp) == ceiling


def _argv(sp: Speculator) -> list[str]:
    flags = frozenset({"-m", "--alias", "--host", "--port", "-c", "--metrics", "--spec-type", "-md",
                       "--spec-draft-n-max", "--spec-draft-n-min", "--spec-ngram-mod-n-max",
                       "--spec-ngram-mod-n-min", "--spec-ngram-simple-size-m"})
    return build_argv(Path("llama-server"), flags, LaunchSpec(Path("m.gguf"), "m", 8080, speculator=sp))


def test_a_new_length_reaches_the_argv() -> None:
    short = with_draft_length(NGRAM_MOD, 8, "acceptance 10%")
    argv = _argv(short)
    assert argv[argv.index("--spec-ngram-mod-n-max") + 1] == "8" and argv[argv.index("--spec-ngram-mod-n-min") + 1] == "4"
    assert draft_length(short) == 8 and "acceptance 10%" in short.reason
    again = with_draft_length(short, 16, "full drafts")
    assert [p for p in again.ngram_params if p[1] == "n_max"] == [("ngram-mod", "n_max", 16)]  # replaced, not added
    argv = _argv(with_draft_length(Speculator("ngram", ("ngram-simple",)), 6, "x"))
    assert argv[argv.index("--spec-ngram-simple-size-m") + 1] == "6"
    argv = _argv(with_draft_length(DRAFT, 3, "x"))
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3"


def test_ps_and_tui_show_the_length() -> None:
    base = {"state": "ready", "speculation": "ngram-mod", "spec_mode": "auto", "spec_status": {"active": True},
            "stats": {}}
    assert speculation_banner(base) is None
    pending = dict(base, draft_length={"n_max": 64, "adapted": False, "reason": "",
                                       "advice": {"action": "shorter", "n_max": 8, "detail": "acceptance 10%"}})
    assert "8 at the next idle moment" in (speculation_banner(pending) or "")
    done = dict(base, draft_length={"n_max": 8, "adapted": True, "reason": "acceptance 10% [bold]",
                                    "advice": {"action": "keep", "n_max": 8, "detail": "ok"}})
    line = draft_length_line(done)
    assert line is not None and "drafts of 8 tokens" in line and "[bold]" in line


def test_daemon_shortens_drafts_when_idle_then_drops_them_at_the_floor(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's wiring: below break-even under auto, a long draft is announced shorter (ps, events),
    relaunched at the next idle moment with that length; speculation is not switched off for it."""
    import asyncio

    from bostudio.daemon.supervise.events import EventBus
    from bostudio.daemon.supervise.stats import InstanceStats
    from bostudio.daemon.supervise.instance import Instance, ModelConfig
    from bostudio.daemon.supervise.lifecycle import READY, Life
    from bostudio.daemon.supervise.supervisor import Supervisor, SupervisorOptions

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    bus = EventBus()
    sup = Supervisor(SupervisorOptions(), bus)
    restarted: list[str] = []

    async def restart(name: str):  # type: ignore[no-untyped-def]
        restarted.append(name)

    sup.restart = restart  # type: ignore[method-assign]
    cfg = ModelConfig("m", tmp_path / "m.gguf", 4096, "auto")
    inst = Instance(cfg, life=Life("m", state=READY), speculator=NGRAM_MOD)
    inst.stats = InstanceStats(requests=10, draft_tokens=6400, draft_accepted=640, mean_accepted_length=5.0)
    inst.active = 1
    sup.instances["m"] = inst
    asyncio.run(sup.check_speculation(inst))
    row = inst.to_json()
    assert restarted == [] and row["draft_length"]["advice"]["action"] == "shorter"
    assert row["draft_length"]["advice"]["n_max"] == 8 and row["draft_length"]["n_max"] == 64
    assert any("drafts of 8 tokens when idle" in e["message"] for e in bus.recent if e["type"] == "speculation")
    inst.active = 0
    asyncio.run(sup.check_speculation(inst))
    assert restarted == ["m"] and cfg.draft_len == 8 and cfg.draft_len_failed == 64 and cfg.auto_off is None
    # a new workload starts again from the plan's length
    sup.configs["m"] = cfg
    sup.register("m", workload="edit")
    assert cfg.draft_len is None and cfg.draft_len_failed is None


# ------------------------------------------------------------------------------------------------ real

REPEATED = "def add(a, b):\n    return a + b\n\n" * 12 + "def add(a, b):\n"


def _spec_counters(client) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    from bostudio.runtime.metrics import parse_metrics

    m = parse_metrics(client.metrics())
    return (m.get("spec_decode_num_drafts_total", 0.0),
            m.get("spec_decode_num_draft_tokens_total", 0.0))


def test_the_relaunch_length_reaches_llama_server_and_a_request_field_does_not(engine, gemma_gguf: Path,
                                                                               tmp_path: Path) -> None:
    """The length auto settles on is launched as flags, and llama-server drafts within it (counters from
    /metrics: tokens drafted <= 8 per draft). A per-request `speculative.n_max` is not honoured by the pinned
    engine (server-schema.cpp compiles those fields out): with n_min 4, drafts stay >= 4 tokens when a request
    asks for 2 - which is why the daemon relaunches instead of injecting fields."""
    from bostudio.runtime.client import LlamaClient
    from bostudio.runtime.process import ServerProcess
    from tests.netutil import free_port

    sp = with_draft_length(NGRAM_MOD, 8, "test")
    port = free_port()
    spec = LaunchSpec(gemma_gguf, "g", port, ctx=2048, speculator=sp, n_parallel=1)
    proc = ServerProcess(build_argv(engine.path, engine.flags, spec) + ["-t", "1"], port, tmp_path / "server.log")
    proc.start()
    try:
        proc.wait_ready(timeout=600)
        with LlamaClient(proc.base_url, timeout=__import__("httpx").Timeout(600, connect=5)) as c:
            c.completion(REPEATED, 64, timeout=600, ignore_eos=True)
            drafts, tokens = _spec_counters(c)
            assert drafts > 0, "the repeated prompt drafted nothing: no length to check"
            assert tokens <= 8 * drafts  # the launched length holds
            c.completion(REPEATED + "    return a + b\n\n", 64, timeout=600, ignore_eos=True,
                         **{"speculative.n_max": 2, "speculative.n_min": 0})
            drafts2, tokens2 = _spec_counters(c)
            assert drafts2 > drafts, "the second request drafted nothing: no per-request field to check"
            assert tokens2 - tokens >= 4 * (drafts2 - drafts)  # n_min 4 still rules: the field was ignored
    finally:
        proc.stop()
