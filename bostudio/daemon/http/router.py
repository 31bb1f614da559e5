"""The model router's hot path, shared by every API the daemon speaks (OpenAI, Anthropic, Ollama):
read a bounded body, check it, refuse a route the model cannot serve (from its GGUF header, before
any launch), get the ready instance, open the upstream request, relay the body unbuffered with an
idle timeout, and answer errors in the shape of the API the client speaks."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from bostudio.gguf.capabilities import GENERATE, model_caps
from bostudio.daemon.http import loopguard, overflow, record, toolrescue
from bostudio.daemon.http.loopguard import Transform
from bostudio.daemon.http.fields import filter_body
from bostudio.daemon.http.guard import check_request
from bostudio.daemon.http.normalise import normalise
from bostudio.daemon.supervise import admission
from bostudio.daemon.supervise.instance import Instance
from bostudio.daemon.supervise.stats import timings_from_body, timings_from_sse
from bostudio.daemon.supervise.supervisor import Supervisor
from bostudio.errors import BostudioError, ConfigError, ModelError, ModelFileError, RequestError, ServerError
from bostudio.gguf import describe
from bostudio.runtime import passthrough
from bostudio.runtime.client import CONNECT, TIMED_OUT, ChildError

log = logging.getLogger("bostudio.daemon")

# Hop-by-hop and length headers are the proxy's own business.
DROP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date",
                "access-control-allow-origin", "access-control-allow-credentials", "access-control-allow-methods",
                "access-control-allow-headers"}
GENERATING = GENERATE | {"/completion", "/completions"}  # the routes admission reserves KV room for
QUEUE_TIMEOUT = 600.0  # seconds a request may wait for room in a busy child's KV pool
# Routes whose requests can carry tools (llama-server renders them with the chat template).
TOOL_ROUTES = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/messages/count_tokens",
                         "/v1/responses/input_tokens", "/v1/chat/completions/input_tokens", "/apply-template"})
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MAX_BODY = 64 << 20  # a 128k-token prompt with base64 images fits; more is refused (413)
PARSED_KEY = "bostudio.json"  # ASGI scope key: (raw, parsed JSON) of a body daemon/http/limits.BodyLimits read
CLIENT_GONE = 499  # nginx's "client closed request": nothing is sent, the status is for the log

# Anthropic's error types by status (docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error",
                    529: "overloaded_error"}


def error_body(api: str, status: int, message: str, type_: str, hint: str = "", code: str | None = None) -> dict:
    """An error in the shape of `api`: openai | anthropic | ollama."""
    if api == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                                           "message": message + (f" ({hint})" if hint else "")}}
    if api == "ollama":
        return {"error": message + (f" ({hint})" if hint else "")}
    err: dict[str, Any] = {"message": message, "type": type_, "param": None, "code": code or status}
    if hint:
        err["hint"] = hint
    return {"error": err}


def api_error(api: str, status: int, message: str, type_: str, hint: str = "", code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(api, status, message, type_, hint, code), status_code=status)


def error_response(exc: BaseException, api: str = "openai") -> JSONResponse:
    """Every error leaves the daemon as JSON in the client's API shape (OpenAI by default)."""
    if isinstance(exc, RequestError):
        return api_error(api, 400, exc.message, "invalid_request_error", exc.hint, exc.code)
    if isinstance(exc, ConfigError):
        return api_error(api, 400, exc.message, "invalid_request_error", exc.hint)
    if isinstance(exc, ModelFileError):  # the file's own fault: the client's model choice, not the daemon
        return api_error(api, 422, exc.message, "invalid_request_error", exc.hint, "model_file_error")
    if isinstance(exc, ModelError):
        return api_error(api, 404, exc.message, "not_found_error", exc.hint, "model_not_found")
    if isinstance(exc, ServerError):
        return api_error(api, 503, exc.message, "unavailable_error", exc.hint)
    if isinstance(exc, BostudioError):
        return api_error(api, 500, exc.message, "server_error", exc.hint)
    if isinstance(exc, asyncio.TimeoutError):
        return api_error(api, 503, "the model did not load in time", "unavailable_error")
    return api_error(api, 500, f"internal error: {exc!r}", "server_error", "see the daemon log")


