"""How much of a hub drafter bostudio reads before deciding to download it: the header only, by range requests.

Serves a ~42 MB synthetic DFlash drafter from the local fake hub (benchmarks/hubserver.py) under the shipped table's
ref for Qwen3.6-35B-A3B, and reads it the way `up --pull ask|always` does before offering the download.
Run: .venv/bin/python -m benchmarks.bench_drafter_header
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.hubserver import FakeHub, HubServer
from bostudio.gguf.synth import tiny_llama, write_model

REF = "abhinand/Qwen3.6-35B-A3B-DFlash-GGUF:Q8_0"
FILE = "Qwen3.6-35B-A3B-DFlash-Q8_0.gguf"


def main() -> int:
    tmp = Path(tempfile.mkdtemp())
    try:
        kv = {".block_count": 5, ".embedding_length": 1024, ".attention.head_count": 8, ".target_layers": [1, 4, 6],
              ".block_size": 16, "general.name": "big dflash"}
        tensors: dict = {"fc.weight": (3 * 64, 64)}
        for i in range(5):
            tensors[f"blk.{i}.attn_q.weight"] = (1024, 2048)
        big = write_model(tmp / "big.gguf", "dflash", kv, tensors)
        fake = FakeHub()
        fake.add_file(REF.split(":")[0], FILE, big)
        with HubServer(fake) as hub:
            os.environ.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp / "hf"), XDG_CONFIG_HOME=str(tmp / "cfg"),
                              HF_HUB_DISABLE_TELEMETRY="1")
            import huggingface_hub.constants

            huggingface_hub.constants.ENDPOINT = hub.url
            from bostudio.gguf import describe
            from bostudio.pairing.edge.fetch import remote_drafters

            target = describe(tiny_llama(tmp / "Qwen3.6-35B-A3B-Q4_K_M.gguf", n_layer=8))
            files, _, _ = remote_drafters(target, {REF: ""}, "always")
            print(f"drafter {big.stat().st_size:,} bytes; header read fetched {fake.bytes_sent(FILE):,} bytes in "
                  f"{sum(1 for r in fake.requests if r.range)} range request(s); kind {files[0].info.drafter}, "
                  f"format problem {files[0].info.drafter_format_problem or 'none'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
