"""What a GGUF file's name says, by the conventions people name them with: the quant tag and the model stem
(without .gguf and the split suffix). Names only: nothing is read from the file."""

from __future__ import annotations

import re
from pathlib import Path

from bostudio.gguf.split import SPLIT_RE

# A quant tag in a file name: Q4_K_M, IQ2_XXS, UD-Q4_K_XL, F16, BF16, MXFP4_MOE, TQ1_0 ...
_QUANT_RE = re.compile(
    r"(?:^|[-_./])((?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?|TQ[12]_0))(?=[-.]|$)",
    re.IGNORECASE)


def quant_tag(filename: str) -> str | None:
    """The quant tag in a GGUF file name, upper-cased (`gemma-3-270m-q4_k_m.gguf` -> `Q4_K_M`), or None."""
    stem = filename[:-5] if filename.lower().endswith(".gguf") else filename
    m = SPLIT_RE.match(filename)
    if m:
        stem = m["prefix"]
    tags = _QUANT_RE.findall(stem)
    return tags[-1].upper() if tags else None


def model_stem(filename: str) -> str:
    """A file name without .gguf and without a split suffix (-00001-of-00003)."""
    m = SPLIT_RE.match(filename)
    if m:
        return Path(m["prefix"]).name
    return filename[:-5] if filename.lower().endswith(".gguf") else filename
