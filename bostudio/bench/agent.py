"""`bench --workload agent|DIR`: whole agent sessions, turn by turn, through each configuration's llama-server.

Every configuration gets its own server (runner.Bench); turn k goes to every server before turn k+1, in an
order that rotates with k, so machine drift hits every side alike. Every pass gets fresh, calibrated servers,
held on the same cores when alone, and the JSON says how far their prefill speeds were apart on the same work.
Each server sees the session as an agent would send it: the same prefix, a conversation that grows, its own
prompt cache.

Per turn: first-token time (measured at the client, to the first generated text or tool call), prefill
tokens (evaluated vs taken from the cache: a cache hit), decode tok/s, drafted/accepted, wall time. Per
session and configuration: the totals (`session_totals`, pure), and the measured projection: the session's
wall time per configuration against off, instead of a decode speed multiplied by a token count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import httpx

from bostudio.bench.load import CompetingLoad
from bostudio.bench.measure import OFF
from bostudio.bench.runner import COMPLETION_TIMEOUT_S, Bench, _Server
from bostudio.bench.sessions import AGENT, MIN_PREFIX_TOKENS, Session, replay_request, resolve_session
from bostudio.runtime.metrics import parse_metrics
from bostudio.errors import ConfigError, ServerError

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class TurnResult:
    """One request of a session on one configuration."""

    session: str
    phase: str  # "alone", or "load N" beside a competing load
    config: str
    turn: int  # 1-based
    route: str
    request: str  # what the turn is: "turn K" (shipped) or the recorded file's name
    ttft_s: float | None  # first generated text or tool call, at the client; None: nothing was generated
    wall_s: float  # the whole request, at the client
    prompt_n: int  # prompt tokens evaluated (prefill)
    cache_n: int  # prompt tokens taken from the cache
    predicted_n: int  # tokens decoded
    decode_s: float  # time spent decoding (llama-server's predicted_ms)
    prefill_s: float  # time spent on the prompt (prompt_ms)
    drafted: int
    accepted: int

    @property
    def cache_hit(self) -> bool:
        return self.cache_n > 0

    @property
    def decode_tok_s(self) -> float | None:
        return self.predicted_n / self.decode_s if self.decode_s > 0 else None

    def to_json(self) -> dict:
        return {**asdict(self), "cache_hit": self.cache_hit, "decode_tok_s": self.decode_tok_s}


TOTAL_FIELDS = ("wall_s", "ttft_s", "prompt_n", "cache_n", "predicted_n", "decode_s", "prefill_s", "drafted",
                "accepted")


def session_totals(turns: Sequence[TurnResult]) -> dict:
    """The sums over a session's turns (first-token times of turns that generated nothing count 0), the
    session's decode tok/s (tokens over decode time), acceptance and the cache hits."""
    out: dict = {f: sum((getattr(t, f) or 0) for t in turns) for f in TOTAL_FIELDS}
    out["turns"] = len(turns)
    out["cache_hits"] = sum(1 for t in turns if t.cache_hit)
    out["decode_tok_s"] = out["predicted_n"] / out["decode_s"] if out["decode_s"] > 0 else None
    out["acceptance"] = out["accepted"] / out["drafted"] if out["drafted"] else None
    return out


def projection(sessions: Sequence[dict], baseline: str = OFF) -> dict:
    """The seeds' claim measured: per session and phase, each configuration's session wall time, its ratio to
    off and the seconds it saves (or costs) on the whole session; under "all", the same over every session
    (their wall times added)."""
    out: dict = {}
    groups: dict[tuple[str, str], dict[str, float]] = {}
    for s in sessions:
        groups.setdefault((s["session"], s["phase"]), {})[s["config"]] = s["totals"]["wall_s"]
        whole = groups.setdefault(("all", s["phase"]), {})
        whole[s["config"]] = whole.get(s["config"], 0.0) + s["totals"]["wall_s"]
    for (session, phase), rows in groups.items():
        base = rows.get(baseline)
        out.setdefault(session, {})[phase] = {
            c: {"wall_s": w, "vs_off": (w / base) if base else None,
                "saved_s": (base - w) if base is not None else None} for c, w in rows.items()}
    return out


CTX_MARGIN = 1024
FIT_TRIES = 8
CHARS_PER_TOKEN_LOW = 3.0  # below what code and prose take on the tokenizers seen (3.3-4.3): an overestimate


def _text_chars(value: object) -> int:
    """Characters of every string in a request body (keys included), unescaped: what a template renders."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + _text_chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    return len(str(value))


def _needed(session: Session, tokens: int) -> int:
    """Tokens the session's longest request needs with its output, overestimated (CHARS_PER_TOKEN_LOW), plus
    the margin. Measured on the shipped session's last turn: 32,434 real tokens, estimated 35,900."""
    longest = max(_text_chars(r.body) for r in session.requests)
    return int(longest / CHARS_PER_TOKEN_LOW) + tokens + CTX_MARGIN


