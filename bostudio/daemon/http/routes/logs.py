"""What happened: an instance's log (the last lines, or followed as server-sent events) and the daemon's
event stream (/bostudio/events: a snapshot, then state changes, launches, evictions and stats)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from starlette.responses import StreamingResponse

from bostudio.daemon.http.router import SSE_HEADERS, sse
from bostudio.daemon.http.routes.control import instance_or_404
from bostudio.daemon.supervise.events import EventBus
from bostudio.daemon.supervise.instance import Instance
from bostudio.daemon.supervise.supervisor import Supervisor
from bostudio.runtime.process import tail


async def follow_log(inst: Instance, lines: int, request: Request) -> AsyncIterator[bytes]:
    """The last `lines` lines of an instance's log, then each line as it is written, until the client leaves."""
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


def add_routes(api: APIRouter, sup: Supervisor, bus: EventBus) -> None:
    """The log routes of every instance and /bostudio/events, on `api`."""

    @api.get("/bostudio/instances/{model:path}/log", tags=["control"], summary="The last lines of an instance's log")
    async def log_tail(model: str, lines: int = Query(100, ge=1, le=5000)) -> dict:
        inst = instance_or_404(sup, model)
        return {"model": model, "path": str(inst.log_path), "lines": tail(inst.log_path, lines)}

    @api.get("/bostudio/instances/{model:path}/log/stream", tags=["control"],
             summary="An instance's log as server-sent events (one `data: {\"line\": ...}` per line)")
    async def log_stream(model: str, request: Request, lines: int = Query(20, ge=0, le=5000)) -> StreamingResponse:
        inst = instance_or_404(sup, model)
        return StreamingResponse(follow_log(inst, lines, request), media_type="text/event-stream", headers=SSE_HEADERS)

    @api.get("/bostudio/events", tags=["control"],
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


__all__ = ["follow_log", "add_routes"]
