"""What the screens show, as plain functions of the daemon's JSON: sizes, safe text, the break-even check,
per-request series from cumulative stats. No Textual here, so these are tested without a terminal."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rich.text import Text

from bostudio.display import escape_untrusted, human_bytes

# Speculation pays when a target forward commits more tokens than drafting and verifying cost. The
# verify batch and the drafting add roughly a tenth of a forward on these machines, so a mean accepted
# length under 1.1 tokens per forward is a loss. An estimate: `bostudio bench` measures the real one.
BREAK_EVEN_ACCEPT_LEN = 1.1
HISTORY = 60  # points per sparkline


def safe(value: object) -> str:
    """Untrusted text (model names, metadata, log lines) as Rich markup that shows it literally:
    markup escaped, control characters (terminal escapes, bidi overrides) shown as \\xNN."""
    return escape_untrusted(str(value))


def markup(text: str) -> Text:
    """Markup built with `safe()` pieces, parsed by Rich (whose escapes `safe` writes), so Textual's own
    markup parser never sees untrusted text."""
    return Text.from_markup(text)


def plain(value: object) -> str:
    """Untrusted text for widgets that print plain text (Log): control characters shown as \\xNN."""
    return Text.from_markup(escape_untrusted(str(value))).plain


def size(n: object) -> str:
    return human_bytes(int(n)) if isinstance(n, (int, float)) else "-"


def pct(value: object) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, (int, float)) else "-"


def speculation_banner(inst: dict) -> str | None:
    """Why an instance's speculation does not pay, or None: inactive, or below break-even."""
    if inst.get("state") != "ready":
        return None
    status = inst.get("spec_status") or {}
    label = inst.get("speculation") or "off"
    if label == "off" or inst.get("spec_mode") == "off":
        return "speculation is off for this model (x switches it on)"
    if status and not status.get("active", True):
        return f"speculation INACTIVE: {status.get('detail', 'unknown reason')}"
    stats = inst.get("stats") or {}
    alen = stats.get("mean_accepted_length")
    if isinstance(alen, (int, float)) and alen < BREAK_EVEN_ACCEPT_LEN:
        return (f"speculation below break-even: {alen:.2f} tokens per target forward "
                f"(needs {BREAK_EVEN_ACCEPT_LEN}); x switches it off")
    return draft_length_line(inst)


def draft_length_line(inst: dict) -> str | None:
    """The draft length auto moved at run time, or is about to move at the next idle moment (None: neither)."""
    dl = inst.get("draft_length") or {}
    advice = dl.get("advice") or {}
    if advice.get("action") in ("shorter", "longer"):
        return f"drafts of {dl.get('n_max')} tokens, {advice['n_max']} at the next idle moment: {advice.get('detail', '')}"
    if dl.get("adapted"):
        return f"drafts of {dl.get('n_max')} tokens (auto, at run time): {dl.get('reason', '')}"
    return None


@dataclass
class Series:
    """Per-request points for the sparklines, from the cumulative stats the daemon publishes."""

    tok_s: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    acceptance: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    accept_len: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    _requests: int = 0
    _tokens: int = 0
    _drafted: int = 0
    _accepted: int = 0

    def add(self, stats: dict) -> bool:
        """Take a stats snapshot; True when it brought a new request (a new point)."""
        requests, tokens = int(stats.get("requests") or 0), int(stats.get("tokens_generated") or 0)
        drafted, accepted = int(stats.get("draft_tokens") or 0), int(stats.get("draft_accepted") or 0)
        if requests < self._requests or tokens < self._tokens:  # a relaunch resets the counters
            self._requests = self._tokens = self._drafted = self._accepted = 0
        if tokens == self._tokens:  # no request finished since the last snapshot (timings land at the end)
            self._requests = requests
            return False
        if isinstance(stats.get("decode_tok_s"), (int, float)):
            self.tok_s.append(float(stats["decode_tok_s"]))
        if drafted > self._drafted:  # acceptance of the drafts since the last snapshot
            self.acceptance.append((accepted - self._accepted) / (drafted - self._drafted))
        if isinstance(stats.get("mean_accepted_length"), (int, float)):
            self.accept_len.append(float(stats["mean_accepted_length"]))
        self._requests, self._tokens, self._drafted, self._accepted = requests, tokens, drafted, accepted
        return True
