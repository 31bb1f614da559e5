"""The runaway guard (bostudio/daemon/http/loopguard.py): the loop rule over text, table-driven, and the stream
transform per dialect on recorded llama-server streams (tests/data/rescue_streams.json, read by the official
client libraries as in tests/test_toolrescue.py)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from bostudio.daemon.http.loopguard import CHECK_EVERY, LOOP_CHARS, MAX_PERIOD, MIN_REPEATS, find_loop, guard


def unit_of(p: int) -> str:
    """A unit of exactly period p (no shorter period): distinct-ish characters from a fixed seed."""
    rng = random.Random(p)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz(){}=;: \n") for _ in range(p - 1)) + "#"


def looped(p: int, chars: int, lead: str = "def main():\n    x = 1\n") -> str:
    u = unit_of(p)
    return lead + (u * (chars // p + 1))[:chars]


CODE = "".join(f"def f{i}(x):\n    return x * {i} + {i * i} - len(str(x))  # case {i}\n\n" for i in range(200))
STEPS = "".join(f"step {i}\n" for i in range(1, 1200))


@pytest.mark.parametrize("p", [1, 37, MAX_PERIOD])
def test_an_exact_loop_of_4096_characters_fires(p: int) -> None:
    text = looped(p, LOOP_CHARS)
    loop = find_loop(text)
    assert loop is not None and loop.period == p and loop.unit == text[-p:]
    assert loop.chars == LOOP_CHARS


@pytest.mark.parametrize("text, why", [
    (looped(37, 4000), "4000 characters of loop"),
    (looped(MAX_PERIOD + 1, 3 * LOOP_CHARS), "a period of 513"),
    (CODE, "long code that does not repeat"),
    (STEPS, "counting lines: step 1, step 2, ..."),
    (looped(MAX_PERIOD, 7 * MAX_PERIOD), "7 periods"),
    ("", "nothing"),
])
def test_what_does_not_fire(text: str, why: str) -> None:
    assert find_loop(text) is None, why


def test_fewer_than_min_repeats_periods_never_fire_even_past_the_length() -> None:
    # With the shipped constants the length implies 8 periods; with a shorter length the count still holds.
    seven = looped(100, 7 * 100, lead="")
    assert find_loop(seven, min_chars=500) is None
    assert find_loop(looped(100, 8 * 100, lead=""), min_chars=500) == find_loop(looped(100, 8 * 100, lead=""),
                                                                               min_chars=800)
    assert find_loop(looped(100, 8 * 100, lead=""), min_chars=500) is not None
    assert MIN_REPEATS * MAX_PERIOD <= LOOP_CHARS


def test_the_shortest_period_and_the_whole_periodic_tail_are_reported() -> None:
    text = "intro\n" + "ab" * 3000
    loop = find_loop(text)
    assert loop is not None and loop.period == 2 and loop.unit == "ab" and loop.chars == 6000
