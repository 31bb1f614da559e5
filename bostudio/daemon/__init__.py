"""The bostudio daemon: one OpenAI-compatible endpoint that starts, routes, supervises and measures
llama-server instances, plus a control API under /bostudio/ (see README, "The daemon").

    http       the HTTP edge: ASGI app, limits, auth, Host/Origin, the request-field allow-list, routes
    supervise  the children: lifecycle as a pure transition, the effects runner, policy, stats, events
    state      the atomic pid/state file; reaping what a killed daemon left behind
    capabilities what a model serves (chat, embedding, rerank) and its template, from the GGUF header
    modelpaths which model and draft paths the control API may load
    service    run in the foreground, start/stop/status in the background, install a user unit
    client     the httpx client the CLI (and the TUI) use

http/ imports supervise/, never the reverse; both may import the modules beside them here.
"""

DEFAULT_HOST = "127.0.0.1"
# Documented default port: not 8080 (llama-server's), not 11434 (Ollama's), not 1234 (LM Studio's).
DEFAULT_PORT = 8642
