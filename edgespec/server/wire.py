"""What the HTTP APIs' request parsers share (OpenAI's, :mod:`.openai.request`; Ollama's,
:mod:`.ollama.request`): the error every refusal raises, the checks of a JSON value, and
:class:`APIRequest`, what a parsed body becomes. Plain Python, no HTTP stack.

:class:`APIError` carries the HTTP status and OpenAI's error shape ``{"error": {"message",
"type", "param", "code"}}`` (the app answers ``/api/`` in Ollama's ``{"error": message}``).
Messages reuse the engine's wording (:class:`~edgespec.errors.InvalidParameterError`):
``temperature=3 is invalid: temperature must be …``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from ..config import SamplingParams
from ..errors import InvalidParameterError
from ..engine.request import GenerationRequest

# No tokenizer averages anywhere near this many characters per token, so a longer prompt
# cannot fit the context: refused before the chat template or the tokenizer spend time on it.
MAX_CHARS_PER_TOKEN = 64
MAX_PROMPT_CHARS = 2_000_000
_TYPE_WORDS = {"int": "an integer", "number": "a number", "bool": "true or false",
               "list": "a list of non-empty strings"}


class APIError(Exception):
    """An HTTP error in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (status, message, param,
                                                                        code, type)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class APIRequest:
    """One HTTP request for a generation: ``generation``, the core request, handed to the
    Engine as it is, and what only the HTTP side reads: ``kind`` ("chat" or "completion":
    the reply's shape, and the field that holds the prompt), the ``model`` named (None: the
    server's default), whether to ``stream``, whether a stream ends with a usage chunk
    (``include_usage``, OpenAI's), and the context the model must be loaded with
    (``num_ctx``; None: any, :mod:`.contexts`)."""

    kind: str
    model: Optional[str]
    generation: GenerationRequest
    stream: bool
    include_usage: bool = False
    num_ctx: Optional[int] = None

    @property
    def holds_answer(self) -> bool:
        """Whether a stream sends the answer once it is complete: a request that may call
        tools (the raw output is the call's JSON; what it means is known only at its end)."""
        return bool(self.generation.tools) and self.generation.tool_choice != "none"


# What each sampling field is, in every API that has it (Ollama's options included).
SAMPLING_KINDS = {"temperature": "number", "top_k": "int", "top_p": "number", "min_p": "number",
                  "repeat_penalty": "number", "repeat_last_n": "int",
                  "presence_penalty": "number", "frequency_penalty": "number", "seed": "int"}


def sampling_fields(source: dict, names: Iterable[str], where: str = "") -> dict:
    """The sampling fields ``names`` that ``source`` gives (not null), each checked as its
    kind (:data:`SAMPLING_KINDS`); ``where``: the path of ``source`` in the request."""
    return {name: get_field(source, name, SAMPLING_KINDS[name], where=where) for name in names
            if source.get(name) is not None}


def sampling_params(values: dict, temperature_max: float, where: str = "") -> SamplingParams:
    """``values`` (checked JSON numbers) as SamplingParams, the temperature within the API's
    range [0, ``temperature_max``]: SamplingParams' own check, the only one; a bad value is
    a 400 naming it (``where``: the path of the fields in the request)."""
    try:
        return SamplingParams(**values, temperature_max=temperature_max)
    except InvalidParameterError as e:
        name = f"{where}.{e.name}" if where else e.name
        raise invalid(name, e.value, e.valid) from None


def generation_request(prompt: Any, names: Optional[dict] = None,
                       **fields) -> GenerationRequest:
    """``GenerationRequest(prompt, **fields)``: its checks of max_tokens and logprobs (with
    the API's bounds, ``context`` and ``logprobs_max``) are the only ones; a refusal is a 400
    naming the field the client sent (``names``: the request's name -> the protocol's, as
    ``{"max_tokens": "options.num_predict"}``)."""
    try:
        return GenerationRequest(prompt, **fields)
    except InvalidParameterError as e:
        raise invalid((names or {}).get(e.name, e.name), e.value, e.valid) from None