def fitted_session(name: str, prefix_tokens: int, turns: int, variant: int, tokens: int,
                   n_ctx_train: int | None, note: Callable[[str], None]) -> Session:
    """The session `name` (resolve_session), the shipped one with its system prompt shortened until its last
    request fits the model's training context: an agent compacts before it overflows, and a turn the model
    cannot hold would fail mid-bench (18k tokens + 12 turns reached 33k on the embedded 32k model). A
    recorded session is replayed as it was."""
    session = resolve_session(name, prefix_tokens, turns, variant)
    if name != AGENT or not n_ctx_train:
        return session
    prefix = prefix_tokens
    for _ in range(FIT_TRIES):
        over = _needed(session, tokens) - n_ctx_train
        if over <= 0:
            break
        if prefix <= MIN_PREFIX_TOKENS:
            raise ConfigError(f"{turns} turns of the agent session do not fit the model's {n_ctx_train}-token "
                              f"context even with the shortest system prompt", "pass fewer --session-turns")
        prefix = max(MIN_PREFIX_TOKENS, prefix - over)  # a prefix token is ~3.4 characters: this overshoots
        session = resolve_session(name, prefix, turns, variant)
    if prefix != prefix_tokens:
        which = f"pass {variant + 1}" if variant >= 0 else f"tune's pass {-variant}"
        note(f"agent session ({which}): system prompt cut from {prefix_tokens} to {prefix} tokens so "
             f"that its last turn fits the model's {n_ctx_train}-token context")
    return session


def session_ctx(sessions: Sequence[Session], tokens: int, n_ctx_train: int | None,
                note: Callable[[str], None]) -> int:
    """The servers' context for these sessions: the longest request (overestimated: `_needed`) plus the
    output, in whole 1024s, at most the training context."""
    ctx = -(-max(_needed(s, tokens) for s in sessions) // 1024) * 1024
    limit = n_ctx_train or ctx
    if ctx > limit:
        note(f"the longest request needs about {ctx} tokens, more than the model's {limit}: the servers run at "
             f"{limit} (a longer request fails)")
    return min(ctx, limit)


# ------------------------------------------------------------------------------------------------ the edge

_GENERATED = ("content_block_delta", "response.output_text.delta", "response.function_call_arguments.delta",
              "response.reasoning_text.delta")


def _generated(event: dict) -> bool:
    """Whether a streamed event carries generated text or a tool call (not a role or a start marker)."""
    if event.get("type") in _GENERATED:
        return True
    for c in event.get("choices") or ():
        d = c.get("delta") or {}
        if d.get("content") or d.get("reasoning_content") or d.get("tool_calls") or c.get("text"):
            return True
    return bool(event.get("content"))  # /completion


def _metrics(server: _Server) -> dict[str, float]:
    assert server.client is not None
    return parse_metrics(server.client.metrics())


def send_turn(server: _Server, route: str, body: dict) -> tuple[float | None, float, dict]:
    """Stream one request; (first-token s, wall s, timings). llama-server puts `timings` on the last event of
    the OpenAI routes; the Anthropic route has none, so its figures come from /metrics (the deltas of this one
    request: the bench sends one at a time)."""
    assert server.client is not None
    before = None if route != "/v1/messages" else _metrics(server)
    started = time.monotonic()
    first = None
    timings = None
    try:
        # Connection: close - llama-server may close a kept-alive connection after a streamed response, and a
        # request sent on it then fails without an answer.
        with server.client.http.stream("POST", route, json=body, headers={"Connection": "close"},
                                       timeout=httpx.Timeout(COMPLETION_TIMEOUT_S, connect=5.0)) as r:
            if r.status_code != 200:
                r.read()
                raise ServerError(f"llama-server ({server.config.label}) answered {r.status_code} to {route}: "
                                  f"{r.text[:500]}", f"see the log: {server.proc.log_path}")
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                try:
                    event = json.loads(line[5:])
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if first is None and _generated(event):
                    first = time.monotonic() - started
                if isinstance(event.get("timings"), dict):
                    timings = event["timings"]
    except httpx.HTTPError as exc:
        raise ServerError(f"llama-server ({server.config.label}) failed a session request on {route}: {exc}",
                          f"see the log: {server.proc.log_path}") from exc
    wall = time.monotonic() - started
    if timings is None:
        after = _metrics(server)
        b = before or {}

        def d(name: str) -> float:
            return after.get(name, 0.0) - b.get(name, 0.0)
        timings = {"prompt_n": int(d("prompt_tokens_total")), "prompt_ms": 1000 * d("prompt_seconds_total"),
                   "predicted_n": int(d("tokens_predicted_total")),
                   "predicted_ms": 1000 * d("tokens_predicted_seconds_total"),
                   "cache_n": int(d("prompt_tokens_cached_total")),
                   "draft_n": int(d("spec_decode_num_draft_tokens_total")),
                   "draft_n_accepted": int(d("spec_decode_num_accepted_tokens_total"))}
    return first, wall, timings


def turn_result(session: str, phase: str, config: str, turn: int, route: str, request: str, first: float | None,
                wall: float, t: dict) -> TurnResult:
    return TurnResult(session, phase, config, turn, route, request, first, wall, int(t.get("prompt_n") or 0),
                      int(t.get("cache_n") or 0), int(t.get("predicted_n") or 0),
                      float(t.get("predicted_ms") or 0.0) / 1000, float(t.get("prompt_ms") or 0.0) / 1000,
                      int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0))


