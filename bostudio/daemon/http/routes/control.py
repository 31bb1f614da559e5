"""The control API under /bostudio: the daemon, its devices and engines, the catalog, plans and pairings,
and the instances (start, stop, restart, speculation, stats). The CLI and the TUI use it through
bostudio/daemon/client.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from bostudio import __version__
from bostudio.daemon.http.router import error_response
from bostudio.daemon.modelpaths import check_spec
from bostudio.daemon.supervise.instance import Instance
from bostudio.daemon.supervise.supervisor import Supervisor, SupervisorOptions
from bostudio.errors import BostudioError, ModelError


@dataclass(frozen=True)
class DaemonInfo:
    host: str
    port: int
    require_token: bool
    started: float


class Answer(Exception):
    """A control-API answer with an error status and a body (instance state included); daemon/http/app.py
    answers it as it is."""

    def __init__(self, status: int, body: dict) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


# ---------------------------------------------------------------- request bodies (OpenAPI)

class StartRequest(BaseModel):
    model: str = Field(description="a model name (GET /v1/models) or a GGUF path on the daemon's machine")
    spec: str | None = Field(None, description="speculation: on | off | auto | ngram | mtp | draft:PATH")
    ctx: int | None = Field(None, ge=256, le=1 << 24,
                            description="context size in tokens (at most what the model was trained for)")
    cache_type: str | None = Field(None, max_length=16, description="KV cache type: f16, q8_0, q4_0, ...")
    port: int | None = Field(None, ge=1, le=65535, description="pin the child's loopback port (tests, debugging)")
    wait: bool = Field(True, description="answer when the model is ready (or failed)")
    workload: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$",
                                 description="the tuned profile auto uses (code, edit, chat...); a change "
                                             "relaunches a running instance")


class SpeculationRequest(BaseModel):
    mode: str = Field(description="on | off | auto | ngram | mtp | draft:PATH; relaunches a running instance")


def instance_or_404(sup: Supervisor, model: str) -> Instance:
    inst = sup.instances.get(model)
    if inst is None:
        raise ModelError(f"model {model!r} has no instance", "GET /bostudio/instances lists them")
    return inst


def add_routes(api: APIRouter, sup: Supervisor, options: SupervisorOptions, info: DaemonInfo) -> None:
    """The /bostudio control routes on `api`. GET /bostudio/instances/{model:path} comes last: the more
    specific instance routes (here, and routes/logs.py's, added before these) match first."""

    @api.get("/bostudio/status", tags=["control"], summary="The daemon: version, pid, address, uptime")
    async def status() -> dict:
        return {"version": __version__, "pid": os.getpid(), "host": info.host, "port": info.port,
                "require_token": info.require_token, "uptime_s": time.time() - info.started,
                "memory_budget_bytes": sup.budget(), "idle_ttl_s": options.idle_ttl,
                "prompt_store": sup.slot_store.usage() if sup.slot_store else None,
                "instances": {n: i.state for n, i in sup.instances.items()}}

    @api.get("/bostudio/devices", tags=["control"], summary="Devices the engine sees (plus host memory)")
    async def devices() -> dict:
        import psutil

        eng = await asyncio.to_thread(lambda: sup.engine)
        vm = psutil.virtual_memory()
        return {"engine": str(eng.path), "backends": list(eng.backends),
                "devices": [d.__dict__ for d in eng.devices],
                "host": {"total_bytes": vm.total, "available_bytes": vm.available, "cpus": os.cpu_count()}}

    @api.get("/bostudio/engine", tags=["control"], summary="The llama-server build in use")
    async def engine() -> dict:
        eng = await asyncio.to_thread(lambda: sup.engine)
        data = eng.to_json()
        data.pop("flags", None)
        return data

    @api.get("/bostudio/engines", tags=["control"],
             summary="Every llama-server found (built, LLAMA_SERVER, PATH): backends, spec types; `in_use` marks the daemon's")
    async def engines() -> dict:
        from bostudio.engine.discover import discover_engines

        found = await asyncio.to_thread(discover_engines)
        current = await asyncio.to_thread(lambda: sup.engine)
        return {"engines": [{"path": str(e.path), "source": e.source, "version": e.version,
                             "backends": list(e.backends), "spec_types": list(e.spec_types),
                             "devices": [d.name for d in e.devices], "problem": e.problem,
                             "in_use": e.path == current.path} for e in found]}

    @api.get("/bostudio/catalog", tags=["control"], summary="Models the daemon can serve, from their GGUF headers")
    async def catalog() -> dict:
        from bostudio.gguf import describe

        out = []
        for name, path in sorted(sup.catalog().items()):
            entry: dict[str, Any] = {"model": name, "path": str(path)}
            try:
                mi = await asyncio.to_thread(describe, path)  # headers are read in a worker (cached)
                entry.update(architecture=mi.architecture, n_params=mi.n_params, quant=mi.quant,
                             file_size=mi.file_size, n_ctx_train=mi.n_ctx_train, n_nextn=mi.n_nextn)
            except BostudioError as exc:
                entry["error"] = exc.message
            out.append(entry)
        return {"models": out}

    @api.get("/bostudio/plans/{model:path}", tags=["control"],
             summary="The launch plan for a model: speculator, memory per device and component, argv; "
                     "ctx, cache_type and spec ask what-if without changing anything")
    async def plan(model: str, ctx: int | None = Query(None, ge=256, le=1 << 24),
                   cache_type: str | None = Query(None, max_length=16),
                   spec: str | None = Query(None, max_length=4096)) -> dict:
        await asyncio.to_thread(check_spec, spec, options.allow_any_model_path)  # draft:FIFO never opened
        return await asyncio.to_thread(plan_for, model, ctx, cache_type, spec)

    def plan_for(model: str, ctx: int | None = None, cache_type: str | None = None, spec: str | None = None) -> dict:
        from bostudio.daemon.http.plans import plan_for as plan_of

        return plan_of(sup, model, ctx, cache_type, spec)

    @api.get("/bostudio/pairings/{model:path}", tags=["control"],
             summary="The speculator each mode would pair with a model; auto's candidates and why each was passed over")
    async def pairings(model: str) -> dict:
        from bostudio.gguf import describe
        from bostudio.pairing.edge.pair import choose
        from bostudio.speculation import parse_spec

        cfg = sup.config_for(model)
        mi = await asyncio.to_thread(describe, cfg.path)
        eng = await asyncio.to_thread(lambda: sup.engine)
        out: dict[str, Any] = {}
        candidates: list[dict] = []
        for mode in ("auto", "ngram", "mtp", "off"):
            try:
                sel = (await asyncio.to_thread(choose, mi, parse_spec(mode), eng, cfg.ctx or mi.n_ctx_train))[0]
                sp = sel.speculator
                out[mode] = {"speculation": sp.label, "kind": sp.kind, "reason": sp.reason}
                if mode == "auto":
                    candidates = [dict(c.to_json(), chosen=(i == sel.chosen)) for i, c in enumerate(sel.considered)]
            except BostudioError as exc:
                out[mode] = {"error": exc.message}
        return {"model": cfg.name, "modes": out, "candidates": candidates,
                "tokenizer": {"model": mi.tokenizer.model, "pre": mi.tokenizer.pre, "vocab_size": mi.tokenizer.vocab_size,
                              "fingerprint": mi.tokenizer.fingerprint}}

    @api.get("/bostudio/instances", tags=["control"], summary="Every instance the daemon knows, with live stats")
    async def instances() -> dict:
        return {"instances": [i.to_json() for i in sup.instances.values()]}

    async def settle(inst: Instance, wait: bool) -> dict:
        if wait and inst.ready is not None:
            try:
                await asyncio.wait_for(asyncio.shield(inst.ready), options.load_timeout)
            except (BostudioError, asyncio.TimeoutError) as exc:
                resp = error_response(exc)
                body = json.loads(bytes(resp.body))
                body["instance"] = inst.to_json()
                raise Answer(resp.status_code, body)
        return inst.to_json()

    @api.post("/bostudio/instances", tags=["control"], summary="Start (load) a model; waits until ready by default")
    async def start(req: StartRequest) -> dict:
        path = await asyncio.to_thread(sup.admit_start, req.model, req.ctx, req.spec)
        before = sup.configs.get(req.model)
        old_workload = before.workload if before else None
        cfg = sup.register(req.model, req.ctx, req.spec, req.port, path, req.cache_type, workload=req.workload)
        if req.workload is not None and req.workload != old_workload and cfg.name in sup.instances:
            return await settle(await sup.restart(cfg.name), req.wait)  # another workload, maybe another profile
        return await settle(await sup.start(cfg), req.wait)

    @api.post("/bostudio/instances/{model:path}/stop", tags=["control"], summary="Stop an instance (SIGTERM, then SIGKILL)")
    async def stop(model: str) -> dict:
        return (await sup.stop(model)).to_json()

    @api.post("/bostudio/instances/{model:path}/restart", tags=["control"], summary="Restart an instance")
    async def restart(model: str, wait: bool = True) -> dict:
        return await settle(await sup.restart(model), wait)

    @api.put("/bostudio/instances/{model:path}/speculation", tags=["control"],
             summary="Switch speculation on/off/auto for a model; relaunches it if it runs")
    async def speculation(model: str, req: SpeculationRequest, wait: bool = True) -> dict:
        # The same model-path and draft-path checks as a start, in a worker (stat, header reads).
        path = await asyncio.to_thread(sup.admit_start, model, None, req.mode)
        inst = await sup.set_speculation(model, req.mode, path)
        return await settle(inst, wait and inst.state != "stopped")

    @api.get("/bostudio/instances/{model:path}/stats", tags=["control"],
             summary="Live stats: tok/s, acceptance rate, mean accepted length")
    async def stats(model: str) -> dict:
        inst = instance_or_404(sup, model)
        return {"model": model, "state": inst.state, **inst.stats.to_json()}

    @api.post("/bostudio/shutdown", tags=["control"], summary="Stop every instance and the daemon")
    async def shutdown() -> dict:
        asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
        return {"stopping": True}

    # Last: `{model:path}` would also match .../stats, .../log and .../log/stream.
    @api.get("/bostudio/instances/{model:path}", tags=["control"], summary="One instance")
    async def instance(model: str) -> dict:
        return instance_or_404(sup, model).to_json()


__all__ = ["Answer", "DaemonInfo", "StartRequest", "SpeculationRequest", "instance_or_404", "add_routes"]
