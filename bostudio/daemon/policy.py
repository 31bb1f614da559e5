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


# ------------------------------------------------------------------ speculation at run time

MIN_DRAFTED = 64  # fewer drafted tokens than this say too little about acceptance
MIN_REQUESTS = 3


@dataclass(frozen=True)
class SpecVerdict:
    """Acceptance since launch against the break-even the profile predicts."""

    state: str  # "unknown" (too little data) | "ok" | "below"
    acceptance: float | None
    break_even: float
    drafted: int
    requests: int
    detail: str

    def to_json(self) -> dict:
        return {"state": self.state, "acceptance": self.acceptance, "break_even": self.break_even,
                "drafted": self.drafted, "requests": self.requests, "detail": self.detail}


def judge_acceptance(drafted: int, accepted: int, requests: int, break_even: float,
                     min_drafted: int = MIN_DRAFTED, min_requests: int = MIN_REQUESTS) -> SpecVerdict:
    """Below break-even once enough has been drafted over enough requests to tell."""
    if drafted < min_drafted or requests < min_requests:
        return SpecVerdict("unknown", accepted / drafted if drafted else None, break_even, drafted, requests,
                           f"{drafted} drafted over {requests} request(s): too little to judge")
    rate = accepted / drafted
    if rate < break_even:
        return SpecVerdict("below", rate, break_even, drafted, requests,
                           f"acceptance {100 * rate:.0f}% is below the break-even of {100 * break_even:.0f}%: "
                           "speculation costs more than it saves on this workload")
    return SpecVerdict("ok", rate, break_even, drafted, requests,
                       f"acceptance {100 * rate:.0f}% is above the break-even of {100 * break_even:.0f}%")


NONE, FLAG, RELAUNCH = "none", "flag", "relaunch"


def fallback_action(verdict: SpecVerdict, spec_mode: str, speculating: bool, busy: bool) -> str:
    """What the daemon does: `relaunch` without speculation (only under auto, and only when idle, so that no
    request is cut), `flag` (shown in ps and the events; the relaunch waits for an idle moment), or `none`."""
    if not speculating or verdict.state != "below":
        return NONE
    if spec_mode != "auto" or busy:
        return FLAG
    return RELAUNCH
