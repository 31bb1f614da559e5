"""Widgets shared by the screens: the key footer (every binding, wrapped to the width), the stacked memory
bar, the connection banner."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from bostudio.tui.format import plain, size

# A glyph per segment as well as a colour: the bar reads without colour (monochrome terminals,
# colour-blind users, `tmux capture-pane`).
BAR_GLYPHS = {"weights": "█", "KV": "▓", "draft": "▒", "draft KV": "▒", "compute": "▆", "prompt cache": "▄",
              "free": "░"}
BAR_COLORS = {"weights": "dodger_blue1", "KV": "green3", "draft": "magenta", "draft KV": "orchid",
              "compute": "dark_orange", "prompt cache": "gold1", "free": "grey35"}


class KeyFooter(Static):
    """Every active binding as `key label`, wrapped over as many lines as the width needs (Textual's
    Footer keeps one line and cuts the rest at 80 columns)."""

    DEFAULT_CSS = """
    KeyFooter { dock: bottom; height: auto; background: $panel; color: $text; padding: 0 1; }
    """

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._changed)
        self._changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _changed(self, screen: object) -> None:
        text = Text()
        seen: set[str] = set()
        for _node, binding, enabled, _tip in self.screen.active_bindings.values():
            if not binding.show or binding.description in seen:
                continue
            seen.add(binding.description)
            if text:
                text.append("  ")
            text.append(self.app.get_key_display(binding), style="bold" if enabled else "dim")
            text.append(" " + binding.description, style="" if enabled else "dim")
        self.update(text)


class Banner(Static):
    """One line across the top for what the user must know now (daemon gone, speculation not paying)."""

    DEFAULT_CSS = """
    Banner { height: auto; background: $error 40%; color: $text; padding: 0 1; display: none; }
    Banner.-shown { display: block; }
    """

    def show(self, message: str | None) -> None:
        if message:
            self.update(Text(plain(message)))
        self.set_class(bool(message), "-shown")


class MemoryBar(Static):
    """One device's memory as a stacked bar (weights, KV, draft, draft KV, compute, prompt cache, free)
    with a legend; over budget shows in red."""

    DEFAULT_CSS = "MemoryBar { height: auto; }"

    def show_bars(self, bars: list[dict]) -> None:
        width = max(10, (self.size.width or 60) - 32)  # device name and sizes beside it
        out = Text()
        for i, dev in enumerate(bars):
            budget, used = int(dev["budget"]), int(dev["used"])
            total = max(budget, used, 1)
            if i:
                out.append("\n")
            out.append(f"{str(dev['device'])[:10]:<10} ", style="bold")
            cells = 0
            segments = [(k, int(v)) for k, v in dev["groups"].items()] + [("free", max(0, budget - used))]
            for name, n in segments:
                w = round(width * n / total)
                w = min(w, width - cells)
                if w > 0:
                    out.append(BAR_GLYPHS.get(name, "█") * w, style=BAR_COLORS.get(name, "white"))
                    cells += w
            out.append(" " * (width - cells))
            over = used > budget
            out.append(f" {size(used)}/{size(budget)}", style="bold red" if over else "")
            out.append("\n")
            legend = [(k, v) for k, v in segments if v]
            for j, (name, n) in enumerate(legend):
                out.append("  " if j else "           ")
                out.append(BAR_GLYPHS.get(name, "█") + " ", style=BAR_COLORS.get(name, "white"))
                out.append(f"{name} {size(n)}")
        self.update(out)
