"""One child's lifecycle as a pure transition: `step(life, event, now)` gives the new `Life` and the effects
to run, in order. Which failure retries, backs off or fails is decided here, and nowhere else.

No process, file, socket or clock: the effects runner (supervise/effects.py) executes the effects and turns
what it waits for (a load, a child's exit, a back-off) into the next event. So the whole table is tested in
milliseconds without processes (tests/test_lifecycle.py), as llama-swap's router keeps its scheduler apart
from its process machinery.

    state       event                         new state    effects
    stopped     Launch                        loading      clear error, fresh ready, spawn, start child
    loading     Loaded                        ready        resolve ready, watch child (nothing while stopping)
    loading     LoadFailed(file, oom, lost
                worker, pinned port, a bug)   failed       stop child, mark failed
    loading     LoadFailed(other)             restarting   stop child, crash counted, retry after back-off
                                              failed       ... or the crash loop: mark failed
    restarting  RetryDue                      loading      start child
    ready       Exited(dead rpc workers)      loading      stop child, mark lost, start child without them
    ready       Exited                        restarting   fresh ready, await the requests it broke
    restarting  Settled(broke one request)    loading      start child, no crash counted
    restarting  Settled(otherwise)            restarting   crash counted, retry after back-off (or failed)
    any         Exited while stopping         (same)       nothing: the stop owns the child
    resident    Stop                          stopping     save slots (if ready), cancel, stop child
    failed      Stop                          failed       cancel, stop child
    stopping    Stopped                       stopped      resolve ready with an error (failed stays failed)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bostudio.daemon.supervise import policy
from bostudio.errors import BostudioError, ModelFileError, OutOfMemoryError, PlanError, PortInUseError, ServerError

# Instance states. `restarting` waits out a backoff after a crash; `failed` needs an explicit start.
STOPPED, LOADING, READY, RESTARTING, FAILED, STOPPING = "stopped", "loading", "ready", "restarting", "failed", "stopping"
RESIDENT_STATES = (LOADING, READY, RESTARTING)

# The crash loop: after CRASH_LIMIT crashes within CRASH_WINDOW_S seconds the model is marked failed; between
# crashes the relaunch waits BACKOFF_BASE_S, twice that, four times ... up to BACKOFF_MAX_S.
CRASH_LIMIT = 5
CRASH_WINDOW_S = 60.0
BACKOFF_BASE_S = 0.25
BACKOFF_MAX_S = 8.0


class WorkerLostError(PlanError):
    """The model no longer fits once an RPC worker it used has died."""


@dataclass(frozen=True)
class Life:
    """What the lifecycle knows of one instance. `name` and `log` only go into messages."""

    name: str
    log: str = ""
    state: str = STOPPED
    crashes: tuple[float, ...] = ()  # monotonic times of the crashes within the window
    failed_at: float | None = None  # wall time the model was marked failed
    stopping: bool = False  # a stop owns the child: its exit is no crash
    lost_workers: tuple[str, ...] = ()  # rpc workers that died under this model: later launches go without them

    def backoff(self) -> float:
        """Seconds to wait before the next relaunch: base, 2x base, 4x base ... capped."""
        return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (max(1, len(self.crashes)) - 1))


# ------------------------------------------------------------------ events

@dataclass(frozen=True)
class Launch:
    """A start was asked for (a request for the model, the control API, a relaunch after a stop)."""


@dataclass(frozen=True)
class Loaded:
    """The child answers and is checked: it serves."""


@dataclass(frozen=True)
class LoadFailed:
    """Loading raised `error`. `plan` is the plan's summary (an out-of-memory message names it); `pinned_port`:
    the config names the child's port (one that is taken stays taken)."""

    error: BaseException
    plan: str = "unknown"
    pinned_port: bool = False


@dataclass(frozen=True)
class Exited:
    """The child exited on its own with `code`; `why` says so with its log's last line. `dead_workers`:
    the rpc workers it used that no longer answer."""

    code: int | None
    why: str
    dead_workers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settled:
    """The requests on the dead child's launch ended: `broke` of them with the request in it (None: they
    did not end in time, a hang guard)."""

    broke: int | None
    why: str


@dataclass(frozen=True)
class RetryDue:
    """The back-off after a crash is over."""


@dataclass(frozen=True)
class Stop:
    reason: str = "stopped"


@dataclass(frozen=True)
class Stopped:
    reason: str = "stopped"


Event = Launch | Loaded | LoadFailed | Exited | Settled | RetryDue | Stop | Stopped


# ------------------------------------------------------------------ effects

@dataclass(frozen=True)
class Announce:
    """Publish the new state (events, ps), with what explains it."""

    state: str
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ClearError:
    """A fresh start: the last failure no longer applies."""


@dataclass(frozen=True)
class FreshReady:
    """Requests from now on wait for the next load. `always`: a new wait even if one is pending."""

    always: bool = False


@dataclass(frozen=True)
class ResolveReady:
    """Answer the requests waiting for the load: with the instance, or with `error`."""

    error: BaseException | None = None


