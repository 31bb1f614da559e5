"""One compile serves both: the bindings run on the engine's libllama (no second llama.cpp build)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bostudio.engine.discover import Engine

SCRIPT = """
import json, os, sys
from bostudio.engine.bindings import load_bindings
llama_cpp = load_bindings()
from llama_cpp import Llama
m = Llama(sys.argv[1], vocab_only=True, verbose=False)
print(json.dumps({"lib": os.environ["LLAMA_CPP_LIB_PATH"], "n_vocab": m.n_vocab(),
                  "ids": m.tokenize(b"def add(a, b):", add_bos=False)}))
"""


def test_bindings_load_the_engine_library(engine: Engine, gemma_gguf: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(gemma_gguf)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(data["lib"]) == engine.path.parent
    assert data["n_vocab"] == 262144
    assert len(data["ids"]) >= 4
