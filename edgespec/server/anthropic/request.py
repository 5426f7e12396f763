"""Anthropic's Messages API request bodies → the generation they ask for (its replies:
:mod:`.replies`).

Plain Python, no HTTP stack. It mirrors :mod:`..openai.request` (OpenAI's) and
:mod:`..ollama.request`: every ``/v1/messages`` (and ``/v1/messages/count_tokens``) body
becomes an :class:`~..wire.APIRequest` holding the core
:class:`~edgespec.engine.request.GenerationRequest`, or raises :class:`~..wire.APIError`
(400), which the app answers in Anthropic's error shape.

Content travels as the engine reads it (OpenAI's messages): ``system`` becomes the system
message; an assistant's ``text`` blocks its content and its ``tool_use`` blocks its
``tool_calls``; a user's ``tool_result`` blocks become ``tool`` messages (named after the call
they answer; ``is_error`` says so in the text) and its ``text`` blocks one user message.
``max_tokens`` is required, as Anthropic requires it; it may exceed the context (the answer
then stops at the context's edge). ``output_config.format`` holds the answer to a JSON
schema. Fields that change nothing here (labels such as ``metadata.user_id`` and
``workspace_id``; ``service_tier``, ``speed`` and ``inference_geo``, which place a request;
``cache_control``, ``citations``, ``output_config.effort``, ``thinking`` ``disabled`` or
``adaptive``) are accepted and ignored; what edgespec cannot honour (images, documents,
thinking blocks, a final assistant message to continue, server tools, containers) is refused
by name; any other field is refused as unknown. docs/server.md lists each.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from ...config import SamplingParams
from ...constraints import Constraint
from ...errors import ConstraintError
from ...engine.request import check_stop
from ...tools import Tool, parse_tools
from ..wire import (APIError, APIRequest, check_size, checked, core_check, generation_request,
                    get_field, invalid, message_list, refuse_unknown, sampling_fields,
                    sampling_params, unsupported)

TEMPERATURE_MAX = 1.0          # Anthropic's range
MAX_STOP_SEQUENCES = 64        # Anthropic states no bound; each one is checked at every token
EFFORTS = ("low", "medium", "high", "xhigh", "max")
# fields that label a request or place it (a tier, a region, a cache hint): accepted, ignored
_LABELS = {"metadata", "service_tier", "cache_control", "inference_geo", "speed",
           "diagnostics", "user_profile_id", "workspace_id"}
COUNT_FIELDS = _LABELS | {"model", "messages", "system", "tools", "tool_choice", "thinking",
                          "output_config"}
MESSAGES_FIELDS = COUNT_FIELDS | {"max_tokens", "stop_sequences", "stream", "temperature",
                                  "top_p", "top_k", "speculative"}
# Anthropic's fields for features edgespec does not have: refused by name, with why
_REFUSED = {"container": "edgespec runs no code containers",
            "mcp_servers": "edgespec connects to no MCP servers",
            "context_management": "edgespec never edits the conversation",
            "output_format": "send output_config.format ({\"type\": \"json_schema\", "
                             "\"schema\": …}) instead"}
_BLOCK_KEYS = {"text": {"type", "text", "cache_control", "citations"},
               "tool_use": {"type", "id", "name", "input", "cache_control", "caller",
                            "toolset_name"},
               "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control",
                               "toolset_name"}}
_TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control", "strict",
              "defer_loading", "eager_input_streaming", "input_examples", "allowed_callers"}
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _object(value: Any, where: str, valid: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(where, value, valid, code="invalid_type")
    return value


# ---------------------------------------------------------------------------------------------
# Content blocks


def _block(block: Any, where: str, allowed: tuple) -> dict:
    """One content block, checked: its type one of ``allowed``, its fields known."""
    kind = _object(block, where, "a content block object").get("type")
    if kind not in allowed:
        if kind in ("image", "document", "search_result"):
            raise unsupported(where, f"{kind} blocks: edgespec serves text models")
        if kind in ("thinking", "redacted_thinking"):
            raise unsupported(where, "thinking blocks: edgespec does not separate thinking")
        raise invalid(f"{where}.type", kind, "one of " + ", ".join(map(repr, allowed)))
    refuse_unknown(block, _BLOCK_KEYS[kind], "field", where)
    return block


def _text(block: dict, where: str) -> str:
    return checked(f"{where}.text", block.get("text"), "str")


def _texts(content: Any, where: str) -> str:
    """A string, or a list of text blocks, as one text (``system``, a tool result)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, type(content).__name__, "a string or a list of text blocks",
                      code="invalid_type")
    return "".join(_text(_block(b, f"{where}[{j}]", ("text",)), f"{where}[{j}]")
                   for j, b in enumerate(content))


