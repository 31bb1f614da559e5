"""The daemon's ASGI app: the OpenAI-compatible router under /v1 and the control API under /bostudio.
FastAPI gives the OpenAPI schema (GET /openapi.json); streams pass through unbuffered. The routes live per
API family in daemon/http/routes/ and daemon/http/ollama.py; here: the lifespan, the error handlers, the middleware."""

from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from bostudio import __version__
from bostudio.daemon.http import ollama
from bostudio.daemon.http.limits import BodyLimits, HttpLimits
from bostudio.daemon.http.router import Router, api_error, api_of, error_response
from bostudio.daemon.http.routes import control, logs, models
from bostudio.daemon.http.routes.control import DaemonInfo
from bostudio.daemon.http.security import SecurityMiddleware
from bostudio.daemon.supervise.events import EventBus
from bostudio.daemon.supervise.lifecycle import READY
from bostudio.daemon.supervise.supervisor import Supervisor, SupervisorOptions
from bostudio.errors import BostudioError

log = logging.getLogger("bostudio.daemon")


def openai_error(status: int, message: str, type_: str, hint: str = "", code: str | None = None) -> JSONResponse:
    return api_error("openai", status, message, type_, hint, code)


def build_app(options: SupervisorOptions, info: DaemonInfo, hosts: frozenset[str], token: str | None,
              on_children=lambda children: None, limits: HttpLimits = HttpLimits()) -> FastAPI:
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
    # Every body bounded, timed and parsed off the loop before a route sees it (daemon/http/limits.py).
    app.add_middleware(BodyLimits, max_body=options.max_body, limits=limits)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        # A bug still answers JSON in the client's API shape, never a plain-text 500.
        log.error("%s %s failed: %r", request.method, request.url.path, exc, exc_info=exc)
        return error_response(exc, api_of(request.url.path))

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

    # ------------------------------------------------------------ the routes, one router per API family

    router = Router(sup, options.stream_idle_timeout, options.max_body)
    app.state.router = router
    # Each family adds its routes to the app's own router, so that app.routes stays one flat list of routes
    # (FastAPI's include_router nests an included APIRouter as one entry in newer releases).
    models.add_passthrough_routes(app.router, router)
    ollama.add_routes(app.router, sup, router)
    models.add_model_list_routes(app.router, sup)
    # Before control: its GET /bostudio/instances/{model:path} would also match .../log and .../log/stream.
    logs.add_routes(app.router, sup, bus)
    control.add_routes(app.router, sup, options, info)

    @app.exception_handler(control.Answer)
    async def _answer(request: Request, exc: control.Answer):
        return JSONResponse(exc.body, status_code=exc.status)

    return SecurityMiddleware(app, hosts, token, info.require_token)  # type: ignore[return-value]


__all__ = ["build_app", "READY"]
