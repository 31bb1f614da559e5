"""The pieces of prompt reuse that are plain data: the planner's prompt-cache component and flags,
the saved-state identity (a state for another model file, engine, context or cache type is never
offered), and the store's disk cap with least-recently-used eviction."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from bostudio.daemon.supervise.slots import SlotStore, state_key
from bostudio.engine.argv import plan_args
from bostudio.gguf import describe
from bostudio.hardware.device import Device
from bostudio.planner import Intent, plan
from bostudio.planner.fit import PROMPT_CACHE, prompt_cache_bytes
from bostudio.planner.memory import MIB
from bostudio.gguf.synth import tiny_llama


def cpu() -> list[Device]:
    from bostudio.hardware import discover_devices

    return [d for d in discover_devices().devices if not d.is_gpu][:1]


def test_the_prompt_cache_is_a_planned_component_sized_from_the_kv_pool(gemma_gguf: Path) -> None:
    info = describe(gemma_gguf)
    plain = plan(info, cpu(), Intent(ctx=8192))
    reuse = plan(info, cpu(), Intent(ctx=8192, prompt_cache=True, swa_full=True))
    assert plain.chosen.component_bytes(PROMPT_CACHE) == 0
    assert "-cram" not in plan_args(plain) and "--swa-full" not in plan_args(plain)
    cache = reuse.chosen.component_bytes(PROMPT_CACHE)
    kv = reuse.chosen.component_bytes("KV cache")
    assert cache == prompt_cache_bytes(kv) and kv <= cache < kv + MIB
    # --swa-full: Gemma's sliding-window layers keep the whole context, so the pool grows.
    assert kv > plain.chosen.component_bytes("KV cache")
    args = plan_args(reuse)
    assert args[args.index("-cram") + 1] == str(cache // MIB) and "--swa-full" in args
    # counted in the total the daemon's budget sees (the full window also grows the compute buffer)
    assert reuse.chosen.total == sum(u.bytes for u in reuse.chosen.uses)
    assert reuse.chosen.total >= plain.chosen.total + cache + (kv - plain.chosen.component_bytes("KV cache"))


def test_a_state_key_changes_with_each_part_of_the_identity(tmp_path: Path) -> None:
    model = tiny_llama(tmp_path / "m.gguf")
    base = state_key(model, "abc123", 8192)
    assert base == state_key(model, "abc123", 8192)
    others = [state_key(model, "def456", 8192), state_key(model, "abc123", 4096),
              state_key(model, "abc123", 8192, cache_type="q8_0"), state_key(model, "abc123", 8192, swa_full=False)]
    os.utime(model, ns=(time.time_ns(), time.time_ns() + 10**9))
    others.append(state_key(model, "abc123", 8192))
    assert len({k.digest for k in [base, *others]}) == len(others) + 1


def fake_state(store: SlotStore, key, slot: int, size: int) -> None:
    (store.ensure() / store.filename(key.digest, slot)).write_bytes(b"\0" * size)
    store.record(key, {slot: {"tokens": 5000, "bytes": size}})


def test_only_the_exact_identity_is_offered_and_the_store_keeps_its_cap_lru(tmp_path: Path) -> None:
    model = tiny_llama(tmp_path / "m.gguf")
    store = SlotStore(tmp_path / "store", cap_bytes=4000)  # sidecars (~0.4 kB) count too
    a, b, c = (state_key(model, "e", ctx) for ctx in (1024, 2048, 4096))
    fake_state(store, a, 0, 1000)
    assert store.for_key(a) == {0: 5000} and store.for_key(b) == {}
    # A sidecar whose recorded identity differs from the key it is filed under is refused.
    forged = store.root / f"{b.digest}.json"
    forged.write_text((store.root / f"{a.digest}.json").read_text())
    (store.root / store.filename(b.digest, 0)).write_bytes(b"\0")
    assert store.for_key(b) == {}
    store.remove(b.digest)
    time.sleep(0.01)
    fake_state(store, b, 0, 1000)
    time.sleep(0.01)
    store.touch(a)  # a was restored: now b is the least recently used
    time.sleep(0.01)
    fake_state(store, c, 1, 1500)  # ~4.7 kB > 4 kB: b goes (~3.3 kB left)
    assert store.for_key(b) == {} and store.for_key(a) == {0: 5000} and store.for_key(c) == {1: 5000}
    usage = store.usage()
    assert usage["bytes"] <= 4000 and {e["digest"] for e in usage["entries"]} == {a.digest, c.digest}
    assert replace(a, ctx=1024) == a