def erase_slots(server: _Server) -> None:
    """Forget every slot's prompt, so that the next pass of a session starts cold like the first."""
    assert server.client is not None
    for s in server.client.slots():
        r = server.client.http.post(f"/slots/{s['id']}", params={"action": "erase"})
        if r.status_code != 200:
            raise ServerError(f"llama-server ({server.config.label}) could not erase slot {s['id']}: {r.text[:300]}",
                              f"see the log: {server.proc.log_path}")


@dataclass(frozen=True)
class PassInfo:
    """How one pass (a session in one phase) ran: which servers, started in which order, on which cores."""

    session: str
    phase: str
    start_order: tuple[str, ...]  # the configurations, in the order their (fresh) servers were started
    cores: tuple[int, ...] | None  # the CPUs every server was held on; None: not held (beside a load, or all)
    calibration: dict  # Bench.even_out: the servers' prefill speeds before the pass, and those restarted


def run_sessions(bench: Bench, sessions: Sequence[Session], tokens: int, load: CompetingLoad | None,
                 progress: Progress, more: Callable[[int], bool] | None = None) -> tuple[list[TurnResult], list[PassInfo]]:
    """Every session on every configuration, turn by turn, interleaved; with a competing load each session
    runs twice, alone and beside the load (the phases alternate which goes first).

    Every pass starts cold on fresh servers (the first on the bench's own, then restarted with the start order
    rotated), so that a server's own speed stays with one pass, not one configuration; before the pass, servers
    that should prefill alike but do not are restarted (Bench.even_out). Alone, every server is held on the
    same cores (Bench.hold_cores); beside the load, none is.

    `more(done)`, when given, is asked before each turn of a pass with the number of turns every server has done
    in it; False ends the pass there (tune's screen: a slice of the session, as long as its budget allows)."""
    phases = ["alone"] + ([f"load {load.n}"] if load is not None and load.n else [])
    total = sum(len(s.requests) for s in sessions) * len(bench.servers) * len(phases)
    done = 0
    out: list[TurnResult] = []
    passes: list[PassInfo] = []
    for si, session in enumerate(sessions):
        order = phases if si % 2 == 0 else phases[::-1]
        for phase in order:
            if load is not None:
                load.pause()
            if passes:
                progress(done, total, f"{session.name} {phase}: fresh servers for this pass")
                bench.restart(len(passes))
            bench.hold_cores(True)
            progress(done, total, f"{session.name} {phase}: calibrating the servers' prefill")
            calibration = bench.even_out()  # alone and held, whatever the phase: a fair measurement
            if load is not None and phase != "alone":
                load.resume()
            cores = bench.hold_cores(phase == "alone")
            for s in bench.servers:
                erase_slots(s)  # the warm-up's and the calibration's prompts
            passes.append(PassInfo(session.name, phase, bench.start_order, tuple(cores) if cores else None,
                                   calibration))
            for k, req in enumerate(session.requests):
                if more is not None and not more(k):
                    progress(done, total, f"{session.name} {phase}: the pass ends after {k} of "
                                          f"{len(session.requests)} turns")
                    break
                r = k % len(bench.servers)
                for server in bench.servers[r:] + bench.servers[:r]:
                    route, body = replay_request(req, server.config.label, tokens)
                    first, wall, t = send_turn(server, route, body)
                    res = turn_result(session.name, phase, server.config.label, k + 1, req.route, req.note,
                                      first, wall, t)
                    out.append(res)
                    done += 1
                    progress(done, total, f"{session.name} {phase} turn {k + 1}/{len(session.requests)} "
                                          f"{server.config.label}: first token {_s(res.ttft_s)}, "
                                          f"{res.prompt_n} prefilled + {res.cache_n} cached, "
                                          f"{_f(res.decode_tok_s)} tok/s, {res.wall_s:.1f} s")
    if load is not None:
        load.pause()
    return out, passes


SPREAD_MIN_PROMPT = 256  # turns with fewer prompt tokens are mostly overhead, not prefill speed


