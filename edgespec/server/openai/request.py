"""OpenAI's request bodies → the generation they ask for (its replies: :mod:`.replies`).

Plain Python, no HTTP stack. Every request a client can send either becomes an
:class:`~..wire.APIRequest` (holding the core
:class:`~edgespec.engine.request.GenerationRequest`) or raises :class:`~..wire.APIError`, which
carries the HTTP status and OpenAI's error shape; nothing in a body can turn into a 422 or a
500.

Fields follow OpenAI's chat completions and (legacy) completions APIs, plus llama.cpp's
sampling extensions ``top_k``, ``min_p`` and ``repeat_penalty``: structured output
(``response_format``: ``json_object``, ``json_schema``), ``tools`` / ``tool_choice``, and
``logprobs`` / ``top_logprobs`` (read from the target's own rows), ``reasoning_effort``
(a thinking model's reasoning: ``"none"`` turns it off, a level on; the reasoning comes back
as ``reasoning_content``), and ``num_ctx``, the context the model must be loaded with (the
field Ollama's users send, as Ollama's own ``options.num_ctx``). Sampling settings a request
leaves out keep edgespec's defaults (llama.cpp's). A completion's ``suffix`` fills in the
middle, for models with fill-in-the-middle tokens. Features edgespec does not have (several
choices, logit bias) are refused by name rather than ignored; fields that
only label a request (``user``, ``metadata`` …) are accepted and ignored; any other field is
refused as unknown.
"""

from __future__ import annotations

from typing import Any, Optional

from ... import config
from ...config import SamplingParams
from ...constraints import Constraint
from ...errors import ConstraintError, InvalidParameterError
from ...engine.request import check_stop
from ...tools import Tool, parse_choice, parse_tools
from ..wire import (APIError, APIRequest, check_size, checked, core_check, generation_request,
                    invalid, is_int, message_list, num_ctx, refuse_unknown, sampling_fields,
                    sampling_params, unsupported)

TEMPERATURE_MAX = 2.0          # OpenAI's range; the engine itself allows more
MAX_STOP_STRINGS = 4
COMPLETIONS_DEFAULT_MAX_TOKENS = 16   # OpenAI's default for /v1/completions
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user",
              "assistant": "assistant", "tool": "tool"}

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty",
             "frequency_penalty", "seed")
_COMMON = {"model", "max_tokens", "n", "stream", "stream_options", "stop", "logprobs",
           "logit_bias", "user", "speculative", "num_ctx", *_SAMPLING}
_IGNORED = {"user", "metadata", "store", "service_tier"}
CHAT_FIELDS = _COMMON | _IGNORED | {"messages", "max_completion_tokens", "top_logprobs",
                                    "tools", "tool_choice", "parallel_tool_calls", "functions",
                                    "function_call", "response_format", "reasoning_effort"}
COMPLETION_LOGPROBS = 5         # OpenAI's bound on /v1/completions (the engine's on chat)
# OpenAI's reasoning efforts -> Ollama's think (edgespec.thinking): "none" is off
EFFORTS = {"none": False, "minimal": "low", "low": "low", "medium": "medium", "high": "high"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}


# ---------------------------------------------------------------------------------------------
# Reading fields


def _optional(body: dict, name: str, check, valid: str) -> Any:
    value = body.get(name)
    if value is not None and not check(value):
        raise invalid(name, value, valid, code="invalid_type")
    return value


def _refuse_features(body: dict) -> None:
    """Features edgespec does not have, refused when a request actually asks for them."""
    if body.get("n") not in (None, 1):
        raise invalid("n", body["n"], "1 (edgespec generates one choice per request)",
                      code="unsupported_value")
    if body.get("best_of") not in (None, 1):
        raise invalid("best_of", body["best_of"], "1", code="unsupported_value")
    if body.get("echo") not in (None, False):
        raise unsupported("echo", "the prompt is not repeated in the output")
    if body.get("logit_bias") not in (None, {}):
        raise unsupported("logit_bias", "it would change the target's distribution")
    for name, instead in (("functions", "tools"), ("function_call", "tool_choice")):
        if body.get(name) is not None:
            raise unsupported(name, f"it is OpenAI's deprecated form of {instead}: send "
                              f"{instead} instead")


