"""The bostudio TUI: a client of the daemon's control API and nothing more. Every call goes through
bostudio.daemon.client.AsyncDaemonClient; live state comes from /bostudio/events (a snapshot, then
changes), consumed by one worker; every network call runs in a worker, so the screen never waits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from textual.app import App
from textual.binding import Binding

from bostudio.daemon.client import AsyncDaemonClient
from bostudio.errors import BostudioError
from bostudio.tui.format import Series, plain

RECONNECT_S = (0.5, 1.0, 2.0, 4.0)  # backoff while the daemon is away


@dataclass
class Store:
    """What the screens show, fed by the event stream and the workers' answers."""

    url: str = ""
    connected: bool = False
    problem: str = ""  # why the daemon is not reachable now
    catalog: list[dict] = field(default_factory=list)
    pairings: dict[str, dict] = field(default_factory=dict)
    instances: dict[str, dict] = field(default_factory=dict)
    series: dict[str, Series] = field(default_factory=dict)
    selected: str | None = None  # the model the Plan, Launch and Bench screens work on
    ctx: int | None = None  # None: the daemon's default for the model
    cache_type: str = "f16"
    spec: str = "auto"  # auto | on | off
    devices: dict = field(default_factory=dict)
    engines: list[dict] = field(default_factory=list)

    def apply(self, ev: dict) -> str | None:
        """Take one event; returns the model it touched (None for daemon-wide ones)."""
        kind = ev.get("type")
        if kind == "snapshot":
            self.instances = {i["model"]: i for i in ev.get("instances", []) if isinstance(i, dict) and "model" in i}
            for name, inst in self.instances.items():
                self.series.setdefault(name, Series()).add(inst.get("stats") or {})
            return None
        model = ev.get("model")
        if not isinstance(model, str):
            return None
        if kind == "state" and isinstance(ev.get("instance"), dict):
            self.instances[model] = ev["instance"]
        elif kind == "progress" and isinstance(ev.get("prefill"), list):  # prompts in progress
            self.instances.setdefault(model, {"model": model})["prefill"] = ev["prefill"]
        elif kind == "stats" and isinstance(ev.get("stats"), dict):
            self.instances.setdefault(model, {"model": model})["stats"] = ev["stats"]
            self.series.setdefault(model, Series()).add(ev["stats"])
        return model


class BostudioApp(App):
    TITLE = "bostudio"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    .title { height: 1; background: $primary 30%; padding: 0 1; text-style: bold; }
    .pane { padding: 0 1; }
    .muted { color: $text-muted; }
    """
    BINDINGS = [
        Binding("f1", "switch_mode('devices')", "Devices", priority=True),
        Binding("f2", "switch_mode('models')", "Models", priority=True),
        Binding("f3", "switch_mode('plan')", "Plan", priority=True),
        Binding("f4", "switch_mode('running')", "Running", priority=True),
        Binding("f5", "switch_mode('bench')", "Bench", priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, client: AsyncDaemonClient, note: str = "", live: bool = True) -> None:
        from bostudio.tui.screens import BenchScreen, DevicesScreen, ModelsScreen, PlanScreen, RunningScreen

        self.MODES = {"devices": DevicesScreen, "models": ModelsScreen, "plan": PlanScreen,
                      "running": RunningScreen, "bench": BenchScreen}
        super().__init__()
        self.client = client
        self.store = Store(url=client.url)
        self.note = note
        self.live = live  # follow /bostudio/events (snapshot tests feed fixed data instead)

    async def on_mount(self) -> None:
        await self.switch_mode("models")
        if self.note:
            self.notify(self.note, timeout=8)
        if self.live:
            self.run_worker(self.follow_events(), name="events", group="events", exclusive=True)

    async def on_unmount(self) -> None:
        await self.client.aclose()

    # -------------------------------------------------------------- the event stream

    async def follow_events(self) -> None:
        """Subscribe to /bostudio/events; when the daemon goes away, say so and reconnect with backoff
        (the snapshot that starts every subscription brings the screens back up to date)."""
        attempt = 0
        while True:
            try:
                async for ev in self.client.events():
                    if not self.store.connected:
                        self.store.connected, self.store.problem, attempt = True, "", 0
                        self.broadcast("connection")
                        self.broadcast("catalog")
                    model = self.store.apply(ev)
                    self.broadcast(ev.get("type", ""), model)
                raise BostudioError("the daemon closed the event stream")
            except BostudioError as exc:
                problem = exc.message
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken stream must not end the app
                problem = f"the event stream broke: {exc!r}"
            self.store.connected = False
            delay = RECONNECT_S[min(attempt, len(RECONNECT_S) - 1)]
            self.store.problem = f"{problem} - reconnecting every {delay:g} s"
            self.broadcast("connection")
            attempt += 1
            await asyncio.sleep(delay)

    def broadcast(self, kind: str, model: str | None = None) -> None:
        """Tell the screens on show what changed; the others catch up from the store when resumed."""
        for screen in self.screen_stack:
            handler = getattr(screen, "on_store_change", None)
            if handler is not None and screen.is_mounted:
                handler(kind, model)

    # -------------------------------------------------------------- shared actions

    def select_model(self, name: str) -> None:
        if name != self.store.selected:
            self.store.selected = name
            self.store.ctx = None
        self.broadcast("selected", name)

    def report(self, exc: BostudioError) -> None:
        hint = f"\n{exc.hint}" if exc.hint else ""
        self.notify(plain(f"{exc.message}{hint}"), severity="error", timeout=10, markup=False)
