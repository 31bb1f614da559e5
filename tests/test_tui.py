"""The TUI against a real daemon (a `bostudio daemon` child on a temporary state dir) with the embedded
Gemma: navigate, filter, change the context, launch, see it ready with speculation, see the stats move
after a request, stop. A hostile GGUF sits in the catalog; the daemon going away gives a banner and a
reconnect. And every module outside bostudio.tui imports without textual."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from bostudio.daemon.client import AsyncDaemonClient
from bostudio.tui.app import BostudioApp
from tests.daemon_util import DaemonProc
from bostudio.gguf.synth import tiny_llama

GEMMA = "gemma-3-270m-q4_k_m"
HOSTILE = "evil-[reverse]x[blink]-\x1b[2J\x1b]0;pwned\x07"  # Rich markup and terminal escapes in a file name


async def until(pilot, cond: Callable[[], object], timeout: float = 120.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await pilot.pause(0.1)


def screen_text(app: BostudioApp) -> str:
    """What the terminal shows, as text (the SVG export's text runs, unescaped)."""
    import html
    import re

    svg = app.export_screenshot()
    return html.unescape("".join(re.findall(r"<text [^>]*>(.*?)</text>", svg, re.S))).replace("\xa0", " ")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine, gemma_gguf: Path) -> Iterator[DaemonProc]:
    root = tmp_path_factory.mktemp("tui")
    models = root / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    tiny_llama(models / f"{HOSTILE}.gguf")
    d = DaemonProc(root, models, ["--idle-ttl", "0"]).start()
    yield d
    assert d.stop() == 0
    assert not d.children()


def test_new_user_flow_filter_plan_launch_stats_stop(daemon: DaemonProc) -> None:
    async def flow() -> None:
        app = BostudioApp(AsyncDaemonClient(daemon.url, token=""))
        async with app.run_test(size=(80, 24)) as pilot:
            s = app.store
            await until(pilot, lambda: s.connected and len(s.catalog) == 2, 60, "the catalog")
            assert app.current_mode == "models"
            # the hostile name is in the catalog, shown escaped: no escape character reaches the screen
            await until(pilot, lambda: len(s.pairings) == 2, 120, "the pairings")
            await pilot.press("e", "v", "i", "l")
            table = app.screen.query_one("#models")
            await until(pilot, lambda: table.row_count == 1, 10, "the filter")
            text = screen_text(app)
            assert "[reverse]x[blink]" in text and "\\x1b[2J" in text and "\x1b" not in text
            for _ in range(4):
                await pilot.press("backspace")
            await pilot.press(*"gemma")
            await until(pilot, lambda: table.row_count == 1 and s.selected == GEMMA, 10, "gemma alone")
            assert "ngram" in screen_text(app)  # the paired speculator column and the detail pane
            await pilot.press("enter")
            await until(pilot, lambda: app.current_mode == "plan", 10, "the Plan screen")
            plan_screen = app.screen
            await until(pilot, lambda: plan_screen._plan.get("model") == GEMMA, 60, "a plan")
            first = plan_screen._plan
            assert first["fits"] and first["bars"] and first["bytes"] > 0
            await pilot.press("c", *"2048")
            await until(pilot, lambda: plan_screen._plan.get("ctx") == 2048, 60, "the plan at ctx 2048")
            assert plan_screen._plan["bytes"] < first["bytes"]  # less context, less KV cache
            assert "2048" in screen_text(app)
            await pilot.press("escape", "l")
            await until(pilot, lambda: app.current_mode == "running", 30, "the Running screen")
            await until(pilot, lambda: s.instances.get(GEMMA, {}).get("state") == "ready", 300, "ready")
            inst = s.instances[GEMMA]
            assert inst["ctx"] == 2048 and inst["speculation"] != "off"
            assert (inst.get("spec_status") or {}).get("active"), inst.get("spec_status")
            assert "acceptance" in screen_text(app)
            before = (inst.get("stats") or {}).get("requests", 0)
            client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            await asyncio.to_thread(client.completions.create, model=GEMMA, prompt="1, 2, 3, 4, 5, 6,", max_tokens=24)
            await until(pilot, lambda: (s.instances[GEMMA].get("stats") or {}).get("requests", 0) > before
                        and s.series[GEMMA].tok_s, 30, "a stats event with the request's timings")
            stats = s.instances[GEMMA]["stats"]
            assert stats["tokens_generated"] > 0 and stats["decode_tok_s"] > 0
            await until(pilot, lambda: "tok/s" in screen_text(app), 5)
            # the speculation switch relaunches without it, and the banner says so
            await pilot.press("x")
            await until(pilot, lambda: s.instances[GEMMA].get("spec_mode") == "off"
                        and s.instances[GEMMA].get("state") == "ready", 300, "the relaunch without speculation")
            assert s.instances[GEMMA]["speculation"] == "off" and s.instances[GEMMA]["loads"] == 2
            await until(pilot, lambda: "speculation is off" in screen_text(app), 10, "the banner")
            # the other screens, on the same live data
            await pilot.press("f1")
            devices = app.screen.query_one("#devices")
            await until(pilot, lambda: devices.row_count >= 1 and "host RAM" in screen_text(app), 60, "devices")
            assert "the engine the daemon uses" in screen_text(app)
            await pilot.press("b")  # this machine's backend is the cached CPU build: the build returns at once
            build_log = app.screen.query_one("#build-log")
            await until(pilot, lambda: any(line.endswith("llama-server") for line in build_log.lines), 120,
                        "the build's output")
            assert any("backend" in line for line in build_log.lines)
            await pilot.press("f5")
            from bostudio.tui.screens import bench_available

            await until(pilot, lambda: ("b runs `bostudio bench`" if bench_available() else "not available")
                        in screen_text(app).replace("\n", " "), 10, "the Bench screen")
            await pilot.press("f4", "s")
            await until(pilot, lambda: s.instances[GEMMA].get("state") == "stopped", 60, "stopped")
    asyncio.run(flow())


