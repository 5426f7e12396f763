"""Ollama's request bodies → the generation they ask for (its replies: :mod:`.replies`).

Plain Python, no HTTP stack. It mirrors :mod:`..openai.request` (OpenAI's): every ``/api/chat`` and
``/api/generate`` body becomes an :class:`OllamaRequest` holding an :class:`~..wire.APIRequest`
(and in it the core :class:`~edgespec.engine.request.GenerationRequest`), or raises
:class:`~..wire.APIError` (400), which the app answers in Ollama's ``{"error": message}``.
Messages reuse the engine's wording (:class:`~edgespec.errors.InvalidParameterError`):
``options.temperature=-1 is invalid: options.temperature must be …``.

Requests follow Ollama's API (docs/api.md, api/types.go): ``stream`` defaults to true;
``format`` is ``"json"`` or a JSON schema; ``options`` are read by :mod:`.options`.
Tool calls travel in Ollama's shape (arguments as an object) and are converted to
OpenAI's, which the engine reads. ``think`` turns a thinking model's reasoning on or off
(:mod:`edgespec.thinking`); ``options.num_ctx`` is the context the model must be loaded with
(:mod:`..contexts`). ``truncate`` and ``shift`` are accepted and ignored: edgespec never cuts
the history (a prompt over the context is a 400) and stops at the context edge
(``done_reason`` ``"length"``). ``suffix`` fills in the middle (the prompt is the text before
the gap, sent in the model's fill-in-the-middle tokens; a model without them is a 400). Images,
``template`` and the deprecated ``context`` are refused by name; any other
top-level field is refused as unknown, so that a typo is not silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from ...chat_template import new_call_id
from ...constraints import Constraint
from ...errors import ConstraintError
from ...thinking import LEVELS
from ...tools import Tool, parse_tools
from .options import parse_options
from ..keep_alive import parse_keep_alive
from ..wire import (APIError, APIRequest, check_size, checked, generation_request, get_field,
                    invalid, refuse_unknown, unsupported)

ROLES = ("system", "user", "assistant", "tool")
THINK_LEVELS = LEVELS

_COMMON = {"model", "format", "options", "stream", "keep_alive", "think", "truncate", "shift",
           "logprobs", "top_logprobs", "_debug_render_only"}
CHAT_FIELDS = _COMMON | {"messages", "tools"}
GENERATE_FIELDS = _COMMON | {"prompt", "suffix", "system", "template", "context", "raw",
                             "images", "width", "height", "steps"}
# The request's names -> the fields an Ollama client sends for them
_WIRE_NAMES = {"max_tokens": "options.num_predict", "logprobs": "top_logprobs"}


@dataclass(frozen=True)
class OllamaRequest:
    """What one ``/api/chat`` or ``/api/generate`` request asks for.

    ``gen`` is the generation, with its kind ("chat", or "completion" for a raw prompt) and
    whether to stream (None for a load request: no messages, or an empty prompt);
    ``keep_alive`` is in seconds (None: not given; 0: unload after the request; negative,
    :data:`~..keep_alive.FOREVER`: keep loaded); ``num_ctx``: the context size the request
    asked for (None: not given), which a load request (no ``gen``) loads the model with too."""

    model: str
    gen: Optional[APIRequest]
    keep_alive: Optional[float] = None
    num_ctx: Optional[int] = None
    load_only: bool = False


# ---------------------------------------------------------------------------------------------
# Reading fields


def _think(body: dict) -> Any:
    """``think``: None (not given), a bool or a level."""
    think = body.get("think")
    if think is not None and not isinstance(think, bool) and think not in THINK_LEVELS:
        raise invalid("think", think, "true, false, 'high', 'medium' or 'low'")
    return think


def _check_dialect(schema: Any, where: str) -> None:
    """A top-level ``$schema`` must be a string: the schema checker fails on anything else."""
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        raise invalid(f"{where}.$schema", schema["$schema"],
                      "a string (the URI of a JSON schema dialect)", code="invalid_type")


def _format(body: dict) -> Optional[Constraint]:
    fmt = body.get("format")
    if fmt in (None, ""):
        return None
    try:
        if fmt == "json":
            return Constraint.json()
        if isinstance(fmt, dict):
            _check_dialect(fmt, "format")
            return Constraint.json_schema(fmt)
    except ConstraintError as e:
        raise APIError(400, f"format: {e}", param="format", code="invalid_value") from None
    raise invalid("format", fmt, "'json' or a JSON schema object")


def _tools(body: dict) -> Optional[list[Tool]]:
    tools = body.get("tools")
    if tools in (None, []):
        return None
    if isinstance(tools, list):
        for i, t in enumerate(tools):
            spec = t.get("function", t) if isinstance(t, dict) else None
            if isinstance(spec, dict):
                _check_dialect(spec.get("parameters"), f"tools[{i}].function.parameters")
    try:
        return parse_tools(tools)
    except ConstraintError as e:
        raise APIError(400, str(e), param="tools", code="invalid_value") from None


def _logprobs(body: dict) -> Optional[int]:
    """Alternatives per token's log-probability (None: not asked for), its range checked
    where the request is made. As in Ollama, ``top_logprobs`` only counts with
    ``logprobs: true``."""
    want = get_field(body, "logprobs", "bool", False)
    top = get_field(body, "top_logprobs", "int", 0)
    return top if want else None


def _refuse_features(body: dict) -> None:
    """Fields of features edgespec does not have, refused when a request actually uses them."""
    if body.get("_debug_render_only") not in (None, False):
        raise unsupported("_debug_render_only", "edgespec does not return the rendered prompt")
    for name in ("width", "height", "steps"):
        if body.get(name) not in (None, 0):
            raise unsupported(name, "image generation is not available: edgespec serves text "
                                    "models")
    for name in ("truncate", "shift"):
        get_field(body, name, "bool")      # accepted, ignored: see the module's docstring


# ---------------------------------------------------------------------------------------------
# Messages


def calls_to_openai(calls: Any, where: str) -> list[dict]:
    """Ollama's ``tool_calls`` (``{"function": {"name", "arguments": {…}}}``) in OpenAI's
    shape, which the engine reads: arguments as JSON text, an id (Ollama's, or a new one)."""
    valid = "a list of {\"function\": {\"name\", \"arguments\": {…}}} objects"
    if not isinstance(calls, list):
        raise invalid(where, type(calls).__name__, valid, code="invalid_type")
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise invalid(f"{where}[{j}]", c, "{\"function\": {\"name\", \"arguments\": {…}}}",
                          code="invalid_type")
        args = f.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, (dict, str)):
            raise invalid(f"{where}[{j}].function.arguments", args, "an object",
                          code="invalid_type")
        call_id = c.get("id")
        out.append({"id": call_id if isinstance(call_id, str) and call_id else new_call_id(),
                    "type": "function",
                    "function": {"name": f["name"], "arguments": args if isinstance(args, str)
                                 else json.dumps(args, ensure_ascii=False)}})
    return out