def _constraint(body: dict) -> Optional[Constraint]:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    try:
        if kind == "text":
            return None
        if kind == "json_object":
            return Constraint.json()
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise invalid("response_format.json_schema", spec,
                              "an object with name and schema", code="invalid_type")
            if not isinstance(spec.get("strict", False), bool):
                raise invalid("response_format.json_schema.strict", spec.get("strict"),
                              "true or false", code="invalid_type")
            # strict or not, the output is held to the schema (llguidance enforces it).
            return Constraint.json_schema(spec.get("schema", {}))
    except ConstraintError as e:
        raise APIError(400, str(e), param="response_format", code="invalid_value") from None
    raise invalid("response_format", fmt, "{\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                  "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}")


def _tools(body: dict) -> tuple[Optional[list[Tool]], Optional[str]]:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise invalid("tool_choice", choice, "'none' or 'auto' when no tools are given")
        return None, None
    try:
        parsed = parse_tools(tools)
        choice = parse_choice(choice, parsed)
    except ConstraintError as e:
        raise APIError(400, str(e), param="tools", code="invalid_value") from None
    except InvalidParameterError as e:
        raise APIError(400, str(e), param=e.name, code="invalid_value") from None
    return parsed, choice


def _logprobs(body: dict, kind: str) -> tuple[Optional[int], str]:
    """How many alternatives each token's log-probability comes with (None: not asked), and
    the field that asked; its range is checked where the request is made."""
    if kind == "completion":        # the legacy API: logprobs is the number of alternatives
        return _optional(body, "logprobs", is_int, "an integer"), "logprobs"
    want = _optional(body, "logprobs", lambda v: isinstance(v, bool), "true or false")
    top = _optional(body, "top_logprobs", is_int, "an integer")
    if top is not None and not want:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs",
                       code="invalid_value")
    return ((top or 0) if want else None), "top_logprobs"


def _sampling(body: dict) -> SamplingParams:
    values = sampling_fields(body, _SAMPLING)
    if "seed" in values:
        values["seed"] %= 2 ** 64       # OpenAI takes any 64-bit integer, negative ones too
    return sampling_params(values, TEMPERATURE_MAX)


def _stop(body: dict) -> tuple:
    stop = body.get("stop")
    return () if stop is None else core_check(check_stop, stop, "stop", most=MAX_STOP_STRINGS)