def prefill_spread(turns: Sequence[TurnResult], same_prefill: Sequence[str]) -> dict | None:
    """How far apart the servers of one pass ran on the same prefill work: each configuration's prefill speed
    (tokens over seconds, turns of SPREAD_MIN_PROMPT tokens or more) among `same_prefill` (those whose
    speculator does no work of its own on the prompt: off and the n-gram ones), and max/min - 1. That is the
    noise under any comparison of the pass's wall times. None with fewer than two such configurations."""
    rates: dict[str, float] = {}
    for c in same_prefill:
        ts = [t for t in turns if t.config == c and t.prompt_n >= SPREAD_MIN_PROMPT and t.prefill_s > 0]
        if ts:
            rates[c] = sum(t.prompt_n for t in ts) / sum(t.prefill_s for t in ts)
    if len(rates) < 2:
        return None
    return {"prefill_tok_s": {c: round(v, 1) for c, v in rates.items()},
            "spread": round(max(rates.values()) / min(rates.values()) - 1, 4)}


def passes_json(passes: Sequence[PassInfo], turns: Sequence[TurnResult], same_prefill: Sequence[str]) -> list[dict]:
    """Per pass: its start order, the cores held and the prefill spread between its servers."""
    return [{**asdict(p), "cores": list(p.cores) if p.cores else None, "start_order": list(p.start_order),
             "prefill": prefill_spread([t for t in turns if t.session == p.session and t.phase == p.phase],
                                       same_prefill)} for p in passes]


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def sessions_json(turns: Sequence[TurnResult]) -> list[dict]:
    """One entry per (session, phase, config): its turns in order and their totals."""
    groups: dict[tuple[str, str, str], list[TurnResult]] = {}
    for t in turns:
        groups.setdefault((t.session, t.phase, t.config), []).append(t)
    return [{"session": s, "phase": p, "config": c, "turns": [t.to_json() for t in ts], "totals": session_totals(ts)}
            for (s, p, c), ts in groups.items()]


def table(doc: dict) -> str:
    """The terminal table: per session, phase and configuration, the totals and the ratio to off."""
    head = (f"{'session':<12} {'phase':<8} {'config':<26} {'wall s':>8} {'vs off':>7} {'1st tok s':>9} "
            f"{'prefill':>8} {'cached':>8} {'hits':>5} {'tok/s':>7} {'accept':>7}")
    lines = [head, "-" * len(head)]
    proj = doc.get("projection", {})
    for s in doc["sessions"]:
        t = s["totals"]
        vs = proj.get(s["session"], {}).get(s["phase"], {}).get(s["config"], {}).get("vs_off")
        lines.append(f"{s['session'][:12]:<12} {s['phase'][:8]:<8} {s['config'][:26]:<26} {t['wall_s']:8.1f} "
                     f"{'-' if vs is None else format(vs, '.2f') + 'x':>7} {t['ttft_s']:9.2f} {t['prompt_n']:8d} "
                     f"{t['cache_n']:8d} {t['cache_hits']:>2}/{t['turns']:<2} {_f(t['decode_tok_s']):>7} "
                     f"{'-' if t['acceptance'] is None else format(100 * t['acceptance'], '.0f') + '%':>7}")
    return "\n".join(lines)


def plot(doc: dict, out, title: str):  # type: ignore[no-untyped-def]
    """Session wall time per configuration (stacked: prefill, decode, the rest) and per-turn wall time."""
    from pathlib import Path

    from bostudio.errors import ConfigError
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib, which is not installed",
                          "pip install 'bostudio[plot]' (or pip install matplotlib)") from exc
    out = Path(out)
    sessions = doc["sessions"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{s['session']} {s['phase']}\n{s['config']}" for s in sessions]
    pre = [s["totals"]["prefill_s"] for s in sessions]
    dec = [s["totals"]["decode_s"] for s in sessions]
    rest = [max(0.0, s["totals"]["wall_s"] - p - d) for s, p, d in zip(sessions, pre, dec)]
    xs = range(len(sessions))
    a.bar(xs, pre, label="prefill")
    a.bar(xs, dec, bottom=pre, label="decode")
    a.bar(xs, rest, bottom=[p + d for p, d in zip(pre, dec)], label="other")
    a.set_xticks(list(xs), labels, rotation=35, ha="right", fontsize=7)
    a.set_ylabel("session wall time (s)")
    a.set_title("whole session, measured")
    a.legend(fontsize=7)
    for s in sessions:
        b.plot([t["turn"] for t in s["turns"]], [t["wall_s"] for t in s["turns"]], marker="o",
               label=f"{s['session']} {s['phase']}: {s['config']}")
    b.set_xlabel("turn")
    b.set_ylabel("wall time per turn (s)")
    b.set_title("turn by turn")
    b.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out