def _call(block: dict, where: str) -> dict:
    """A ``tool_use`` block as an OpenAI tool call (arguments as JSON text)."""
    call_id = checked(f"{where}.id", block.get("id"), "str")
    name = checked(f"{where}.name", block.get("name"), "str")
    args = _object(block.get("input", {}), f"{where}.input", "an object")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def _result(block: dict, where: str, names: dict) -> dict:
    """A ``tool_result`` block as a ``tool`` message; ``names``: call ids → tool names."""
    call_id = checked(f"{where}.tool_use_id", block.get("tool_use_id"), "str")
    text = _texts(block.get("content", ""), f"{where}.content")
    if get_field(block, "is_error", "bool", False, where):
        text = f"error: {text}"
    msg = {"role": "tool", "content": text, "tool_call_id": call_id}
    if call_id in names:
        msg["name"] = names[call_id]
    return msg


def _message(i: int, m: Any, names: dict) -> list[dict]:
    """One Anthropic message as the engine's messages (see the module docstring)."""
    where = f"messages[{i}]"
    m = _object(m, where, "an object with role and content")
    refuse_unknown(m, {"role", "content"}, "field", where)
    role = m.get("role")
    if role not in ("user", "assistant"):
        raise invalid(f"{where}.role", role, "'user' or 'assistant'")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content", type(content).__name__,
                      "a string or a list of content blocks", code="invalid_type")
    allowed = ("text", "tool_use") if role == "assistant" else ("text", "tool_result")
    texts, calls, results = [], [], []
    for j, raw in enumerate(content):
        at = f"{where}.content[{j}]"
        block = _block(raw, at, allowed)
        if block["type"] == "text":
            texts.append(_text(block, at))
        elif block["type"] == "tool_use":
            calls.append(_call(block, at))
            names[calls[-1]["id"]] = calls[-1]["function"]["name"]
        else:
            results.append(_result(block, at, names))
    if role == "assistant":
        return [{"role": "assistant", "content": "".join(texts),
                 **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": "user", "content": "".join(texts)}]
                      if texts or not results else [])


def _messages(body: dict, n_ctx: int) -> list[dict]:
    messages = message_list(body)
    names: dict[str, str] = {}
    out = [msg for i, m in enumerate(messages) for msg in _message(i, m, names)]
    if messages[-1].get("role") == "assistant":
        raise unsupported(f"messages[{len(messages) - 1}]", "a final assistant message "
                          "(prefill) cannot be continued: end with a user message")
    system = body.get("system")
    if system is not None:
        out.insert(0, {"role": "system", "content": _texts(system, "system")})
    check_size(sum(len(m["content"]) for m in out), n_ctx, "messages")
    return out


# ---------------------------------------------------------------------------------------------
# Tools


def _tools(body: dict) -> tuple[Optional[list[Tool]], Optional[str], bool]:
    """(tools, tool_choice, parallel calls allowed); (None, None, False) without tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    kind = None
    if choice is not None:
        kind = _object(choice, "tool_choice", "an object with type").get("type")
        refuse_unknown(choice, {"type", "name", "disable_parallel_tool_use"}, "field",
                       "tool_choice")
        if kind not in ("auto", "any", "tool", "none"):
            raise invalid("tool_choice.type", kind, "'auto', 'any', 'tool' or 'none'")
    if tools in (None, []):
        if kind not in (None, "auto", "none"):
            raise invalid("tool_choice.type", kind, "'auto' or 'none' when no tools are given")
        return None, None, False
    if not isinstance(tools, list):
        raise invalid("tools", type(tools).__name__, "a list of tools", code="invalid_type")
    specs = []
    for i, t in enumerate(tools):
        t = _object(t, f"tools[{i}]", "an object with name and input_schema")
        if t.get("type") not in (None, "custom"):
            raise unsupported(f"tools[{i}].type", f"{t['type']!r} is one of Anthropic's "
                              "server tools, which edgespec does not run: define the tool "
                              "with name, description and input_schema")
        refuse_unknown(t, _TOOL_KEYS, "field", f"tools[{i}]")
        callers = t.get("allowed_callers")
        if callers is not None and (not isinstance(callers, list) or "direct" not in callers):
            raise unsupported(f"tools[{i}].allowed_callers", "edgespec's models call tools "
                              "directly only: include \"direct\" or leave it out")
        if t.get("input_schema") is None:
            raise APIError(400, f"tools[{i}].input_schema is required: the JSON schema of "
                                "the tool's input", param=f"tools[{i}].input_schema",
                           code="missing_required_parameter")
        specs.append({"name": t.get("name"), "description": t.get("description") or "",
                      "input_schema": t["input_schema"]})
    try:
        parsed = parse_tools(specs, schema="input_schema")
    except ConstraintError as e:
        raise APIError(400, str(e), param="tools", code="invalid_value") from None
    choice = choice or {}
    parallel = not get_field(choice, "disable_parallel_tool_use", "bool", False,
                             "tool_choice")
    if kind != "tool":
        return parsed, _CHOICES[kind or "auto"], parallel
    name = choice.get("name")
    if name not in [t.name for t in parsed]:
        raise invalid("tool_choice.name", name, "the name of one of the tools: "
                      + ", ".join(t.name for t in parsed))
    return parsed, name, parallel


# ---------------------------------------------------------------------------------------------
# Sampling and limits


def _sampling(body: dict) -> SamplingParams:
    return sampling_params(sampling_fields(body, ("temperature", "top_p", "top_k")),
                           TEMPERATURE_MAX)


def _stop_sequences(body: dict) -> tuple:
    stop = body.get("stop_sequences")
    return () if stop is None else core_check(check_stop, stop, "stop_sequences",
                                              most=MAX_STOP_SEQUENCES, one_string=False)


def _max_tokens(body: dict) -> int:
    """The required ``max_tokens``, its type checked (its range where the request is made)."""
    value = body.get("max_tokens")
    if value is None:
        raise APIError(400, "max_tokens is required: the most tokens the answer may have",
                       param="max_tokens", code="missing_required_parameter")
    return checked("max_tokens", value, "int")


def _refuse_features(body: dict) -> None:
    """Features edgespec does not have, refused when a request asks for them; the labels
    checked for their types (and ignored)."""
    for name, why in _REFUSED.items():
        if body.get(name) is not None:
            raise unsupported(name, why)
    thinking = body.get("thinking")
    if thinking is not None and _object(thinking, "thinking", "an object with type").get(
            "type") not in ("disabled", "adaptive"):
        raise unsupported("thinking", "edgespec does not separate thinking (send {\"type\": "
                          "\"disabled\"} or \"adaptive\", or leave it out)")
    metadata = body.get("metadata")
    if metadata is not None:
        refuse_unknown(_object(metadata, "metadata", "an object"), {"user_id"}, "field",
                       "metadata")
        get_field(metadata, "user_id", "str", where="metadata")
    for name in ("cache_control", "diagnostics"):
        if body.get(name) is not None:
            _object(body[name], name, "an object")
    for name in ("service_tier", "inference_geo", "speed", "user_profile_id", "workspace_id"):
        get_field(body, name, "str")


def _constraint(body: dict) -> Optional[Constraint]:
    """``output_config.format``: the answer held to a JSON schema (``effort`` is accepted
    and ignored: edgespec's models have no such setting)."""
    config = body.get("output_config")
    if config is None:
        return None
    refuse_unknown(_object(config, "output_config", "an object"), {"effort", "format"},
                   "field", "output_config")
    effort = config.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise invalid("output_config.effort", effort, "one of " + ", ".join(EFFORTS))
    fmt = config.get("format")
    if fmt is None:
        return None
    fmt = _object(fmt, "output_config.format", "{\"type\": \"json_schema\", \"schema\": …}")
    refuse_unknown(fmt, {"type", "schema"}, "field", "output_config.format")
    if fmt.get("type") != "json_schema":
        raise invalid("output_config.format.type", fmt.get("type"), "'json_schema'")
    try:
        return Constraint.json_schema(_object(fmt.get("schema"), "output_config.format.schema",
                                              "a JSON schema object"))
    except ConstraintError as e:
        raise APIError(400, f"output_config.format.schema: {e}",
                       param="output_config.format.schema", code="invalid_value") from None


# ---------------------------------------------------------------------------------------------
# Requests


def _start(body: Any, fields: set) -> str:
    """Checks both endpoints share; the model's name."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown({k: v for k, v in body.items() if k not in _REFUSED}, fields)
    _refuse_features(body)
    model = body.get("model")
    if model is None or model == "":
        raise APIError(400, "model is required: the name of a model /v1/models lists",
                       param="model", code="missing_required_parameter")
    return checked("model", model, "str")


def _request(body: Any, fields: set, n_ctx: int, max_tokens: Optional[int]) -> APIRequest:
    """What both endpoints read; ``max_tokens`` None: read it from the body (required)."""
    model = _start(body, fields)
    max_tokens = max_tokens or _max_tokens(body)
    prompt = _messages(body, n_ctx)
    tools, choice, parallel = _tools(body)
    constraint = _constraint(body)
    if constraint is not None and tools and choice != "none":
        raise APIError(400, "output_config.format and tools cannot both shape one answer: "
                            "send one of them (or tool_choice {\"type\": \"none\"})",
                       param="output_config.format", code="invalid_value")
    generation = generation_request(
        prompt, max_tokens=max_tokens, sampling=_sampling(body), stop=_stop_sequences(body),
        speculative=get_field(body, "speculative", "bool", True), constraint=constraint,
        tools=tools, tool_choice=choice, parallel_tool_calls=parallel)
    return APIRequest(kind="chat", model=model, generation=generation,
                      stream=get_field(body, "stream", "bool", False))


def parse_messages(body: Any, n_ctx: int) -> APIRequest:
    """A ``POST /v1/messages`` body."""
    return _request(body, MESSAGES_FIELDS, n_ctx, None)


def parse_count(body: Any, n_ctx: int) -> APIRequest:
    """A ``POST /v1/messages/count_tokens`` body: the prompt the same messages, system and
    tools would make (nothing is generated; the fields only ``/v1/messages`` has are
    refused as unknown)."""
    return _request(body, COUNT_FIELDS, n_ctx, 1)
