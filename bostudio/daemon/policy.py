"""Eviction and idle unloading: pure decisions on the planner's per-instance bytes.
No file, process or network access."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Resident:
    """A loaded (or loading) instance as the eviction policy sees it."""

    name: str
    bytes: int
    last_used: float  # monotonic seconds
    busy: bool  # requests in flight or loading: never evicted


def choose_evictions(resident: list[Resident], need: int, budget: int) -> list[str] | None:
    """Which instances to unload, least recently used first, so that `need` more bytes fit in `budget`.
    [] when it fits already; None when it cannot fit even after unloading every idle instance."""
    used = sum(r.bytes for r in resident)
    if used + need <= budget:
        return []
    victims: list[str] = []
    for r in sorted((r for r in resident if not r.busy), key=lambda r: r.last_used):
        victims.append(r.name)
        used -= r.bytes
        if used + need <= budget:
            return victims
    return None


def idle_expired(resident: list[Resident], now: float, ttl: float) -> list[str]:
    """Instances idle for longer than `ttl` seconds (ttl <= 0: never)."""
    if ttl <= 0:
        return []
    return [r.name for r in resident if not r.busy and now - r.last_used > ttl]
