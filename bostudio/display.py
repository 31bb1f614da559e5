"""Showing untrusted text, sizes and progress to people.

Strings from a GGUF (names, licenses, chat templates) come from whoever made the file. Before they reach a
terminal or a Rich/Textual widget, `escape_untrusted` makes control characters (ANSI escape sequences, bidi
overrides, zero-width characters) visible as escapes and neutralises Rich markup, so a file can neither
drive the terminal nor style or hide text.
"""

from __future__ import annotations

import re
import sys
import time
import unicodedata
from typing import Callable, TextIO

# The same pattern rich.markup.escape uses: a backslash before "[" that would open a tag.
_RICH_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_untrusted(text: str, *, multiline: bool = False) -> str:
    """`text` made safe to print: control/format characters as \\xNN escapes, backslashes doubled, Rich
    markup escaped. With `multiline`, newlines and tabs are kept (for chat templates)."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif multiline and ch in "\n\t":
            out.append(ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(_escape_char(ch))
        else:
            out.append(ch)
    return _RICH_TAG.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", "".join(out))


def escape_terminal(text: str) -> str:
    """Plain text for a terminal (no Rich): control and format characters of `text` as \\xNN escapes,
    newlines and tabs kept. For lines that mix our own layout with file names (plan, pair)."""
    return "".join(_escape_char(ch) if ch not in "\n\t" and unicodedata.category(ch) in
                   ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") else ch for ch in text)


def terminal_print(*parts: object, **kw) -> None:
    """print() with every part through escape_terminal."""
    print(*(escape_terminal(str(p)) for p in parts), **kw)


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; binary units, as llama.cpp prints them."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class Progress:
    """A progress line on a terminal, a line every 5% elsewhere (logs, CI): `label: pct% (done/total) time,
    about N min left`, the counts shown by `count` (str for steps, human_bytes for bytes)."""

    def __init__(self, label: str, out: TextIO | None = None, count: Callable[[int], str] = str) -> None:
        self.label = label
        self.out = out if out is not None else sys.stderr
        self.count = count
        self.tty = self.out.isatty()
        self.last_pct = -5
        self.start = time.monotonic()

    def update(self, done: int, total: int, what: str = "") -> None:
        pct = int(100 * done / max(total, 1))
        elapsed = time.monotonic() - self.start
        eta = ""
        if pct >= 5 and pct < 100:  # before that, the estimate is noise
            left = elapsed * (total - done) / done
            eta = f", about {int(left) + 1} s left" if left < 60 else f", about {int(left / 60) + 1} min left"
        line = f"{self.label}: {pct:3d}% ({self.count(done)}/{self.count(total)}) {int(elapsed)}s{eta}"
        if self.tty:
            bar = "#" * (pct // 4) + "." * (25 - pct // 4)
            self.out.write(f"\r[{bar}] {line} {what[:30]:30s}")
            self.out.flush()
        elif pct >= self.last_pct + 5 or done == total:
            self.last_pct = pct
            self.out.write(line + "\n")
            self.out.flush()

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def human_duration(seconds: float) -> str:
    """45.2 -> '45s', 85 -> '1m25s', 3720 -> '1h02m' (rounded to whole seconds, minutes past an hour)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    m = round(s / 60)
    return f"{m // 60}h{m % 60:02d}m"


def prefill_line(p: dict) -> str:
    """One prompt in progress (the daemon's instances[].prefill[]) for people:
    'prefill 4,096/11,712 tokens (35%), a batch of 2,048 running, 48 tok/s, ~2m39s left'."""
    total, done, cached = p.get("total"), int(p.get("done") or 0), int(p.get("cached") or 0)
    of = f", {cached:,} from cache" if cached else ""
    if total:
        head = f"prefill {done:,}/{total:,} tokens ({100 * done / total:.0f}%{of})"
    else:
        head = f"prefill {done:,} tokens so far (total unknown{of})"
    if p.get("in_batch"):  # a batch is being decoded: what a CPU works on for minutes at 0%
        head += f", a batch of {int(p['in_batch']):,} running"
    rate, eta = p.get("rate_tok_s"), p.get("eta_s")
    if rate is None:  # nothing to estimate by yet: at least show that it is working, and for how long
        elapsed = f", {human_duration(p['elapsed_s'])} so far" if p.get("elapsed_s") is not None else ""
        return f"{head}{elapsed}, time left known after its first batch"
    head += f", {rate:.0f} tok/s" + (" (the last prompt's rate)" if p.get("rate_source") == "last request" else "")
    if eta is None:
        return head
    return f"{head}, " + (f"~{human_duration(eta)} left" if eta >= 1 else "~0s left (slower than estimated)")