@dataclass(frozen=True)
class Spawn:
    """Run the lifecycle's task (load, watch, relaunch) for the instance."""


@dataclass(frozen=True)
class StartChild:
    """Plan, start and check a child; ends in Loaded or LoadFailed."""


@dataclass(frozen=True)
class WatchChild:
    """Wait for the child's exit; ends in Exited (with the rpc workers that died under it)."""


@dataclass(frozen=True)
class AwaitSettle:
    """Wait for the requests on the dead child to end; ends in Settled."""

    why: str


@dataclass(frozen=True)
class Retry:
    """Wait `delay` seconds; ends in RetryDue."""

    delay: float


@dataclass(frozen=True)
class StopChild:
    """Stop the child's process group (SIGTERM, SIGKILL after the grace) and close its client."""


@dataclass(frozen=True)
class SaveSlots:
    """Save the child's slot states before it stops (prompt reuse); a failure is logged, never raised."""

    reason: str


@dataclass(frozen=True)
class CancelTask:
    """Cancel the lifecycle's task (bounded wait)."""


@dataclass(frozen=True)
class MarkFailed:
    """Record `error` (with the log's tail and the plan), publish `failed`, answer the waiting requests."""

    error: BostudioError


@dataclass(frozen=True)
class MarkLost:
    """Record that rpc workers died under the child (published as `failed`, then relaunched)."""

    why: str


@dataclass(frozen=True)
class NoteChildren:
    """The set of live children changed: rewrite the daemon's state file."""


@dataclass(frozen=True)
class Warn:
    message: str


Effect = (Announce | ClearError | FreshReady | ResolveReady | Spawn | StartChild | WatchChild | AwaitSettle
          | Retry | StopChild | SaveSlots | CancelTask | MarkFailed | MarkLost | NoteChildren | Warn)
Step = tuple[Life, list]


# ------------------------------------------------------------------ the transition

def step(life: Life, event: Event, now: float, wall: float = 0.0) -> Step:
    """The new life and the effects to run, in order. `now`: monotonic seconds (crashes are counted in a
    window of them); `wall`: the time of day (a failure's, for its cool-down)."""
    if isinstance(event, Launch):
        if life.state in RESIDENT_STATES:
            return life, []
        new = replace(life, state=LOADING, stopping=False, failed_at=None, crashes=())
        return new, [ClearError(), FreshReady(always=True), Announce(LOADING), Spawn(), StartChild()]
    if isinstance(event, Loaded):
        if life.stopping:  # a stop cancels the load: the stop answers the waiting requests
            return life, []
        return replace(life, state=READY), [Announce(READY), ResolveReady(), WatchChild()]
    if isinstance(event, LoadFailed):
        return _load_failed(life, event, now, wall)
    if isinstance(event, Exited):
        if life.stopping:
            return life, []
        if event.dead_workers:
            lost = ", ".join(event.dead_workers)
            why = f"rpc worker {lost} stopped answering; llama-server exited with code {event.code}"
            new = replace(life, state=LOADING, lost_workers=life.lost_workers + event.dead_workers)
            return new, [StopChild(), MarkLost(why), FreshReady(),
                         Announce(LOADING, {"reason": f"relaunching without {lost}"}), StartChild()]
        new = replace(life, state=RESTARTING)
        return new, [NoteChildren(), Announce(RESTARTING, {"reason": event.why, "crashes": len(life.crashes)}),
                     FreshReady(), AwaitSettle(event.why)]
    if isinstance(event, Settled):
        if event.broke == 1:
            # It died of one request: that one was answered 502 and is not sent again; the others queue for
            # the relaunch. Counted, one client could crash-loop a model for everyone.
            return replace(life, state=LOADING), [
                Warn(f"{life.name}: {event.why}, while serving one request (answered 502, not sent again); "
                     "relaunching, not counted toward the crash loop"),
                Announce(LOADING, {"reason": "relaunching after a request that ended the child"}), StartChild()]
        return _crashed(life, event.why, now, wall, [])
    if isinstance(event, RetryDue):
        return replace(life, state=LOADING), [Announce(LOADING), StartChild()]
    if isinstance(event, Stop):
        effects: list = []
        if life.state in RESIDENT_STATES:
            effects.append(Announce(STOPPING, {"reason": event.reason}))
        if life.state == READY:
            effects.append(SaveSlots(event.reason))
        effects += [CancelTask(), StopChild()]
        state = STOPPING if life.state in RESIDENT_STATES else life.state
        return replace(life, state=state, stopping=True), effects
    if isinstance(event, Stopped):
        done = ResolveReady(ServerError(f"model {life.name} was {event.reason} while loading", "send the request again"))
        if life.state == FAILED:
            return life, [done]
        return replace(life, state=STOPPED), [Announce(STOPPED, {"reason": event.reason}), done]
    raise TypeError(f"not a lifecycle event: {event!r}")


