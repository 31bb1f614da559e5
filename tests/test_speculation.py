"""Parsing --spec and choosing the speculator: pure, table-driven."""

from __future__ import annotations

from pathlib import Path

import pytest

from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.errors import ConfigError, EngineError
from bostudio.speculation import SpecRequest, Speculator, choose_speculator, parse_spec

ALL = ("none", "draft-simple", "draft-mtp", "ngram-mod")


@pytest.mark.parametrize("value, expected", [
    ("auto", SpecRequest("auto")),
    ("off", SpecRequest("off")),
    ("none", SpecRequest("off")),
    ("ngram", SpecRequest("ngram")),
    ("mtp", SpecRequest("mtp")),
    ("draft:/m/d.gguf", SpecRequest("draft", Path("/m/d.gguf"))),
])
def test_parse_spec(value: str, expected: SpecRequest) -> None:
    assert parse_spec(value) == expected


@pytest.mark.parametrize("value", ["", "fast", "draft", "draft:", "ngram-mod", "MTP!"])
def test_parse_spec_rejects(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_spec(value)
    assert err.value.hint


@pytest.mark.parametrize("sp,expected", [
    (Speculator("none"), "off"),
    (Speculator("ngram", ("ngram-simple",),
                ngram_params=(("ngram-simple", "size_n", 6), ("ngram-simple", "size_m", 16))),
     "ngram-simple size_n=6 size_m=16"),
    (Speculator("draft", ("draft-simple",), Path("d.gguf"), n_max=3, p_min=0.5), "draft-simple n_max=3 p_min=0.5"),
    (Speculator("mtp", ("draft-mtp",), n_max=2), "draft-mtp n_max=2"),
])
def test_detail_names_the_parameters_beside_the_defaults(sp: Speculator, expected: str) -> None:
    # what bench labels auto@WORKLOAD with: two tuned n-gram configurations of one type read apart
    assert sp.detail == expected


@pytest.mark.parametrize("mode, n_nextn, types, kind", [
    ("auto", 0, ALL, ("ngram-mod",)),
    ("auto", 1, ALL, ("draft-mtp",)),
    ("auto", 1, ("none", "ngram-mod"), ("ngram-mod",)),  # an engine without MTP support
    ("ngram", 1, ALL, ("ngram-mod",)),
    ("mtp", 1, ALL, ("draft-mtp",)),
    ("off", 1, ALL, ()),
])
def test_choose(mode: str, n_nextn: int, types: tuple[str, ...], kind: tuple[str, ...]) -> None:
    sp = choose_speculator(SpecRequest(mode), n_nextn=n_nextn, engine_spec_types=types)
    assert sp.spec_types == kind
    assert sp.reason


def test_choose_refuses_what_cannot_run() -> None:
    with pytest.raises(ConfigError, match="MTP"):
        choose_speculator(SpecRequest("mtp"), n_nextn=0, engine_spec_types=ALL)
    with pytest.raises(EngineError, match="draft-simple"):
        choose_speculator(SpecRequest("draft", Path("d.gguf")), n_nextn=0, engine_spec_types=("none",))


def test_argv_refuses_flags_the_engine_lacks() -> None:
    old_flags = frozenset({"-m", "--alias", "--host", "--port", "-c", "--metrics", "--spec-type", "-md"})
    sp = choose_speculator(SpecRequest("draft", Path("d.gguf")), n_nextn=0, engine_spec_types=ALL)
    with pytest.raises(EngineError, match="--spec-draft-n-max"):
        build_argv(Path("/old/llama-server"), old_flags, LaunchSpec(Path("m.gguf"), "m", 8080, speculator=sp))
