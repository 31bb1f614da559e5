"""The A/B runner: one llama-server per configuration, all from the same engine and model, started together;
the same prompt goes to every configuration in turn (A B A B ...), so machine drift hits every side alike.

I/O lives here (processes, HTTP); the figures are computed by `measure.summarise` (pure).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from bostudio import paths
from bostudio.bench.measure import OFF, Sample
from bostudio.bench.workloads import CONTEXT_QUESTION, Task, filler_code
from bostudio.catalog.resolve import model_name
from bostudio.engine.discover import Engine
from bostudio.errors import ConfigError, PortInUseError, ServerError
from bostudio.gguf import ModelInfo
from bostudio.launch import Decision, bench_intent, gather_and_decide
from bostudio.pairing.edge.pair import choose, make_self_draft
from bostudio.profiles import default_workload
from bostudio.runtime.client import LlamaClient
from bostudio.runtime.net import free_loopback_port
from bostudio.hardware.cpu import one_cpu_per_core, smt_siblings
from bostudio.runtime.process import ServerProcess, set_cpu_affinity
from bostudio.speculation import DRAFT_N_MAX, NGRAM_VARIANTS, SpecRequest, Speculator, parse_spec

if TYPE_CHECKING:
    from bostudio.bench.load import CompetingLoad

COMPLETION_TIMEOUT_S = 900.0  # one request on a loaded shared CPU can take minutes
CALIBRATION_TOKENS = 1024  # a prompt on which a server's own speed shows (4 turns in 5 of a session are longer)
CALIBRATION_SPREAD = 0.03  # servers doing the same work may differ this much in prefill speed, not more
CALIBRATION_TRIES = 3
READY_TIMEOUT_S = 600.0
PORT_TRIES = 3  # a server whose port another process took first is started again on another, this many times in all
DEFAULT_SELF_DRAFT = "Q2_K"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchConfig:
    """A configuration under test: its label (the JSON's `config`) and what llama-server runs."""

    label: str
    speculator: Speculator
    threads: str = "planned"  # planned (the plan's -t/-tb) | all (every core) | T | T/TB
    flash_attn: str = "planned"  # planned (the plan's -fa) | on | off

    @property
    def settings(self) -> tuple[str, str]:
        """The settings under test besides the speculator (--threads, --flash-attn): servers of different
        settings are meant to run at different speeds."""
        return self.threads, self.flash_attn

    @property
    def same_prefill(self) -> bool:
        """Whether its server does exactly off's work on a prompt (Speculator.same_prefill)."""
        return self.speculator.same_prefill


def parse_threads(value: str | None) -> list[str]:
    """--threads LIST: planned, all, T or T/TB settings (default: planned only)."""
    out = []
    for part in (value or "planned").split(","):
        p = part.strip()
        if not p:
            continue
        nums = p.split("/")
        if p not in ("planned", "all") and not (len(nums) <= 2 and all(n.isdigit() and int(n) > 0 for n in nums)):
            raise ConfigError(f"--threads value {part!r} is not planned, all, T or T/TB", "e.g. --threads planned,all")
        out.append(p)
    if len(set(out)) != len(out):
        raise ConfigError("a --threads setting is listed twice", "name each once")
    return out or ["planned"]


def parse_flash_attn(value: str | None) -> list[str]:
    """--flash-attn LIST: planned, on, off (default: planned only)."""
    out = [p.strip() for p in (value or "planned").split(",") if p.strip()]
    bad = [p for p in out if p not in ("planned", "on", "off")]
    if bad:
        raise ConfigError(f"--flash-attn value {bad[0]!r} is not planned, on or off", "e.g. --flash-attn on,off")
    if len(set(out)) != len(out):
        raise ConfigError("a --flash-attn setting is listed twice", "name each once")
    return out or ["planned"]


def threads_asked(setting: str, cores: int) -> tuple[int, int] | None:
    """A --threads setting as (-t, -tb) asked of the plan (None: planned; all: every one of `cores`)."""
    if setting == "planned":
        return None
    t, _, tb = (f"{cores}/{cores}" if setting == "all" else setting).partition("/")
    return int(t), int(tb or t)


def config_names(value: str | None, engine: Engine, info: ModelInfo) -> list[str]:
    """The --spec list; by default off, every n-gram variant the engine knows, and the model's MTP head."""
    if value:
        names = [v.strip() for v in value.split(",") if v.strip()]
    else:
        names = [v for v in NGRAM_VARIANTS if v in engine.spec_types]
        names += ["mtp"] if info.has_mtp and "draft-mtp" in engine.spec_types else []
    return [OFF] + [n for n in names if n not in (OFF, "none")]


def resolve_config(name: str, info: ModelInfo, engine: Engine, ctx: int, note: Progress) -> BenchConfig:
    """A --spec name to a configuration: off, an n-gram variant, auto[@WORKLOAD] (with the tuned profile, as
    `up --workload` runs it), ngram, mtp, self-draft[:QUANT], draft:PATH. Drafts go through the pairing's compatibility check, as for `bostudio up`."""
    if name == OFF:
        return BenchConfig(OFF, Speculator("none", reason="baseline"))
    if name in NGRAM_VARIANTS:
        if name not in engine.spec_types:
            raise ConfigError(f"this llama-server does not support --spec-type {name}",
                              "build the pinned engine with `bostudio engine build`")
        return BenchConfig(name, Speculator("ngram", (name,), reason=f"{name} with llama.cpp's defaults"))
    if name == "self-draft" or name.startswith("self-draft:"):
        quant = name.partition(":")[2] or DEFAULT_SELF_DRAFT
        path = make_self_draft(info.path, quant, engine, log=note)
        sp = choose(info, SpecRequest("draft", path), engine, ctx)[0].speculator
        return BenchConfig(f"self-draft:{quant}", replace(sp, n_max=sp.n_max or DRAFT_N_MAX))
    if name == "auto" or name.startswith("auto@"):
        # auto as `up` runs it: the tuned profile of the workload (after @, else the configured default)
        workload = _workload(name.partition("@")[2], info)
        sp = choose(info, SpecRequest("auto"), engine, ctx, workload=workload)[0].speculator
        return BenchConfig(f"auto@{workload}({sp.detail})", sp)
    request = parse_spec(name)
    sp = choose(info, request, engine, ctx)[0].speculator
    if request.mode == "draft":
        assert request.draft is not None
        return BenchConfig(f"draft-simple:{request.draft.name}", sp)
    return BenchConfig(sp.label, sp)


def _workload(named: str, info: ModelInfo) -> str:
    """The workload after `@` in a --spec name, else the model's configured default (as `up` uses)."""
    return named or default_workload(model_name(info.path))


def resolve_configs(name: str, info: ModelInfo, engine: Engine, ctx: int, note: Progress) -> list[BenchConfig]:
    """A --spec name to its configurations: one (resolve_config), or for `sweep@WORKLOAD[:N]` the N best
    (default 3) of that workload's tuned sweep, as the profile ranked them, so that `auto@WORKLOAD` runs beside
    the configurations it was chosen from, on the same fresh prompts."""
    if name != "sweep" and not name.startswith("sweep@"):
        return [resolve_config(name, info, engine, ctx, note)]
    from bostudio.profiles import find_profile, speculator_from_json

    workload, _, count = name.partition("@")[2].partition(":")
    workload = _workload(workload, info)
    try:
        n = int(count) if count else 3
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"--spec {name}: {count!r} is not a number of configurations", "e.g. sweep@code:3")
    found = find_profile(info.path, engine, workload)
    if found.profile is None or not found.profile.ranking:
        why = found.note or f"no profile of workload {workload!r} with a ranked sweep at {found.path}"
        raise ConfigError(f"--spec {name}: {why}", f"run `bostudio tune MODEL --workload {workload}` first")
    return [BenchConfig(f"sweep@{workload}#{i + 1}({m.label})",
                        speculator_from_json(m.speculator, f"tuned sweep of {workload}, #{i + 1}: {m.label}"))
            for i, m in enumerate(found.profile.ranking[:n])]


