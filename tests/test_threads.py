"""The CPU thread rule (planner.threads): a table of cores x children x where the layers run, and the
flags a plan emits through plan_args(Plan); and how a bench holds its servers on cores (one CPU per physical
core, pure; the affinity itself on a real child process)."""

from __future__ import annotations

import os

import pytest

from bostudio.hardware.device import GIB, Device, device_from_json
from bostudio.errors import ConfigError
from bostudio.engine.argv import plan_args, thread_args
from bostudio.planner import Intent, plan
from bostudio.planner.threads import headroom_cores, plan_threads
from bostudio.gguf import ModelInfo, describe
from bostudio.gguf.synth import tiny_llama
from tests.test_planner import shape


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    base = describe(tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", n_layer=2))
    return shape(base, n_layer=8, n_ctx_train=8192)

# cores, children, CPU computes?  ->  -t, -tb
TABLE = [
    (1, 1, True, 1, 1),
    (2, 1, True, 1, 1),    # measured: -t 1 held decode beside a busy process (-t 2 fell to 0.5 tok/s), and
                           # prefill at -tb 1 kept its speed there while -tb 2 took 6x longer
    (2, 2, True, 1, 1),
    (2, 3, True, 1, 1),
    (4, 1, True, 3, 3),
    (4, 2, True, 1, 1),
    (4, 3, True, 1, 1),
    (8, 1, True, 6, 6),
    (8, 2, True, 3, 3),
    (8, 3, True, 2, 2),
    (16, 1, True, 12, 12),
    (16, 2, True, 6, 6),
    (16, 3, True, 4, 4),
    (2, 1, False, 2, 2),   # every layer on a GPU: a couple of feeding threads
    (4, 1, False, 2, 2),
    (8, 3, False, 2, 2),
    (16, 1, False, 2, 2),
    (16, 3, False, 2, 2),
]


@pytest.mark.parametrize("cores,children,cpu,t,tb", TABLE)
def test_thread_rule_table(cores: int, children: int, cpu: bool, t: int, tb: int) -> None:
    p = plan_threads(cores, children, cpu)
    assert p is not None
    assert (p.threads, p.threads_batch) == (t, tb)
    assert thread_args(p) == ["-t", str(t), "-tb", str(tb)]
    assert p.why


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128])
@pytest.mark.parametrize("children", [1, 2, 3, 4])
def test_thread_rule_laws(cores: int, children: int) -> None:
    p = plan_threads(cores, children, True)
    assert p is not None
    # at least one thread each; decode and batch alike (prefill collapses beside a load as decode does)
    assert 1 <= p.threads == p.threads_batch
    # the children's decode threads together leave the headroom free (when each can still have one)
    if (cores - headroom_cores(cores)) >= children:
        assert p.threads * children <= cores - headroom_cores(cores)
    # and so do their batch threads
    if (cores - headroom_cores(cores)) >= children:
        assert p.threads_batch * children <= cores - headroom_cores(cores)
    # a machine with more than one core always keeps a core out of decode
    if cores > 1:
        assert headroom_cores(cores) >= 1 and p.threads < cores
    g = plan_threads(cores, children, False)
    assert g is not None and g.threads <= max(1, cores // children) and g.threads <= 2  # feeding a GPU: few


def test_unknown_cores_leave_llama_cpp_default() -> None:
    assert plan_threads(None) is None
    assert plan_threads(0) is None


def host(cores: int | None) -> Device:
    return Device("cpu", "cpu", "host", total_bytes=64 * GIB, free_bytes=60 * GIB, cores=cores)


def gpu(total_gib: float) -> Device:
    return Device("nvidia", "cuda", "gpu", total_bytes=int(total_gib * GIB), free_bytes=int(total_gib * GIB))


def test_plan_emits_threads_through_plan_args(model: ModelInfo) -> None:
    m = model
    p = plan(m, [host(8)], Intent(ctx=4096))
    args = plan_args(p)
    assert args[args.index("-t") + 1] == "6" and args[args.index("-tb") + 1] == "6"
    assert p.threads is not None and p.threads.to_json()["headroom"] == 2


def test_children_split_the_cores(model: ModelInfo) -> None:
    m = model
    p = plan(m, [host(16)], Intent(ctx=4096, children=2))
    args = plan_args(p)
    assert args[args.index("-t") + 1] == "6" and args[args.index("-tb") + 1] == "6"


def test_all_layers_on_a_gpu_need_few_threads_and_some_on_the_host_need_more(model: ModelInfo) -> None:
    m = model
    full = plan(m, [host(16), gpu(80)], Intent(ctx=4096))
    assert full.chosen.n_gpu_layers == m.n_block + 1
    assert full.threads is not None and full.threads.threads == 2
    partial = plan(m, [host(16), gpu(full.chosen.total / GIB * 0.5)], Intent(ctx=4096, reserve=0))
    assert 0 < partial.chosen.n_gpu_layers < m.n_block + 1
    assert partial.threads is not None and partial.threads.threads == 12


def test_no_cores_known_no_thread_flags(model: ModelInfo) -> None:
    p = plan(model, [host(None)], Intent(ctx=4096))
    assert p.threads is None and "-t" not in plan_args(p) and "-tb" not in plan_args(p)


def test_devices_file_takes_cores_and_refuses_nonsense() -> None:
    d = device_from_json({"vendor": "cpu", "backend": "cpu", "name": "big host", "total_gib": 256, "cores": 32})
    assert d.cores == 32
    with pytest.raises(ConfigError, match="cores"):
        device_from_json({"vendor": "cpu", "backend": "cpu", "name": "h", "total_gib": 8, "cores": 0})
    with pytest.raises(ConfigError, match="cores"):
        device_from_json({"vendor": "cpu", "backend": "cpu", "name": "h", "total_gib": 8, "cores": "many"})


# ------------------------------------------------------------------------- holding a bench's servers on cores

SMT = {0: {0, 4}, 1: {1, 5}, 2: {2, 6}, 3: {3, 7}, 4: {0, 4}, 5: {1, 5}, 6: {2, 6}, 7: {3, 7}}


@pytest.mark.parametrize("allowed, siblings, n, want", [
    ([0, 1], {}, 1, [1]),  # the last CPU: CPU 0 takes most interrupts
    ([0, 1], {}, 2, [0, 1]),
    ([0, 1], {}, 5, [0, 1]),  # no more than there are
    (list(range(8)), SMT, 2, [6, 7]),  # 6 and 7 are different cores (2 and 3)
    (list(range(8)), SMT, 4, [4, 5, 6, 7]),
    (list(range(8)), SMT, 6, [4, 5, 6, 7]),  # 4 physical cores: one CPU each, never two siblings
    ([0, 4, 5], SMT, 2, [4, 5]),  # 4 and 0 are siblings
    ([0, 4], SMT, 2, [4]),
    ([2, 3, 9], {}, 2, [3, 9]),  # topology unknown: logical CPUs from the end
])
def test_one_cpu_per_core(allowed: list[int], siblings: dict, n: int, want: list[int]) -> None:
    from bostudio.hardware.cpu import one_cpu_per_core

    got = one_cpu_per_core(allowed, lambda c: frozenset(siblings[c]) if c in siblings else None, n)
    assert got == want


def test_smt_siblings_reads_this_machine_or_says_unknown() -> None:
    from bostudio.hardware.cpu import smt_siblings

    for cpu in sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]:
        sib = smt_siblings(cpu)
        assert sib is None or cpu in sib


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_set_cpu_affinity_holds_every_thread_and_lets_go() -> None:
    """A real child with several threads: every thread on the one CPU, then on every CPU again."""
    import subprocess
    import sys

    from bostudio.runtime.process import set_cpu_affinity

    code = ("import threading, time\n"
            "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(3)]\n"
            "print('up', flush=True)\ntime.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        everything = os.sched_getaffinity(0)
        last = max(everything)
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) == 4
        assert set_cpu_affinity(child.pid, {last})
        assert all(os.sched_getaffinity(t) == {last} for t in tids)
        assert set_cpu_affinity(child.pid, None)
        assert all(os.sched_getaffinity(t) == everything for t in tids)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert not set_cpu_affinity(child.pid, {last})  # gone: nothing held, no exception
