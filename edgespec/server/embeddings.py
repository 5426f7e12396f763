"""The embedding endpoints: Ollama's ``/api/embed`` and ``/api/embeddings``, OpenAI's
``/v1/embeddings`` (bodies: :mod:`.embed_request`).

Every model on the server embeds: an embedding model (BERT, nomic-bert, …; the catalogue's
kind ``"embedding"``, loaded as an :class:`~edgespec.embedding.Embedder`) pools as its file
declares; a generative model's Engine mean-pools its hidden states on a context of its own
(:meth:`Engine.embed <edgespec.engine.engine.Engine.embed>`). The model is leased from the
:class:`~.models.ModelManager` like any other (loaded on demand, kept ``keep_alive``), the
inputs are embedded in a worker thread (the event loop stays free), and the tokens embedded
are counted for ``/metrics``.

``dimensions``: Ollama cuts a vector to its first ``dimensions`` components and normalises it
again, for any model, when ``dimensions`` is below the model's length (otherwise the whole
vector); so does ``/api/embed`` here. OpenAI refuses ``dimensions`` for models not trained for
it, but a GGUF does not say whether its model was (Matryoshka training), so ``/v1/embeddings``
cuts as Ollama's does, and refuses only a number outside 1 to the model's length.
"""

from __future__ import annotations

import base64
import contextlib
import time
from typing import Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..embedding import Embeddings, shape
from ..errors import EdgespecError, EngineClosedError, InputTooLongError, InvalidParameterError
from .body import read_json
from .embed_request import (EmbedRequest, parse_ollama_embed, parse_ollama_embeddings,
                            parse_openai_embeddings)
from .generation import GenerationPath, api_error
from .wire import APIError


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def embed_error(e: EdgespecError, truncates: bool) -> Optional[APIError]:
    """The HTTP error for a failure to embed (None: not the request's doing). ``truncates``:
    the API has a ``truncate`` field."""
    if isinstance(e, InputTooLongError):
        message = str(e) if truncates else (
            f"input {e.index} is {e.n_prompt} tokens but this model embeds at most {e.n_ctx} "
            "(its context): shorten it")
        return APIError(400, message, param="input", code="context_length_exceeded")
    if isinstance(e, InvalidParameterError):
        param = "input" if e.name.startswith("inputs") else e.name
        return APIError(400, str(e), param=param, code="invalid_value")
    if isinstance(e, EngineClosedError):
        return api_error(e)
    return None


def ollama_dimensions(req: EmbedRequest, vectors_len: int) -> bool:
    """Whether Ollama's ``dimensions`` cuts the vectors: only below their length."""
    return req.dimensions is not None and 0 < req.dimensions < vectors_len


class EmbeddingRoutes:
    """The embedding endpoints over ``path``'s models; bodies are read up to ``max_body``
    bytes."""

    def __init__(self, path: GenerationPath, max_body: int):
        self.path, self.max_body = path, max_body

    def routes(self) -> list[Route]:
        return [Route("/api/embed", self.ollama_embed, methods=["POST"]),
                Route("/api/embeddings", self.ollama_embeddings, methods=["POST"]),
                Route("/v1/embeddings", self.openai_embeddings, methods=["POST"])]

    async def _embed(self, req: EmbedRequest, endpoint: str, dimensions: bool = True
                     ) -> tuple[Embeddings, str, float]:
        """(the embeddings, the model's name, seconds spent loading it). ``dimensions``:
        pass the request's on to the model (else the caller applies it)."""
        async with contextlib.AsyncExitStack() as leases:
            lease = await self.path.lease(leases, req.model, req.keep_alive, embedding=True)
            model = lease.engine
            try:
                result = await run_in_threadpool(
                    model.embed, req.inputs, truncate=req.truncate, normalize=req.normalize,
                    dimensions=req.dimensions if dimensions else None)
            except EdgespecError as e:
                err = embed_error(e, truncates=endpoint == "/api/embed")
                if err is None:
                    raise
                raise err from None
        metrics = self.path.metrics
        if metrics is not None:
            metrics.embedding_done(lease.name, endpoint, len(result), result.prompt_tokens)
        return result, lease.name, lease.load_seconds

    async def ollama_embed(self, request: Request) -> Response:
        t0 = time.perf_counter()
        req = parse_ollama_embed(await read_json(request, self.max_body, any_type=True))
        result, _, load_seconds = await self._embed(req, request.url.path, dimensions=False)
        vectors = result.vectors
        if ollama_dimensions(req, vectors.shape[1]):
            vectors = shape(vectors, req.dimensions, normalize=True)
        return JSONResponse({"model": req.model, "embeddings": vectors.tolist(),
                             "total_duration": _ns(time.perf_counter() - t0),
                             "load_duration": _ns(load_seconds),
                             "prompt_eval_count": result.prompt_tokens})

    async def ollama_embeddings(self, request: Request) -> Response:
        req = parse_ollama_embeddings(await read_json(request, self.max_body, any_type=True))
        result, _, _ = await self._embed(req, request.url.path)
        return JSONResponse({"embedding": result.vectors[0].tolist() if len(result) else []})

    async def openai_embeddings(self, request: Request) -> Response:
        req = parse_openai_embeddings(await read_json(request, self.max_body))
        result, name, _ = await self._embed(req, request.url.path)
        vectors = ([_base64(v) for v in result.vectors] if req.encoding_format == "base64"
                   else result.vectors.tolist())
        data = [{"object": "embedding", "index": i, "embedding": v}
                for i, v in enumerate(vectors)]
        return JSONResponse({"object": "list", "data": data, "model": req.model or name,
                             "usage": {"prompt_tokens": result.prompt_tokens,
                                       "total_tokens": result.prompt_tokens}})


def _base64(vector) -> str:
    """A vector as OpenAI's ``base64`` encoding: its float32 values, little-endian."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
