"""Fuzzing the reader: thousands of mutated and truncated GGUFs per run.

Each must either parse (and describe) or raise GGUFFormatError: no other exception, no allocation beyond a
small bound, and no read beyond the file (the reader is lazy and bounded: it never asks for more than a
file holds, whatever a count or length in it claims). The seed changes every run and is printed on failure;
set GGUF_FUZZ_SEED to replay one. Speed is not asserted here (it depends on the machine):
benchmarks/bench_describe.py measures it; a hang would still end the run at pytest's timeout.
"""

from __future__ import annotations

import os
import random
import time
import tracemalloc

import pytest

from bostudio.errors import GGUFFormatError
from bostudio.gguf import BytesSource, describe_header, parse_header
from bostudio.gguf.synth import dense_layers, write_model

CASES = 2000
MAX_ALLOC = 1024 * 1024  # bytes allocated while reading one 8 KB file
TRACE_EVERY = 4


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "base.gguf"
    tensors: dict = {"token_embd.weight": (8, 40), **dense_layers(2, 8, 2, 1, 4, 16)}
    tensors["blk.1.ffn_up.weight"] = ((32, 2), "Q8_0")
    kv = {".context_length": 128, ".embedding_length": 8, ".block_count": 2, ".feed_forward_length": [16, 16],
          ".attention.head_count": 2, ".attention.head_count_kv": [1, 1], ".attention.sliding_window": 16,
          ".rope.freq_base": 10000.0, "general.name": "fuzz base"}
    vocab = [f"t{i}" for i in range(40)]
    write_model(path, "gemma2", kv, tensors, vocab=vocab, chat_template="{{ messages }}")
    return path.read_bytes()


class CountingSource(BytesSource):
    """A BytesSource that counts the bytes it hands out."""

    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(data, name)
        self.bytes_read = 0

    def read(self, offset: int, n: int) -> bytes:
        got = super().read(offset, n)
        self.bytes_read += len(got)
        return got


def _mutate(rng: random.Random, data: bytes, header_end: int) -> bytes:
    buf = bytearray(data)
    op = rng.randrange(6)
    if op == 0:  # truncate anywhere in the header or just after it
        return bytes(buf[:rng.randrange(header_end + 64)])
    pos = rng.randrange(header_end)
    if op == 1:  # flip a few bytes
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(header_end)] ^= 1 << rng.randrange(8)
    elif op == 2:  # an extreme 8-byte value where a length/count/offset might be
        extreme = rng.choice([2**64 - 1, 2**63, 2**63 - 1, 2**32, 2**32 - 1, 0, 1, rng.getrandbits(64)])
        buf[pos:pos + 8] = extreme.to_bytes(8, "little")
    elif op == 3:  # an extreme 4-byte value (types, dims, counts)
        buf[pos:pos + 4] = rng.choice([0, 9, 12, 13, 255, 2**31, 2**32 - 1]).to_bytes(4, "little")
    elif op == 4:  # delete a chunk
        del buf[pos:pos + rng.randint(1, 64)]
    else:  # duplicate a chunk
        n = rng.randint(1, 64)
        buf[pos:pos] = buf[pos:pos + n]
    return bytes(buf)


def test_fuzzed_files_fail_only_with_the_typed_error(base: bytes) -> None:
    seed = int(os.environ.get("GGUF_FUZZ_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    header_end = parse_header(BytesSource(base)).data_offsets[0]
    outcomes = {"ok": 0, "refused": 0}
    for i in range(CASES):
        data = _mutate(rng, base, header_end)
        traced = i % TRACE_EVERY == 0  # tracemalloc slows parsing ~7x: measure every 4th case
        if traced:
            tracemalloc.start()
        src = CountingSource(data, name=f"case-{i}")
        try:
            describe_header(parse_header(src))
            outcomes["ok"] += 1
        except GGUFFormatError as exc:
            assert f"case-{i}" in exc.message, (seed, i, exc.message)
            outcomes["refused"] += 1
        except Exception as exc:  # noqa: BLE001 - any other exception is the bug this test hunts
            pytest.fail(f"seed {seed} case {i}: {type(exc).__name__}: {exc}")
        finally:
            if traced:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
        assert src.bytes_read <= len(data), f"seed {seed} case {i}: read {src.bytes_read} of {len(data)} bytes"
        if traced:
            assert peak < MAX_ALLOC, f"seed {seed} case {i}: allocated {peak:,} bytes"
    assert outcomes["ok"] + outcomes["refused"] == CASES
    # The mutations must really exercise both paths, or the test proves little.
    assert outcomes["refused"] > CASES // 4 and outcomes["ok"] > CASES // 20, (seed, outcomes)
