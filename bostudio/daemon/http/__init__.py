"""The daemon's HTTP edge: what a request meets before any child does. It may use supervise/ (the router asks
the supervisor for a ready child); supervise/ never imports it.

    app        the ASGI app (FastAPI): lifespan, error handlers, middleware
    limits     the raw-ASGI gate: header and body size, slow clients, the token, before any parsing
    security   token file, Host allowlist, Origin check, bind rules (ASGI middleware)
    guard      request parameters that could harm a child: rejected with 400 (pure)
    fields     each API's request-field allow-list, with types and bounds
    normalise  the daemon's own changes to a body (volatile prompt headers, forced calls, output limits)
    toolrescue a tool call the model wrote as text, sent as a call
    router     the hot path shared by every API: check, admit, open the child's route, relay unbuffered
    routes     its routes per API family: models (/v1 passthrough, /v1/models), logs and events, control
    ollama     the Ollama API (/api/*), translated to llama-server's OpenAI routes
    plans      the plan route's view: what a load of a model would decide
    record     `--record DIR`: request bodies saved for replay by bench
"""
