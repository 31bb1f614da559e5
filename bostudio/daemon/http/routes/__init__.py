"""The daemon's routes, one module per API family; daemon/http/app.py adds them in this order:

    models   llama-server's APIs passed through by the body's `model` (OpenAI, Anthropic, llama.cpp's own)
    (daemon/http/ollama.py: the Ollama API, next to its translation)
    models   GET /v1/models, /v1/models/{model}
    logs     an instance's log (tail and stream) and the daemon's event stream (server-sent events)
    control  /bostudio/*: status, devices, engines, catalog, plans, pairings, instances; its
             GET /bostudio/instances/{model:path} last of all, after the more specific instance routes

Each module's `add_...routes(api, ...)` adds its routes to `api` (the app's own APIRouter) from the explicit
dependencies it is given: the supervisor, the model router, the event bus, the options.
"""
