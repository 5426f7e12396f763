"""What the embedding endpoints share: a body parsed into an :class:`EmbedRequest`, and the
path that embeds it. Ollama's ``/api/embed`` and ``/api/embeddings``
(:mod:`.ollama.embeddings`) and OpenAI's ``/v1/embeddings`` (:mod:`.openai.embeddings`) read
their bodies and shape their replies; every refusal is an :class:`~.wire.APIError` (400),
answered in the shape of the API asked.

Every model on the server embeds: an embedding model (BERT, nomic-bert, …; the catalogue's
kind ``"embedding"``, loaded as an :class:`~edgespec.embedding.Embedder`) pools as its file
declares; a generative model's Engine mean-pools its hidden states on a context of its own
(:meth:`Engine.embed <edgespec.engine.engine.Engine.embed>`). The model is leased from the
:class:`~.models.ModelManager` like any other (loaded on demand, kept ``keep_alive``), the
inputs are embedded in a worker thread (the event loop stays free), and the tokens embedded
are counted for ``/metrics``.

At most :data:`MAX_INPUTS` inputs per request (OpenAI's bound).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Optional, Union

from starlette.concurrency import run_in_threadpool

from ..embedding import Embeddings
from ..errors import EdgespecError, EngineClosedError, InputTooLongError, InvalidParameterError
from .generation import GenerationPath, api_error
from .wire import APIError, refuse_unknown

MAX_INPUTS = 2048


@dataclass(frozen=True)
class EmbedRequest:
    """One embedding request: the ``model`` named (None: the server's default), the
    ``inputs`` (texts, or token-id lists), whether an input too long is ``truncate``-d or
    refused, ``dimensions`` (None: all; Ollama's: any number, applied only below the model's
    length), whether vectors are ``normalize``-d, ``keep_alive`` in seconds (Ollama's;
    None: the server's) and OpenAI's ``encoding_format``."""

    model: Optional[str]
    inputs: list[Union[str, list[int]]]
    truncate: bool = True
    dimensions: Optional[int] = None
    normalize: bool = True
    keep_alive: Optional[float] = None
    encoding_format: str = "float"


def embed_body(body: Any, fields: set) -> dict:
    """``body``: a JSON object of only ``fields``."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown(body, fields)
    return body


def count_inputs(n: int) -> None:
    """An APIError when a request holds more than :data:`MAX_INPUTS` inputs."""
    if n > MAX_INPUTS:
        raise APIError(400, f"input holds {n} items: at most {MAX_INPUTS} are embedded per "
                            "request", param="input", code="invalid_value")


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


async def embed(path: GenerationPath, req: EmbedRequest, endpoint: str, *, truncates: bool,
                dimensions: bool = True) -> tuple[Embeddings, str, float]:
    """(the embeddings, the model's name, seconds spent loading it), the model leased from
    ``path`` and the tokens counted under ``endpoint``. ``truncates``: the API has a
    ``truncate`` field (:func:`embed_error`); ``dimensions``: pass the request's on to the
    model (else the caller applies it)."""
    async with contextlib.AsyncExitStack() as leases:
        lease = await path.lease(leases, req.model, req.keep_alive, embedding=True)
        model = lease.engine
        try:
            result = await run_in_threadpool(
                model.embed, req.inputs, truncate=req.truncate, normalize=req.normalize,
                dimensions=req.dimensions if dimensions else None)
        except EdgespecError as e:
            err = embed_error(e, truncates=truncates)
            if err is None:
                raise
            raise err from None
    metrics = path.metrics
    if metrics is not None:
        metrics.embedding_done(lease.name, endpoint, len(result), result.prompt_tokens)
    return result, lease.name, lease.load_seconds
