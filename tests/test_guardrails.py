"""Per-backend guardrails: the shipped table is valid, each rule matches what it names (and nothing else),
the pairing choice passes over or refuses what a rule forbids, `pair` explains it, the user can override."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bostudio.engine.discover import KNOWN_SPEC_TYPES
from bostudio.errors import ConfigError
from bostudio.gguf import describe
from bostudio.pairing.core.guardrails import GuardrailContext, load_allowed, load_guardrails, parse_guardrails
from bostudio.pairing.core.select import select
from bostudio.pairing.core.table import PairingTable, load_table_file, shipped_table_path
from bostudio.speculation import SpecRequest, Speculator
from bostudio.gguf.synth import tiny_glm4moe_mtp

DATA = Path(__file__).parent / "data" / "guardrails"
RULES = load_guardrails()
BY_ID = {r.id: r for r in RULES}
SHIPPED = load_table_file(shipped_table_path())
MTP = Speculator("mtp", ("draft-mtp",), n_max=3)
NGRAM = Speculator("ngram", ("ngram-mod",))


def test_shipped_table_is_valid_and_every_rule_cites_llama_cpp() -> None:
    assert len(RULES) >= 3
    assert len({r.id for r in RULES}) == len(RULES)
    for r in RULES:
        assert r.llama_cpp > 0 and r.reference == f"llama.cpp #{r.llama_cpp}"
        assert r.what and r.spec_types and r.backends
    assert {r.llama_cpp for r in RULES} >= {23203, 25972, 28626}


@pytest.mark.parametrize("name, message", [
    ("unknown_key", "unknown key `why`"),
    ("missing_number", "missing `llama_cpp`"),
    ("number_not_int", "must be the issue or PR number"),
    ("unknown_backend", "unknown backend 'syc1'"),
    ("unknown_spec_type", "unknown spec type 'draft-mtpp'"),
    ("duplicate_id", "appears twice"),
    ("wrong_version", "version must be 1"),
    ("bad_syntax", "cannot read the guardrail table"),
    ("bad_build", "`up_to_build` must be a llama.cpp build number"),
])
def test_bad_tables_are_refused_with_the_file_and_the_problem(name: str, message: str) -> None:
    path = DATA / f"{name}.toml"
    with pytest.raises(ConfigError) as err:
        parse_guardrails(path.read_text(encoding="utf-8"), path)
    assert message in err.value.message and str(path) in err.value.message


# (rule, speculator, architecture, is_mla, backends, engine build, matches)
CASES = [
    ("sycl-draft-mtp-memory", MTP, "qwen35", False, ("cpu", "sycl"), 0, True),
    ("sycl-draft-mtp-memory", MTP, "qwen35", False, ("cpu", "cuda"), 0, False),
    ("sycl-draft-mtp-memory", NGRAM, "qwen35", False, ("cpu", "sycl"), 0, False),
    ("openvino-mtp-crash", MTP, "glm4moe", False, ("cpu", "openvino"), 0, True),
    ("openvino-mtp-crash", MTP, "glm4moe", False, ("cpu", "sycl"), 0, False),
    ("mtp-full-kv-deepseek2-glm4moe-cohere2moe", MTP, "deepseek2", True, ("cpu",), 10820, True),
    ("mtp-full-kv-deepseek2-glm4moe-cohere2moe", MTP, "glm4moe", False, ("cpu", "cuda"), 9000, True),
    ("mtp-full-kv-deepseek2-glm4moe-cohere2moe", MTP, "qwen35", False, ("cpu",), 9000, False),
    # newer builds (and the pinned source, whose build number is unknown) keep only the NextN layers
    ("mtp-full-kv-deepseek2-glm4moe-cohere2moe", MTP, "deepseek2", True, ("cpu",), 10821, False),
    ("mtp-full-kv-deepseek2-glm4moe-cohere2moe", MTP, "deepseek2", True, ("cpu",), 0, False),
]


@pytest.mark.parametrize("rule_id, sp, arch, mla, backends, build, expected", CASES)
def test_each_rule_matches_what_it_names(rule_id, sp, arch, mla, backends, build, expected) -> None:
    assert BY_ID[rule_id].matches(sp, arch, mla, backends, build) is expected


def test_every_shipped_rule_has_a_case() -> None:
    assert {c[0] for c in CASES if c[-1]} == set(BY_ID)


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory):
    return describe(tiny_glm4moe_mtp(tmp_path_factory.mktemp("g") / "glm-mtp.gguf"))


@pytest.mark.parametrize("rule_id, backends, build", [
    ("sycl-draft-mtp-memory", ("cpu", "sycl"), 0),
    ("openvino-mtp-crash", ("cpu", "openvino"), 0),
    ("mtp-full-kv-deepseek2-glm4moe-cohere2moe", ("cpu",), 10000),
])
def test_auto_passes_over_a_forbidden_candidate_and_says_why(mtp_target, rule_id, backends, build) -> None:
    guard = GuardrailContext(RULES, backends, engine_build=build)
    sel = select(mtp_target, SHIPPED, SpecRequest("auto"), engine_spec_types=KNOWN_SPEC_TYPES, guard=guard)
    assert sel.speculator.spec_types == ("ngram-mod",)  # the next usable candidate
    mtp = next(c for c in sel.considered if c.speculator and c.speculator.kind == "mtp")
    assert not mtp.usable and f"llama.cpp #{BY_ID[rule_id].llama_cpp}" in mtp.why and rule_id in mtp.why
    # an explicit request is refused with the way to override it
    with pytest.raises(ConfigError) as err:
        select(mtp_target, SHIPPED, SpecRequest("mtp"), engine_spec_types=KNOWN_SPEC_TYPES, guard=guard)
    assert f"#{BY_ID[rule_id].llama_cpp}" in err.value.message and rule_id in err.value.hint
    # overridden: the MTP head is chosen again
    allowed = replace(guard, allowed=frozenset({rule_id}))
    sel = select(mtp_target, SHIPPED, SpecRequest("auto"), engine_spec_types=KNOWN_SPEC_TYPES, guard=allowed)
    assert sel.speculator.kind == "mtp"


def test_the_cpu_backend_keeps_the_mtp_head(mtp_target) -> None:
    sel = select(mtp_target, SHIPPED, SpecRequest("auto"), engine_spec_types=KNOWN_SPEC_TYPES,
                 guard=GuardrailContext(RULES, ("cpu",)))
    assert sel.speculator.kind == "mtp"


def test_allow_list_from_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    assert load_allowed(cfg) == frozenset()
    cfg.write_text('[guardrails]\nallow = ["sycl-draft-mtp-memory"]\n', encoding="utf-8")
    assert load_allowed(cfg) == {"sycl-draft-mtp-memory"}
    cfg.write_text('[guardrails]\nalow = ["x"]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown key `alow`"):
        load_allowed(cfg)


def test_pair_explains_a_rule_for_a_sycl_plan(tmp_path: Path, mtp_target) -> None:
    """`bostudio pair` on a machine whose devices run SYCL: the rule, its issue number and the override."""
    from bostudio.engine.discover import Engine
    from bostudio.hardware.device import Device
    from bostudio.pairing.edge.pair import choose

    engine = Engine(path=Path("/nonexistent/llama-server"), source="path", spec_types=KNOWN_SPEC_TYPES)
    sycl = (Device(vendor="intel", backend="sycl", name="Arc A770", index=0, total_bytes=16 << 30,
                   free_bytes=16 << 30, engine_name="SYCL0"),)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        sel, _ = choose(mtp_target, SpecRequest("auto"), engine, 1024, table=PairingTable(), devices=sycl)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert sel.speculator.kind != "mtp"
    why = " ".join(c.why for c in sel.considered)
    assert "llama.cpp #23203" in why and "[guardrails]" in why
