"""OpenAI's ``POST /v1/embeddings``, over the shared embedding path (:mod:`..embeddings`):
``model``, ``input`` (a text, a list of texts, a list of token ids, or a list of such lists;
none empty), ``encoding_format`` (``float`` or ``base64``), ``dimensions``, ``user``
(ignored). An input longer than the model embeds is refused, as OpenAI does, not truncated.

``dimensions``: OpenAI refuses ``dimensions`` for models not trained for it, but a GGUF does
not say whether its model was (Matryoshka training), so ``/v1/embeddings`` cuts as Ollama's
``/api/embed`` does (the first ``dimensions`` components, normalised again), and refuses only
a number outside 1 to the model's length.
"""

from __future__ import annotations

import base64
from typing import Any, Union

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..body import read_json
from ..embeddings import EmbedRequest, count_inputs, embed, embed_body
from ..generation import GenerationPath
from ..wire import APIError, get_field, invalid

OPENAI_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
ENCODINGS = ("float", "base64")


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in v)


def _openai_inputs(raw: Any) -> list[Union[str, list[int]]]:
    valid = ("a non-empty string, a list of non-empty strings, a list of token ids, or a list "
             "of non-empty lists of token ids")
    if isinstance(raw, str) and raw:
        return [raw]
    if _is_ids(raw):
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(v, str) and v for v in raw) or all(_is_ids(v) for v in raw):
            return list(raw)
    if raw is None:
        raise APIError(400, "input is required: the text (or texts) to embed", param="input",
                       code="missing_required_parameter")
    shown = raw if isinstance(raw, str) else type(raw).__name__
    raise invalid("input", shown, valid)


def parse_openai_embeddings(body: Any) -> EmbedRequest:
    """A ``POST /v1/embeddings`` body."""
    body = embed_body(body, OPENAI_FIELDS)
    model = get_field(body, "model", "str")
    get_field(body, "user", "str")
    inputs = _openai_inputs(body.get("input"))
    count_inputs(len(inputs))
    encoding = get_field(body, "encoding_format", "str", "float")
    if encoding not in ENCODINGS:
        raise invalid("encoding_format", encoding, "'float' or 'base64'")
    return EmbedRequest(model, inputs, truncate=False,
                        dimensions=get_field(body, "dimensions", "int"),
                        encoding_format=encoding)


class OpenAIEmbeddingRoutes:
    """OpenAI's embedding endpoint over ``path``'s models; bodies are read up to ``max_body``
    bytes."""

    def __init__(self, path: GenerationPath, max_body: int):
        self.path, self.max_body = path, max_body

    def routes(self) -> list[Route]:
        return [Route("/v1/embeddings", self.openai_embeddings, methods=["POST"])]

    async def openai_embeddings(self, request: Request) -> Response:
        req = parse_openai_embeddings(await read_json(request, self.max_body))
        result, name, _ = await embed(self.path, req, request.url.path, truncates=False)
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