def _message(i: int, m: Any, pending: list[dict]) -> dict:
    """One message in the engine's (OpenAI's) shape. ``pending``: the calls of the last
    assistant message that no tool result has answered yet; a tool result without a
    ``tool_call_id`` is matched to one of them by its ``tool_name`` (else in order)."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise invalid(where, m, "an object with role and content", code="invalid_type")
    role = m.get("role")
    role = role.lower() if isinstance(role, str) else role
    if role not in ROLES:
        raise invalid(f"{where}.role", m.get("role"), "one of " + ", ".join(ROLES))
    content = get_field(m, "content", "str", "", where)
    if m.get("images") not in (None, []):
        raise unsupported(f"{where}.images", "edgespec serves text models")
    msg: dict = {"role": role, "content": content}
    calls = m.get("tool_calls")
    if role == "assistant":
        pending.clear()
        if calls not in (None, []):
            msg["tool_calls"] = calls_to_openai(calls, f"{where}.tool_calls")
            pending.extend(msg["tool_calls"])
    elif calls not in (None, []):
        raise APIError(400, f"{where}.tool_calls is not allowed with role {role!r}: only "
                            "assistant messages carry tool calls", param=f"{where}.tool_calls",
                       code="invalid_value")
    if role == "tool":
        name = get_field(m, "tool_name", "str", where=where)
        call_id = get_field(m, "tool_call_id", "str", where=where)
        if call_id is None and pending:
            call = next((c for c in pending if c["function"]["name"] == name), pending[0])
            pending.remove(call)
            call_id, name = call["id"], name or call["function"]["name"]
        if call_id:
            msg["tool_call_id"] = call_id
        if name:
            msg["name"] = name
    return msg


# ---------------------------------------------------------------------------------------------
# Requests


def _start(body: Any, fields: set) -> str:
    """Checks every request shares; the model's name."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown(body, fields)
    model = body.get("model")
    if model is None or model == "":
        raise APIError(400, "model is required: the name of a model that /api/tags lists",
                       param="model", code="missing_required_parameter")
    checked("model", model, "str")
    _refuse_features(body)
    return model


