"""The daemon's ASGI app: the OpenAI-compatible router under /v1 and the control API under /bostudio.
FastAPI gives the OpenAPI schema (GET /openapi.json); streams pass through unbuffered."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from bostudio import __version__
from bostudio.daemon.events import EventBus
from bostudio.daemon.ollama import register as register_ollama
from bostudio.daemon.router import SSE_HEADERS, Router, api_error, error_response, sse
from bostudio.daemon.security import SecurityMiddleware
from bostudio.daemon.supervisor import READY, Instance, Supervisor, SupervisorOptions
from bostudio.errors import BostudioError, ModelError
from bostudio.runtime.process import tail

log = logging.getLogger("bostudio.daemon")


@dataclass(frozen=True)
class DaemonInfo:
    host: str
    port: int
    require_token: bool
    started: float


def openai_error(status: int, message: str, type_: str, hint: str = "", code: str | None = None) -> JSONResponse:
    return api_error("openai", status, message, type_, hint, code)


# Every llama-server API the router passes through, routed by the body's `model`:
# (path, error shape, OpenAPI tag, summary). Streams pass unbuffered; a model that cannot serve a
# route is refused with 400 before launch (bostudio/daemon/capabilities.py).
PASSTHROUGH_ROUTES = (
    ("/v1/chat/completions", "openai", "openai", "Chat completion"),
    ("/v1/completions", "openai", "openai", "Text completion"),
    ("/v1/chat/completions/input_tokens", "openai", "openai", "Count a chat request's prompt tokens"),
    ("/v1/responses", "openai", "openai", "OpenAI Responses API"),
    ("/v1/responses/input_tokens", "openai", "openai", "Count a Responses request's input tokens"),
    ("/v1/embeddings", "openai", "openai", "Embeddings (embedding models only)"),
    ("/v1/rerank", "openai", "llama.cpp", "Rerank documents against a query (rerank models only)"),
    ("/v1/messages", "anthropic", "anthropic", "Anthropic Messages API"),
    ("/v1/messages/count_tokens", "anthropic", "anthropic", "Anthropic token counting"),
    ("/infill", "openai", "llama.cpp", "Fill-in-the-middle code completion (models with FIM tokens)"),
    ("/tokenize", "openai", "llama.cpp", "Text to tokens"),
    ("/detokenize", "openai", "llama.cpp", "Tokens to text"),
    ("/apply-template", "openai", "llama.cpp", "Render the chat template (in llama-server, sandboxed)"),
)


# ---------------------------------------------------------------- request bodies (OpenAPI)

class StartRequest(BaseModel):
    model: str = Field(description="a model name (GET /v1/models) or a GGUF path on the daemon's machine")
    spec: str | None = Field(None, description="speculation: on | off | auto | ngram | mtp | draft:PATH")
    ctx: int | None = Field(None, ge=256, description="context size in tokens")
    cache_type: str | None = Field(None, max_length=16, description="KV cache type: f16, q8_0, q4_0, ...")
    port: int | None = Field(None, ge=1, le=65535, description="pin the child's loopback port (tests, debugging)")
    wait: bool = Field(True, description="answer when the model is ready (or failed)")
    workload: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$",
                                 description="the tuned profile auto uses (code, edit, chat...); a change "
                                             "relaunches a running instance")


class SpeculationRequest(BaseModel):
    mode: str = Field(description="on | off | auto | ngram | mtp | draft:PATH; relaunches a running instance")


def build_app(options: SupervisorOptions, info: DaemonInfo, hosts: frozenset[str], token: str | None,
              on_children=lambda children: None) -> FastAPI:
    bus = EventBus()
    sup = Supervisor(options, bus, on_children)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sup.start_background()
        bus.publish("daemon", state="started", pid=os.getpid())
        try:
            yield
        finally:
            bus.publish("daemon", state="stopping")
            await sup.shutdown()

    app = FastAPI(title="bostudio daemon", version=__version__, lifespan=lifespan, docs_url=None,
                  redoc_url=None,
                  description="One OpenAI-compatible endpoint (/v1) in front of supervised llama-server "
                              "instances, and a control API (/bostudio) for the CLI, the TUI and tools.")
    app.state.supervisor = sup
    app.state.bus = bus

    @app.exception_handler(BostudioError)
    async def _bostudio_error(request: Request, exc: BostudioError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return openai_error(400, f"invalid request: {exc.errors()}", "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return openai_error(exc.status_code, str(exc.detail), kind)

    # ------------------------------------------------------------ the model router (every API)

    router = Router(sup, options.stream_idle_timeout, options.max_body)
    app.state.router = router

    def passthrough_route(path: str, api: str, tag: str, summary: str) -> None:
        async def handler(request: Request) -> Response:
            return await router.forward(request, path, api)

        handler.__name__ = "route_" + path.strip("/").replace("/", "_").replace("-", "_")
        app.post(path, tags=[tag], summary=summary)(handler)

    for path, api, tag, summary in PASSTHROUGH_ROUTES:
        passthrough_route(path, api, tag, summary)
    register_ollama(app, sup, router)

    def model_entry(name: str, path) -> dict:
        inst = sup.instances.get(name)
        try:
            created = int(path.stat().st_mtime)
        except OSError:
            created = 0
        return {"id": name, "object": "model", "created": created, "owned_by": "bostudio",
                "state": inst.state if inst else "stopped"}

    @app.get("/v1/models", tags=["openai"], summary="Every model the router serves, loaded or not")
    async def models() -> dict:
        return {"object": "list", "data": [model_entry(n, p) for n, p in sorted(sup.catalog().items())]}

    @app.get("/v1/models/{model}", tags=["openai"], summary="One model")
    async def model(model: str) -> dict:
        path = sup.catalog().get(model)
        if path is None:
            raise ModelError(f"model {model!r} does not exist", "GET /v1/models lists the models")
        return model_entry(model, path)

    # ------------------------------------------------------------ control API

    @app.get("/bostudio/status", tags=["control"], summary="The daemon: version, pid, address, uptime")
    async def status() -> dict:
        return {"version": __version__, "pid": os.getpid(), "host": info.host, "port": info.port,
                "require_token": info.require_token, "uptime_s": time.time() - info.started,
                "memory_budget_bytes": sup.budget(), "idle_ttl_s": options.idle_ttl,
                "prompt_store": sup.slot_store.usage() if sup.slot_store else None,
                "instances": {n: i.state for n, i in sup.instances.items()}}

    @app.get("/bostudio/devices", tags=["control"], summary="Devices the engine sees (plus host memory)")
    async def devices() -> dict:
        import psutil

        eng = await asyncio.to_thread(lambda: sup.engine)
        vm = psutil.virtual_memory()
        return {"engine": str(eng.path), "backends": list(eng.backends),
                "devices": [d.__dict__ for d in eng.devices],
                "host": {"total_bytes": vm.total, "available_bytes": vm.available, "cpus": os.cpu_count()}}

    @app.get("/bostudio/engine", tags=["control"], summary="The llama-server build in use")
    async def engine() -> dict:
        eng = await asyncio.to_thread(lambda: sup.engine)
        data = eng.to_json()
        data.pop("flags", None)
        return data

    @app.get("/bostudio/engines", tags=["control"],
             summary="Every llama-server found (built, LLAMA_SERVER, PATH): backends, spec types; `in_use` marks the daemon's")
    async def engines() -> dict:
        from bostudio.engine.discover import discover_engines

        found = await asyncio.to_thread(discover_engines)
        current = await asyncio.to_thread(lambda: sup.engine)
        return {"engines": [{"path": str(e.path), "source": e.source, "version": e.version,
                             "backends": list(e.backends), "spec_types": list(e.spec_types),
                             "devices": [d.name for d in e.devices], "problem": e.problem,
                             "in_use": e.path == current.path} for e in found]}

    @app.get("/bostudio/catalog", tags=["control"], summary="Models the daemon can serve, from their GGUF headers")
    async def catalog() -> dict:
        from bostudio.gguf import describe

        out = []
        for name, path in sorted(sup.catalog().items()):
            entry: dict[str, Any] = {"model": name, "path": str(path)}
            try:
                mi = describe(path)
                entry.update(architecture=mi.architecture, n_params=mi.n_params, quant=mi.quant,
                             file_size=mi.file_size, n_ctx_train=mi.n_ctx_train, n_nextn=mi.n_nextn)
            except BostudioError as exc:
                entry["error"] = exc.message
            out.append(entry)
        return {"models": out}

    @app.get("/bostudio/plans/{model}", tags=["control"],
             summary="The launch plan for a model: speculator, memory per device and component, argv; "
                     "ctx, cache_type and spec ask what-if without changing anything")
    async def plan(model: str, ctx: int | None = Query(None, ge=256, le=1 << 24),
                   cache_type: str | None = Query(None, max_length=16),
                   spec: str | None = Query(None, max_length=4096)) -> dict:
        return await asyncio.to_thread(plan_for, model, ctx, cache_type, spec)

    def plan_for(model: str, ctx: int | None = None, cache_type: str | None = None, spec: str | None = None) -> dict:
        from dataclasses import replace

        from bostudio.daemon.capabilities import model_caps
        from bostudio.daemon.supervisor import child_argv, plan_view
        from bostudio.gguf import describe
        from bostudio.planner.memory import cache_type as check_cache_type
        from bostudio.planner.pool import placement_lines
        from bostudio.planner.render import option_bars
        from bostudio.speculation import parse_spec

        cfg = sup.config_for(model)
        ctx = ctx or cfg.ctx
        ctype = cache_type or cfg.cache_type
        check_cache_type(ctype)
        mode = spec or cfg.spec
        parse_spec("auto" if mode == "on" else mode)
        eng = sup.engine
        info = describe(cfg.path)
        caps = model_caps(cfg.path)
        workload = cfg.resolved_workload()
        pool = sup.view_pool(cfg.name)
        planned, refused = plan_view(info, mode, eng, ctx, ctype, workload,
                                     cfg.fallback(workload) if mode == cfg.spec else None,
                                     prompt_reuse=sup.slot_store is not None, caps=caps, pool=pool)
        o = planned.chosen
        sp = o.speculator
        argv = child_argv(eng, replace(cfg, ctx=ctx, cache_type=ctype), planned, caps, 0,
                          sup.slot_store.root if sup.slot_store else None, pool)
        out: dict[str, Any] = {
            "model": cfg.name, "kind": caps.kind, "ctx": ctx, "cache_type": ctype, "spec_mode": mode, "speculation": sp.label,
            "reason": sp.reason, "bytes": o.total, "fits": refused is None,
            "not_fit_reason": refused or "", "why": planned.why,
            "cost_line": planned.cost_line, "spec_cost_bytes": planned.spec_cost_bytes,
            "spec_cost_tokens": planned.spec_cost_tokens, "n_ctx_train": info.n_ctx_train,
            "bars": option_bars(o),
            "uses": [{"device": u.device, "component": u.component, "bytes": u.bytes} for u in o.uses],
            "budget_bytes": sup.budget(), "argv": argv, "would_fit": [],
            "chat_template": caps.template.to_json(),  # issue21: the template it is served with
            # with RPC workers: where each part lives and why, and the workers that could not be used
            "placement": placement_lines(planned) if pool.devices else [], "rpc_problems": list(pool.problems)}
        if refused is not None:  # what would make it fit, one change at a time (the planner's answer)
            from bostudio.planner import what_would_fit

            draft = describe(sp.draft) if sp.draft else None
            out["would_fit"] = [{"change": f.change, "ctx": f.option.n_ctx, "cache_type": f.intent.cache_type_k,
                                 "speculation": f.option.speculator.label, "bytes": f.option.total}
                                for f in what_would_fit(info, planned.devices, planned.intent, sp, draft)]
        return out

    @app.get("/bostudio/pairings/{model}", tags=["control"],
             summary="The speculator each mode would pair with a model; auto's candidates and why each was passed over")
    async def pairings(model: str) -> dict:
        from bostudio.gguf import describe
        from bostudio.pairing.pair import choose
        from bostudio.speculation import parse_spec

        cfg = sup.config_for(model)
        mi = await asyncio.to_thread(describe, cfg.path)
        eng = await asyncio.to_thread(lambda: sup.engine)
        out: dict[str, Any] = {}
        candidates: list[dict] = []
        for mode in ("auto", "ngram", "mtp", "off"):
            try:
                sel = (await asyncio.to_thread(choose, mi, parse_spec(mode), eng, cfg.ctx))[0]
                sp = sel.speculator
                out[mode] = {"speculation": sp.label, "kind": sp.kind, "reason": sp.reason}
                if mode == "auto":
                    candidates = [dict(c.to_json(), chosen=(i == sel.chosen)) for i, c in enumerate(sel.considered)]
            except BostudioError as exc:
                out[mode] = {"error": exc.message}
        return {"model": cfg.name, "modes": out, "candidates": candidates,
                "tokenizer": {"model": mi.tokenizer.model, "pre": mi.tokenizer.pre, "vocab_size": mi.tokenizer.vocab_size,
                              "fingerprint": mi.tokenizer.fingerprint}}

    @app.get("/bostudio/instances", tags=["control"], summary="Every instance the daemon knows, with live stats")
    async def instances() -> dict:
        return {"instances": [i.to_json() for i in sup.instances.values()]}

    def instance_or_404(model: str) -> Instance:
        inst = sup.instances.get(model)
        if inst is None:
            raise ModelError(f"model {model!r} has no instance", "GET /bostudio/instances lists them")
        return inst

    @app.get("/bostudio/instances/{model}", tags=["control"], summary="One instance")
    async def instance(model: str) -> dict:
        return instance_or_404(model).to_json()

    async def settle(inst: Instance, wait: bool) -> dict:
        if wait and inst.ready is not None:
            try:
                await asyncio.wait_for(asyncio.shield(inst.ready), options.load_timeout)
            except (BostudioError, asyncio.TimeoutError) as exc:
                resp = error_response(exc)
                body = json.loads(bytes(resp.body))
                body["instance"] = inst.to_json()
                raise _Answer(resp.status_code, body)
        return inst.to_json()

    @app.post("/bostudio/instances", tags=["control"], summary="Start (load) a model; waits until ready by default")
    async def start(req: StartRequest) -> dict:
        path = await asyncio.to_thread(sup.locate, req.model)
        before = sup.configs.get(req.model)
        old_workload = before.workload if before else None
        cfg = sup.register(req.model, req.ctx, req.spec, req.port, path, req.cache_type, workload=req.workload)
        if req.workload is not None and req.workload != old_workload and cfg.name in sup.instances:
            return await settle(await sup.restart(cfg.name), req.wait)  # another workload, maybe another profile
        return await settle(await sup.start(cfg), req.wait)

    @app.post("/bostudio/instances/{model}/stop", tags=["control"], summary="Stop an instance (SIGTERM, then SIGKILL)")
    async def stop(model: str) -> dict:
        return (await sup.stop(model)).to_json()

    @app.post("/bostudio/instances/{model}/restart", tags=["control"], summary="Restart an instance")
    async def restart(model: str, wait: bool = True) -> dict:
        return await settle(await sup.restart(model), wait)

    @app.put("/bostudio/instances/{model}/speculation", tags=["control"],
             summary="Switch speculation on/off/auto for a model; relaunches it if it runs")
    async def speculation(model: str, req: SpeculationRequest, wait: bool = True) -> dict:
        inst = await sup.set_speculation(model, req.mode)
        return await settle(inst, wait and inst.state != "stopped")

    @app.get("/bostudio/instances/{model}/stats", tags=["control"],
             summary="Live stats: tok/s, acceptance rate, mean accepted length")
    async def stats(model: str) -> dict:
        inst = instance_or_404(model)
        return {"model": model, "state": inst.state, **inst.stats.to_json()}

    @app.get("/bostudio/instances/{model}/log", tags=["control"], summary="The last lines of an instance's log")
    async def log_tail(model: str, lines: int = Query(100, ge=1, le=5000)) -> dict:
        inst = instance_or_404(model)
        return {"model": model, "path": str(inst.log_path), "lines": tail(inst.log_path, lines)}

    @app.get("/bostudio/instances/{model}/log/stream", tags=["control"],
             summary="An instance's log as server-sent events (one `data: {\"line\": ...}` per line)")
    async def log_stream(model: str, request: Request, lines: int = Query(20, ge=0, le=5000)) -> StreamingResponse:
        inst = instance_or_404(model)
        return StreamingResponse(follow_log(inst, lines, request), media_type="text/event-stream", headers=SSE_HEADERS)

    async def follow_log(inst: Instance, lines: int, request: Request) -> AsyncIterator[bytes]:
        for line in tail(inst.log_path, lines) if lines else []:
            yield sse({"line": line})
        pos = inst.log_path.stat().st_size if inst.log_path.exists() else 0
        partial = b""
        while not await request.is_disconnected():
            try:
                size = inst.log_path.stat().st_size
            except OSError:
                size = 0
            if size < pos:  # a relaunch starts a new log
                pos, partial = 0, b""
            if size > pos:
                with open(inst.log_path, "rb") as f:
                    f.seek(pos)
                    data = f.read(size - pos)
                pos = size
                *done, partial = (partial + data).split(b"\n")
                for line in done:
                    yield sse({"line": line.decode("utf-8", "replace")})
            else:
                yield b": keep-alive\n\n"
            await asyncio.sleep(0.25)

    @app.get("/bostudio/events", tags=["control"],
             summary="Server-sent events: a snapshot, then state changes, launches, evictions and stats")
    async def events(request: Request) -> StreamingResponse:
        q = bus.subscribe()

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield sse({"type": "snapshot", "seq": bus.seq,
                           "instances": [i.to_json() for i in sup.instances.values()]}, "snapshot")
                while True:
                    try:
                        ev = await asyncio.wait_for(q.get(), 10.0)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    yield sse(ev, ev["type"])
            finally:
                bus.unsubscribe(q)

        return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    @app.post("/bostudio/shutdown", tags=["control"], summary="Stop every instance and the daemon")
    async def shutdown() -> dict:
        asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
        return {"stopping": True}

    @app.exception_handler(_Answer)
    async def _answer(request: Request, exc: _Answer):
        return JSONResponse(exc.body, status_code=exc.status)

    return SecurityMiddleware(app, hosts, token, info.require_token)  # type: ignore[return-value]


class _Answer(Exception):
    """A control-API answer with an error status and a body (instance state included)."""

    def __init__(self, status: int, body: dict) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


__all__ = ["DaemonInfo", "build_app", "READY"]
