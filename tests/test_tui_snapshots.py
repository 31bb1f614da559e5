"""SVG snapshots of every TUI screen at 80x24 and 120x40, on fixed data (tests/tui_fixtures.py) so that the
pictures do not depend on this machine. The catalog holds a model whose name and metadata carry Rich markup
and terminal escapes: the snapshots show them as literal, escaped text. Update with --snapshot-update."""

from __future__ import annotations

import pytest

from bostudio.tui.app import BostudioApp
from tests import tui_fixtures as fx

SIZES = [(80, 24), (120, 40)]


def fixed_app() -> BostudioApp:
    app = BostudioApp(fx.FixedClient(), live=False)  # type: ignore[arg-type]
    s = app.store
    s.connected = True
    s.catalog = fx.CATALOG
    s.pairings = dict(fx.PAIRINGS)
    s.selected = "gemma-3-270m-q4_k_m"
    s.instances = {"gemma-3-270m-q4_k_m": fx.instance()}
    from bostudio.tui.format import Series

    series = Series()
    for st in fx.STATS_HISTORY:
        series.add(st)
    s.series = {"gemma-3-270m-q4_k_m": series}
    return app


def show(mode: str, fits: bool = True, hostile: bool = False, bench: bool = False, inactive: bool = False,
         prefill: bool = False):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        app = pilot.app
        if inactive or prefill:
            app.store.instances = {"gemma-3-270m-q4_k_m": fx.instance(active=not inactive, prefill=prefill)}
        await app.switch_mode(mode)
        await pilot.pause()
        screen = app.screen
        if mode == "models":
            if hostile:
                app.store.selected = fx.HOSTILE
            screen.fill()
        elif mode == "plan":
            screen.set_plan(fx.plan(fits))
        elif mode == "running":
            log = screen.query_one("#log")
            for line in fx.LOG_LINES:
                from bostudio.tui.format import plain

                log.write_line(plain(line))
            screen.refresh_view()
        elif mode == "bench" and bench:
            screen.show_result(fx.BENCH)
        await pilot.pause()
    return run_before


CASES = [("devices", {}), ("models", {}), ("models-hostile", {"hostile": True}), ("plan", {}),
         ("plan-no-fit", {"fits": False}), ("running", {}), ("running-inactive", {"inactive": True}),
         ("running-prefill", {"prefill": True}),
         ("bench-unavailable", {}), ("bench-chart", {"bench": True})]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("case, opts", CASES, ids=[c for c, _ in CASES])
def test_screen_snapshot(case: str, opts: dict, size: tuple[int, int], snap_compare,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The Bench screen's text depends on whether bostudio.bench is installed: fixed here, both ways.
    monkeypatch.setattr("bostudio.tui.screens.bench_available", lambda: case == "bench-chart")
    mode = case.split("-")[0]
    assert snap_compare(fixed_app(), terminal_size=size, run_before=show(mode, **opts))
