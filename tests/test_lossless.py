"""Lossless: with greedy sampling, speculation changes no output token. Proven exactly on full precision.

Why full precision (measured): on the embedded Q4_K_M file, greedy output with a self-draft
(`--spec-type draft-simple`, the model as its own draft, `--spec-draft-n-max 8`) departs from the output
without speculation on all 4 prompts tried on an AVX-512 AMD EPYC, at margins of 0.358, 0.050 and 0.341 nats;
on the fourth prompt speculation took the third candidate, 0.22 nats behind the best. Evaluating the same
prefix as one batch on the speculation-free server does not reproduce those flips. Quantized kernels take
other arithmetic paths for a batch of tokens than for one (activations quantized per block, repacked weight
layouts, tiled matrix-matrix against matrix-vector kernels), and those paths differ from one CPU to the next,
so no margin tuned on one CPU holds on another.

Dequantized copies (the engine's `llama-quantize --allow-requantize IN OUT TYPE`) differ only in the order
floating-point sums are taken, so they depart only at real ties. `benchmarks/check_precision.py`, 4 prompts x
128 tokens, the Q4_K_M file drafting (`-np 1`), on this machine's two engines:

| weights | native (AVX-512) | portable (AVX2, GGML_NATIVE=OFF) |
| --- | --- | --- |
| Q4_K_M | 2/4 identical; departs at 0.594 and 0.050 nats | - |
| F16 | 4/4 identical | 3/4; one tie, 0.0006 nats (token 54) |
| F32 | 3/4; one tie, 0.005 nats (token 11, the Dijkstra prompt) | 4/4 identical |

F16 decodes 1.4-1.7x faster than F32 here (`--speed`, interleaved: 65.6 vs 47.5 tok/s native, 55.1 vs 32.3
portable), so these tests use the F16 copy (tests/conftest.py: FULL_PRECISION), except on a CPU with
half-precision vector arithmetic (x86 AVX512-FP16, ARM's FP16 vectors), whose F16 kernels compute in half
precision: on a 2-core Xeon with avx512_fp16, F16 departed on the Dijkstra prompt (token 11, draft-simple) at
0.0117 nats, beyond a tie, and F32 passed all 22 tests here in 216 s. There the tests use the F32 copy.

So the rule, on full-precision weights: speculative greedy output equals the output with speculation off,
token for token. The only allowance is a real tie: at the first departure the baseline's top two candidates
are within TIE_NATS of each other and speculation took the other of the two. No re-evaluation escape, no
wider bound. Covered: two n-gram types, draft-simple with a self-draft (the embedded Q4_K_M file drafting
for its full-precision copy), draft-mtp on a synthetic NextN model written at F32, and the same two requests
through `bostudio up` and through the daemon's speculation switch.

On the quantized file the tests assert only what is portable: counters, `/slots` state, output produced
and its length; never which token wins.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from bostudio.runtime.client import LlamaClient
from benchmarks.lossless import (GREEDY, N_PREDICT, PROMPTS, TIMEOUT_S, Greedy, assert_lossless, first_difference,
                                 launch)
from bostudio.gguf.synth import tiny_glm4moe_mtp
from bostudio.speculation import Speculator
from tests.daemon_util import DaemonProc
from tests.netutil import free_port
from tests.test_pairing_servers import spec_counter
from tests.test_up import Up

# Full precision decodes slower than Q4_K_M; a loaded machine may be far slower than an idle one.
pytestmark = pytest.mark.timeout(1800)

# The same two requests go through `up` and through the daemon.
END_TO_END = ("code-classes", "prose-fisherman")


@contextmanager
def serving(engine, model: Path, specs: dict[str, Speculator], logs: Path,
            prefix: str = "") -> Iterator[dict[str, LlamaClient]]:
    """One ready llama-server per speculator on `model`, started together; all stopped on exit."""
    procs = {name: launch(engine, model, prefix + name, sp, logs) for name, sp in specs.items()}
    clients: dict[str, LlamaClient] = {}
    try:
        for name, proc in procs.items():
            proc.wait_ready()
            clients[name] = LlamaClient(proc.base_url, timeout=None)
        yield clients
    finally:
        for c in clients.values():
            c.close()
        for p in procs.values():
            p.stop()


@pytest.fixture(scope="module")
def servers(engine, gemma_full_precision: Path, gemma_gguf: Path, tmp_path_factory) -> Iterator[dict[str, LlamaClient]]:
    logs = tmp_path_factory.mktemp("lossless-logs")
    specs = {
        "off": Speculator("none"),
        "ngram-mod": Speculator("ngram", ("ngram-mod",)),
        "ngram-simple": Speculator("ngram", ("ngram-simple",)),
        # The self-draft: the embedded Q4_K_M file is a low-bit copy of the full-precision target.
        "draft-simple": Speculator("draft", ("draft-simple",), draft=gemma_gguf, n_max=8),
    }
    with serving(engine, gemma_full_precision, specs, logs) as clients:
        yield clients


class Baselines(dict):
    """Each prompt's greedy output without speculation, with the top two candidates at every position;
    generated on first use (one at a time, so no test waits for all of them)."""

    def __init__(self, off: LlamaClient) -> None:
        super().__init__()
        self.off = off

    def __missing__(self, prompt: str) -> Greedy:
        self[prompt] = Greedy.from_native(self.off.completion(PROMPTS[prompt], N_PREDICT, timeout=TIMEOUT_S,
                                                              return_tokens=True, n_probs=2, **GREEDY))
        return self[prompt]


@pytest.fixture(scope="module")
def baselines(servers) -> Baselines:
    return Baselines(servers["off"])


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("spec_name", ["ngram-mod", "ngram-simple", "draft-simple"])
def test_greedy_output_equals_the_baseline_on_full_precision(servers, baselines, spec_name: str,
                                                             prompt: str) -> None:
    base = baselines[prompt]
    assert len(base.tokens) == N_PREDICT and "draft_n" not in base.timings
    spec = Greedy.from_native(servers[spec_name].completion(PROMPTS[prompt], N_PREDICT, timeout=TIMEOUT_S,
                                                            return_tokens=True, **GREEDY))
    assert len(spec.tokens) == N_PREDICT
    if spec_name == "draft-simple":  # a draft model drafts on every prompt
        assert spec.timings["draft_n"] > 0 and spec.timings["draft_n_accepted"] > 0
    assert_lossless(base, spec, f"{spec_name} on {prompt!r}")


@pytest.mark.parametrize("spec_name", ["ngram-mod", "ngram-simple", "draft-simple"])
def test_each_speculator_really_drafted(servers, spec_name: str) -> None:
    """The equality above proves something only if drafts were verified: each speculator drafted and had
    drafts accepted on the repetitive code prompt."""
    out = servers[spec_name].completion(PROMPTS["code-classes"], N_PREDICT, timeout=TIMEOUT_S, **GREEDY)
    assert out["timings"]["draft_n"] > 0, f"{spec_name} drafted nothing"
    assert 0 < out["timings"]["draft_n_accepted"] <= out["timings"]["draft_n"]
    assert spec_counter(servers[spec_name], "num_accepted_tokens") > 0
    assert all(s["speculative"] for s in servers[spec_name].slots())


MTP_PROMPTS = [[1, 5, 6, 7], [1, 20, 12, 3, 9], [1, 30]]  # ids of the synthetic 32-token vocabulary


def test_draft_mtp_on_a_full_precision_nextn_model_equals_the_baseline(engine, tmp_path) -> None:
    model = tiny_glm4moe_mtp(tmp_path / "glm-mtp-f32.gguf")  # every tensor F32 (general.file_type 0)
    specs = {"off": Speculator("none"), "mtp": Speculator("mtp", ("draft-mtp",))}
    with serving(engine, model, specs, tmp_path) as clients:
        for prompt in MTP_PROMPTS:
            base = Greedy.from_native(clients["off"].completion(prompt, N_PREDICT, timeout=TIMEOUT_S,
                                                                return_tokens=True, n_probs=2, **GREEDY))
            spec = Greedy.from_native(clients["mtp"].completion(prompt, N_PREDICT, timeout=TIMEOUT_S,
                                                                return_tokens=True, **GREEDY))
            assert len(base.tokens) == N_PREDICT and "draft_n" not in base.timings
            assert spec.timings["draft_n"] > 0 and spec.timings["draft_n_accepted"] > 0
            assert_lossless(base, spec, f"draft-mtp on {prompt}")
        assert all(s["speculative"] for s in clients["mtp"].slots())


# ----------------------------------------------------------------- end to end: up and the daemon

def openai_greedy(client: openai.OpenAI, model: str, prompt: str) -> Greedy:
    """One request as a user's OpenAI client sends it; `logprobs` returns the token ids (and on the
    baseline, the top two candidates for the tie rule)."""
    resp = client.completions.create(model=model, prompt=prompt, max_tokens=N_PREDICT, logprobs=2,
                                     temperature=0, seed=0, extra_body={"top_k": 1, "ignore_eos": True},
                                     timeout=TIMEOUT_S)
    return Greedy.from_openai(resp.model_dump())


def test_the_switch_is_transparent_through_up(gemma_full_precision: Path, gemma_gguf: Path, tmp_state) -> None:
    env = dict(os.environ)
    ups = {"off": Up([str(gemma_full_precision), "--spec", "off", "--ctx", "2048", "--port", str(free_port())], env),
           "on": Up([str(gemma_full_precision), "--spec", f"draft:{gemma_gguf}", "--ctx", "2048",
                     "--port", str(free_port())], env)}
    try:
        fields = {name: up.wait_ready() for name, up in ups.items()}
        assert fields["on"]["speculation"].startswith("draft-simple - active"), fields["on"]["speculation"]
        out = {}
        for name, f in fields.items():
            client = openai.OpenAI(base_url=f["OpenAI base URL"], api_key="none", max_retries=0)
            out[name] = {p: openai_greedy(client, f["model"], PROMPTS[p]) for p in END_TO_END}
        for p in END_TO_END:
            assert "draft_n" not in out["off"][p].timings
            assert out["on"][p].timings["draft_n"] > 0
            assert_lossless(out["off"][p], out["on"][p], f"`up --spec draft` on {p!r}")
    finally:
        for up in ups.values():
            up.stop(2)


def test_the_switch_is_transparent_through_the_daemon(gemma_full_precision: Path, gemma_gguf: Path,
                                                      tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "gemma-f32.gguf").symlink_to(gemma_full_precision)
    # The control API reads draft files only inside the model directories (or with --allow-any-model-path).
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    daemon = DaemonProc(tmp_path, models).start()
    try:
        client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="none", max_retries=0)
        with daemon.http(timeout=TIMEOUT_S) as http:
            r = http.post("/bostudio/instances", json={"model": "gemma-f32",
                                                       "spec": f"draft:{models / gemma_gguf.name}"})
            assert r.status_code == 200, r.text
            on = {p: openai_greedy(client, "gemma-f32", PROMPTS[p]) for p in END_TO_END}
            r = http.put("/bostudio/instances/gemma-f32/speculation", json={"mode": "off"})
            assert r.status_code == 200, r.text
            off = {p: openai_greedy(client, "gemma-f32", PROMPTS[p]) for p in END_TO_END}
        for p in END_TO_END:
            assert on[p].timings["draft_n"] > 0 and "draft_n" not in off[p].timings
            assert_lossless(off[p], on[p], f"the daemon's speculation switch on {p!r}")
    finally:
        daemon.stop()


# ----------------------------------------------------------------- quantized weights: only what is portable

@pytest.fixture(scope="module")
def q4_servers(engine, gemma_gguf: Path, tmp_path_factory) -> Iterator[dict[str, LlamaClient]]:
    logs = tmp_path_factory.mktemp("q4-logs")
    specs = {"off": Speculator("none"), "ngram-mod": Speculator("ngram", ("ngram-mod",)),
             "draft-simple": Speculator("draft", ("draft-simple",), draft=gemma_gguf, n_max=8)}
    with serving(engine, gemma_gguf, specs, logs, prefix="q4-") as clients:
        yield clients


@pytest.mark.parametrize("spec_name", ["off", "ngram-mod", "draft-simple"])
def test_quantized_speculation_counters_and_state(q4_servers, spec_name: str) -> None:
    """On Q4_K_M the batched kernels differ from one CPU to the next: assert counters, state and length,
    never which token wins."""
    client = q4_servers[spec_name]
    out = client.completion(PROMPTS["code-classes"], 32, timeout=TIMEOUT_S, return_tokens=True, **GREEDY)
    assert len(out["tokens"]) == 32 and out["content"]
    slots = client.slots()
    if spec_name == "off":
        assert "draft_n" not in out["timings"]
        assert not any(s["speculative"] for s in slots)
        return
    t = out["timings"]
    assert t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"]
    assert all(s["speculative"] for s in slots)
    assert spec_counter(client, "num_draft_tokens") >= t["draft_n"]
    assert spec_counter(client, "num_accepted_tokens") >= t["draft_n_accepted"]


# ----------------------------------------------------------------- the rule itself

def g(tokens: list[int], top: list[list[tuple[int, float]]] | None = None) -> Greedy:
    return Greedy(tokens, top or [], {})


def test_the_rule_accepts_equal_outputs_and_real_ties_only() -> None:
    tie = [(7, -0.690), (9, -0.696), (3, -3.0)]
    clear = [(7, -0.40), (9, -0.75), (3, -3.0)]
    assert_lossless(g([1, 7, 4]), g([1, 7, 4]), "equal")
    assert_lossless(g([1, 7, 4], [[], tie, []]), g([1, 9, 5]), "a 0.006-nat tie")
    with pytest.raises(AssertionError, match="0.3500 nats apart"):
        assert_lossless(g([1, 7, 4], [[], clear, []]), g([1, 9, 4]), "a clear margin")
    with pytest.raises(AssertionError, match="took token 3"):  # within a tie, but not one of the two
        assert_lossless(g([1, 7, 4], [[], tie, []]), g([1, 3, 4]), "the third candidate")
    with pytest.raises(AssertionError, match="prefix"):
        assert_lossless(g([1, 7, 4]), g([1, 7]), "short")
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_full_precision_is_f32_where_the_cpu_computes_f16_in_half_precision(tmp_path: Path) -> None:
    from tests.conftest import full_precision_type

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_fp16 amx_tile\n")
    assert full_precision_type(info) == "F32"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")  # AVX-512 EPYC: F32 sums
    assert full_precision_type(info) == "F16"
    info.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm fphp asimdhp cpuid\n")  # ARM FP16 vectors
    assert full_precision_type(info) == "F32"
    assert full_precision_type(tmp_path / "missing") == "F16"

