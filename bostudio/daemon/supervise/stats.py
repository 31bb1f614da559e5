"""Live per-instance statistics from response `timings` and llama-server's /metrics (pure parsing)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

MIN_RATE_PROMPT = 256  # prompt tokens below which a prefill rate is mostly overhead, no guide for a long prompt


def timings_from_body(body: bytes) -> dict | None:
    """`timings` of a non-streamed completion body, if any."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    t = data.get("timings") if isinstance(data, dict) else None
    return t if isinstance(t, dict) else None


def timings_from_sse(chunk: bytes) -> dict | None:
    """`timings` from the SSE events in a streamed chunk (llama-server puts them on the last one)."""
    if b'"timings"' not in chunk:
        return None
    for line in chunk.split(b"\n"):
        if line.startswith(b"data:") and b'"timings"' in line:
            found = timings_from_body(line[5:].strip())
            if found is not None:
                return found
    return None


@dataclass
class InstanceStats:
    requests: int = 0
    errors: int = 0
    tokens_generated: int = 0
    decode_tok_s: float | None = None  # last request's decode speed
    decode_tok_s_avg: float | None = None  # over all requests with timings
    prompt_tok_s: float | None = None
    draft_tokens: int = 0
    draft_accepted: int = 0
    acceptance_rate: float | None = None  # accepted / drafted
    mean_accepted_length: float | None = None  # 1 + accepted / drafts (from /metrics)
    tool_calls_rescued: int = 0  # answers written as a fenced JSON call, sent as calls (toolrescue.py)
    tool_calls_forced: int = 0  # answers that tried a call in a broken form, asked again with it forced
    runaways_stopped: int = 0  # streamed answers stopped in an exact loop, ended as the output limit (loopguard.py)
    context_trims: int = 0  # requests over the context sent with earlier turns shortened (http/overflow.py)
    last_prefill: dict | None = None  # the last request's prompt: total, cached, processed, seconds, rate
    long_prefill_tok_s: float | None = None  # the rate of the last prompt of MIN_RATE_PROMPT tokens or more
    _decode_ms: float = 0.0
    _decode_n: int = 0
    _rate_from_metrics: bool = False  # the child's /metrics counts every draft: it wins over the sum of timings

    def add_timings(self, t: dict) -> None:
        n = int(t.get("predicted_n") or 0)
        ms = float(t.get("predicted_ms") or 0.0)
        self.tokens_generated += n
        if t.get("predicted_per_second"):
            self.decode_tok_s = float(t["predicted_per_second"])
        if t.get("prompt_per_second"):
            self.prompt_tok_s = float(t["prompt_per_second"])
        if isinstance(t.get("prompt_n"), int):
            cached, processed = int(t.get("cache_n") or 0), int(t["prompt_n"])
            self.last_prefill = {"total": cached + processed, "cached": cached, "processed": processed,
                                 "seconds": float(t.get("prompt_ms") or 0.0) / 1000.0,
                                 "rate_tok_s": float(t["prompt_per_second"]) if t.get("prompt_per_second") else None}
            if processed >= MIN_RATE_PROMPT and self.last_prefill["rate_tok_s"]:
                self.long_prefill_tok_s = self.last_prefill["rate_tok_s"]
        if n > 1 and ms > 0:
            self._decode_n += n - 1  # the first token comes free with the prompt (reference 2.3)
            self._decode_ms += ms
            self.decode_tok_s_avg = 1000.0 * self._decode_n / self._decode_ms
        self.draft_tokens += int(t.get("draft_n") or 0)
        self.draft_accepted += int(t.get("draft_n_accepted") or 0)
        if self.draft_tokens and not self._rate_from_metrics:
            self.acceptance_rate = self.draft_accepted / self.draft_tokens

    def add_metrics(self, m: dict[str, float]) -> None:
        drafts = m.get("spec_decode_num_drafts_total", 0.0)
        if drafts > 0:
            self.mean_accepted_length = 1.0 + m.get("spec_decode_num_accepted_tokens_total", 0.0) / drafts
        drafted = m.get("spec_decode_num_draft_tokens_total", 0.0)
        if drafted > 0:
            self.acceptance_rate = m.get("spec_decode_num_accepted_tokens_total", 0.0) / drafted
            self._rate_from_metrics = True

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}
