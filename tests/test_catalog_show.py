"""`bostudio show`: untrusted strings from a GGUF reach the terminal escaped, and a chat template is text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bostudio.cli import main
from bostudio.display import escape_untrusted
from tests.catalog_fixtures import Stores, small_gguf, stores  # noqa: F401
from bostudio.gguf.synth import tiny_llama, write_model

HOSTILE_NAME = "\x1b[2J\x1b]0;owned\x07[bold red]boom[/bold red] \u202eevil\u200b"


def _marker_template(marker: Path) -> str:
    """A Jinja template that runs a shell command if anything ever renders it."""
    return ("{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}"
            "{% for m in messages %}{{ m.content }}{% endfor %}")


def _hostile_model(tmp_path: Path, marker: Path) -> Path:
    return write_model(tmp_path / "hostile.gguf", "llama",
                       {".block_count": 1, "general.name": HOSTILE_NAME, "general.license": "[link=x]y[/link]"},
                       {"blk.0.attn_norm.weight": (8,)}, chat_template=_marker_template(marker))


def test_show_escapes_terminal_sequences_and_markup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    path = _hostile_model(tmp_path, marker)
    assert main(["show", str(path), "--local"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\u200b" not in out
    assert "\\x1b[2J\\x1b]0;owned\\x07\\[bold red]boom\\[/bold red] \\u202eevil\\u200b" in out
    assert "chat template: yes" in out
    assert not marker.exists()


def test_template_is_printed_escaped_never_rendered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    path = _hostile_model(tmp_path, marker)
    assert main(["show", str(path), "--template", "--local"]) == 0
    out = capsys.readouterr().out
    assert "cycler.__init__.__globals__.os.system" in out and "{% for m in messages %}" in out
    assert not marker.exists()


def test_describe_never_loads_a_template_engine(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = _hostile_model(tmp_path, marker)
    code = ("import sys; from bostudio.catalog.lookup import describe_model; "
            f"name, info = describe_model({str(path)!r}, remote=False); "
            "assert info.has_chat_template and 'os.system' in info.chat_template; "
            "print('jinja2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert not marker.exists()


def test_json_output_is_valid_and_keeps_strings_verbatim(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = _hostile_model(tmp_path, tmp_path / "pwned")
    assert main(["show", str(path), "--json", "--local"]) == 0
    raw = capsys.readouterr().out
    assert "\x1b" not in raw  # JSON escapes control characters itself (\u001b)
    shown = json.loads(raw)
    assert shown["name"] == "hostile.gguf" and "chat_template" not in shown
    assert shown["has_chat_template"] is True


def test_ls_escapes_names_from_files(stores: Stores, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    (stores.models / "evil\x1b[31m.gguf").write_bytes(small_gguf("x"))
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "evil\\x1b[31m" in out


def test_show_by_name_and_ambiguous_name(stores: Stores, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    tiny_llama(stores.models / "alpha-Q8_0.gguf")
    tiny_llama(stores.models / "alpha-Q4_0.gguf", n_layer=1)
    assert main(["show", "alpha-Q4_0"]) == 0
    assert "layers:        1" in capsys.readouterr().out
    assert main(["show", "alpha"]) == 1
    err = capsys.readouterr().err
    assert "ambiguous" in err and "alpha-Q8_0 (models)" in err and "alpha-Q4_0 (models)" in err


@pytest.mark.parametrize("text, shown", [
    ("plain", "plain"),
    ("a\nb", "a\\x0ab"),
    ("back\\slash", "back\\\\slash"),
    ("[red]x[/red]", "\\[red]x\\[/red]"),
    ("[not markup", "[not markup"),
    ("\u2028", "\\u2028"),
    ("\x9b31m", "\\x9b31m"),
])
def test_escape_untrusted(text: str, shown: str) -> None:
    assert escape_untrusted(text) == shown


def test_escaped_text_shows_its_markup_in_rich() -> None:
    """In a Rich/Textual widget the escaped string shows the tags as text instead of applying them."""
    from rich.text import Text

    text = Text.from_markup(escape_untrusted("[bold]x[/bold] \\[y] \x1b[1m"))
    assert text.plain == "[bold]x[/bold] \\\\[y] \\x1b[1m"
    assert not text.spans
