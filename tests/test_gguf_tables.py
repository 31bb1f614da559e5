"""bostudio.gguf stays import-light, and its copies of ggml's tables agree with gguf-py's."""

from __future__ import annotations

import subprocess
import sys

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from bostudio.gguf.ggml_types import FILE_TYPES, GGML_TYPES


def test_gguf_package_imports_no_heavy_modules() -> None:
    code = ("import sys, bostudio.gguf; "
            "print(sorted(m for m in ('httpx', 'psutil', 'pynvml', 'subprocess', 'numpy', 'gguf') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_ggml_types_match_gguf_py() -> None:
    for t in GGMLQuantizationType:
        assert GGML_TYPES[t.value] == (t.name, *GGML_QUANT_SIZES[t]), t.name
    assert set(GGML_TYPES) - {t.value for t in GGMLQuantizationType} == {42}  # Q2_0: newer than gguf-py


def test_file_types_match_gguf_py() -> None:
    for f in LlamaFileType:
        if f.name != "GUESSED":
            assert FILE_TYPES[f.value] == f.name.removeprefix("MOSTLY_").removeprefix("ALL_"), f.name
