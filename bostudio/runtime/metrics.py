"""llama-server's Prometheus page (/metrics, with --metrics) as numbers. Pure parsing."""

from __future__ import annotations

import re

_METRIC = re.compile(r"^llamacpp:(\w+)(?:\{[^}]*\})?\s+([-+0-9.eE]+|nan|inf)\s*$", re.M)


def parse_metrics(text: str) -> dict[str, float]:
    """Unlabelled `llamacpp:*` samples from a Prometheus text page (labelled ones summed by name)."""
    out: dict[str, float] = {}
    for name, value in _METRIC.findall(text):
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out