def test_daemon_going_away_gives_a_banner_then_reconnects(tmp_path: Path, gemma_gguf: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / gemma_gguf.name).symlink_to(gemma_gguf)
    first = DaemonProc(tmp_path, models).start()

    async def flow() -> None:
        app = BostudioApp(AsyncDaemonClient(first.url, token=""))
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.store.connected, 30, "connected")
            banner = app.screen.query_one("#banner")
            assert not banner.display
            await asyncio.to_thread(first.stop)
            await until(pilot, lambda: not app.store.connected and banner.display, 30, "the banner")
            assert "daemon unreachable" in screen_text(app)
            second = await asyncio.to_thread(DaemonProc(tmp_path, models, port=first.port).start)
            try:
                await until(pilot, lambda: app.store.connected and not banner.display, 30, "the reconnect")
                await pilot.press("f3", "f4", "f1", "f2")  # every screen still answers
                assert app.current_mode == "models"
            finally:
                await asyncio.to_thread(second.stop)
    try:
        asyncio.run(flow())
    finally:
        first.stop()


def test_pull_from_the_hub_shows_progress_and_what_to_do_on_errors(tmp_path: Path, gemma_gguf: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.hubserver import FakeHub, HubServer

    fake = FakeHub()
    fake.add_file("org/Tiny-GGUF", "Tiny-Q8_0.gguf", tiny_llama(tmp_path / "Tiny-Q8_0.gguf"))
    models = tmp_path / "models"
    models.mkdir()
    with HubServer(fake) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)  # the `bostudio pull` child reads it
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        d = DaemonProc(tmp_path, models).start()

        async def flow() -> None:
            app = BostudioApp(AsyncDaemonClient(d.url, token=""))
            async with app.run_test(size=(80, 24)) as pilot:
                await pilot.press("ctrl+o")
                await until(pilot, lambda: app.screen.__class__.__name__ == "PullScreen", 10, "the pull dialog")
                log = app.screen.query_one("#pull-log")
                await pilot.press(*"org/Missing-GGUF:Q8_0", "enter")
                await until(pilot, lambda: "pull failed" in "\n".join(log.lines), 120, "the failure")
                text = "\n".join(log.lines)
                assert "hint:" in text and "Traceback" not in text
                app.screen.query_one("#ref").value = ""
                await pilot.press(*"org/Tiny-GGUF:Q8_0", "enter")
                await until(pilot, lambda: "pulled into" in "\n".join(log.lines), 120, "the download")
                assert any(line.endswith("Tiny-Q8_0.gguf") for line in log.lines)
                await pilot.press("escape")
                await until(pilot, lambda: app.current_mode == "models" and app.screen.__class__.__name__ == "ModelsScreen", 10)
        try:
            asyncio.run(flow())
        finally:
            d.stop()


def test_no_module_outside_the_tui_loads_textual() -> None:
    code = ("import pkgutil, importlib, sys, bostudio\n"
            "names = [m.name for m in pkgutil.walk_packages(bostudio.__path__, 'bostudio.')\n"
            "         if not m.name.startswith('bostudio.tui') and m.name != 'bostudio.__main__']\n"
            "for n in names: importlib.import_module(n)\n"
            "print(len(names), ','.join(m for m in ('textual', 'textual_plotext', 'plotext') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    count, loaded = out.stdout.split()[0], out.stdout.strip().partition(" ")[2]
    assert int(count) > 40 and loaded == ""


def test_bostudio_without_arguments_opens_the_tui(monkeypatch: pytest.MonkeyPatch) -> None:
    import bostudio.tui
    from bostudio.cli import main

    calls: list[tuple] = []
    monkeypatch.setattr(bostudio.tui, "run_tui", lambda *a: calls.append(a) or 0)
    assert main([]) == 0 and calls == [(None, None, [])]
    assert main(["tui", "--port", "9999"]) == 0 and calls[-1] == (None, 9999, [])
    out = subprocess.run([sys.executable, "-m", "bostudio", "--help"], capture_output=True, text=True, timeout=60)
    assert "terminal UI" in out.stdout and "tui" in out.stdout
