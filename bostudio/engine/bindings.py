"""The llama-cpp-python bindings, loaded against the engine's own libllama.

scripts/setup.sh installs llama-cpp-python without a native build (CMAKE_ARGS=-DLLAMA_BUILD=OFF),
so llama.cpp is compiled once: the engine build produces libllama.so beside llama-server, and the
bindings find it through LLAMA_CPP_LIB_PATH, which must be set before `llama_cpp` is imported.
"""

from __future__ import annotations

import os
from types import ModuleType

from bostudio.engine.build import built_engines, is_current_default
from bostudio.errors import EngineError


def load_bindings() -> ModuleType:
    """Import `llama_cpp`, pointing it at a built engine's libraries unless the user chose others."""
    if not os.environ.get("LLAMA_CPP_LIB_PATH"):
        # The default build first, as `engine list` ranks it (a portable variant or an older build after).
        for eng in sorted(built_engines(), key=lambda e: not is_current_default(e)):
            if (eng.bin_dir / "libllama.so").exists() or (eng.bin_dir / "libllama.dylib").exists():
                os.environ["LLAMA_CPP_LIB_PATH"] = str(eng.bin_dir)
                break
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError, FileNotFoundError) as exc:
        raise EngineError(f"the llama-cpp-python bindings could not load libllama: {exc}",
                          "run `bostudio engine build` (it builds the library the bindings use)") from exc
    return llama_cpp