def api_of(path: str) -> str:
    """Which API's error shape a request path speaks."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


async def until_disconnected(receive: Callable[[], Any]) -> None:
    """Returns once the client has hung up (its request body already read: what is left is the
    disconnect). A replayed body (BodyLimits) is skipped."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def sse(data: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, default=str)}\n\n".encode()


def in_band_error(api: str, message: str) -> bytes:
    """An error a streaming client reads in-band, once headers (200) are gone."""
    if api == "anthropic":
        return sse(error_body(api, 500, message, "server_error"), "error")
    if api == "ollama":
        return (json.dumps({"error": message}) + "\n").encode()
    return sse({"error": {"message": message, "type": "server_error", "code": 502}}) + b"data: [DONE]\n\n"


def chained(*transforms: Transform | None) -> Transform | None:
    """The relay transforms given, the first reading the upstream's chunks and each the one before's output
    (None ones skipped); None when all are None."""
    steps = [t for t in transforms if t is not None]
    if not steps:
        return None

    def run(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        for step in steps:
            chunks = step(chunks)
        return chunks
    return run


def closer(upstream: passthrough.UpstreamResponse) -> Callable[[], Awaitable[None]]:
    """Closes `upstream` even from a cancelled task: llama-server then stops generating (the relay
    transforms that end an answer early call it first)."""
    async def close() -> None:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
    return close


class Reject(Exception):
    """A request refused before anything was forwarded; carries the response to send."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


class Router:
    def __init__(self, sup: Supervisor, stream_idle_timeout: float, max_body: int = MAX_BODY,
                 queue_timeout: float = QUEUE_TIMEOUT) -> None:
        self.sup = sup
        self.idle_timeout = stream_idle_timeout
        self.max_body = max_body
        self.queue_timeout = queue_timeout
        # id(upstream) -> (its instance, its KV reservation, the launch it runs on)
        self._held: dict[int, tuple[Instance, int, int]] = {}

    def context_of(self, name: str) -> int:
        """The context `name` runs (or will run) with: the running child's, else its config's, else the
        trained context (the launch plan's ceiling). Blocking (a GGUF header): call it off the loop."""
        inst = self.sup.instances.get(name)
        ctx = inst.decision.ctx if inst is not None and inst.decision is not None else None
        cfg = self.sup.config_for(name)
        return int(ctx or cfg.ctx or describe(cfg.path).n_ctx_train or 4096)

    async def read_json(self, request: Request, api: str) -> tuple[bytes, dict]:
        """The body (bounded) and its JSON object. Raises Reject. Behind BodyLimits (the daemon's
        app) the body was read, bounded and parsed off the event loop already."""
        if PARSED_KEY in request.scope:
            raw, body = request.scope[PARSED_KEY]
        else:
            raw, body = await self._read_body(request, api)
        if not isinstance(body, dict):
            raise Reject(api_error(api, 400, "the request body must be a JSON object", "invalid_request_error"))
        recorder = record.active()  # `daemon --record DIR`: saved in the order received
        if recorder is not None:
            await recorder.save(request.url.path, dict(request.headers), body)
        return bytes(raw), body

    async def _read_body(self, request: Request, api: str) -> tuple[bytes, object]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise Reject(self.too_large(api))
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.max_body:
                raise Reject(self.too_large(api))
        try:
            return bytes(raw), json.loads(raw)
        except (ValueError, RecursionError):
            raise Reject(api_error(api, 400, "the request body is not JSON", "invalid_request_error"))

    def too_large(self, api: str) -> JSONResponse:
        return api_error(api, 413, f"the request body is larger than {self.max_body / (1 << 20):g} MiB",
                         "invalid_request_error", "send a shorter prompt or smaller media")

    async def admit(self, body: dict, route: str, api: str) -> str:
        """The model name of a checked body whose model can serve `route`. Raises Reject."""
        try:
            name = check_request(body)
            cfg = self.sup.config_for(name)
            caps = await asyncio.to_thread(model_caps, cfg.path)
            refusal = caps.refusal(route, name) or (caps.tool_refusal(body, name) if route in TOOL_ROUTES else None)
        except BostudioError as exc:
            raise Reject(error_response(exc, api))
        except OSError as exc:
            raise Reject(error_response(ModelError(f"cannot read the model file of {body.get('model')}: {exc}",
                                                   "GET /bostudio/catalog lists the models"), api))
        if refusal is not None:
            raise Reject(error_response(refusal, api))
        return name

    async def open(self, name: str, path: str, raw: bytes, api: str,
                   body: dict | None = None, request: Request | None = None
                   ) -> tuple[Instance, passthrough.UpstreamResponse]:
        """The ready instance (loaded on demand) and its upstream response to POST `path`. A generating
        request first gets room in the child's KV pool (bostudio.daemon.supervise.admission): it waits in line
        while the requests in flight fill the pool, and one that can never fit is refused with 400.
        The caller must `release(inst, upstream)` once done with it. Raises Reject. With `request`, a
        client that hangs up meanwhile cancels it: a request waiting for its model to load or for room
        in the pool is dropped, one waiting for llama-server's answer closes that connection, and
        llama-server stops generating."""
        if request is None:
            return await self._open(name, path, raw, api, body)
        work = asyncio.ensure_future(self._open(name, path, raw, api, body))
        gone = asyncio.ensure_future(until_disconnected(request.receive))
        gone.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            gone.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait({work})
        if not work.cancelled() and work.exception() is None:
            if not gone.done() or gone.cancelled():
                return work.result()
            inst, upstream = work.result()  # answered just as the client left: nobody to give it to
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
            self.release(inst, upstream)
        elif not work.cancelled() and not (gone.done() and not gone.cancelled()):
            raise work.exception()  # type: ignore[misc]
        log.info("%s: the client hung up before %s was answered; cancelled", name, path)
        raise Reject(Response(status_code=CLIENT_GONE))

    async def _open(self, name: str, path: str, raw: bytes, api: str,
                    body: dict | None) -> tuple[Instance, passthrough.UpstreamResponse]:
        for attempt in (1, 2):
            try:
                inst = await self.sup.get_ready(name)
            except (BostudioError, asyncio.TimeoutError) as exc:
                raise Reject(error_response(exc, api))
            # From its first byte to the child (the prompt count) the request counts as in flight on this
            # launch, until it ends (_ended): a child whose death broke exactly one request died of that
            # request (the supervisor does not count such a death toward the crash loop).
            launch = inst.loads
            inst.in_flight[launch] = inst.in_flight.get(launch, 0) + 1
            # A child already dead or dying (its exit not yet noticed; a request on it already broke) can
            # take nothing: a request that fails on it, even on a connection its dying socket still took,
            # reached nothing and is retried.
            alive = inst.proc is not None and inst.proc.alive() and not inst.died_with.get(launch)
            tokens = 0
            active = False
            try:
                tokens, sent = await self.reserve(inst, path, raw, body, api)
                inst.active += 1
                active = True
                inst.stats.requests += 1
                if inst.http is None or inst.port is None:
                    raise ChildError("instance is not ready", kind=CONNECT)
                upstream = await passthrough.post("127.0.0.1", inst.port, path, sent, inst.api_key)
                self._held[id(upstream)] = (inst, tokens, launch)
                return inst, upstream
            except ChildError as exc:
                if active:
                    inst.active -= 1
                inst.admission.release(tokens)
                inst.stats.errors += 1
                log.warning("%s: upstream %s failed (attempt %d): %r", inst.name, path, attempt, exc)
                reached = alive and exc.reached  # the child had (part of) it
                try:
                    exited = await self.sup.confirm_exited(inst)
                except BaseException:  # cancelled meanwhile (the client hung up)
                    self._ended(inst, launch, died=reached)
                    raise
                if reached and exited:
                    # It died with this request in it: sent again, a request that crashes a model would
                    # crash the relaunched child too. Answered, not retried; counted as died with the launch.
                    self._ended(inst, launch, died=True)
                    raise Reject(api_error(api, 502, f"llama-server for {inst.name} exited while serving this "
                                                     "request; it is not sent again", "server_error",
                                           "the model is relaunched for the other requests; check the request "
                                           "before sending it again"))
                self._ended(inst, launch)
                # Not connected to a child that proved dead, or it was dead before: nothing was served;
                # wait for the relaunch and retry once.
                if attempt == 1 and not reached and exited:
                    continue
                raise Reject(api_error(api, 502, f"llama-server for {inst.name} failed: {exc!r}", "server_error",
                                       "the model is restarted automatically; send the request again"))
            except BaseException:  # refused, or cancelled (the client hung up): no longer in flight
                if active:
                    inst.active -= 1
                inst.admission.release(tokens)
                self._ended(inst, launch)
                raise
        raise AssertionError("unreachable")

    @staticmethod
    def _ended(inst: Instance, launch: int, died: bool = False) -> None:
        """A request on `launch` of `inst` ended: answered, refused, never reached the child, or (`died`)
        its connection to the child broke with the request in it."""
        left = inst.in_flight.get(launch, 0) - 1
        if left > 0:
            inst.in_flight[launch] = left
        else:
            inst.in_flight.pop(launch, None)
        if died:
            inst.died_with[launch] = inst.died_with.get(launch, 0) + 1

    async def reserve(self, inst: Instance, path: str, raw: bytes, body: dict | None,
                      api: str) -> tuple[int, bytes]:
        """Room in `inst`'s KV pool for a request to `path`: the tokens reserved (0 for a route that
        generates nothing, or a prompt the child could not count), and the body to send (shortened to fit
        the context, under `--context-overflow trim`). Raises Reject (400: can never fit; 503: waited too
        long)."""
        layout = inst.layout
        if layout is None or inst.http is None or path not in GENERATING:
            return 0, raw
        if body is None:
            try:
                body = json.loads(raw)
            except ValueError:
                return 0, raw
        prompt = await admission.count_prompt(inst.http, path, raw, body)
        if prompt is None:
            return 0, raw
        if prompt >= layout.slot_ctx and self.sup.opts.context_overflow == "trim" and isinstance(body, dict):
            raw, body, prompt = await self._fit(inst, path, raw, body, prompt, layout.slot_ctx)
        if prompt >= layout.slot_ctx:
            n_train = inst.n_ctx_train or None
            raise Reject(error_response(admission.too_long(inst.name, prompt, layout.slot_ctx, n_train), api))
        tokens = admission.reservation(prompt, body, layout.slot_ctx)
        try:
            await inst.admission.acquire(tokens, layout.pool_ctx, self.queue_timeout)
        except admission.QueueTimeout:
            raise Reject(api_error(api, 503, f"{inst.name} is busy: the requests in flight fill its KV pool of "
                                             f"{layout.pool_ctx} tokens, and this one ({tokens} tokens with its "
                                             f"output) waited {self.queue_timeout:g} s", "unavailable_error",
                                   "send it again later, or set a smaller max_tokens so requests can share the pool"))
        inst.prefill.expect(prompt, time.monotonic())  # the total of its prompt progress (daemon/supervise/prefill.py)
        return tokens, raw

    async def _fit(self, inst: Instance, path: str, raw: bytes, body: dict, prompt: int,
                   ctx: int) -> tuple[bytes, dict, int]:
        """The request shortened until its prompt leaves room for its answer in the context (overflow.py),
        counted by the child each time; the request as it was when nothing can be cut or no cut fits."""
        assert inst.http is not None
        target = ctx - min(admission.output_budget(body) or ctx // 4, ctx // 4) - admission.DRAFT_ROOM
        per_token = len(raw) / max(prompt, 1)  # JSON and tool schemas included: errs toward cutting more
        last = 0
        for attempt in range(4):
            need = int((prompt - target) * per_token * (1.0 + 0.5 * attempt)) + 1
            cut_body, cut = overflow.elide(path, body, need, ctx)
            if cut == 0 or cut == last:  # nothing (more) to cut
                break
            last = cut
            cut_raw = json.dumps(cut_body, ensure_ascii=False).encode()
            counted = await admission.count_prompt(inst.http, path, cut_raw, cut_body)
            if counted is None:
                break
            if counted <= target:
                inst.stats.context_trims += 1
                log.info("%s: %s was %d tokens, over the context of %d: %d characters elided from the middle of "
                         "earlier turns, now %d tokens (%d trimmed so far; --context-overflow refuse keeps them "
                         "whole)", inst.name, path, prompt, ctx, cut, counted, inst.stats.context_trims)
                return cut_raw, cut_body, counted
        return raw, body, prompt

    def release(self, inst: Instance, upstream: passthrough.UpstreamResponse | None = None) -> None:
        inst.active -= 1
        inst.last_used = time.monotonic()
        held = self._held.pop(id(upstream), None) if upstream is not None else None
        if held is not None:
            owner, tokens, launch = held
            owner.admission.release(tokens)
            self._ended(owner, launch)

    def broke(self, inst: Instance, upstream: passthrough.UpstreamResponse) -> None:
        """`upstream`'s connection broke mid-response: its request counts as one that died with its
        launch (if the child died of it, the supervisor sees it), from now on, before the client hears."""
        held = self._held.get(id(upstream))
        if held is not None:
            inst.died_with[held[2]] = inst.died_with.get(held[2], 0) + 1

    async def chunks(self, inst: Instance, upstream: passthrough.UpstreamResponse) -> AsyncIterator[bytes]:
        """The upstream body as it arrives; a body silent for longer than the idle timeout raises
        ChildError, TIMED_OUT (a wedged child must not hold the client forever)."""
        it = upstream.aiter_raw().__aiter__()
        while True:
            try:
                if self.idle_timeout > 0:
                    chunk = await asyncio.wait_for(it.__anext__(), self.idle_timeout)
                else:
                    chunk = await it.__anext__()
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise ChildError(f"llama-server for {inst.name} sent nothing for {self.idle_timeout:g} s "
                                 "(--stream-idle-timeout)", kind=TIMED_OUT)
            yield chunk

    async def timed_chunks(self, inst: Instance, upstream: passthrough.UpstreamResponse, streaming: bool
                           ) -> AsyncIterator[bytes]:
        """`chunks`, counting the response's timings into the instance's stats as they pass."""
        body = bytearray()
        async for chunk in self.chunks(inst, upstream):
            if streaming:
                t = timings_from_sse(chunk)
                if t is not None:
                    inst.stats.add_timings(t)
            elif len(body) < (4 << 20):
                body += chunk
            yield chunk
        if not streaming and upstream.status_code == 200:
            t = timings_from_body(bytes(body))
            if t is not None:
                inst.stats.add_timings(t)

    async def prepare(self, name: str, path: str, body: dict, api: str, raw: bytes | None = None
                      ) -> tuple[bytes, dict]:
        """The body to forward for a checked request: only the fields `path`'s API defines
        (daemon/http/fields.py: unknown ones dropped, a bad value refused with 400), then the daemon's own
        normalisation (normalise.py: billing header stripped, forced call opened, an output limit on
        every generating route). `raw`, the client's bytes of `body`, is forwarded as it is when nothing
        changed. Raises Reject."""
        try:
            kept = filter_body(path, body)
        except BostudioError as exc:
            raise Reject(error_response(exc, api))
        cfg = self.sup.config_for(name)
        changed = normalise(path, kept, (await asyncio.to_thread(model_caps, cfg.path)).template.call_prefill,
                            output_limit=max(256, await asyncio.to_thread(self.context_of, name) // 4))
        if changed is None and raw is not None and len(kept) == len(body):
            return raw, body
        out = kept if changed is None else changed
        if raw is not None and len(raw) > (64 << 10):  # a large conversation: serialised off the loop
            return (await asyncio.to_thread(json.dumps, out)).encode(), out
        return json.dumps(out).encode(), out

    async def forward(self, request: Request, path: str, api: str = "openai") -> Response:
        """The whole pass-through: `path` on the child of the body's model, streamed unbuffered."""
        try:
            raw, body = await self.read_json(request, api)
            name = await self.admit(body, path, api)
            raw, body = await self.prepare(name, path, body, api, raw)
            inst, upstream = await self.open(name, path, raw, api, body, request)
        except Reject as r:
            return r.response
        streaming = body.get("stream") is True
        if upstream.status_code >= 400 and (api == "anthropic" or upstream.status_code == 400):
            return await self.translate_error(inst, upstream, api)
        # The loop guard reads the child's own events first (loopguard.py says why), the rescue what it passes.
        return self.relay(inst, upstream, streaming, api,
                          transform=chained(self.one_call(upstream, path, body, streaming),
                                            self.loop_guard(inst, upstream, path, body, streaming),
                                            self.tool_rescue(inst, path, api, body, streaming, upstream.status_code)))

    @staticmethod
    def one_call(upstream: passthrough.UpstreamResponse, path: str, body: dict, streaming: bool
                 ) -> Transform | None:
        """The relay transform that keeps an Anthropic answer to one call when the request asks so
        (toolrescue.one_call: llama-server ignores disable_parallel_tool_use); None otherwise."""
        if upstream.status_code != 200:
            return None

        return toolrescue.one_call(path, body, streaming, closer(upstream))

    def loop_guard(self, inst: Instance, upstream: passthrough.UpstreamResponse, path: str, body: dict,
                   streaming: bool) -> Transform | None:
        """The relay transform that stops a streamed 200 answer caught in an exact loop (loopguard.py): it
        closes `upstream` (the child stops generating) and ends the stream as the output limit does. None for
        a whole answer, an error, or a route that generates no chat or completion text."""
        if not streaming or upstream.status_code != 200:
            return None

        def fired(loop: loopguard.Loop) -> None:
            inst.stats.runaways_stopped += 1
            log.warning("%s: the answer to %s repeated %r (a period of %d characters) over its last %d characters; "
                        "stopped as its output limit would stop it (%d so far)", inst.name, path, loop.unit[:80],
                        loop.period, loop.chars, inst.stats.runaways_stopped)

        return loopguard.guard(path, str(body.get("model") or ""), fired, closer(upstream))

    def tool_rescue(self, inst: Instance, path: str, api: str, body: dict, streaming: bool, status: int):
        """The relay transform that makes a near-miss tool call in the answer a real one (toolrescue.py),
        or None when the request has no tools to call or the answer is an error. An answer that tried a call
        in a form no rule reads is asked again, forced to call the tool it named (`regenerate`)."""
        if status != 200:
            return None

        def fired(tool: str) -> None:
            inst.stats.tool_calls_rescued += 1
            log.info("%s: the answer to %s was a tool call written as text (%s); sent as a call "
                     "(%d so far)", inst.name, path, tool, inst.stats.tool_calls_rescued)

        async def regenerate(tool: str) -> AsyncIterator[bytes]:
            """The response to `body` forced to call `tool`, under the grammar of its schema; raises
            RegenerateFailed before yielding when the child will not give it."""
            try:
                raw, forced = await self.prepare(inst.name, path, toolrescue.forcing(api, body, tool), api)
                again, upstream = await self.open(inst.name, path, raw, api, forced)
            except (Reject, ChildError) as exc:
                log.warning("%s: could not ask for the %s call again: %s", inst.name, tool, exc)
                raise toolrescue.RegenerateFailed from exc
            try:
                if upstream.status_code != 200:
                    log.warning("%s: the forced %s call was refused (%d)", inst.name, tool, upstream.status_code)
                    raise toolrescue.RegenerateFailed
                inst.stats.tool_calls_forced += 1
                log.info("%s: the answer to %s tried a %s call in a form no rule reads; asked again with the call "
                         "forced (%d so far)", inst.name, path, tool, inst.stats.tool_calls_forced)
                source = self.timed_chunks(again, upstream, streaming)
                steps = chained(self.one_call(upstream, path, forced, streaming),
                                self.loop_guard(again, upstream, path, forced, streaming))
                async for chunk in (steps(source) if steps else source):
                    yield chunk
            finally:
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()
                self.release(again, upstream)

        return toolrescue.rescuer(path, api, body, streaming, fired, regenerate)

    async def translate_error(self, inst: Instance, upstream: passthrough.UpstreamResponse, api: str) -> Response:
        """llama-server's (OpenAI-shaped) error body, re-shaped for `api`."""
        data = bytearray()
        try:
            async for chunk in self.chunks(inst, upstream):
                data += chunk
                if len(data) > (1 << 20):
                    break
        except ChildError:
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
            self.release(inst, upstream)
        exceeded = admission.exceed_message(bytes(data))
        if exceeded is not None:  # llama-server's own context check: the same answer as admission's
            n_train = inst.n_ctx_train or None
            return error_response(admission.too_long(inst.name, exceeded[0], exceeded[1], n_train), api)
        try:
            err = json.loads(data).get("error", {})
            message = err.get("message") or str(err)
            type_ = str(err.get("type") or "invalid_request_error")
        except (ValueError, AttributeError):
            message, type_ = data.decode("utf-8", "replace")[:2000], "invalid_request_error"
        return api_error(api, upstream.status_code, message, type_)

    def relay(self, inst: Instance, upstream: passthrough.UpstreamResponse, streaming: bool, api: str,
              transform: Transform | None = None,
              media_type: str | None = None, status_code: int | None = None) -> Response:
        """Stream the upstream body to the client (optionally through `transform`, e.g. SSE to
        NDJSON), recording timings; a client disconnect closes the upstream and so cancels it."""
        async def out() -> AsyncIterator[bytes]:
            source = self.timed_chunks(inst, upstream, streaming)
            try:
                async for chunk in (transform(source) if transform else source):
                    yield chunk
            except ChildError as exc:
                # The child died or stalled mid-response: tell a streaming client at once, in-band.
                inst.stats.errors += 1
                if exc.kind != TIMED_OUT:
                    self.broke(inst, upstream)
                log.warning("%s: response failed mid-stream: %s", inst.name, exc)
                if streaming:
                    yield in_band_error(api, f"llama-server for {inst.name} failed mid-stream: {exc}")
                else:
                    raise
            finally:
                # A client that disconnects cancels this generator: closing the upstream response
                # closes its connection, and llama-server cancels the generation. The close is
                # shielded: inside a cancelled anyio scope every unshielded await is cancelled too.
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()
                self.release(inst, upstream)

        if transform is not None:
            headers: dict[str, str] = {}
        else:
            headers = {k: v for k, v in upstream.headers.items() if k.lower() not in DROP_HEADERS}
        if streaming:
            headers.update(SSE_HEADERS)
        return StreamingResponse(out(), status_code=status_code or upstream.status_code, headers=headers,
                                 media_type=media_type or upstream.headers.get("content-type"))


__all__ = ["Router", "Reject", "chained", "api_error", "error_body", "error_response", "api_of", "sse", "in_band_error",
           "SSE_HEADERS", "MAX_BODY", "PARSED_KEY", "until_disconnected"]