def bench_decision(info: ModelInfo, engine: Engine, ctx: int) -> Decision:
    """The launch decision every bench server shares: one slot (requests run one at a time), `ctx`
    tokens, speculation off in the plan (each side adds its own speculator). Raises PlanError."""
    return gather_and_decide(info, engine, bench_intent(ctx))


@dataclass
class _Server:
    config: BenchConfig
    proc: ServerProcess
    client: LlamaClient | None = None


def _stop(server: _Server) -> None:
    if server.client is not None:
        server.client.close()
    server.proc.stop()


class Bench:
    """The servers of one bench run. Use as a context manager: every server stops on exit."""

    def __init__(self, info: ModelInfo, engine: Engine, configs: Sequence[BenchConfig], ctx: int,
                 progress: Progress, cold_slots: Path | None = None, decision: Decision | None = None) -> None:
        labels = [c.label for c in configs]
        if len(set(labels)) != len(labels):
            raise ConfigError("a configuration is listed twice in --spec", "name each configuration once")
        self.info, self.engine, self.configs, self.ctx, self.progress = info, engine, configs, ctx, progress
        # The launch decision of the baseline (one slot, speculation off): every side runs its memory
        # plan (offload, cache types, -fit off, threads) with its own speculator, so only the speculator
        # (and, with --threads, the thread setting under test) differs. A caller that starts many benches
        # (tune, one per pass) makes it once (bench_decision) and passes it.
        # `cold_slots`: a session's passes each start cold (no host prompt cache: only a slot's own cache carries
        # a prefix from turn to turn), and the slots, saved in that directory, can be erased before each pass.
        self.decision = (decision or bench_decision(info, engine, ctx)).varied(cold_slots=cold_slots is not None)
        self.cold_slots = cold_slots
        self._decisions: dict[tuple[str, str], Decision] = {}
        planned = self.decision.plan.threads
        self.threads = planned  # the plan's CPU threads (None: cores unknown)
        self.cores = planned.cores if planned is not None else (os.cpu_count() or 1)
        self.servers: list[_Server] = []
        self.start_order: tuple[str, ...] = ()

    def decision_for(self, config: BenchConfig) -> Decision:
        """The shared decision with `config`'s settings under test (-fa, -t/-tb) asked of the plan."""
        if config.settings not in self._decisions:
            fa = None if config.flash_attn == "planned" else config.flash_attn
            self._decisions[config.settings] = self.decision.varied(
                flash_attn=fa, threads=threads_asked(config.threads, self.cores))
        return self._decisions[config.settings]

    def argv(self, config: BenchConfig, port: int) -> list[str]:
        return self.decision_for(config).argv(port=port, alias=model_name(self.info.path), slot_dir=self.cold_slots,
                                              speculator=config.speculator)

    def __enter__(self) -> "Bench":
        self._logdir = paths.logs_dir() / "bench" / str(os.getpid())  # concurrent benches keep their own logs
        self._starts = 0
        self.start_order = tuple(c.label for c in self.configs)
        self._start(list(range(len(self.configs))))
        return self

    def _start(self, order: Sequence[int]) -> None:
        """Start every configuration's server, in `order` (indices into the configurations); wait for all, warm
        each up. `servers` stays in the configurations' order. On failure every server is stopped."""
        self._starts += 1
        started = dict(enumerate(self.servers))  # a partial restart keeps the others
        try:
            for i in order:
                self._launch(i, started)
            for i in order:
                for attempt in range(PORT_TRIES):
                    try:
                        started[i].proc.wait_ready(timeout=READY_TIMEOUT_S)
                        break
                    except PortInUseError:
                        # another process took the port between its pick and llama-server's bind (seen: a
                        # restart's fifth server got the first's port before that one had bound it)
                        if attempt == PORT_TRIES - 1:
                            raise
                        started[i].proc.stop()
                        self._launch(i, started, again=attempt + 1)
            for s in (started[i] for i in order):
                s.client = LlamaClient(s.proc.base_url, timeout=httpx.Timeout(COMPLETION_TIMEOUT_S, connect=5.0),
                                       name=f"llama-server ({s.config.label})", log_path=s.proc.log_path)
                s.client.completion("def f():", 4, timeout=COMPLETION_TIMEOUT_S)  # warm-up: page in the weights
        except BaseException:
            self.__exit__()
            raise

    def _launch(self, i: int, started: dict[int, "_Server"], again: int = 0) -> None:
        """Start configuration `i`'s server on a free port that no other server of this bench was given (one that
        has not bound its port yet leaves it free to the OS's next pick)."""
        c = self.configs[i]
        port = free_loopback_port(avoid={s.proc.port for k, s in started.items() if k != i})
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in c.label)
        suffix = ("" if self._starts == 1 else f".{self._starts}") + (f"-port{again + 1}" if again else "")
        proc = ServerProcess(self.argv(c, port), port, self._logdir / f"{safe}{suffix}.log", env=self.engine.server_env())
        started[i] = _Server(c, proc)
        self.servers = [started[k] for k in sorted(started)]
        self.progress(f"starting llama-server for {c.label} (log: {proc.log_path})")
        proc.start()

    def restart(self, rotate: int) -> None:
        """Stop every server and start fresh ones, the start order rotated by `rotate`. Two servers with the same
        argv can differ by 20% in prefill speed for their whole life (measured here: the first started of five,
        every turn of a session; the lead: llama.cpp's `-fa auto` left some processes at `-fa on` speed and
        others at `-fa off` speed). Fresh servers for every pass keep that luck with one pass instead of one
        configuration."""
        self.__exit__()
        self.servers = []
        n = len(self.configs)
        order = [(i + rotate) % n for i in range(n)]
        self.start_order = tuple(self.configs[i].label for i in order)
        self._start(order)

    def prefill_rate(self, server: _Server, variant: int) -> float:
        """`server`'s prefill speed on CALIBRATION_TOKENS of the project's code (not cached), tokens a second."""
        assert server.client is not None
        t = server.client.completion(self.context_prompt(CALIBRATION_TOKENS, variant), 1,
                                     timeout=COMPLETION_TIMEOUT_S, what="a calibration prefill").get("timings") or {}
        ms = float(t.get("prompt_ms") or 0.0)
        return float(t.get("prompt_n") or 0) / ms * 1000 if ms > 0 else 0.0

    def even_out(self, tries: int = CALIBRATION_TRIES) -> dict:
        """Servers that do the same work on a prompt (BenchConfig.same_prefill) should prefill at the same speed;
        a process can be 10-20% off for its whole life (see restart). Measure each on the same prompt, every
        server held on the same cores; restart those more than CALIBRATION_SPREAD / 2 from the median of the
        servers with the same --threads and --flash-attn setting and measure again, up to `tries` times. A restarted server that is as fast as its predecessor (within
        CALIBRATION_SPREAD / 2) shows its configuration's own speed, not luck, and is not restarted again
        (ngram-mod prefilled 1,024 tokens 4-5% faster than off on every restart here). Returns the last
        measurement ({label: tok/s}), its spread and the configurations restarted. The caller pauses any
        competing load first."""
        idx = [i for i, c in enumerate(self.configs) if c.same_prefill]
        groups: dict[tuple[str, str], list[int]] = {}  # compared within a setting only (BenchConfig.settings)
        for i in idx:
            groups.setdefault(self.configs[i].settings, []).append(i)
        groups = {g: members for g, members in groups.items() if len(members) > 1}
        restarted: list[str] = []
        rates: dict[str, float] = {}
        steady: set[int] = set()  # restarted and as fast as before: the configuration's own speed, not luck
        for attempt in range(1, tries + 1):
            if len(idx) < 2:
                break
            before = rates
            rates = {self.configs[i].label: self.prefill_rate(self.servers[i], attempt) for i in idx}
            steady |= {i for i in idx if self.configs[i].label in restarted and before.get(self.configs[i].label)
                       and abs(rates[self.configs[i].label] / before[self.configs[i].label] - 1)
                       <= CALIBRATION_SPREAD / 2}
            slow_or_fast = []
            for members in groups.values():
                med = statistics.median(rates[self.configs[i].label] for i in members)
                slow_or_fast += [i for i in members if i not in steady and (
                    med <= 0 or abs(rates[self.configs[i].label] / med - 1) > CALIBRATION_SPREAD / 2)]
            slow_or_fast.sort()
            if not slow_or_fast or attempt == tries:
                break
            labels = [self.configs[i].label for i in slow_or_fast]
            self.progress(f"calibration {attempt}: prefill tok/s {', '.join(f'{k} {v:.0f}' for k, v in rates.items())}"
                          f"; restarting {', '.join(labels)} (more than {100 * CALIBRATION_SPREAD / 2:.1f}% from "
                          f"the median)")
            restarted += labels
            for i in slow_or_fast:
                _stop(self.servers[i])
            self._start(slow_or_fast)
            self.hold_cores(True)
        spreads = []
        for members in groups.values():  # the widest within one setting
            r = [rates[self.configs[i].label] for i in members]
            spreads += [max(r) / min(r) - 1] if min(r) > 0 else []
        spread = max(spreads) if spreads else None
        return {"prefill_tok_s": {k: round(v, 1) for k, v in rates.items()},
                "spread": None if spread is None else round(spread, 4), "restarted": restarted}

    def threads_of(self, config: BenchConfig) -> int:
        """The most CPU threads `config`'s server runs (its -t or -tb, whichever is larger: its plan's)."""
        t = self.decision_for(config).plan.threads
        return max(t.threads, t.threads_batch) if t is not None else self.cores

    def hold_cores(self, held: bool) -> list[int] | None:
        """With `held`: every server's threads on the same cores, one logical CPU per physical core from the end
        of this process's CPUs, as many as the most threads any configuration runs. The servers take turns, so
        none gets a core the others do not. Without: every CPU again (beside a competing load the kernel must be
        free to move a server away from it). Returns the cores held; None when nothing is held."""
        cpus: list[int] | None = None
        if held and hasattr(os, "sched_getaffinity"):
            allowed = sorted(os.sched_getaffinity(0))
            want = max((self.threads_of(c) for c in self.configs), default=len(allowed))
            picked = one_cpu_per_core(allowed, smt_siblings, want)
            cpus = picked if len(picked) < len(allowed) else None  # every CPU: nothing to hold
        pids = [s.proc.pid for s in self.servers if s.proc.pid is not None]
        done = [set_cpu_affinity(pid, set(cpus) if cpus else None) for pid in pids]
        if cpus and not (all(done) and all(sorted(os.sched_getaffinity(pid)) == cpus for pid in pids)):
            for pid in pids:  # the OS refused for one of them: hold none, rather than some
                set_cpu_affinity(pid, None)
            cpus = None
        return cpus

    def __exit__(self, *exc: object) -> None:
        for s in self.servers:
            _stop(s)

    def send(self, server: _Server, prompt: str | list[int], tokens: int) -> dict:
        assert server.client is not None
        # ignore_eos: a fixed output length, the same on every side of the comparison.
        result = server.client.completion(prompt, tokens, timeout=COMPLETION_TIMEOUT_S, what="a bench request",
                                          ignore_eos=True)
        timings = result.get("timings")
        if not isinstance(timings, dict):
            raise ServerError(f"llama-server ({server.config.label}) sent no timings",
                              f"see the log: {server.proc.log_path}")
        return timings

    def round(self, workload: str, ctx: int | None, prompt_id: int, prompt: str | list[int], tokens: int,
              step: Callable[[str, dict], None], rotate: int = 0) -> list[Sample]:
        """The same prompt to every configuration; the order rotates with `rotate` (A B, then B A ...).
        `prompt_id` pairs the samples of this prompt."""
        k = rotate % len(self.servers)
        order = self.servers[k:] + self.servers[:k]
        out = []
        for s in order:
            t = self.send(s, prompt, tokens)
            out.append(Sample.from_timings(workload, ctx, s.config.label, prompt_id, t))
            step(s.config.label, t)
        return out

    def context_prompt(self, length: int, variant: int) -> list[int]:
        """`length` tokens: real code (the project's own source) then a question about it."""
        client = self.servers[0].client
        assert client is not None
        question = client.tokenize(CONTEXT_QUESTION, add_special=False)
        text = filler_code(variant)[: max(4096, length * 6)]  # a code token is rarely more than 6 chars
        code = client.tokenize(text, add_special=True)
        keep = length - len(question)
        if keep <= 0 or len(code) < keep:
            raise ConfigError(f"cannot fill {length} tokens of context with the project's code",
                              "use a smaller --ctx value")
        return code[:keep] + question


