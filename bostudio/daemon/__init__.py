"""The bostudio daemon: one OpenAI-compatible endpoint that starts, routes, supervises and measures
llama-server instances, plus a control API under /bostudio/ (see README, "The daemon").

    security   token file, Host allowlist, Origin check, bind rules (ASGI middleware)
    guard      request parameters that could harm a child: rejected with 400 (pure)
    policy     memory estimate, LRU eviction, idle TTL (pure)
    state      the atomic pid/state file; reaping what a killed daemon left behind
    stats      timings and /metrics -> per-instance live stats (pure parsing)
    events     the event bus behind /bostudio/events (SSE)
    supervisor instances: load on demand, readiness, crash restarts, stop
    app        the ASGI app (FastAPI): lifespan, error handlers, middleware
    routes     its routes per API family: models (/v1 passthrough, /v1/models), logs and events, control
    ollama     the Ollama API (/api/*), translated to llama-server's OpenAI routes
    service    run in the foreground, start/stop/status in the background, install a user unit
    client     the httpx client the CLI (and the TUI) use
"""

DEFAULT_HOST = "127.0.0.1"
# Documented default port: not 8080 (llama-server's), not 11434 (Ollama's), not 1234 (LM Studio's).
DEFAULT_PORT = 8642
