"""Real llama-server runs of what pairing chooses: a synthetic NextN target with draft-mtp, the Gemma target
with its self-draft (made by llama-quantize, recorded in the user's table, chosen from it), and that
self-draft's counters and state (its losslessness is proven on full precision in tests/test_lossless.py)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.gguf import describe
from bostudio.pairing.edge.pair import choose, make_self_draft, record_self_draft
from bostudio.pairing.core.table import user_table_path
from bostudio.runtime.client import LlamaClient
from bostudio.runtime.process import ServerProcess
from bostudio.speculation import SpecRequest, Speculator
from bostudio.gguf.synth import tiny_glm4moe_mtp
from tests.netutil import free_port

N_PREDICT = 32
PROMPTS = ["Once upon a time, in a small village by the sea, there lived an old fisherman who",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]


@pytest.fixture(scope="module")
def pairing(engine, gemma_gguf: Path, tmp_path_factory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("pairing-servers")
    saved = {k: os.environ.get(k) for k in ("XDG_CONFIG_HOME", "XDG_DATA_HOME")}
    os.environ["XDG_CONFIG_HOME"] = str(tmp / "config")
    os.environ["XDG_DATA_HOME"] = str(tmp / "data")
    procs: dict[str, ServerProcess] = {}
    clients: dict[str, LlamaClient] = {}
    try:
        gemma = describe(gemma_gguf)
        draft = make_self_draft(gemma_gguf, "Q2_K", engine, log=lambda m: None)
        assert record_self_draft(gemma, draft, "Q2_K")
        assert not record_self_draft(gemma, draft, "Q2_K")  # recorded once
        self_sel = choose(gemma, SpecRequest("auto"), engine, ctx=1024)[0]
        mtp_model = tiny_glm4moe_mtp(tmp / "glm-mtp.gguf")
        mtp_sel = choose(describe(mtp_model), SpecRequest("auto"), engine, ctx=1024)[0]
        launches = {"off": (gemma_gguf, Speculator("none")), "self-draft": (gemma_gguf, self_sel.speculator),
                    "mtp": (mtp_model, mtp_sel.speculator)}
        for name, (model, sp) in launches.items():
            port = free_port()
            launch = LaunchSpec(model=model, alias=name, port=port, ctx=1024, speculator=sp, n_parallel=1)
            procs[name] = ServerProcess(build_argv(engine.path, engine.flags, launch), port, tmp / f"{name}.log")
            procs[name].start()
        for name, proc in procs.items():
            proc.wait_ready()
            clients[name] = LlamaClient(proc.base_url, timeout=None)
        yield {"clients": clients, "self": self_sel, "mtp": mtp_sel, "draft": draft}
    finally:
        for c in clients.values():
            c.close()
        for p in procs.values():
            p.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def spec_counter(client: LlamaClient, name: str) -> float:
    m = re.search(rf"^llamacpp:spec_decode_{name}_total (\S+)$", client.metrics(), re.M)
    assert m, f"no spec_decode_{name}_total in /metrics"
    return float(m.group(1))


def test_synthetic_nextn_target_drafts_with_its_mtp_head(pairing) -> None:
    sp = pairing["mtp"].speculator
    assert sp.kind == "mtp" and sp.spec_types == ("draft-mtp",) and sp.draft is None
    client = pairing["clients"]["mtp"]
    # token ids: the synthetic vocabulary has no byte tokens to spell text with
    out = client.completion([1, 5, 6, 7], N_PREDICT, return_tokens=True)
    assert out["timings"]["draft_n"] > 0
    assert out["timings"]["draft_n_accepted"] > 0
    assert out["tokens"][:3] == [8, 9, 10]  # the weights make the next token the successor id
    assert spec_counter(client, "num_accepted_tokens") > 0
    assert all(s["speculative"] for s in client.slots())


def test_gemma_self_draft_is_chosen_from_the_user_table_and_accepts(pairing) -> None:
    sel = pairing["self"]
    sp = sel.speculator
    assert sp.kind == "draft" and sp.spec_types == ("draft-simple",) and sp.draft == pairing["draft"]
    assert str(user_table_path()) in sel.considered[sel.chosen].origin
    assert "low-bit copy of the target itself" in sp.reason
    client = pairing["clients"]["self-draft"]
    out = client.completion(PROMPTS[0], N_PREDICT)
    assert out["timings"]["draft_n"] > 0
    assert out["timings"]["draft_n_accepted"] > 0
    assert spec_counter(client, "num_accepted_tokens") > 0


@pytest.mark.parametrize("prompt", PROMPTS, ids=["prose", "code"])
def test_self_draft_generates_in_full_with_consistent_counters(pairing, prompt: str) -> None:
    """On quantized weights which token wins depends on the CPU's batched kernels (tests/test_lossless.py
    proves losslessness on full precision): here, output of the asked length, drafts verified, counters
    consistent, every slot speculative."""
    off, spec_client = pairing["clients"]["off"], pairing["clients"]["self-draft"]
    params = dict(return_tokens=True, seed=0, top_k=1, ignore_eos=True)
    base = off.completion(prompt, N_PREDICT, **params)
    spec = spec_client.completion(prompt, N_PREDICT, **params)
    assert len(base["tokens"]) == len(spec["tokens"]) == N_PREDICT and spec["content"]
    assert "draft_n" not in base["timings"]
    t = spec["timings"]
    assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]
    assert all(s["speculative"] for s in spec_client.slots())
    assert not any(s["speculative"] for s in off.slots())
