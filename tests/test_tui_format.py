"""The TUI's pure pieces: per-request sparkline points from cumulative stats, the speculation banner, the
memory bar's segments, escaping."""

from __future__ import annotations

import pytest

from bostudio.planner.render import BAR_GROUPS, bar_group
from bostudio.tui.format import BREAK_EVEN_ACCEPT_LEN, Series, markup, plain, safe, speculation_banner


def test_series_takes_one_point_per_request_and_the_acceptance_of_new_drafts_only() -> None:
    s = Series()
    assert s.add({"requests": 1, "tokens_generated": 16, "decode_tok_s": 40.0, "draft_tokens": 10,
                  "draft_accepted": 5, "mean_accepted_length": 1.5})
    assert not s.add({"requests": 2, "tokens_generated": 16, "decode_tok_s": 40.0, "draft_tokens": 10,
                      "draft_accepted": 5})  # a request started; its timings are not in yet
    assert s.add({"requests": 2, "tokens_generated": 32, "decode_tok_s": 50.0, "draft_tokens": 30, "draft_accepted": 25})
    assert list(s.tok_s) == [40.0, 50.0] and list(s.acceptance) == [0.5, 1.0] and list(s.accept_len) == [1.5]
    assert s.add({"requests": 1, "tokens_generated": 8, "decode_tok_s": 45.0, "draft_tokens": 4,
                  "draft_accepted": 1})  # relaunched
    assert list(s.acceptance)[-1] == 0.25


@pytest.mark.parametrize("inst, expect", [
    ({"state": "loading"}, None),
    ({"state": "ready", "speculation": "off", "spec_mode": "off"}, "speculation is off"),
    ({"state": "ready", "speculation": "ngram-mod", "spec_status": {"active": False, "detail": "INACTIVE: vocab"}},
     "INACTIVE: vocab"),
    ({"state": "ready", "speculation": "ngram-mod", "spec_status": {"active": True},
      "stats": {"mean_accepted_length": BREAK_EVEN_ACCEPT_LEN - 0.05}}, "below break-even"),
    ({"state": "ready", "speculation": "ngram-mod", "spec_status": {"active": True},
      "stats": {"mean_accepted_length": 2.5}}, None),
])
def test_speculation_banner(inst: dict, expect: str | None) -> None:
    got = speculation_banner(inst)
    assert (got is None) if expect is None else (got is not None and expect in got)


@pytest.mark.parametrize("component, group", [
    ("weights", "weights"), ("weights (CPU repack)", "weights"), ("KV cache", "KV"), ("recurrent state", "KV"),
    ("draft weights", "draft"), ("draft weights (CPU repack)", "draft"), ("draft KV cache", "draft KV"),
    ("MTP KV cache", "draft KV"), ("compute buffer", "compute"), ("draft compute buffer", "compute"),
    ("MTP compute buffer", "compute"), ("output buffer", "compute"), ("n-gram table", "compute"),
    ("platform overhead", "compute"), ("output buffer growth when drafting", "compute")])
def test_every_planner_component_has_a_bar_segment(component: str, group: str) -> None:
    assert bar_group(component) == group and group in BAR_GROUPS


@pytest.mark.parametrize("hostile", ["[reverse]x[/reverse]", "\x1b[2J\x1b]52;c;aGk=\x07", "\x1b[31mred[/]",
                                     "a\\[b]c", "\u202eevil", "[link=file:///etc/passwd]x[/link]"])
def test_untrusted_text_shows_literally_and_never_as_a_control_character(hostile: str) -> None:
    shown = markup(f"[b]{safe(hostile)}[/b]")
    assert not any(ord(c) < 32 or c == "\u202e" for c in shown.plain)
    assert all(not span.style or str(span.style) == "bold" for span in shown.spans)  # no style from the input
    assert shown.plain == plain(hostile)


def test_a_command_s_lines_go_to_the_log_and_its_progress_bar_to_the_status_line() -> None:
    import asyncio
    import sys

    from bostudio.tui.screens import stream_process

    class Sink:  # records what the Log and the status Static are given
        def __init__(self) -> None:
            self.lines: list[str] = []

        def write_line(self, line: str) -> None:
            self.lines.append(line)

        def update(self, text) -> None:  # type: ignore[no-untyped-def]
            self.lines.append(str(text))

    code = ("import sys, time\nprint('start', flush=True)\n"
            "for p in (10, 50, 100):\n    sys.stderr.write(f'file.gguf {p}%\\r'); sys.stderr.flush(); time.sleep(0.05)\n"
            "sys.stderr.write('\\n\\x1b[2Jdone \\u00e9\\n'); sys.exit(3)")
    log, status = Sink(), Sink()
    assert asyncio.run(stream_process([sys.executable, "-c", code], log, status)) == 3  # type: ignore[arg-type]
    assert log.lines == ["start", "", "\\x1b[2Jdone \u00e9"]
    assert status.lines == ["file.gguf 10%", "file.gguf 50%", "file.gguf 100%"]
