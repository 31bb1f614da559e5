"""Pyflakes' checks over the code: a name nobody defined (a merge that dropped an import), an import nobody
uses, a variable assigned and never read. Stop 40's CI failed on `Path` lost from bench/service.py, which no
fast test reached; this finds such a name in a second, whatever path runs it.

Fixtures imported into a test module and then named as parameters read as redefinitions (F811), so that one
rule is off for tests/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_package_benchmarks_and_scripts_pass_pyflakes() -> None:
    r = _ruff("--select", "F", "bostudio", "benchmarks", "scripts")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_tests_pass_pyflakes_but_fixture_redefinitions() -> None:
    r = _ruff("--select", "F", "--ignore", "F811", "tests")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_check_finds_an_undefined_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return Path('x')\n")
    r = _ruff("--select", "F", str(bad))
    assert r.returncode == 1 and "F821" in r.stdout, r.stdout + r.stderr
