"""Ollama's embedding endpoints, over the shared embedding path (:mod:`..embeddings`):

- ``POST /api/embed``: ``model`` (required), ``input`` (a text or a list of texts; an empty
  text, or none, loads the model and embeds nothing), ``truncate`` (default true),
  ``dimensions``, ``keep_alive`` and ``options`` (accepted; none of its options changes an
  embedding here). Vectors are normalised.
- the older ``POST /api/embeddings``: ``model``, ``prompt`` (one text; empty: load the model),
  ``keep_alive``, ``options``. Its vector is not normalised, as Ollama's is not.

``dimensions``: Ollama cuts a vector to its first ``dimensions`` components and normalises it
again, for any model, when ``dimensions`` is below the model's length (otherwise the whole
vector); so does ``/api/embed`` here.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...embedding import shape
from ..body import read_json
from ..embeddings import EmbedRequest, count_inputs, embed, embed_body
from ..generation import GenerationPath
from ..keep_alive import parse_keep_alive
from ..wire import APIError, checked, get_field, invalid
from .replies import nanoseconds

OLLAMA_FIELDS = {"model", "input", "truncate", "dimensions", "keep_alive", "options"}
LEGACY_FIELDS = {"model", "prompt", "keep_alive", "options"}


def _ollama_common(body: dict) -> tuple[str, Optional[float]]:
    """The model (required, as Ollama's) and keep_alive; ``options`` must be an object."""
    model = body.get("model")
    if model is None or model == "":
        raise APIError(400, "model is required: the name of a model that /api/tags lists",
                       param="model", code="missing_required_parameter")
    checked("model", model, "str")
    options = body.get("options")
    if options is not None and not isinstance(options, dict):
        raise invalid("options", type(options).__name__, "an object", code="invalid_type")
    return model, parse_keep_alive(body.get("keep_alive"))


def parse_ollama_embed(body: Any) -> EmbedRequest:
    """A ``POST /api/embed`` body."""
    body = embed_body(body, OLLAMA_FIELDS)
    model, keep_alive = _ollama_common(body)
    raw = body.get("input")
    if raw is None or raw == "":
        inputs = []
    elif isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and all(isinstance(v, str) for v in raw):
        inputs = list(raw)
    else:
        raise invalid("input", type(raw).__name__, "a string or a list of strings",
                      code="invalid_type")
    count_inputs(len(inputs))
    return EmbedRequest(model, inputs, truncate=get_field(body, "truncate", "bool", True),
                        dimensions=get_field(body, "dimensions", "int"),
                        keep_alive=keep_alive)


def parse_ollama_embeddings(body: Any) -> EmbedRequest:
    """A ``POST /api/embeddings`` body (Ollama's older endpoint)."""
    body = embed_body(body, LEGACY_FIELDS)
    model, keep_alive = _ollama_common(body)
    prompt = get_field(body, "prompt", "str", "")
    return EmbedRequest(model, [prompt] if prompt else [], normalize=False,
                        keep_alive=keep_alive)


def ollama_dimensions(req: EmbedRequest, vectors_len: int) -> bool:
    """Whether Ollama's ``dimensions`` cuts the vectors: only below their length."""
    return req.dimensions is not None and 0 < req.dimensions < vectors_len


class OllamaEmbeddingRoutes:
    """Ollama's embedding endpoints over ``path``'s models; bodies are read up to ``max_body``
    bytes."""

    def __init__(self, path: GenerationPath, max_body: int):
        self.path, self.max_body = path, max_body

    def routes(self) -> list[Route]:
        return [Route("/api/embed", self.ollama_embed, methods=["POST"]),
                Route("/api/embeddings", self.ollama_embeddings, methods=["POST"])]

    async def ollama_embed(self, request: Request) -> Response:
        t0 = time.perf_counter()
        req = parse_ollama_embed(await read_json(request, self.max_body, any_type=True))
        result, _, load_seconds = await embed(self.path, req, request.url.path,
                                              truncates=True, dimensions=False)
        vectors = result.vectors
        if ollama_dimensions(req, vectors.shape[1]):
            vectors = shape(vectors, req.dimensions, normalize=True)
        return JSONResponse({"model": req.model, "embeddings": vectors.tolist(),
                             "total_duration": nanoseconds(time.perf_counter() - t0),
                             "load_duration": nanoseconds(load_seconds),
                             "prompt_eval_count": result.prompt_tokens})

    async def ollama_embeddings(self, request: Request) -> Response:
        req = parse_ollama_embeddings(await read_json(request, self.max_body, any_type=True))
        result, _, _ = await embed(self.path, req, request.url.path, truncates=False)
        return JSONResponse({"embedding": result.vectors[0].tolist() if len(result) else []})
