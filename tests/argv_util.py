"""Comparing llama-server argvs of one launch decision made by different launchers."""

from __future__ import annotations

# What differs between two launches of the same decision: where they listen, what they are called,
# their key, and where files are (the model by path or by the daemon's models dir, the slot store).
VARYING = {"--port", "--alias", "--api-key", "-m", "-md", "--slot-save-path", "--host"}


def comparable(argv: list[str]) -> list[str]:
    """argv without the binary and the values that may differ between launches."""
    out, skip = [], False
    for a in argv[1:]:
        if skip:
            skip = False
            continue
        out.append(a)
        skip = a in VARYING
    return out
