"""Every command the README (and the docs/ pages' shell blocks) shows still works: each `bostudio ...` line of a
```sh block is parsed by bostudio's own argument parser, each option the README's command table names is one
that command has, each script exists and is executable, and each `python -m benchmarks.NAME` is a module.

Parsing is the check, not running: the commands start servers, daemons and agents. What cannot be checked at
all is listed in NOT_CHECKED with why. A misspelt command, subcommand or option fails here (the tests at the
bottom prove it on a copy of the README).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from bostudio.cli import build_parser, parse_args

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A code block line that starts with one of these cannot be checked by parsing, and why.
NOT_CHECKED = {
    "curl": "an HTTP request to a running daemon; the routes are tested in tests/test_daemon_*.py",
}
# Placeholders in the README's synopses, and a value that parses in their place.
PLACEHOLDERS = {"MODEL": "qwen2.5-coder-1.5b-instruct-q4_k_m", "ARGS": "hello", "...": "x", "DIR": "/tmp/x"}


@dataclass(frozen=True)
class Line:
    page: str
    number: int
    text: str


def shell_lines(path: Path) -> list[Line]:
    """The commands of the page's ```sh blocks: continuations joined, comments dropped, blank lines skipped."""
    out: list[Line] = []
    in_sh, pending, start = False, "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.startswith("```"):
            in_sh = raw.strip() == "```sh"
            continue
        if not in_sh:
            continue
        if not pending:
            start = n
        pending += raw.rstrip("\\").rstrip() + " " if raw.endswith("\\") else raw
        if raw.endswith("\\"):
            continue
        text = re.sub(r"\s+#\s.*$", "", pending).strip()
        pending = ""
        if text:
            out.append(Line(path.name, start, text))
    return out


def unbracket(text: str) -> str:
    """A synopsis made concrete: optional groups kept without their brackets, placeholders given values."""
    text = text.replace("[", " ").replace("]", " ")
    return " ".join(PLACEHOLDERS.get(w, w) for w in text.split())


def check_bostudio(argv: list[str]) -> None:
    """argv parses as bostudio's CLI parses it (argparse exits 2 on an unknown command or option)."""
    try:
        parse_args(build_parser(), argv)
    except SystemExit as exc:
        raise AssertionError(f"`bostudio {' '.join(argv)}` does not parse (exit {exc.code})") from None


def check_line(line: Line) -> None:
    where = f"{line.page}:{line.number}: {line.text}"
    first = line.text.split()[0]
    if first in NOT_CHECKED:
        return
    words = shlex.split(unbracket(line.text))
    if words[0] in ("bostudio", ".venv/bin/bostudio"):
        try:
            check_bostudio(words[1:])
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None
    elif words[0].startswith("scripts/"):
        script = ROOT / words[0]
        assert script.is_file() and os.access(script, os.X_OK), f"{where}: {words[0]} is not an executable script"
    elif words[:3] == [".venv/bin/python", "-m", words[2]] and words[2].startswith("benchmarks."):
        module = ROOT / (words[2].replace(".", "/") + ".py")
        assert module.is_file(), f"{where}: no module {words[2]}"
    else:
        raise AssertionError(f"{where}: a command this test does not know how to check: check it, or list it in "
                             "NOT_CHECKED with why")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def table_commands(path: Path) -> list[Line]:
    """The `bostudio ...` synopses in the first cell of the page's command table rows."""
    out = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.startswith("| `bostudio"):
            cell = raw.split(" | ")[0]
            out += [Line(path.name, n, span) for span in re.findall(r"`(bostudio[^`]*)`", cell)]
    return out


def check_synopsis(line: Line) -> None:
    """The synopsis's command path exists (each of `a|b` alternatives) and each `--option` it names is one
    that command accepts."""
    where = f"{line.page}:{line.number}: {line.text}"
    words = line.text.replace("\\|", "|").split()[1:]
    parsers = [build_parser()]
    for w in words:
        nxt = []
        for p in parsers:
            subs = subparsers(p)
            names = w.split("|")
            if subs and all(name in subs for name in names):
                nxt += [subs[name] for name in names]
        if not nxt:
            break
        parsers = nxt
    for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line.text):
        for p in parsers:
            assert option in p._option_string_actions, f"{where}: `{p.prog}` has no option {option}"


@pytest.mark.parametrize("line", [ln for page in PAGES for ln in shell_lines(page)],
                         ids=lambda ln: f"{ln.page}:{ln.number}")
def test_a_shell_block_command_works(line: Line) -> None:
    check_line(line)


@pytest.mark.parametrize("line", table_commands(ROOT / "README.md"), ids=lambda ln: f"{ln.text[:40]}")
def test_a_command_table_synopsis_names_real_options(line: Line) -> None:
    check_synopsis(line)


def test_the_readme_has_the_quick_start_and_is_short() -> None:
    text = (ROOT / "README.md").read_text()
    commands = [ln.text for ln in shell_lines(ROOT / "README.md")]
    assert commands[:2] == ["scripts/up.sh", "scripts/test.sh"], "the quick start is the README's first block"
    assert len(text.splitlines()) <= 300
    assert len(table_commands(ROOT / "README.md")) >= 20


def test_every_page_a_page_links_exists() -> None:
    for page in PAGES + [ROOT / "BENCHMARKS.md"]:
        for link in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)", page.read_text()):
            assert (page.parent / link).is_file(), f"{page.name} links {link}, which does not exist"


# ----------------------------------------------------------------- the check can fail

def failures(check, lines: list[Line]) -> list[str]:
    """What `check` says about each line it refuses."""
    out = []
    for line in lines:
        try:
            check(line)
        except AssertionError as exc:
            out.append(str(exc))
    return out


def readme_with(tmp_path: Path, right: str, wrong: str) -> Path:
    text = (ROOT / "README.md").read_text()
    assert right in text
    page = tmp_path / "README.md"
    page.write_text(text.replace(right, wrong, 1))
    return page


@pytest.mark.parametrize("typo", [
    ("bostudio bench --workload code", "bostudio bench --worklaod code"),
    ("bostudio daemon start", "bostudio deamon start"),
    ("scripts/up.sh", "scripts/upp.sh"),
    ("bostudio ps", "bostudio pss"),
])
def test_a_misspelt_shell_command_fails(tmp_path: Path, typo: tuple[str, str]) -> None:
    right, wrong = typo  # at the start of a line: in a shell block, not in the command table
    found = failures(check_line, shell_lines(readme_with(tmp_path, f"\n{right}", f"\n{wrong}")))
    assert len(found) == 1 and wrong in found[0], found


def test_a_misspelt_option_in_the_command_table_fails(tmp_path: Path) -> None:
    found = failures(check_synopsis, table_commands(readme_with(tmp_path, "[--idle-ttl S]", "[--idle-tll S]")))
    assert len(found) == 1 and "--idle-tll" in found[0], found
