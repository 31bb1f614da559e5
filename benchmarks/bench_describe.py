#!/usr/bin/env python3
"""Time bostudio's describe() against gguf-py's GGUFReader on one GGUF (default: the Gemma 3 270M file).

    python -m benchmarks.bench_describe [MODEL.gguf]

One run of each, cold-ish (the file is read once first so both see a warm page cache); prints both times and
the ratio. The target is describe() at least 100x faster on the 262k-token Gemma vocabulary.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def _default_model() -> Path:
    from bostudio.paths import models_dir

    candidates = sorted(p for p in models_dir().rglob("*.gguf") if "gemma" in p.name.lower())
    if candidates:
        return candidates[0]
    from bostudio.catalog.embedded import GEMMA_270M, ensure_embedded

    return ensure_embedded(GEMMA_270M)


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else _default_model()
    with open(path, "rb") as f:  # warm the page cache for both contenders
        while f.read(1 << 24):
            pass

    from bostudio.gguf import describe

    t0 = time.perf_counter()
    info = describe(path)
    ours = time.perf_counter() - t0

    import gguf

    t0 = time.perf_counter()
    reader = gguf.GGUFReader(str(path))
    theirs = time.perf_counter() - t0

    print(f"model:               {path} ({info.architecture}, {info.tokenizer.vocab_size:,} tokens, "
          f"{len(reader.tensors)} tensors)")
    print(f"bostudio describe(): {ours * 1000:9.1f} ms")
    print(f"gguf.GGUFReader:     {theirs * 1000:9.1f} ms")
    print(f"ratio:               {theirs / ours:9.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