def _max_tokens(body: dict, default: int) -> tuple[int, str]:
    """The most tokens to generate, and the field that asked (``max_completion_tokens``,
    OpenAI's newer name, or ``max_tokens``); its range is checked where the request is made
    (at most the context: OpenAI refuses more)."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    value = body.get(name)
    return (default if value is None else checked(name, value, "int")), name


def _streaming(body: dict) -> tuple[bool, bool]:
    stream = bool(_optional(body, "stream", lambda v: isinstance(v, bool), "true or false"))
    options = _optional(body, "stream_options", lambda v: isinstance(v, dict), "an object")
    if options is None:
        return stream, False
    if not stream:
        raise APIError(400, "stream_options is only allowed when stream is true",
                       param="stream_options", code="invalid_value")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise invalid("stream_options.include_usage", usage, "true or false",
                      code="invalid_type")
    return stream, usage


def _think(body: dict) -> Any:
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise invalid("reasoning_effort", effort, "one of " + ", ".join(EFFORTS))
    return EFFORTS[effort]


def _message(i: int, m: Any) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise invalid(where, m, "an object with role and content", code="invalid_type")
    role = m.get("role")
    if role not in CHAT_ROLES:
        raise invalid(f"{where}.role", role, "one of " + ", ".join(CHAT_ROLES))
    content = m.get("content")
    extra = {}
    if role == "assistant" and m.get("tool_calls") is not None:
        extra["tool_calls"] = m["tool_calls"]      # checked with the rest by the engine
        content = "" if content is None else content
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                extra[key] = _optional(m, key, lambda v: isinstance(v, str), "a string")
    if isinstance(content, list):    # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise unsupported(f"{where}.content[{j}]", "only text parts "
                                  "({\"type\": \"text\", \"text\": …}) are available")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise invalid(f"{where}.content", content, "a string or a list of text parts",
                      code="invalid_type")
    return {"role": CHAT_ROLES[role], "content": content, **extra}


def _common(body: dict, kind: str, prompt, n_ctx: int, default_max: int) -> APIRequest:
    _optional(body, "model", lambda v: isinstance(v, str), "a string")
    _optional(body, "user", lambda v: isinstance(v, str), "a string")
    _refuse_features(body)
    stream, include_usage = _streaming(body)
    tools, choice = _tools(body) if kind == "chat" else (None, None)
    constraint = _constraint(body) if kind == "chat" else None
    if constraint is not None and tools and choice != "none":
        raise APIError(400, "response_format and tools cannot both shape one answer: send "
                            "one of them (or tool_choice 'none')", param="response_format",
                       code="invalid_value")
    # checked in this order (the ranges of max_tokens and logprobs as the request is made):
    # a body with several mistakes is told of the first
    max_tokens, max_name = _max_tokens(body, default_max)
    sampling = _sampling(body)
    stop = _stop(body)
    logprobs, logprobs_name = _logprobs(body, kind)
    # off unless asked for, as in llama.cpp's server (docs/api.md)
    parallel = _optional(body, "parallel_tool_calls", lambda v: isinstance(v, bool),
                         "true or false") is True
    speculative = _optional(body, "speculative", lambda v: isinstance(v, bool),
                            "true or false") is not False
    context = num_ctx(body.get("num_ctx"), "num_ctx")
    generation = generation_request(
        prompt, {"max_tokens": max_name, "logprobs": logprobs_name}, max_tokens=max_tokens,
        sampling=sampling, speculative=speculative, raw=kind == "completion", stop=stop,
        constraint=constraint, tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
        logprobs=logprobs, think=_think(body) if kind == "chat" else None,
        suffix=_suffix(body) if kind == "completion" else None, context=n_ctx,
        logprobs_max=COMPLETION_LOGPROBS if kind == "completion" else config.MAX_LOGPROBS)
    return APIRequest(kind=kind, model=body.get("model"), generation=generation, stream=stream,
                      include_usage=include_usage, num_ctx=context)


def _suffix(body: dict) -> Optional[str]:
    """The text after the gap a completion fills in (None: no suffix; "" counts as none, as
    in OpenAI's API)."""
    suffix = _optional(body, "suffix", lambda v: isinstance(v, str), "a string")
    return suffix or None


def parse_chat(body: Any, n_ctx: int) -> APIRequest:
    """A ``POST /v1/chat/completions`` body, checked against the context ``n_ctx`` it will be
    served with. Without max_tokens, up to the context edge."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown(body, CHAT_FIELDS)
    prompt = [_message(i, m) for i, m in enumerate(message_list(body))]
    check_size(sum(len(m["content"]) for m in prompt), n_ctx, "messages")
    return _common(body, "chat", prompt, n_ctx, default_max=n_ctx)


def parse_completion(body: Any, n_ctx: int) -> APIRequest:
    """A ``POST /v1/completions`` body: the prompt is sent as-is (no chat template)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise APIError(400, "prompt is required: a non-empty string", param="prompt",
                       code="missing_required_parameter")
    if not isinstance(prompt, str) or not prompt:
        raise invalid("prompt", prompt if isinstance(prompt, str) else type(prompt).__name__,
                      "a non-empty string (one prompt per request; token arrays are not "
                      "accepted)")
    check_size(len(prompt), n_ctx, "prompt")
    return _common(body, "completion", prompt, n_ctx,
                   default_max=COMPLETIONS_DEFAULT_MAX_TOKENS)
