"""The screens: Devices, Models, Plan (launch from here), Running, Bench. Each reads the app's Store,
asks the daemon through the app's client in workers, and refreshes when the store tells it to."""

from __future__ import annotations

import asyncio
import codecs
import importlib.util
import json
import re
import sys

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Input, Log, Sparkline, Static

from bostudio.errors import BostudioError
from bostudio.display import prefill_line
from bostudio.tui.format import markup, pct, plain, safe, size, speculation_banner
from bostudio.tui.widgets import Banner, KeyFooter, MemoryBar

CACHE_TYPES = ("f16", "q8_0", "q4_0", "bf16", "f32")
SPEC_MODES = ("auto", "on", "off")
# Repetitive on purpose: n-gram speculation drafts from text already in the context.
TRY_PROMPT = ("Copy the list.\nList: apple, banana, cherry, date, elderberry, fig, grape, honeydew.\n"
              "Copy: apple, banana, cherry, date, elderberry, fig, grape, honeydew.\nCopy:")


class BaseScreen(Screen):
    """Title line, connection banner, key footer; subclasses add their body."""

    TITLE_TEXT = ""

    def compose(self) -> ComposeResult:
        yield Static(self.TITLE_TEXT, classes="title", id="title")
        yield Banner(id="banner")
        yield from self.body()
        yield KeyFooter()

    def body(self) -> ComposeResult:
        yield from ()

    @property
    def store(self):  # type: ignore[no-untyped-def]
        return self.app.store  # type: ignore[attr-defined]

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return self.app.client  # type: ignore[attr-defined]

    def on_mount(self) -> None:
        self.show_connection()

    def on_screen_resume(self) -> None:
        self.show_connection()
        self.refresh_view()

    def show_connection(self) -> None:
        s = self.store
        msg = None if s.connected or not s.problem else f"daemon unreachable at {s.url}: {s.problem}"
        self.query_one("#banner", Banner).show(msg or self.extra_banner())

    def extra_banner(self) -> str | None:
        return None

    def on_store_change(self, kind: str, model: str | None) -> None:
        if kind == "connection":
            self.show_connection()
        self.refresh_view(kind, model)

    def refresh_view(self, kind: str = "", model: str | None = None) -> None:
        pass


# ------------------------------------------------------------------------------------------ Devices

class DevicesScreen(BaseScreen):
    TITLE_TEXT = "Devices and engines"
    BINDINGS = [Binding("g", "reload", "Refresh"), Binding("b", "build", "Build GPU backend")]

    def body(self) -> ComposeResult:
        table: DataTable = DataTable(id="devices", cursor_type="row", zebra_stripes=True)
        table.add_columns("device", "backend", "memory: used / free")
        yield table
        yield Static(id="engine", classes="pane")
        yield Log(id="build-log", max_lines=500)

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#build-log", Log).display = False
        self.load()

    def refresh_view(self, kind: str = "", model: str | None = None) -> None:
        # Device memory changes when models load or unload: refresh on those events, not on a timer.
        if kind in ("", "connection", "state", "evict", "launch") and self.store.connected:
            self.load()

    def action_reload(self) -> None:
        self.load()

    @work(exclusive=True, group="devices")
    async def load(self) -> None:
        try:
            self.store.devices = await self.client.devices()
            self.store.engines = await self.client.engines()
        except BostudioError as exc:
            self.query_one("#engine", Static).update(Text(f"{exc.message} ({exc.hint})"))
            return
        self.show_devices()

    def show_devices(self) -> None:
        d = self.store.devices
        table = self.query_one("#devices", DataTable)
        table.clear()
        for dev in d.get("devices", []):
            total, free = int(dev.get("total_mib", 0)) << 20, int(dev.get("free_mib", 0)) << 20
            table.add_row(safe(clip(f"{dev.get('name')} {dev.get('description', '')}", 30)),
                          safe(dev.get("backend", "")), bar(total - free, total))
        host = d.get("host") or {}
        if host:
            total, avail = int(host.get("total_bytes", 0)), int(host.get("available_bytes", 0))
            table.add_row("host RAM", "cpu", bar(total - avail, total))
        lines = []
        for e in self.store.engines:
            mark = "[green]*[/]" if e.get("in_use") else " "
            lines.append(f"{mark} [b]{safe(e.get('path', '?'))}[/b] ({safe(e.get('source', '?'))}, "
                         f"{safe(e.get('version', '?'))})")
            lines.append(f"    backends: {safe(', '.join(e.get('backends') or []) or 'cpu')}; speculative types: "
                         f"{safe(', '.join(e.get('spec_types') or []) or 'none')}"
                         + (f"; [red]unusable:[/] {safe(e['problem'])}" if e.get("problem") else ""))
        lines.append("* = the engine the daemon uses" if self.store.engines else "no llama-server found: b builds one")
        if not d.get("devices"):
            lines.append("  no GPU in this build: b builds the backend of this machine's GPU (needs its toolkit)")
        self.query_one("#engine", Static).update(markup("\n".join(lines)))

    def action_build(self) -> None:
        log = self.query_one("#build-log", Log)
        log.display = True
        log.clear()
        self.run_command([sys.executable, "-m", "bostudio", "engine", "build", "--backend", "auto"], log,
                         "engine build")

    @work(exclusive=True, group="build")
    async def run_command(self, argv: list[str], log: Log, what: str) -> None:
        code = await stream_process(argv, log)
        self.notify(f"{what} {'finished' if code == 0 else f'failed (exit {code})'}",
                    severity="information" if code == 0 else "error")
        if code == 0:
            self.load()


