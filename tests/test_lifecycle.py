"""The supervisor's lifecycle table (bostudio/daemon/supervise/lifecycle.py), one case per transition, without
processes: state + event -> new state + effects. What a fault does to a model (retry, back off, fail, relaunch
without a dead worker, not counted when one request killed it) is proved here in milliseconds; a handful of
daemon tests (tests/test_daemon_faults.py) keep the real processes honest."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bostudio.daemon.supervise import lifecycle as lc
from bostudio.daemon.supervise.lifecycle import (FAILED, LOADING, READY, RESTARTING, STOPPED, STOPPING, Announce,
                                                 AwaitSettle, CancelTask, ClearError, Exited, FreshReady, Launch, Life,
                                                 Loaded, LoadFailed, MarkFailed, MarkLost, NoteChildren, ResolveReady,
                                                 Retry, RetryDue, SaveSlots, Settled, Spawn, StartChild, Stop,
                                                 StopChild, Stopped, View, Warn, WatchChild, WorkerLostError)
from bostudio.errors import ModelFileError, OutOfMemoryError, PlanError, PortInUseError, ServerError

NOW, WALL = 1000.0, 1.7e9


def life(state: str = STOPPED, **kw) -> Life:  # type: ignore[no-untyped-def]
    return Life("m", "/logs/m.log", state=state, **kw)


def kinds(effects: list) -> list[str]:
    return [type(e).__name__ for e in effects]


def step(before: Life, event: lc.Event, now: float = NOW) -> tuple[Life, list]:
    return lc.step(before, event, now, WALL)


# ------------------------------------------------------------------ load

def test_launch_from_stopped_loads_with_a_fresh_wait_and_a_task() -> None:
    before = life(STOPPED, crashes=(1.0, 2.0), failed_at=5.0, stopping=True)
    after, effects = step(before, Launch())
    assert after == life(LOADING)  # crashes forgotten, no failure, not stopping
    assert effects == [ClearError(), FreshReady(always=True), Announce(LOADING), Spawn(), StartChild()]


@pytest.mark.parametrize("state", [FAILED, STOPPED])
def test_launch_of_a_failed_or_stopped_model_starts_it_afresh(state: str) -> None:
    after, effects = step(life(state, failed_at=1.0), Launch())
    assert after.state == LOADING and after.failed_at is None and StartChild() in effects


@pytest.mark.parametrize("state", [LOADING, READY, RESTARTING])
def test_launch_of_a_resident_model_changes_nothing(state: str) -> None:
    before = life(state, crashes=(1.0,))
    assert step(before, Launch()) == (before, [])


def test_ready_answers_the_waiting_requests_and_watches_the_child() -> None:
    after, effects = step(life(LOADING), Loaded())
    assert after.state == READY
    assert effects == [Announce(READY), ResolveReady(), WatchChild()]


def test_a_load_that_ends_while_a_stop_owns_the_child_is_ignored() -> None:
    before = life(STOPPING, stopping=True)
    assert step(before, Loaded()) == (before, [])


# ------------------------------------------------------------------ crash during load: retry, back off, give up

def test_a_crash_during_load_stops_the_child_and_retries_after_a_backoff() -> None:
    after, effects = step(life(LOADING), LoadFailed(ServerError("llama-server exited with code 1 while loading")))
    assert after.state == RESTARTING and after.crashes == (NOW,)
    assert effects == [StopChild(), NoteChildren(),
                       Announce(RESTARTING, {"reason": "llama-server exited with code 1 while loading", "crashes": 1}),
                       FreshReady(), Retry(lc.BACKOFF_BASE_S)]


def test_the_backoff_doubles_per_crash_up_to_its_cap() -> None:
    delays = []
    cur = life(LOADING)
    for n in range(lc.CRASH_LIMIT - 1):
        cur, effects = step(cur, LoadFailed(ServerError("boom")), now=NOW + n)
        delays.append(effects[-1].delay)
        cur, _ = step(cur, RetryDue())
    assert delays == [0.25, 0.5, 1.0, 2.0]
    assert life(crashes=tuple(range(20))).backoff() == lc.BACKOFF_MAX_S


def test_retry_due_loads_again() -> None:
    after, effects = step(life(RESTARTING, crashes=(NOW,)), RetryDue())
    assert after.state == LOADING and after.crashes == (NOW,)  # the count goes on until a start asks afresh
    assert effects == [Announce(LOADING), StartChild()]


def test_the_fifth_crash_in_a_minute_gives_up_with_the_count_and_the_log() -> None:
    cur = life(LOADING)
    for n in range(lc.CRASH_LIMIT):
        cur, effects = step(cur, LoadFailed(ServerError("boom")), now=NOW + n)
        if n < lc.CRASH_LIMIT - 1:
            cur, _ = step(cur, RetryDue())
    assert cur.state == FAILED and cur.failed_at == WALL
    assert kinds(effects) == ["StopChild", "NoteChildren", "MarkFailed"]
    err = effects[-1].error
    assert isinstance(err, ServerError) and err.message == "m crashed 5 times in 60 s; last: boom"
    assert "/logs/m.log" in err.hint and "bostudio up --daemon m" in err.hint


def test_crashes_spread_wider_than_the_window_never_give_up() -> None:
    cur = life(LOADING)
    for t in (0.0, 20.0, 40.0, 61.0, 81.0, 101.0, 122.0):  # never 5 within 60 s
        cur, _ = step(cur, LoadFailed(ServerError("boom")), now=t)
        assert cur.state == RESTARTING, t
        cur, _ = step(cur, RetryDue())


def test_crashes_older_than_the_window_do_not_count() -> None:
    old = tuple(NOW - lc.CRASH_WINDOW_S - n for n in range(1, 5))  # four, all out of the window
    after, effects = step(life(LOADING, crashes=old), LoadFailed(ServerError("boom")))
    assert after.state == RESTARTING and after.crashes == (NOW,) and effects[-1] == Retry(lc.BACKOFF_BASE_S)


@pytest.mark.parametrize("error", [
    ModelFileError("m: not a GGUF file", "re-download it"),  # the file's fault: every relaunch fails the same
    WorkerLostError("m does not fit without the lost rpc worker(s) h:1: ...", "restart the worker"),
])
def test_a_fault_no_relaunch_can_cure_fails_at_once_uncounted(error: Exception) -> None:
    after, effects = step(life(LOADING), LoadFailed(error))
    assert after.state == FAILED and after.crashes == () and after.failed_at == WALL
    assert effects == [StopChild(), MarkFailed(error)]


def test_out_of_memory_fails_at_once_and_names_the_plan() -> None:
    after, effects = step(life(LOADING), LoadFailed(OutOfMemoryError("m needs 900 MiB", "stop a model"),
                                                    plan="900 MiB for m at ctx 4096"))
    assert after.state == FAILED
    (stop, failed) = effects
    assert stop == StopChild() and isinstance(failed.error, OutOfMemoryError)
    assert failed.error.message == "m needs 900 MiB (plan: 900 MiB for m at ctx 4096)"
    assert failed.error.hint == "stop a model"


def test_a_busy_port_is_a_crash_unless_the_port_is_pinned() -> None:
    busy = PortInUseError("port 9000 is in use", "pick another")
    after, effects = step(life(LOADING), LoadFailed(busy))
    assert after.state == RESTARTING and isinstance(effects[-1], Retry)  # the next launch picks another port
    after, effects = step(life(LOADING), LoadFailed(busy, pinned_port=True))
    assert after.state == FAILED and effects == [StopChild(), MarkFailed(busy)]  # a pinned port stays taken


def test_a_bug_while_loading_fails_the_model_instead_of_leaving_requests_waiting() -> None:
    after, effects = step(life(LOADING), LoadFailed(KeyError("oops")))
    assert after.state == FAILED
    err = effects[-1].error
    assert isinstance(err, ServerError) and err.message == "unexpected error while loading: KeyError('oops')"


def test_a_plan_error_that_is_not_a_file_fault_is_a_crash() -> None:
    # (the runner turns a PlanError into ModelFileError or WorkerLostError; a bare one is retried like a crash)
    after, _ = step(life(LOADING), LoadFailed(PlanError("no fit")))
    assert after.state == RESTARTING


# ------------------------------------------------------------------ crash while serving

def test_a_crash_while_serving_waits_for_the_requests_it_broke() -> None:
    after, effects = step(life(READY), Exited(-9, "llama-server exited with code -9: killed"))
    assert after.state == RESTARTING and after.crashes == ()  # not counted before the requests settle
    assert effects == [NoteChildren(), Announce(RESTARTING, {"reason": "llama-server exited with code -9: killed",
                                                             "crashes": 0}),
                       FreshReady(), AwaitSettle("llama-server exited with code -9: killed")]


def test_a_child_killed_by_one_request_relaunches_at_once_uncounted() -> None:
    after, effects = step(life(RESTARTING), Settled(1, "llama-server exited with code -6: abort"))
    assert after.state == LOADING and after.crashes == ()
    assert kinds(effects) == ["Warn", "Announce", "StartChild"]
    assert "answered 502, not sent again" in effects[0].message
    assert effects[1] == Announce(LOADING, {"reason": "relaunching after a request that ended the child"})


@pytest.mark.parametrize("broke", [0, 2, None])  # none, several (not one request's fault), or a hang
def test_otherwise_a_death_while_serving_counts_as_a_crash(broke: int | None) -> None:
    after, effects = step(life(RESTARTING), Settled(broke, "died"))
    assert after.state == RESTARTING and after.crashes == (NOW,)
    assert effects == [NoteChildren(), Announce(RESTARTING, {"reason": "died", "crashes": 1}), FreshReady(),
                       Retry(lc.BACKOFF_BASE_S)]


def test_a_dead_rpc_worker_relaunches_without_it() -> None:
    after, effects = step(life(READY, lost_workers=("a:1",)), Exited(1, "exited", dead_workers=("b:2",)))
    assert after.state == LOADING and after.lost_workers == ("a:1", "b:2") and after.crashes == ()
    why = "rpc worker b:2 stopped answering; llama-server exited with code 1"
    assert effects == [StopChild(), MarkLost(why), FreshReady(),
                       Announce(LOADING, {"reason": "relaunching without b:2"}), StartChild()]


def test_an_exit_while_a_stop_owns_the_child_is_no_crash() -> None:
    before = life(STOPPING, stopping=True)
    assert step(before, Exited(0, "exited", dead_workers=("b:2",))) == (before, [])


# ------------------------------------------------------------------ stop, evict, idle, reload

def test_stopping_a_ready_model_saves_its_slots_first() -> None:
    after, effects = step(life(READY), Stop("idle"))
    assert after.state == STOPPING and after.stopping
    assert effects == [Announce(STOPPING, {"reason": "idle"}), SaveSlots("idle"), CancelTask(), StopChild()]
    after, effects = step(after, Stopped("idle"))
    assert after.state == STOPPED
    assert kinds(effects) == ["Announce", "ResolveReady"] and effects[0] == Announce(STOPPED, {"reason": "idle"})
    assert str(effects[1].error) == "model m was idle while loading"


@pytest.mark.parametrize("state", [LOADING, RESTARTING])
def test_stopping_a_loading_model_cancels_it_without_saving(state: str) -> None:
    after, effects = step(life(state), Stop("evicted"))
    assert after.state == STOPPING
    assert effects == [Announce(STOPPING, {"reason": "evicted"}), CancelTask(), StopChild()]


def test_stopping_a_failed_model_keeps_it_failed() -> None:
    before = life(FAILED, failed_at=WALL)
    after, effects = step(before, Stop())
    assert after.state == FAILED and effects == [CancelTask(), StopChild()]
    after, effects = step(after, Stopped())
    assert after.state == FAILED and kinds(effects) == ["ResolveReady"]


def test_reload_is_stop_then_launch() -> None:
    cur, _ = step(life(READY, crashes=(NOW,)), Stop("restarting"))
    cur, _ = step(cur, Stopped("restarting"))
    cur, effects = step(cur, Launch())
    assert cur == life(LOADING) and StartChild() in effects  # and the crash count starts afresh


def test_eviction_picks_idle_models_least_recently_used_first_never_busy_ones() -> None:
    views = [View("old", READY, 4, last_used=1.0, active=0), View("busy", READY, 4, last_used=0.5, active=1),
             View("new", READY, 4, last_used=2.0, active=0), View("loading", LOADING, 4, last_used=0.1, active=0),
             View("gone", STOPPED, 40, last_used=0.0, active=0), View("me", READY, 4, last_used=0.0, active=0)]
    assert lc.evictions(views, "me", need=4, budget=20) == []  # 16 resident besides me, 4 more fit 20
    assert lc.evictions(views, "me", need=8, budget=20) == ["old"]
    assert lc.evictions(views, "me", need=12, budget=20) == ["old", "new"]
    assert lc.evictions(views, "me", need=16, budget=20) is None  # busy and loading ones stay


def test_each_offload_device_must_hold_what_lands_on_it() -> None:
    """The host budget may fit while a GPU does not: models holding memory on that device go, least recently
    used first, never busy ones, never one already chosen, never one holding nothing there."""
    views = [View("host-only", READY, 4, last_used=0.0, active=0), View("gpu-old", READY, 4, last_used=1.0, active=0),
             View("gpu-busy", READY, 4, last_used=0.5, active=1), View("gpu-new", READY, 4, last_used=2.0, active=0),
             View("me", READY, 4, last_used=0.0, active=0)]
    on = {"host-only": {"CPU": 4}, "gpu-old": {"Vulkan0": 6}, "gpu-busy": {"Vulkan0": 6}, "gpu-new": {"Vulkan0": 6}}
    cap = {"Vulkan0": 20}
    assert lc.device_evictions(views, "me", [], on, {"Vulkan0": 2}, cap) == []  # 18 there, 2 more fit 20
    assert lc.device_evictions(views, "me", [], on, {"Vulkan0": 6}, cap) == ["gpu-old"]
    assert lc.device_evictions(views, "me", ["gpu-old"], on, {"Vulkan0": 6}, cap) == []  # its 6 freed already
    assert lc.device_evictions(views, "me", ["gpu-old"], on, {"Vulkan0": 10}, cap) == ["gpu-new"]
    assert lc.device_evictions(views, "me", [], on, {"Vulkan0": 15}, cap) is None  # the busy one stays
    assert lc.device_evictions(views, "me", [], on, {"CPU": 100}, cap) == []  # the host is the budget's business


def test_idle_unload_picks_ready_models_without_requests_past_the_ttl() -> None:
    views = [View("idle", READY, 0, last_used=0.0, active=0), View("busy", READY, 0, last_used=0.0, active=2),
             View("fresh", READY, 0, last_used=95.0, active=0), View("loading", LOADING, 0, last_used=0.0, active=0)]
    assert lc.idle(views, now=100.0, ttl=10.0) == ["idle"]
    assert lc.idle(views, now=100.0, ttl=0) == []  # 0: never unload


# ------------------------------------------------------------------ what a request finds

def test_a_request_serves_starts_waits_retries_or_refuses() -> None:
    assert lc.on_request(life(READY), None, WALL, 60) == lc.SERVE
    assert lc.on_request(life(STOPPED), None, WALL, 60) == lc.START
    assert lc.on_request(life(STOPPING), None, WALL, 60) == lc.START  # after the stop in progress
    assert lc.on_request(life(LOADING), None, WALL, 60) == lc.WAIT
    assert lc.on_request(life(RESTARTING), None, WALL, 60) == lc.WAIT
    failed = life(FAILED, failed_at=WALL - 30)
    assert lc.on_request(failed, "ServerError", WALL, 60) == lc.REFUSE
    assert lc.on_request(failed, "ModelFileError", WALL, 60) == lc.REFUSE_FILE  # 422: still the file's fault
    assert lc.on_request(failed, "ServerError", WALL + 30, 60) == lc.RETRY  # the cool-down is over
    assert lc.on_request(failed, "ModelFileError", WALL + 30, 60) == lc.RETRY
    assert lc.on_request(failed, "ServerError", WALL + 1e6, 0) == lc.REFUSE  # 0: explicit restart only


# ------------------------------------------------------------------ the whole table, walked

def test_every_event_from_every_state_gives_a_known_state_and_only_effects() -> None:
    """No (state, event) pair raises or leaves the lifecycle in a state it does not know."""
    events = [Launch(), Loaded(), LoadFailed(ServerError("x")), LoadFailed(ModelFileError("x")),
              Exited(1, "x"), Exited(1, "x", ("w:1",)), Settled(1, "x"), Settled(0, "x"), RetryDue(), Stop(),
              Stopped()]
    states = [STOPPED, LOADING, READY, RESTARTING, FAILED, STOPPING]
    effect_types = tuple(t for t in vars(lc).values() if isinstance(t, type) and t.__module__ == lc.__name__
                         and t.__name__ in {"Announce", "ClearError", "FreshReady", "ResolveReady", "Spawn",
                                            "StartChild", "WatchChild", "AwaitSettle", "Retry", "StopChild",
                                            "SaveSlots", "CancelTask", "MarkFailed", "MarkLost", "NoteChildren",
                                            "Warn"})
    for state in states:
        for stopping in (False, True):
            for event in events:
                after, effects = step(life(state, stopping=stopping), event)
                assert after.state in states, (state, event)
                assert all(isinstance(e, effect_types) for e in effects), (state, event, effects)
    with pytest.raises(TypeError):
        step(life(), object())  # type: ignore[arg-type]


def test_a_life_is_plain_data() -> None:
    a = life(READY, crashes=(1.0,))
    assert a == replace(life(READY), crashes=(1.0,)) and hash(a) == hash(replace(a))
    assert Warn("x") == Warn("x")
