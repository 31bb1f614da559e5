"""Running bostudio's own commands from a benchmark, as a user would, with their JSON kept beside the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def bostudio(args: list[str], out: Path, env: dict[str, str]) -> dict | list:
    """Run one bostudio command with --json; its progress goes to OUT.err, its JSON to OUT.json."""
    with open(out.with_suffix(".err"), "w") as err:
        proc = subprocess.run([sys.executable, "-m", "bostudio", *args, "--json"], stdout=subprocess.PIPE,
                              stderr=err, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"bostudio {args[0]} failed (exit {proc.returncode}); see {out.with_suffix('.err')}")
    out.with_suffix(".json").write_text(proc.stdout)
    return json.loads(proc.stdout)
