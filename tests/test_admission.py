"""Admission into a child's KV pool (bostudio.daemon.supervise.admission), without a server: reservations fit the
pool or wait first come first served, a wait is bounded and a cancelled waiter leaves the line, what a
request reserves, and llama-server's own context error read back."""

from __future__ import annotations

import asyncio
import json

import pytest

from bostudio.daemon.supervise.admission import (DRAFT_ROOM, Admission, QueueTimeout, exceed_message, output_budget,
                                                 reservation, too_long)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_requests_that_fit_together_run_together_and_the_rest_wait_in_order() -> None:
    async def scenario() -> list[str]:
        adm, order = Admission(), []
        await adm.acquire(3000, 4096, 10)  # in flight
        waiters = [asyncio.create_task(adm.acquire(t, 4096, 10)) for t in (2000, 500)]
        await asyncio.sleep(0)
        assert adm.waiting == 2 and adm.in_use == 3000  # 500 would fit, but waits behind the 2000 (FIFO)
        for i, w in enumerate(waiters):
            w.add_done_callback(lambda _, i=i: order.append(f"w{i}"))
        adm.release(3000)
        await asyncio.gather(*waiters)
        assert adm.in_use == 2500 and adm.waiting == 0 and adm.waited == 2
        adm.release(2000)
        adm.release(500)
        assert adm.in_use == 0
        return order

    assert run(scenario()) == ["w0", "w1"]


def test_a_request_alone_is_admitted_even_if_it_reserves_the_whole_pool() -> None:
    async def scenario() -> None:
        adm = Admission()
        await adm.acquire(4096, 4096, 1)
        assert adm.in_use == 4096

    run(scenario())


def test_the_wait_is_bounded_and_a_cancelled_waiter_leaves_the_line() -> None:
    async def scenario() -> None:
        adm = Admission()
        await adm.acquire(4000, 4096, 1)
        with pytest.raises(QueueTimeout):
            await adm.acquire(1000, 4096, 0.05)
        assert adm.waiting == 0 and adm.in_use == 4000
        t = asyncio.create_task(adm.acquire(1000, 4096, 10))
        await asyncio.sleep(0)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert adm.waiting == 0
        adm.release(4000)
        assert adm.in_use == 0  # nothing was granted to the request that left

    run(scenario())


@pytest.mark.parametrize("body, prompt, ctx, want", [
    ({"max_tokens": 100}, 2000, 4096, 2100 + DRAFT_ROOM),
    ({"max_completion_tokens": 50}, 2000, 4096, 2050 + DRAFT_ROOM),
    ({"max_output_tokens": 10}, 100, 4096, 110 + DRAFT_ROOM),  # Responses
    ({"n_predict": -1}, 1000, 4096, 4096),  # llama.cpp's "no limit"
    ({}, 1000, 4096, 4096),  # no limit: up to the end of the context
    ({"max_tokens": 100000}, 1000, 4096, 4096),
    ({"max_tokens": True}, 1000, 4096, 4096),  # not a number
    ({"options": {"num_predict": 20}}, 10, 4096, 30 + DRAFT_ROOM),  # Ollama
    ({"max_tokens": 4000}, 90, 4096, 4096),  # never more than the context
])
def test_a_request_reserves_its_prompt_and_the_output_it_may_generate(body: dict, prompt: int, ctx: int,
                                                                      want: int) -> None:
    assert reservation(prompt, body, ctx) == want


def test_the_output_budget_comes_from_any_api_familys_field() -> None:
    assert output_budget({"max_tokens": 7}) == 7
    assert output_budget({"max_output_tokens": 9}) == 9
    assert output_budget({"options": {"num_predict": 3}}) == 3
    assert output_budget({"max_tokens": 0}) is None and output_budget({"n_predict": -1}) is None
    assert output_budget({"max_tokens": "9"}) is None


def test_llama_servers_context_error_is_read_back_with_its_numbers() -> None:
    body = {"error": {"code": 400, "type": "exceed_context_size_error", "message": "request (5000 tokens) exceeds "
                      "the available context size (4096 tokens)", "n_prompt_tokens": 5000, "n_ctx": 4096}}
    assert exceed_message(json.dumps(body).encode()) == (5000, 4096)
    assert exceed_message(b'{"error": {"type": "server_error"}}') is None
    assert exceed_message(b"not json") is None
    err = too_long("m", 5000, 4096, 32768)
    assert "5000 tokens" in err.message and "4096 tokens" in err.message and "32768" in err.hint
    assert "--ctx" not in too_long("m", 40000, 32768, 32768).hint  # already at the training context


def test_a_load_plans_with_idle_models_memory_as_free_and_the_budget_on_the_host(monkeypatch, tmp_path) -> None:
    """Supervisor.planning_devices: an idle model's memory counts as free (the load evicts it if it needs
    the room), a busy one's does not, and the host holds at most the memory budget less the busy models."""
    from pathlib import Path
    from types import SimpleNamespace

    from bostudio.daemon.supervise import supervisor as sv
    from bostudio.daemon.supervise.events import EventBus
    from bostudio.daemon.supervise.instance import Instance, ModelConfig
    from bostudio.daemon.supervise.lifecycle import READY, Life
    from bostudio.engine.discover import Engine
    from bostudio.hardware.device import GIB, Device, ProbeResult
    from bostudio.planner.fit import Use

    host = Device(vendor="cpu", backend="cpu", name="host", index=0, total_bytes=32 * GIB, free_bytes=10 * GIB)
    monkeypatch.setattr(sv, "discover_devices", lambda **_: ProbeResult((host,)))
    sup = sv.Supervisor(sv.SupervisorOptions(memory_budget=20 * GIB, prompt_reuse=False), EventBus())

    def resident(name: str, gib: int, active: int) -> None:
        inst = Instance(ModelConfig(name, Path(f"/m/{name}.gguf"), None, "auto"), life=Life(name, state=READY),
                        active=active)
        # What planning_devices reads of the child's Decision: its total and its bytes per device.
        chosen = SimpleNamespace(uses=[Use("CPU", "weights", gib * GIB)])
        inst.decision = SimpleNamespace(bytes=gib * GIB, plan=SimpleNamespace(chosen=chosen))  # type: ignore[assignment]
        sup.instances[name] = inst

    resident("idle", 4, 0)
    resident("busy", 3, 1)
    (d,) = sup.planning_devices(Engine(Path("/x"), "explicit"), "new")
    assert d.free_bytes == 14 * GIB  # 10 free + the idle model's 4
    assert d.budget_bytes == 17 * GIB  # the 20 GiB budget less the busy model's 3
    (again,) = sup.planning_devices(Engine(Path("/x"), "explicit"), "idle", running=True)
    assert again.free_bytes == 14 * GIB  # a relaunch of `idle` frees its own memory too
