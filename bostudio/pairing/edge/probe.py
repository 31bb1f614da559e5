"""Tokenize a small corpus (code and prose) with a target and a draft and compare the token ids.

llama.cpp's draft-simple check compares token *texts*; two models with the same texts but a different
pre-tokenizer still split text differently, and every differing split is a draft the target rejects. This
probe loads only the vocabularies (llama-cpp-python, `vocab_only=True`, against the engine's libllama) and
reports where the ids part. It runs in a child process: a tokenizer that throws inside libllama would
otherwise take bostudio down with it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROBE_TIMEOUT_S = 120.0

PROBE_CORPUS = (
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 1024; ++i) { total += values[i] * 31; }  // 12345 67890",
    'SELECT name, COUNT(*) FROM users WHERE created_at > "2024-01-01" GROUP BY name;',
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.",
    "In 1969, 3 astronauts flew 384,400 km to the Moon; the trip took about 76 hours.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. 東京は日本の首都です。",
)


@dataclass(frozen=True)
class ProbeResult:
    texts: int
    differing: int  # texts whose ids differ
    first: str = ""  # the first difference, in words
    error: str = ""  # the probe could not run

    @property
    def ok(self) -> bool:
        return not self.error and self.differing == 0

    def to_json(self) -> dict:
        return {"texts": self.texts, "differing": self.differing, "first": self.first, "error": self.error}


def compare_ids(target_ids: list[list[int]], draft_ids: list[list[int]],
                corpus: tuple[str, ...] = PROBE_CORPUS) -> ProbeResult:
    """Compare per-text token ids (pure)."""
    differing = 0
    first = ""
    for n, (text, a, b) in enumerate(zip(corpus, target_ids, draft_ids)):
        if a == b:
            continue
        differing += 1
        if not first:
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first = (f"text {n + 1} ({text[:24]!r}...) splits differently from token {i}: target "
                     f"{a[i:i + 4]}, draft {b[i:i + 4]} ({len(a)} vs {len(b)} tokens in all)")
    return ProbeResult(len(corpus), differing, first)


def tokenize_corpus(path: Path, corpus: tuple[str, ...] = PROBE_CORPUS) -> list[list[int]]:
    """Token ids of each corpus text, without BOS, using only the model's vocabulary (in this process)."""
    from bostudio.engine.bindings import load_bindings

    load_bindings()
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        return [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in corpus]
    finally:
        llm.close()


def probe_tokenization(target: Path, draft: Path, timeout: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Run the probe in a child interpreter; a failure becomes ProbeResult.error, never an exception."""
    try:
        proc = subprocess.run([sys.executable, "-m", "bostudio.pairing.edge.probe", str(target), str(draft)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ProbeResult(len(PROBE_CORPUS), 0, error=f"the tokenization probe took over {timeout:.0f} s")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return ProbeResult(len(PROBE_CORPUS), 0, error=f"the tokenization probe failed: {last}")
    ids = json.loads(proc.stdout)
    return compare_ids(ids["target"], ids["draft"])


def _main(argv: list[str]) -> int:
    target, draft = (Path(a) for a in argv)
    json.dump({"target": tokenize_corpus(target), "draft": tokenize_corpus(draft)}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