def core_check(check: Callable[..., Any], value: Any, name: str, **bounds) -> Any:
    """``check(value, name, **bounds)`` (one of :mod:`edgespec.engine.request`'s checks, the
    only ones of their parameters), its refusal a 400 naming ``name``."""
    try:
        return check(value, name, **bounds)
    except InvalidParameterError as e:
        raise invalid(name, e.value, e.valid) from None


def invalid(name: str, value: Any, valid: str, code: str = "invalid_value") -> APIError:
    return APIError(400, str(InvalidParameterError(name, value, valid)), param=name, code=code)


def unsupported(name: str, what: str) -> APIError:
    return APIError(400, f"{name} is not supported: {what}", param=name,
                    code="unsupported_parameter")


def refuse_unknown(body: dict, allowed: set, what: str = "parameter", where: str = "") -> None:
    """An APIError for the first field of ``body`` not in ``allowed`` (``what``: the word
    for a field in the message; ``where``: the path of ``body`` in the request)."""
    for name in body:
        if name not in allowed:
            full = f"{where}.{name}" if where else name
            raise APIError(400, f"unknown {what} {full!r}: edgespec does not know it (see "
                                "docs/api.md for the supported fields)",
                           param=full, code="unknown_parameter")


def message_list(body: dict) -> list:
    """``body["messages"]``: a non-empty list (its items are the caller's to check)."""
    messages = body.get("messages")
    if messages is None:
        raise APIError(400, "messages is required: a non-empty list of {role, content} "
                            "objects", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", messages, "a non-empty list of {role, content} objects")
    return messages


def num_ctx(value: Any, name: str) -> Optional[int]:
    """A requested context size: None, or an integer >= 1 (an APIError names ``name``, the
    field the client sent: ``num_ctx`` or Ollama's ``options.num_ctx``). The only check of
    it; :mod:`.contexts` then clamps it to what the model can have."""
    if value is None:
        return None
    n = checked(name, value, "int")
    if n < 1:
        raise invalid(name, n, "an integer >= 1 (tokens of context)")
    return n


def asked(body: Any, *path: str) -> Any:
    """``body[path[0]][path[1]]…`` when every step is an object holding the next (else
    None): what a body asks for, read before it is checked."""
    for key in path:
        body = body.get(key) if isinstance(body, dict) else None
    return body


def check_size(n_chars: int, n_ctx: int, param: str) -> None:
    """An APIError when a prompt of ``n_chars`` characters cannot fit ``n_ctx`` tokens."""
    limit = min(MAX_CHARS_PER_TOKEN * n_ctx, MAX_PROMPT_CHARS)
    if n_chars > limit:
        raise APIError(400, f"the prompt is {n_chars} characters long, far more than the "
                            f"context of {n_ctx} tokens holds (at most {limit} characters are "
                            "accepted)", param=param, code="context_length_exceeded")


# ---------------------------------------------------------------------------------------------
# JSON values


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def integer(value: Any) -> Optional[int]:
    """An integer, or a JSON number with an integral value (JavaScript sends 5 as 5.0)."""
    if is_int(value):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def as_float(value: float) -> float:
    """A JSON number as a float (an integer too large for one is infinite)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def checked(name: str, value: Any, kind: str) -> Any:
    """``value`` as ``kind`` ("int": an integer or an integral number; "number": a finite
    one; "bool"; "str"), else an APIError naming it."""
    if kind == "int":
        n = integer(value)
        if n is not None:
            return n
    elif kind == "number" and is_number(value) and math.isfinite(as_float(value)):
        return value
    elif kind == "bool" and isinstance(value, bool):
        return value
    elif kind == "str" and isinstance(value, str):
        return value
    raise invalid(name, value, _TYPE_WORDS.get(kind, "a string"), code="invalid_type")


def get_field(body: dict, name: str, kind: str, default: Any = None, where: str = "") -> Any:
    """``body[name]`` checked as ``kind`` (``default`` when absent or null); ``where``: the
    path of ``body`` in the request, for the message."""
    value = body.get(name)
    return default if value is None else checked(f"{where}.{name}" if where else name, value,
                                                 kind)
