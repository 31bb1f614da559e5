"""Parsing --spec and choosing the speculator: pure, table-driven."""

from __future__ import annotations

from pathlib import Path

import pytest

from bostudio.engine.argv import LaunchSpec, build_argv
from bostudio.errors import ConfigError, EngineError
from bostudio.speculation import SpecRequest, choose_speculator, parse_spec

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
