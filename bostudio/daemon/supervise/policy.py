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


def choose_device_evictions(resident: list[Resident], on_device: dict[str, dict[str, int]], need: dict[str, int],
                            capacity: dict[str, int]) -> list[str] | None:
    """choose_evictions for each offload device: `on_device[name][device]` is what a resident holds there,
    `need[device]` what the new instance will, `capacity[device]` what the device holds (its free memory,
    or a cap set in config.toml). Victims of one device are not counted twice; None when a device cannot
    make room."""
    victims: list[str] = []
    for device, want in need.items():
        if want <= 0 or device not in capacity:
            continue
        # only those holding memory there: unloading the others frees nothing on this device
        left = [Resident(r.name, held, r.last_used, r.busy) for r in resident
                if r.name not in victims and (held := on_device.get(r.name, {}).get(device, 0))]
        more = choose_evictions(left, want, capacity[device])
        if more is None:
            return None
        victims += more
    return victims


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


# ------------------------------------------------------------------ draft length at run time

KEEP, SHORTER, LONGER, OFF = "keep", "shorter", "longer", "off"
DRAFT_FLOOR = 2  # below this a draft hardly pays for the verification step it adds
FULL_DRAFTS = 0.75  # drafts accepted to this fraction of their length, on average, could be longer


@dataclass(frozen=True)
class DraftAdvice:
    """What to do with the draft length, from the acceptance since the child was launched."""

    action: str  # keep | shorter | longer | off
    n_max: int  # the draft length to run (the current one for keep and off)
    detail: str

    def to_json(self) -> dict:
        return {"action": self.action, "n_max": self.n_max, "detail": self.detail}


def adapt_draft_length(n_max: int, verdict: SpecVerdict, accepted_per_draft: float | None, ceiling: int,
                       failed_at: int | None = None, floor: int = DRAFT_FLOOR) -> DraftAdvice:
    """The draft length to run next, from acceptance against the break-even (`verdict`) and the tokens a
    draft gets accepted on average (`accepted_per_draft`, None when unknown).

    - Below break-even, a shorter draft wastes less: about twice what a draft gets accepted, at most half
      the current length, at least `floor`; already at the floor, speculation goes off.
    - Above it, with drafts accepted nearly whole (FULL_DRAFTS of their length): twice as long, up to the
      `ceiling`, and below half a length that already fell below break-even (`failed_at`), so that the
      length settles instead of swinging.
    - Otherwise (or too little data): keep."""
    if verdict.state == "unknown":
        return DraftAdvice(KEEP, n_max, verdict.detail)
    if verdict.state == "below":
        if n_max <= floor:
            return DraftAdvice(OFF, n_max, f"{verdict.detail}; drafts of {n_max} are already the shortest")
        want = 2 * accepted_per_draft if accepted_per_draft is not None else n_max / 4
        new = max(floor, min(n_max // 2, int(round(want))))
        return DraftAdvice(SHORTER, new, f"{verdict.detail}; drafts of {n_max} -> {new} tokens")
    cap = min(ceiling, (failed_at // 2) if failed_at else ceiling)
    if accepted_per_draft is not None and accepted_per_draft >= FULL_DRAFTS * n_max and n_max < cap:
        new = min(cap, 2 * n_max)
        return DraftAdvice(LONGER, new, f"{verdict.detail}; drafts are accepted nearly whole "
                                        f"({accepted_per_draft:.1f} of {n_max}): {n_max} -> {new} tokens")
    return DraftAdvice(KEEP, n_max, verdict.detail)
