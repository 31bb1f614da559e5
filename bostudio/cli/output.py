"""What every command prints the same way: JSON, a shell-quoted argv, a service unit written or shown."""

from __future__ import annotations

import json
import sys


def print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def report_unit(path, text: str, how: str, print_only: bool) -> int:  # type: ignore[no-untyped-def]
    """Print a user unit (--print), or where it was written and how to enable it."""
    if print_only:
        sys.stdout.write(text)
        return 0
    print(f"wrote {path}")
    print(f"enable it with: {how}")
    return 0