def bar(used: int, total: int, width: int = 12) -> str:
    if total <= 0:
        return "?"
    filled = max(0, min(width, round(width * used / total)))
    return f"[green]{'█' * filled}[/][grey50]{'░' * (width - filled)}[/] {size(used)} / {size(total - used)}"


_LINE_END = re.compile(r"(\r\n|\n|\r)")


async def stream_process(argv: list[str], log: Log, status: Static | None = None) -> int:
    """Run a bostudio command, its output into `log` line by line as it comes; progress bars (lines
    rewritten with \\r, as tqdm draws them) go to `status`. Returns the exit code."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    try:
        while chunk := await proc.stdout.read(4096):
            pieces = _LINE_END.split(pending + decoder.decode(chunk))  # text, end, text, ..., text
            for seg, end in zip(pieces[0::2], pieces[1::2]):
                if end == "\r":  # a progress bar redrawing its line
                    if status is not None and seg.strip():
                        status.update(Text(plain(seg.strip())))
                else:
                    log.write_line(plain(seg))
            pending = pieces[-1]
        if pending:
            log.write_line(plain(pending))
        return await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# ------------------------------------------------------------------------------------------ Models

class ModelsScreen(BaseScreen):
    TITLE_TEXT = "Models - type to filter, Enter plans the highlighted one"
    BINDINGS = [Binding("up", "move(-1)", "Up", show=False), Binding("down", "move(1)", "Down", show=False),
                Binding("ctrl+o", "pull", "Pull from hub"), Binding("ctrl+r", "reload", "Rescan")]
    DEFAULT_CSS = """
    ModelsScreen #filter { height: 1; border: none; padding: 0 1; }
    ModelsScreen #models { height: 45%; }
    ModelsScreen #detail { height: 1fr; }
    """

    def body(self) -> ComposeResult:
        yield Input(placeholder="filter: name, architecture, quant ...", id="filter")
        table: DataTable = DataTable(id="models", cursor_type="row", zebra_stripes=True)
        table.add_columns("model", "arch", "size", "quant", "ctx", "MTP", "speculator")
        yield table
        with VerticalScroll(id="detail"):
            yield Static(id="detail-text", classes="pane")

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#filter", Input).focus()
        if self.store.catalog:
            self.fill()
        if self.app.live:  # type: ignore[attr-defined]
            self.load()

    def refresh_view(self, kind: str = "", model: str | None = None) -> None:
        if kind == "catalog":
            self.load()
        elif kind in ("pairing", "fixed"):
            self.fill()

    def action_reload(self) -> None:
        self.load()

    @work(exclusive=True, group="catalog")
    async def load(self) -> None:
        try:
            self.store.catalog = await self.client.catalog()
        except BostudioError as exc:
            self.query_one("#detail-text", Static).update(Text(f"{exc.message}\n{exc.hint}"))
            return
        self.fill()
        for entry in list(self.store.catalog):  # the paired speculator of each, one after the other
            name = entry["model"]
            if name not in self.store.pairings:
                try:
                    self.store.pairings[name] = await self.client.pairings(name)
                except BostudioError as exc:
                    self.store.pairings[name] = {"error": exc.message}
                self.fill()

    def rows(self) -> list[dict]:
        words = self.query_one("#filter", Input).value.lower().split()
        out = []
        for e in self.store.catalog:
            hay = " ".join(str(e.get(k, "")) for k in ("model", "architecture", "quant")).lower()
            if all(w in hay for w in words):
                out.append(e)
        return out

    def fill(self) -> None:
        table = self.query_one("#models", DataTable)
        keep = self.store.selected
        table.clear()
        for e in self.rows():
            pairing = self.store.pairings.get(e["model"], {})
            auto = (pairing.get("modes") or {}).get("auto") or {}
            spec = auto.get("speculation") or ("?" if not pairing else pairing.get("error", "-"))
            mtp = "yes" if e.get("n_nextn") else ("-" if "error" in e else "no")
            table.add_row(safe(clip(e["model"], 30)), safe(clip(e.get("architecture", "?"), 10)), size(e.get("file_size")),
                          safe(e.get("quant", "?")), str(e.get("n_ctx_train", "?")), mtp, safe(spec),
                          key=e["model"])
        if table.row_count:
            names = [e["model"] for e in self.rows()]
            table.move_cursor(row=names.index(keep) if keep in names else 0)
            self.show_detail(names[table.cursor_row])
        else:
            self.query_one("#detail-text", Static).update("no model matches the filter" if self.store.catalog
                                                           else "no models yet: Ctrl+O pulls one from the hub")

    @on(Input.Changed, "#filter")
    def filtered(self) -> None:
        self.fill()

    @on(Input.Submitted, "#filter")
    def submitted(self) -> None:
        self.open_plan()

    @on(DataTable.RowHighlighted, "#models")
    def highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value:
            self.show_detail(str(event.row_key.value))

    @on(DataTable.RowSelected, "#models")
    def selected(self, event: DataTable.RowSelected) -> None:
        self.open_plan()

    def action_move(self, step: int) -> None:
        table = self.query_one("#models", DataTable)
        if table.row_count:
            table.move_cursor(row=max(0, min(table.row_count - 1, table.cursor_row + step)))

    def open_plan(self) -> None:
        if self.store.selected:
            self.app.switch_mode("plan")

    def show_detail(self, name: str) -> None:
        if name != self.store.selected:
            self.app.select_model(name)  # type: ignore[attr-defined]
        e = next((x for x in self.store.catalog if x["model"] == name), None)
        if e is None:
            return
        lines = [f"[b]{safe(name)}[/b]  {safe(e.get('path', ''))}"]
        if "error" in e:
            lines.append(f"[red]unreadable:[/] {safe(e['error'])}")
        else:
            params = e.get("n_params")
            lines.append(f"{safe(e.get('architecture'))}, {f'{params / 1e9:.2f} B params, ' if params else ''}"
                         f"{safe(e.get('quant'))}, {size(e.get('file_size'))}, trained context {e.get('n_ctx_train')}, "
                         f"MTP layers {e.get('n_nextn') or 0}")
        p = self.store.pairings.get(name)
        if p is None:
            lines.append("pairing: asking the daemon ...")
        elif "error" in p:
            lines.append(f"pairing: {safe(p['error'])}")
        else:
            tok = p.get("tokenizer") or {}
            lines.append(f"tokenizer: {safe(tok.get('model'))}/{safe(tok.get('pre'))}, {tok.get('vocab_size')} tokens, "
                         f"fingerprint {safe(str(tok.get('fingerprint', ''))[:12])}")
            auto = (p.get("modes") or {}).get("auto") or {}
            lines.append(f"[b]speculator (auto):[/b] {safe(auto.get('speculation', auto.get('error', '?')))} - "
                         f"{safe(auto.get('reason', ''))}")
            for c in p.get("candidates", []):
                mark = "[green]* chosen[/]" if c.get("chosen") else ("usable" if c.get("usable") else "[yellow]passed over[/]")
                mem = f" {size(c['memory_bytes'])}" if c.get("memory_bytes") else ""
                lines.append(f"  {mark} {safe(c.get('label'))}{mem}: {safe(c.get('why'))}")
        self.query_one("#detail-text", Static).update(markup("\n".join(lines)))

    def action_pull(self) -> None:
        self.app.push_screen(PullScreen(), lambda ok: self.load() if ok else None)


class PullScreen(ModalScreen[bool]):
    """Pull REPO[:QUANT] from the Hugging Face hub with `bostudio pull`, its progress shown as it comes."""

    BINDINGS = [Binding("escape", "close", "Close")]
    AUTO_FOCUS = "#ref"
    pulled = False

    def action_close(self) -> None:
        self.dismiss(self.pulled)
    DEFAULT_CSS = """
    PullScreen { align: center middle; }
    PullScreen > #box { width: 90%; height: 80%; border: round $primary; background: $surface; }
    PullScreen Input { height: 3; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="box"):
            yield Static("Pull from the hub: REPO[:QUANT] (e.g. Qwen/Qwen3-0.6B-GGUF:Q4_K_M); Esc closes")
            yield Input(placeholder="org/repo:QUANT", id="ref")
            yield Static(id="pull-progress")
            yield Log(id="pull-log", max_lines=500)
        yield KeyFooter()

    @on(Input.Submitted, "#ref")
    def go(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.pull(event.value.strip())

    @work(exclusive=True, group="pull")
    async def pull(self, ref: str) -> None:
        log = self.query_one("#pull-log", Log)
        log.write_line(f"bostudio pull {plain(ref)}")
        code = await stream_process([sys.executable, "-m", "bostudio", "pull", ref], log,
                                    self.query_one("#pull-progress", Static))
        if code == 0:
            log.write_line("pulled into the Hugging Face cache (path above); `bostudio ls` lists it. The daemon "
                           "serves the GGUFs of its models dir, or a path: `bostudio up --daemon PATH`")
        else:
            log.write_line(f"pull failed (exit {code}): the line above says why and what to do")
        self.pulled = code == 0


# ------------------------------------------------------------------------------------------ Plan

class PlanScreen(BaseScreen):
    TITLE_TEXT = "Plan"
    AUTO_FOCUS = "#plan-body"
    BINDINGS = [Binding("l", "launch", "Launch"), Binding("c", "edit_ctx", "Context"),
                Binding("k", "cycle_cache", "KV type"), Binding("s", "cycle_spec", "Speculation"),
                Binding("escape", "leave_input", "Done editing", show=False)]
    DEFAULT_CSS = """
    PlanScreen #controls { height: 1; padding: 0 1; }
    PlanScreen #ctx { width: 12; height: 1; border: none; padding: 0; }
    PlanScreen #ctx-label, PlanScreen #knobs { width: auto; height: 1; }
    PlanScreen #plan-body { height: 1fr; padding: 0 1; }
    """

    def body(self) -> ComposeResult:
        with Horizontal(id="controls"):
            yield Static("context (c): ", id="ctx-label")
            yield Input(placeholder="default", id="ctx", restrict=r"[0-9]*", max_length=8)
            yield Static(id="knobs")
        with VerticalScroll(id="plan-body"):
            yield MemoryBar(id="bar")
            yield Static(id="plan-text")
        self._plan: dict = {}

    def on_mount(self) -> None:
        super().on_mount()
        self.refresh_view("selected")

    def refresh_view(self, kind: str = "", model: str | None = None) -> None:
        s = self.store
        self.query_one("#title", Static).update(
            markup(f"Plan: {safe(s.selected)}") if s.selected else "Plan - choose a model first (F2)")
        self.query_one("#knobs", Static).update(markup(f"   KV cache (k): [b]{s.cache_type}[/b]   speculation (s): [b]{s.spec}[/b]"))
        if kind in ("selected", "connection", "fixed", ""):
            ctx_input = self.query_one("#ctx", Input)
            want = "" if s.ctx is None else str(s.ctx)
            if ctx_input.value != want and not ctx_input.has_focus:
                with ctx_input.prevent(Input.Changed):
                    ctx_input.value = want
            if kind != "fixed":
                self.replan()
            else:
                self.show_plan()

    @on(Input.Changed, "#ctx")
    def ctx_changed(self, event: Input.Changed) -> None:
        self.store.ctx = int(event.value) if event.value.isdigit() and int(event.value) >= 256 else None
        self.replan()

    @on(Input.Submitted, "#ctx")
    def ctx_done(self) -> None:
        self.action_leave_input()

    def action_leave_input(self) -> None:
        self.query_one("#plan-body").focus()

    def action_edit_ctx(self) -> None:
        self.query_one("#ctx", Input).focus()

    def action_cycle_cache(self) -> None:
        s = self.store
        s.cache_type = CACHE_TYPES[(CACHE_TYPES.index(s.cache_type) + 1) % len(CACHE_TYPES)]
        self.refresh_view()
        self.replan()

    def action_cycle_spec(self) -> None:
        s = self.store
        s.spec = SPEC_MODES[(SPEC_MODES.index(s.spec) + 1) % len(SPEC_MODES)]
        self.refresh_view()
        self.replan()

    @work(exclusive=True, group="plan")
    async def replan(self) -> None:
        s = self.store
        if not s.selected or not self.app.live:  # type: ignore[attr-defined]
            self.show_plan()
            return
        await asyncio.sleep(0.25)  # typing: the last keystroke wins (exclusive cancels the earlier ones)
        try:
            self._plan = await self.client.plan(s.selected, ctx=s.ctx, cache_type=s.cache_type, spec=s.spec)
        except BostudioError as exc:
            self._plan = {"error": exc.message, "hint": exc.hint}
        self.show_plan()

    def set_plan(self, plan: dict) -> None:
        """Show a plan the caller already has (fixed data)."""
        self._plan = plan
        self.show_plan()

    def show_plan(self) -> None:
        p = self._plan
        text = self.query_one("#plan-text", Static)
        if not p:
            text.update("asking the daemon for the plan ..." if self.store.selected else "")
            return
        if "error" in p:
            self.query_one("#bar", MemoryBar).update("")
            text.update(Text(f"cannot plan: {p['error']}\n{p.get('hint', '')}", style="red"))
            return
        self.query_one("#bar", MemoryBar).show_bars(p.get("bars", []))
        lines = [f"context [b]{p['ctx']}[/b] tokens (trained {p.get('n_ctx_train')}), KV {safe(p['cache_type'])}, "
                 f"total {size(p['bytes'])}",
                 f"speculator: [b]{safe(p['speculation'])}[/b] - {safe(p.get('reason', ''))}"]
        if p.get("layout_line"):  # the slots and their shared KV pool (the daemon queues what does not fit)
            lines.append(f"slots: {safe(p['layout_line'])}")
        if p.get("cost_line"):
            lines.append(f"trade-off: {safe(p['cost_line'])}")
        lines.append(f"why: {safe(p.get('why', ''))}")
        if (p.get("chat_template") or {}).get("label"):  # which template serves it, fallback or not
            lines.append(f"chat template: {safe(p['chat_template']['label'])}")
        lines += [f"  {safe(line)}" for line in p.get("placement", [])]  # with RPC workers: where each part lives
        lines += [f"  [yellow]{safe(problem)}[/]" for problem in p.get("rpc_problems", [])]
        if not p.get("fits"):
            lines.append(f"[b red]DOES NOT FIT[/]: {safe(p.get('not_fit_reason', ''))}")
            for w in p.get("would_fit", []):
                lines.append(f"  [yellow]fits with {safe(w.get('change', 'a change'))}:[/] context {w['ctx']}, "
                             f"KV {safe(w['cache_type'])}, speculation {safe(w['speculation'])} ({size(w['bytes'])})")
            if not p.get("would_fit"):
                lines.append("  nothing smaller fits either: a smaller quant of this model, or another device")
        else:
            lines.append("[green]fits[/] - l launches it")
        text.update(markup("\n".join(lines)))

    @work(exclusive=True, group="launch")
    async def action_launch(self) -> None:
        s = self.store
        if not s.selected:
            self.notify("choose a model first (F2)", severity="warning")
            return
        try:
            await self.client.start(s.selected, spec=s.spec, ctx=s.ctx, cache_type=s.cache_type, wait=False)
        except BostudioError as exc:
            self.app.report(exc)  # type: ignore[attr-defined]
            return
        self.notify(f"launching {plain(s.selected)}", markup=False)
        self.app.switch_mode("running")


# ------------------------------------------------------------------------------------------ Running

class RunningScreen(BaseScreen):
    TITLE_TEXT = "Running"
    BINDINGS = [Binding("t", "try_it", "Send a request"), Binding("x", "toggle_spec", "Speculation on/off"),
                Binding("y", "copy_url", "Copy URL"), Binding("s", "stop", "Stop"), Binding("r", "restart", "Restart")]
    DEFAULT_CSS = """
    RunningScreen #instances { height: auto; max-height: 5; }
    RunningScreen #info { height: auto; padding: 0 1; }
    RunningScreen .spark-row { height: 1; padding: 0 1; }
    RunningScreen .spark-label { width: 34; }
    RunningScreen Sparkline { width: 1fr; height: 1; }
    RunningScreen #log { height: 1fr; min-height: 3; border-top: solid $primary-darken-2;
                         scrollbar-size-horizontal: 0; }
    """

    def body(self) -> ComposeResult:
        table: DataTable = DataTable(id="instances", cursor_type="row")
        table.add_columns("model", "state", "speculation", "tok/s", "accept", "acc.len", "reqs")
        yield table
        yield Static(id="info")
        for key, label in (("tok_s", "tok/s"), ("acceptance", "acceptance"), ("accept_len", "accepted len")):
            with Horizontal(classes="spark-row"):
                yield Static(label, id=f"label-{key}", classes="spark-label")
                yield Sparkline([], id=f"spark-{key}")
        yield Log(id="log", max_lines=300)
        self._following: str | None = None

    def on_mount(self) -> None:
        super().on_mount()
        self.refresh_view()

    def current(self) -> str | None:
        table = self.query_one("#instances", DataTable)
        names = list(self.store.instances)
        if not names:
            return None
        if table.row_count and 0 <= table.cursor_row < len(names):
            return names[table.cursor_row]
        return self.store.selected if self.store.selected in names else names[0]

    def refresh_view(self, kind: str = "", model: str | None = None) -> None:
        s = self.store
        table = self.query_one("#instances", DataTable)
        want = s.selected if s.selected in s.instances else self.current()
        table.clear()
        for name, inst in s.instances.items():
            st = inst.get("stats") or {}
            state = inst.get("state", "?")
            color = {"ready": "green", "failed": "red", "loading": "yellow", "restarting": "yellow"}.get(state, "")
            table.add_row(safe(clip(name, 28)), f"[{color}]{safe(state)}[/]" if color else safe(state), safe(inst.get("speculation") or "-"),
                          _n(st.get("decode_tok_s")), pct(st.get("acceptance_rate")),
                          _n(st.get("mean_accepted_length"), ".2f"), str(st.get("requests", 0)), key=name)
        names = list(s.instances)
        if want in names:
            table.move_cursor(row=names.index(want))
        self.show_instance()

    @on(DataTable.RowHighlighted, "#instances")
    def highlighted(self) -> None:
        self.show_instance()

    def extra_banner(self) -> str | None:
        name = self.current()
        return speculation_banner(self.store.instances[name]) if name else None

    def show_instance(self) -> None:
        name = self.current()
        info = self.query_one("#info", Static)
        self.show_connection()
        if name is None:
            info.update("nothing loaded: choose a model (F2), plan it (Enter) and press l to launch it")
            for key in ("tok_s", "acceptance", "accept_len"):
                self.query_one(f"#spark-{key}", Sparkline).data = []
            return
        inst = self.store.instances[name]
        st = inst.get("stats") or {}
        status = inst.get("spec_status") or {}
        plan = inst.get("plan") or {}
        lines = [f"endpoint [b]{safe(self.store.url)}/v1[/b]  model [b]{safe(name)}[/b]  (y copies)",
                 f"state [b]{inst.get('state')}[/b]"
                 + (f" in {inst['ready_s']:.1f} s" if inst.get("state") == "ready" and inst.get("ready_s") else "")
                 + f", memory {size(plan.get('bytes'))} planned (ctx {inst.get('ctx')}, KV {safe(inst.get('cache_type', 'f16'))})",
                 f"speculation {safe(inst.get('speculation') or '-')}: {safe(status.get('detail', 'not verified yet'))}"]
        for p in inst.get("prefill") or []:  # a long prompt in progress, its rate and the time left
            lines.append(f"[b yellow]{safe(prefill_line(p))}[/]")
        if (inst.get("chat_template") or {}).get("label"):  # which template, fallback or not
            lines.append(f"chat template {safe(inst['chat_template']['label'])}")
        if inst.get("error"):
            err = inst["error"]
            lines.append(f"[red]failed:[/] {safe(err.get('message', err))}" + (f" - {safe(err['hint'])}" if err.get("hint") else ""))
        info.update(markup("\n".join(lines)))
        series = self.store.series.get(name)
        for key, value in (("tok_s", _n(st.get("decode_tok_s")) + " tok/s"),
                           ("acceptance", "acceptance " + pct(st.get("acceptance_rate"))),
                           ("accept_len", "accepted len " + _n(st.get("mean_accepted_length"), ".2f"))):
            self.query_one(f"#label-{key}", Static).update(value)
            self.query_one(f"#spark-{key}", Sparkline).data = list(getattr(series, key)) if series else []
        if self._following != name and self.app.live:  # type: ignore[attr-defined]
            self._following = name
            self.follow_log(name)

    @work(exclusive=True, group="log")
    async def follow_log(self, name: str) -> None:
        log = self.query_one("#log", Log)
        log.clear()
        while self._following == name:
            try:
                async for ev in self.client.log_stream(name, lines=20):
                    if "line" in ev:
                        log.write_line(plain(ev["line"]))
            except BostudioError:
                pass
            await asyncio.sleep(1.0)  # the instance went away or the daemon restarted: follow again

    def action_copy_url(self) -> None:
        url = f"{self.store.url}/v1"
        self.app.copy_to_clipboard(url)  # OSC 52; terminals without it ignore it, so show it too
        self.notify(f"copied {url} (OSC 52); if your terminal does not support it, select it here", markup=False)

    @work(group="instance-action")
    async def action_try_it(self) -> None:
        name = self.current()
        if name is None:
            return
        try:
            out = await self.client.complete(name, TRY_PROMPT, max_tokens=32)
        except BostudioError as exc:
            self.app.report(exc)  # type: ignore[attr-defined]
            return
        t = out.get("timings") or {}
        self.notify(f"{t.get('predicted_n', '?')} tokens, {t.get('draft_n_accepted', 0)}/{t.get('draft_n', 0)} "
                    "drafts accepted", markup=False)

    @work(group="instance-action")
    async def action_toggle_spec(self) -> None:
        name = self.current()
        if name is None:
            return
        inst = self.store.instances[name]
        mode = "auto" if (inst.get("speculation") or "off") == "off" else "off"
        try:
            await self.client.set_speculation(name, mode, wait=False)
        except BostudioError as exc:
            self.app.report(exc)  # type: ignore[attr-defined]
            return
        self.notify(f"speculation {mode}: relaunching {plain(name)}", markup=False)

    @work(group="instance-action")
    async def action_stop(self) -> None:
        name = self.current()
        if name is not None:
            try:
                await self.client.stop(name)
            except BostudioError as exc:
                self.app.report(exc)  # type: ignore[attr-defined]

    @work(group="instance-action")
    async def action_restart(self) -> None:
        name = self.current()
        if name is not None:
            try:
                await self.client.restart(name, wait=False)
            except BostudioError as exc:
                self.app.report(exc)  # type: ignore[attr-defined]


def clip(value: object, width: int) -> str:
    """At most `width` characters (the table stays inside 80 columns; the detail pane has the whole name)."""
    text = str(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def _n(value: object, spec: str = ".1f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


# ------------------------------------------------------------------------------------------ Bench

def bench_available() -> bool:
    return importlib.util.find_spec("bostudio.bench") is not None


class BenchScreen(BaseScreen):
    TITLE_TEXT = "Bench"
    BINDINGS = [Binding("b", "bench", "Run bench")]
    DEFAULT_CSS = """
    BenchScreen #bench-text { height: auto; padding: 0 1; }
    BenchScreen #chart { height: 1fr; min-height: 8; }
    BenchScreen #bench-log { height: 5; }
    """

    def body(self) -> ComposeResult:
        from textual_plotext import PlotextPlot

        yield Static(id="bench-text")
        yield PlotextPlot(id="chart")
        yield Log(id="bench-log", max_lines=200)

    def on_mount(self) -> None:
        super().on_mount()
        self.refresh_view()

    def refresh_view(self, kind: str = "", model: str | None = None) -> None:
        if getattr(self, "_result", None):
            return
        chart = self.query_one("#chart")
        chart.display = False
        self.query_one("#bench-log", Log).display = False
        if not bench_available():
            self.query_one("#bench-text", Static).update(
                "`bostudio bench` is not available in this installation (no bostudio.bench package).\n"
                "Install a bostudio with the bench command to measure speculation here.")
        else:
            who = safe(self.store.selected) if self.store.selected else "the model chosen on the Models screen (F2)"
            self.query_one("#bench-text", Static).update(markup(f"b runs `bostudio bench` on {who}: speculation off "
                                                                "vs on, decode tok/s side by side"))

    def action_bench(self) -> None:
        if not bench_available():
            self.notify("bostudio bench is not available in this installation", severity="warning")
        elif not self.store.selected:
            self.notify("choose a model first (F2)", severity="warning")
        else:
            self.run_bench(self.store.selected)

    @work(exclusive=True, group="bench")
    async def run_bench(self, model: str) -> None:
        log = self.query_one("#bench-log", Log)
        log.display = True
        log.clear()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bostudio", "bench", model, "--json", "--runs", "1", "--tokens", "32",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None and proc.stdout is not None

        async def progress() -> None:
            assert proc.stderr is not None
            async for raw in proc.stderr:
                log.write_line(plain(raw.decode("utf-8", "replace").rstrip("\n")))

        out, _ = await asyncio.gather(proc.stdout.read(), progress())
        code = await proc.wait()
        try:
            data = json.loads(out) if code == 0 else None
        except ValueError:
            data = None
        if data is None:
            self.notify(f"bench failed (exit {code}): see its output below", severity="error")
            return
        self.show_result(data)

    def show_result(self, data: dict) -> None:
        """Chart a `bostudio bench --json` result (see the bench contract): tok/s per config and workload."""
        self._result = data
        rows = [r for r in data.get("results", []) if isinstance(r, dict)]
        lines = [f"[b]{safe(data.get('model', '?'))}[/b] on {safe(data.get('engine', '?'))}, {data.get('runs')} run(s)"]
        for r in rows:
            sp = r.get("speedup")
            lines.append(f"  {safe(r.get('workload'))} {safe(r.get('config'))}: {_n(r.get('tok_s_total') or r.get('tok_s_median'))} tok/s"
                         + (f", x{sp:.2f} ({_n(r.get('speedup_min'), '.2f')}-{_n(r.get('speedup_max'), '.2f')})"
                            if isinstance(sp, (int, float)) else "")
                         + (f", acceptance {pct(r.get('acceptance'))}" if r.get("acceptance") is not None else ""))
        saved = (data.get("projection") or {}).get("seconds_saved") or {}
        if saved:
            proj = data["projection"]
            lines.append(f"  over {proj.get('turns')} turns of {proj.get('tokens_per_turn')} tokens: "
                         + ", ".join(f"{safe(k)} saves {v:.0f} s" for k, v in saved.items()))
        self.query_one("#bench-text", Static).update(markup("\n".join(lines)))
        chart = self.query_one("#chart")
        chart.display = True
        plt = chart.plt  # type: ignore[attr-defined]
        plt.clear_data()
        plt.clear_figure()
        workloads = list(dict.fromkeys(str(r.get("workload")) for r in rows))
        configs = list(dict.fromkeys(str(r.get("config")) for r in rows))
        values = {(str(r.get("workload")), str(r.get("config"))):
                  float(r.get("tok_s_total") or r.get("tok_s_median") or 0) for r in rows}
        plt.multiple_bar(workloads, [[values.get((w, c), 0.0) for w in workloads] for c in configs],
                         labels=[plain(c) for c in configs])
        plt.title("decode tok/s (tokens over time)")
        chart.refresh()
