"""The embedding routes' request bodies → :class:`EmbedRequest` (their replies and routes:
:mod:`.embeddings`). Plain Python, no HTTP stack; every refusal is an
:class:`~.wire.APIError` (400), answered in the shape of the API asked.

- Ollama's ``POST /api/embed``: ``model`` (required), ``input`` (a text or a list of texts; an
  empty text, or none, loads the model and embeds nothing), ``truncate`` (default true),
  ``dimensions``, ``keep_alive`` and ``options`` (accepted; none of its options changes an
  embedding here). Vectors are normalised.
- Ollama's older ``POST /api/embeddings``: ``model``, ``prompt`` (one text; empty: load the
  model), ``keep_alive``, ``options``. Its vector is not normalised, as Ollama's is not.
- OpenAI's ``POST /v1/embeddings``: ``model``, ``input`` (a text, a list of texts, a list of
  token ids, or a list of such lists; none empty), ``encoding_format`` (``float`` or
  ``base64``), ``dimensions``, ``user`` (ignored). An input longer than the model embeds is
  refused, as OpenAI does, not truncated.

At most :data:`MAX_INPUTS` inputs per request (OpenAI's bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from .keep_alive import parse_keep_alive
from .wire import APIError, checked, get_field, invalid, refuse_unknown

MAX_INPUTS = 2048
OLLAMA_FIELDS = {"model", "input", "truncate", "dimensions", "keep_alive", "options"}
LEGACY_FIELDS = {"model", "prompt", "keep_alive", "options"}
OPENAI_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
ENCODINGS = ("float", "base64")


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


def _object(body: Any, fields: set) -> dict:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown(body, fields)
    return body


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


def _count(n: int) -> None:
    if n > MAX_INPUTS:
        raise APIError(400, f"input holds {n} items: at most {MAX_INPUTS} are embedded per "
                            "request", param="input", code="invalid_value")


def parse_ollama_embed(body: Any) -> EmbedRequest:
    """A ``POST /api/embed`` body."""
    body = _object(body, OLLAMA_FIELDS)
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
    _count(len(inputs))
    return EmbedRequest(model, inputs, truncate=get_field(body, "truncate", "bool", True),
                        dimensions=get_field(body, "dimensions", "int"),
                        keep_alive=keep_alive)


def parse_ollama_embeddings(body: Any) -> EmbedRequest:
    """A ``POST /api/embeddings`` body (Ollama's older endpoint)."""
    body = _object(body, LEGACY_FIELDS)
    model, keep_alive = _ollama_common(body)
    prompt = get_field(body, "prompt", "str", "")
    return EmbedRequest(model, [prompt] if prompt else [], normalize=False,
                        keep_alive=keep_alive)


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
    body = _object(body, OPENAI_FIELDS)
    model = get_field(body, "model", "str")
    get_field(body, "user", "str")
    inputs = _openai_inputs(body.get("input"))
    _count(len(inputs))
    encoding = get_field(body, "encoding_format", "str", "float")
    if encoding not in ENCODINGS:
        raise invalid("encoding_format", encoding, "'float' or 'base64'")
    return EmbedRequest(model, inputs, truncate=False,
                        dimensions=get_field(body, "dimensions", "int"),
                        encoding_format=encoding)
