"""The daemon's routes, one module per API family; daemon/app.py includes them in this order:

    models   the model router: llama-server's APIs passed through by `model` (OpenAI, Anthropic,
             llama.cpp's own), and GET /v1/models
    (the Ollama API lives with its translation in daemon/ollama.py)
    logs     an instance's log (tail and stream) and the daemon's event stream (server-sent events)
    control  /bostudio/*: status, devices, engines, catalog, plans, pairings, instances

Each module's `routes(...)` takes what its routes need and returns a FastAPI APIRouter.
"""