def _load_failed(life: Life, event: LoadFailed, now: float, wall: float) -> Step:
    exc = event.error
    if isinstance(exc, OutOfMemoryError):
        # Restarting would run out of memory again: reported with the plan that caused it.
        err = OutOfMemoryError(f"{exc.message} (plan: {event.plan})", exc.hint)
        return _failed(life, err, wall, [StopChild()])
    if isinstance(exc, (WorkerLostError, ModelFileError)):
        # The file's own fault (or a plan without the lost worker): every relaunch would fail the same way.
        # Failed at once (422 to the requests waiting), no crash counted, no back-off.
        return _failed(life, exc, wall, [StopChild()])
    if isinstance(exc, PortInUseError) and event.pinned_port:
        return _failed(life, exc, wall, [StopChild()])  # a pinned port that is taken stays taken
    if isinstance(exc, BostudioError):  # a crash; an unpinned port is picked afresh by the next launch
        return _crashed(life, str(exc), now, wall, [StopChild()])
    # A bug must not leave requests waiting forever.
    return _failed(life, ServerError(f"unexpected error while loading: {exc!r}", "see the daemon log"),
                   wall, [StopChild()])


def _failed(life: Life, error: BostudioError, wall: float, before: list) -> Step:
    return replace(life, state=FAILED, failed_at=wall), [*before, MarkFailed(error)]


def _crashed(life: Life, why: str, now: float, wall: float, before: list) -> Step:
    """Count a crash; after too many within the window the model is failed, else retried after a back-off."""
    crashes = tuple(t for t in life.crashes if now - t < CRASH_WINDOW_S) + (now,)
    life = replace(life, crashes=crashes)
    effects = [*before, NoteChildren()]
    if len(crashes) >= CRASH_LIMIT:
        return _failed(life, ServerError(
            f"{life.name} crashed {len(crashes)} times in {CRASH_WINDOW_S:.0f} s; last: {why}",
            f"see the log {life.log}; restart it with `bostudio up --daemon {life.name}`"), wall, effects)
    life = replace(life, state=RESTARTING)
    return life, [*effects, Announce(RESTARTING, {"reason": why, "crashes": len(crashes)}), FreshReady(),
                  Retry(life.backoff())]


# ------------------------------------------------------------------ what a request finds

SERVE, START, RETRY, WAIT, REFUSE_FILE, REFUSE = "serve", "start", "retry", "wait", "refuse-file", "refuse"


def on_request(life: Life, error_type: str | None, wall: float, cooldown: float) -> str:
    """What a request for the model does in `life`: serve at once, start it, retry a failed model whose
    cool-down is over (`cooldown` <= 0: never), wait for the load in progress, or refuse (a file's fault
    stays one: 422)."""
    if life.state == READY:
        return SERVE
    if life.state in (STOPPED, STOPPING):  # a stop in progress finishes first
        return START
    if life.state == FAILED:
        if cooled_down(life, wall, cooldown):
            return RETRY
        return REFUSE_FILE if error_type == ModelFileError.__name__ else REFUSE
    return WAIT


def cooled_down(life: Life, wall: float, cooldown: float) -> bool:
    return cooldown > 0 and life.failed_at is not None and wall - life.failed_at >= cooldown


# ------------------------------------------------------------------ across instances: room and idleness

@dataclass(frozen=True)
class View:
    """An instance as eviction and idle unloading see it."""

    name: str
    state: str
    bytes: int
    last_used: float  # monotonic
    active: int  # requests in flight


def evictions(views: list[View], name: str, need: int, budget: int) -> list[str] | None:
    """Which resident models to stop, least recently used first, so that `name` (needing `need` bytes) fits
    `budget`; a model with requests in flight, loading or restarting is never chosen. None: it cannot fit."""
    resident = [policy.Resident(v.name, v.bytes, v.last_used, busy=v.active > 0 or v.state != READY)
                for v in views if v.name != name and v.state in RESIDENT_STATES]
    return policy.choose_evictions(resident, need, budget)


def device_evictions(views: list[View], name: str, victims: list[str], on_device: dict[str, dict[str, int]],
                     need: dict[str, int], capacity: dict[str, int]) -> list[str] | None:
    """More models to stop, beyond `victims` (chosen by the memory budget), so that what `name` puts on each
    offload device fits there: `on_device[model][device]` is what a resident holds there, `need[device]` what
    `name` will, `capacity[device]` what the device holds. None: a device cannot make room."""
    resident = [policy.Resident(v.name, v.bytes, v.last_used, busy=v.active > 0 or v.state != READY)
                for v in views if v.name != name and v.name not in victims and v.state in RESIDENT_STATES]
    return policy.choose_device_evictions(resident, on_device, need, capacity)


def idle(views: list[View], now: float, ttl: float) -> list[str]:
    """The ready models idle (no request in flight) for longer than `ttl` seconds (ttl <= 0: never)."""
    resident = [policy.Resident(v.name, 0, v.last_used, busy=v.active > 0) for v in views if v.state == READY]
    return policy.idle_expired(resident, now, ttl)
