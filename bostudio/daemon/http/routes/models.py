"""The model router's routes: every llama-server API passed through by the body's `model`, and the model list."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from starlette.responses import Response

from bostudio.daemon.http.router import Router
from bostudio.daemon.supervise.supervisor import Supervisor
from bostudio.errors import ModelError

# Every llama-server API the router passes through, routed by the body's `model`:
# (path, error shape, OpenAPI tag, summary). Streams pass unbuffered; a model that cannot serve a
# route is refused with 400 before launch (bostudio/gguf/capabilities.py).
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


def add_passthrough_routes(api: APIRouter, router: Router) -> None:
    """POST routes that `router` forwards to the model the body names (PASSTHROUGH_ROUTES)."""

    def passthrough_route(path: str, shape: str, tag: str, summary: str) -> None:
        async def handler(request: Request) -> Response:
            return await router.forward(request, path, shape)

        handler.__name__ = "route_" + path.strip("/").replace("/", "_").replace("-", "_")
        api.post(path, tags=[tag], summary=summary)(handler)

    for path, api_shape, tag, summary in PASSTHROUGH_ROUTES:
        passthrough_route(path, api_shape, tag, summary)


def add_model_list_routes(api: APIRouter, sup: Supervisor) -> None:
    """GET /v1/models and /v1/models/{model}: every model the router serves, loaded or not."""

    def model_entry(name: str, path: Path) -> dict:
        inst = sup.instances.get(name)
        try:
            created = int(path.stat().st_mtime)
        except OSError:
            created = 0
        return {"id": name, "object": "model", "created": created, "owned_by": "bostudio",
                "state": inst.state if inst else "stopped"}

    @api.get("/v1/models", tags=["openai"], summary="Every model the router serves, loaded or not")
    async def models() -> dict:
        return {"object": "list", "data": [model_entry(n, p) for n, p in sorted(sup.catalog().items())]}

    @api.get("/v1/models/{model}", tags=["openai"], summary="One model")
    async def model(model: str) -> dict:
        path = sup.catalog().get(model)
        if path is None:
            raise ModelError(f"model {model!r} does not exist", "GET /v1/models lists the models")
        return model_entry(model, path)


__all__ = ["PASSTHROUGH_ROUTES", "add_passthrough_routes", "add_model_list_routes"]