def _request(body: dict, model: str, kind: str, prompt: Any, n_ctx: int,
             tools: Optional[list[Tool]] = None, suffix: Optional[str] = None
             ) -> OllamaRequest:
    stream = get_field(body, "stream", "bool", True)     # Ollama streams unless told not to
    keep_alive = parse_keep_alive(body.get("keep_alive"))
    think = _think(body)
    options = parse_options(body, n_ctx)
    constraint = _format(body)
    logprobs = _logprobs(body)
    if constraint is not None and tools:
        raise APIError(400, "format and tools cannot both shape one answer: send one of them",
                       param="format", code="invalid_value")
    gen = None if prompt is None else APIRequest(
        kind=kind, model=model, stream=stream, generation=generation_request(
            prompt, _WIRE_NAMES, max_tokens=options.max_tokens, sampling=options.sampling,
            raw=kind == "completion", stop=options.stop, constraint=constraint, tools=tools,
            tool_choice="auto" if tools else None,
            parallel_tool_calls=bool(tools),            # Ollama returns several calls
            logprobs=logprobs, think=think, suffix=suffix), num_ctx=options.num_ctx)
    return OllamaRequest(model=model, gen=gen, keep_alive=keep_alive, num_ctx=options.num_ctx,
                         load_only=gen is None)


def parse_ollama_chat(body: Any, n_ctx: int) -> OllamaRequest:
    """A ``POST /api/chat`` body. No messages (or an empty list) asks to load the model
    (with ``keep_alive: 0``, to unload it): ``load_only``, and no ``gen``."""
    model = _start(body, CHAT_FIELDS)
    messages = body.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise invalid("messages", type(messages).__name__, "a list of {role, content} objects",
                      code="invalid_type")
    pending: list[dict] = []
    prompt = [_message(i, m, pending) for i, m in enumerate(messages or [])]
    check_size(sum(len(m["content"]) for m in prompt), n_ctx, "messages")
    return _request(body, model, "chat", prompt or None, n_ctx, _tools(body))


def parse_ollama_generate(body: Any, n_ctx: int) -> OllamaRequest:
    """A ``POST /api/generate`` body. With ``raw: true`` the prompt is sent as-is (kind
    ``completion``); otherwise it is a user message (after ``system``, if given) in the
    model's chat template. An empty prompt asks to load the model (``load_only``)."""
    model = _start(body, GENERATE_FIELDS)
    prompt = get_field(body, "prompt", "str", "")
    system = get_field(body, "system", "str", "")
    raw = get_field(body, "raw", "bool", False)
    if get_field(body, "template", "str", ""):
        raise unsupported("template", "edgespec applies the model's own chat template: send "
                          "raw: true with a prompt formatted yourself, or use /api/chat")
    suffix = get_field(body, "suffix", "str", "") or None
    if suffix is not None and not raw and system:
        raise unsupported("system", "a suffix fills in the middle of the prompt's text, with "
                          "no template, so there is no place for a system message")
    if body.get("context") not in (None, []):
        raise unsupported("context", "the deprecated token-array continuation is not "
                          "available: keep the conversation in /api/chat's messages")
    if body.get("images") not in (None, []):
        raise unsupported("images", "edgespec serves text models")
    if raw and system:
        raise unsupported("system", "raw: true applies no template, so there is no place for "
                          "a system message: put it in the prompt")
    check_size(len(prompt) + len(system), n_ctx, "prompt")
    if not prompt and suffix is None:
        text = None
    elif raw or suffix is not None:
        text = prompt
    else:
        text = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": prompt}]
    return _request(body, model, "completion" if raw or suffix is not None else "chat", text,
                    n_ctx, suffix=suffix)