def parse_ctx_list(value: str | None) -> list[int]:
    """`4k,16k,32768` -> [4096, 16384, 32768]."""
    if not value:
        return []
    out = []
    for part in value.split(","):
        p = part.strip().lower()
        try:
            n = int(float(p[:-1]) * 1024) if p.endswith("k") else int(p)
        except ValueError:
            raise ConfigError(f"--ctx value {part!r} is not a token count", "e.g. --ctx 4k,16k or --ctx 2048") from None
        if n < 256:
            raise ConfigError(f"--ctx {n} is too small for a context sweep", "use at least 256 tokens")
        out.append(n)
    return sorted(set(out))


@dataclass(frozen=True)
class Plan:
    """What one bench run does: workloads x runs, then the context sweep; `steps` for the progress bar."""

    workloads: dict[str, tuple[Task, ...]]
    runs: int
    ctx_sweep: tuple[int, ...]
    tokens: int | None  # overrides each task's own output length
    repeat: bool
    n_configs: int
    first_run: int = 0  # run r sends the prompts of variant first_run + r (0: every bench asks the same ones)

    @property
    def steps(self) -> int:
        per_run = sum(len(t) for t in self.workloads.values()) + len(self.ctx_sweep)
        return per_run * self.runs * self.n_configs


def run(bench: Bench, plan: Plan, progress: Callable[[int, int, str], None], load: "CompetingLoad | None" = None) -> list[Sample]:
    """Every round of `plan` on `bench`'s servers; progress(done, total, message) after each request. With a
    competing `load`, every prompt runs twice, alone (the load paused) and beside it (its samples under the
    workload `W+loadN`), the two alternating which goes first."""
    from bostudio.bench.load import loaded_name

    samples: list[Sample] = []
    done = 0
    phases = 2 if load is not None and load.n else 1
    steps = plan.steps * phases

    def stepper(what: str) -> Callable[[str, dict], None]:
        def step(label: str, t: dict) -> None:
            nonlocal done
            done += 1
            tok = float(t.get("predicted_per_second") or 0.0)
            progress(done, steps, f"{what} {label}: {tok:.1f} tok/s, "
                                  f"{t.get('draft_n_accepted', 0)}/{t.get('draft_n', 0)} accepted")
        return step

    def one(workload: str, ctx: int | None, pid: int, prompt: str | list[int], tokens: int, what: str) -> list[Sample]:
        if phases == 1:
            return bench.round(workload, ctx, pid, prompt, tokens, stepper(what), pid)
        assert load is not None
        out = []
        for loaded in ((False, True) if pid % 2 == 0 else (True, False)):
            load.resume() if loaded else load.pause()
            name = loaded_name(workload, load.n) if loaded else workload
            out += bench.round(name, ctx, pid, prompt, tokens, stepper(what + (" +load" if loaded else "")), pid)
        load.pause()
        return out

    prompt_id = 0
    for r in range(plan.runs):
        for name, tasks in plan.workloads.items():
            for j, task in enumerate(tasks):
                # tasks of one workload read different code
                variant = 0 if plan.repeat else plan.first_run + r + 31 * j
                tokens = plan.tokens or task.tokens
                what = f"run {r + 1}/{plan.runs} {name}/{task.name}"
                # the order rotates with every prompt, so that even one run does not always start with off
                samples += one(name, None, prompt_id, task.prompt(variant), tokens, what)
                prompt_id += 1
        for length in plan.ctx_sweep:
            tokens = plan.tokens or 64
            prompt = bench.context_prompt(length - tokens - 8, 0 if plan.repeat else plan.first_run + r)
            samples += one("context", length, prompt_id, prompt, tokens, f"run {r + 1}/{plan.runs} context {length}")
            prompt_id += 1
    return samples


def sweep_fits(info: ModelInfo, ctx_sweep: list[int], note: Progress) -> list[int]:
    """The sweep lengths the model can hold (its training context); larger ones are dropped with a note."""
    limit = info.n_ctx_train or max(ctx_sweep, default=0)
    kept = [c for c in ctx_sweep if c <= limit]
    for c in ctx_sweep:
        if c > limit:
            note(f"context {c} is beyond the model's training context ({limit}): left out of the sweep")
    return kept

