"""Ollama's wire format: request bodies → generation settings, results → response bodies.

Plain Python, no HTTP stack: the endpoints ``/api/chat``, ``/api/generate``, ``/api/tags``,
``/api/show``, ``/api/ps`` and ``/api/version`` call it. It mirrors :mod:`.protocol` and
:mod:`.replies` (OpenAI's format): every request body becomes an :class:`OllamaRequest`
holding a :class:`~.protocol.GenerationRequest`, or raises :class:`~.protocol.APIError` (400),
which :func:`ollama_error_body` turns into Ollama's ``{"error": message}``. Messages reuse the
engine's wording (:class:`~edgespec.errors.InvalidParameterError`): ``options.temperature=-1 is
invalid: options.temperature must be …``.

Requests follow Ollama's API (docs/api.md, api/types.go): ``stream`` defaults to true;
``format`` is ``"json"`` or a JSON schema; ``options`` carry the sampling settings edgespec has
(``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``, ``repeat_last_n``,
``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop``, ``num_predict``) and
``num_ctx``, which is recorded for the caller; options that only place or load the model
(``num_thread``, ``num_gpu``, ``use_mmap`` …) are accepted and ignored; samplers edgespec does
not have (Mirostat, typical-p, tail-free) are refused unless they are set to their neutral
value. Sampling settings a request leaves out keep edgespec's defaults (llama.cpp's), not
Ollama's. Tool calls travel in Ollama's shape (arguments as an object) and are converted to
and from OpenAI's, which the engine reads. ``think``, ``truncate`` and ``shift`` are accepted
and ignored: edgespec does not separate thinking, never cuts the history (a prompt over the
context is a 400) and stops at the context edge (``done_reason`` ``"length"``). Images,
``suffix``, ``template`` and the deprecated ``context`` are refused by name; any other
top-level field or option is refused as unknown, so that a typo is not silently ignored.

Replies are Ollama's newline-delimited JSON objects, checked against the official ``ollama``
client's types by the tests. Durations are in nanoseconds; ``prompt_eval_count`` is the whole
prompt, cached or not, as Ollama reports it since 0.2 (the cached part is
``prompt_eval_cached_count``, as in Ollama's newer releases). Model names are listed with a
tag (``name:latest``), Ollama's convention, which apps display and send back.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Sequence

from .. import __version__
from ..chat_template import new_call_id
from ..config import SamplingParams
from ..constraints import Constraint
from ..errors import ConstraintError, InvalidParameterError
from ..tools import Tool, parse_tools
from .protocol import APIError, GenerationRequest, _check_size, _is_int, _is_number, invalid
from .protocol import unsupported
from .replies import speculation

# The Ollama version /api/version reports: clients compare it to enable features, and 0.12.11
# is the first whose API has every field edgespec serves (logprobs, structured output, tools).
OLLAMA_VERSION = "0.12.11"
FOREVER = -1.0                 # keep_alive: a negative number of seconds keeps the model loaded
MAX_STOP_STRINGS = 16          # Ollama sets no bound; Modelfiles carry a handful
MAX_TOP_LOGPROBS = 20          # Ollama's bound
ROLES = ("system", "user", "assistant", "tool")
THINK_LEVELS = ("high", "medium", "low")
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}   # as Ollama says
_MAX_DURATION_NS = 2 ** 63 - 1                       # Go's longest time.Duration ("forever")

_COMMON = {"model", "format", "options", "stream", "keep_alive", "think", "truncate", "shift",
           "logprobs", "top_logprobs", "_debug_render_only"}
CHAT_FIELDS = _COMMON | {"messages", "tools"}
GENERATE_FIELDS = _COMMON | {"prompt", "suffix", "system", "template", "context", "raw",
                             "images", "width", "height", "steps"}

# options: name -> the type it must have ("int", "number", "bool")
_SAMPLING_OPTIONS = {"temperature": "number", "top_k": "int", "top_p": "number",
                     "min_p": "number", "repeat_penalty": "number", "repeat_last_n": "int",
                     "presence_penalty": "number", "frequency_penalty": "number", "seed": "int"}
# where and how the model runs, or what only matters on a context shift: no effect on output
_IGNORED_OPTIONS = {"num_keep": "int", "num_batch": "int", "num_gpu": "int", "main_gpu": "int",
                    "num_thread": "int", "use_mmap": "bool", "use_mlock": "bool",
                    "numa": "bool", "low_vram": "bool", "f16_kv": "bool", "logits_all": "bool",
                    "vocab_only": "bool", "embedding_only": "bool",
                    "mirostat_tau": "number", "mirostat_eta": "number"}   # only with mirostat
# samplers edgespec does not have: accepted at the value that turns them off
_NEUTRAL_OPTIONS = {"mirostat": (0, "0 (edgespec has no Mirostat sampling)"),
                    "typical_p": (1, "1 (edgespec has no typical-p sampling)"),
                    "tfs_z": (1, "1 (edgespec has no tail-free sampling)")}
_OTHER_OPTIONS = {"num_predict": "int", "num_ctx": "int", "stop": "list",
                  "penalize_newline": "bool"}
_OPTION_TYPES = {**_SAMPLING_OPTIONS, **_IGNORED_OPTIONS, **_OTHER_OPTIONS,
                 **{name: "number" for name in _NEUTRAL_OPTIONS}}
_TYPE_WORDS = {"int": "an integer", "number": "a number", "bool": "true or false",
               "list": "a list of non-empty strings"}


@dataclass(frozen=True)
class OllamaRequest:
    """What one ``/api/chat`` or ``/api/generate`` request asks for.

    ``gen`` is the generation (None for a load request: no messages, or an empty prompt);
    ``keep_alive`` is in seconds (None: not given; 0: unload after the request; negative,
    :data:`FOREVER`: keep loaded); ``think_ignored``: the request set ``think``, which edgespec
    ignores; ``num_ctx``: the context size the request asked for (None: not given)."""

    model: str
    gen: Optional[GenerationRequest]
    keep_alive: Optional[float] = None
    think_ignored: bool = False
    num_ctx: Optional[int] = None
    load_only: bool = False


def ollama_error_body(err: APIError) -> dict:
    """Ollama's error shape, which its clients raise as ``ResponseError``."""
    return {"error": err.message}


# ---------------------------------------------------------------------------------------------
# Reading fields


def _integer(value: Any) -> Optional[int]:
    """An integer, or a JSON number with an integral value (JavaScript sends 5 as 5.0)."""
    if _is_int(value):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _float(value: float) -> float:
    """A JSON number as a float (an integer too large for one is infinite)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _checked(name: str, value: Any, kind: str) -> Any:
    """``value`` as ``kind`` ("int", "number", "bool", "str"), else an APIError naming it."""
    if kind == "int":
        n = _integer(value)
        if n is not None:
            return n
    elif kind == "number" and _is_number(value) and math.isfinite(_float(value)):
        return value
    elif kind == "bool" and isinstance(value, bool):
        return value
    elif kind == "str" and isinstance(value, str):
        return value
    raise invalid(name, value, _TYPE_WORDS.get(kind, "a string"), code="invalid_type")


def _get(body: dict, name: str, kind: str, default: Any = None, where: str = "") -> Any:
    """``body[name]`` checked as ``kind`` (``default`` when absent or null); ``where``: the
    path of ``body`` in the request, for the message."""
    value = body.get(name)
    return default if value is None else _checked(f"{where}.{name}" if where else name, value,
                                                  kind)


def _refuse_unknown(body: dict, allowed: set, what: str = "") -> None:
    for name in body:
        if name not in allowed:
            raise APIError(400, f"unknown {what or 'parameter'} {name!r}: edgespec does not know "
                                "it (see docs/api.md for the supported fields)",
                           param=name, code="unknown_parameter")


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
                 "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any) -> Optional[float]:
    """Ollama's ``keep_alive`` in seconds: a number of seconds, or a Go duration such as
    ``"5m"``, ``"1h30m"`` or ``"-1m"`` (a bare number in a string counts as seconds). None
    when not given; a negative value keeps the model loaded (:data:`FOREVER`)."""
    if value is None:
        return None
    valid = "a number of seconds or a duration such as '5m' (negative: keep the model loaded)"
    if _is_number(value) and not math.isnan(_float(value)):
        seconds = _float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            sign, rest = (-1.0, text[1:]) if text[0] == "-" else (1.0, text.lstrip("+"))
            parts = list(_DURATION_PART.finditer(rest))
            if not parts or "".join(p.group(0) for p in parts) != rest:
                raise invalid("keep_alive", value, valid) from None
            seconds = sign * sum(float(p.group(1)) * _UNIT_SECONDS[p.group(2)] for p in parts)
        if math.isnan(seconds):
            raise invalid("keep_alive", value, valid)
    else:
        raise invalid("keep_alive", value, valid, code="invalid_type")
    return FOREVER if seconds < 0 or math.isinf(seconds) else seconds


def _think(body: dict) -> bool:
    """Whether the request says anything about thinking (edgespec ignores it)."""
    think = body.get("think")
    if think is None:
        return False
    if not isinstance(think, bool) and think not in THINK_LEVELS:
        raise invalid("think", think, "true, false, 'high', 'medium' or 'low'")
    return True


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
    """Alternatives per token's log-probability (None: not asked for). As in Ollama,
    ``top_logprobs`` only counts with ``logprobs: true``."""
    want = _get(body, "logprobs", "bool", False)
    top = _get(body, "top_logprobs", "int", 0)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise invalid("top_logprobs", top, f"an integer in [0, {MAX_TOP_LOGPROBS}]")
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
        _get(body, name, "bool")      # accepted, ignored: see the module's docstring


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class _Options:
    sampling: SamplingParams
    stop: tuple
    max_tokens: int
    num_ctx: Optional[int]


def _stop(value: Any) -> tuple:
    stop = [value] if isinstance(value, str) else value
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or any(not isinstance(s, str) or not s for s in stop)):
        raise invalid("options.stop", value, f"a list of at most {MAX_STOP_STRINGS} non-empty "
                      "strings")
    return tuple(stop)


def _options(body: dict, n_ctx: int) -> _Options:
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise invalid("options", options, "an object of model parameters", code="invalid_type")
    _refuse_unknown(options, set(_OPTION_TYPES), what="option")
    values = {name: _checked(f"options.{name}", v, _OPTION_TYPES[name])
              for name, v in options.items() if v is not None and name != "stop"}
    for name, (neutral, valid) in _NEUTRAL_OPTIONS.items():
        if name in values and values[name] != neutral:
            raise invalid(f"options.{name}", values[name], valid, code="unsupported_value")
    sampling = {name: values[name] for name in _SAMPLING_OPTIONS if name in values}
    if sampling.get("repeat_last_n") == -1:           # Ollama's -1: the whole context
        sampling["repeat_last_n"] = n_ctx
    seed = sampling.get("seed")
    if seed == -1:                                     # Ollama's -1: a random seed
        del sampling["seed"]
    elif seed is not None:
        sampling["seed"] = seed % 2 ** 64
    try:
        params = SamplingParams(**sampling)
    except InvalidParameterError as e:
        raise invalid(f"options.{e.name}", e.value, e.valid) from None
    if values.get("penalize_newline") is False and params.uses_penalty:
        raise unsupported("options.penalize_newline", "edgespec's penalties apply to newlines "
                          "as to any token: drop it, or the penalty")
    predict = values.get("num_predict", -1)
    valid = "an integer: the most tokens to generate, or -1 or -2 (up to the context's end)"
    if predict < -2:
        raise invalid("options.num_predict", predict, valid)
    num_ctx = values.get("num_ctx")
    if num_ctx is not None and num_ctx < 1:
        raise invalid("options.num_ctx", num_ctx, "an integer >= 1")
    return _Options(params, _stop(options["stop"]) if options.get("stop") is not None else (),
                    # 0, -1 and -2 all run to the context's end, as in Ollama
                    min(predict, n_ctx) if predict > 0 else n_ctx, num_ctx)


# ---------------------------------------------------------------------------------------------
# Messages and tool calls


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


def calls_to_ollama(calls: Sequence) -> list[dict]:
    """:class:`~edgespec.tools.ToolCall`s in Ollama's shape: arguments as an object (with
    the call's id and index, as Ollama's newer releases send them)."""
    return [{"id": c.id, "function": {"index": i, "name": c.name,
                                      "arguments": c.parsed_arguments}}
            for i, c in enumerate(calls)]


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
    content = _get(m, "content", "str", "", where)
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
        name = _get(m, "tool_name", "str", where=where)
        call_id = _get(m, "tool_call_id", "str", where=where)
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
    _refuse_unknown(body, fields)
    model = body.get("model")
    if model is None or model == "":
        raise APIError(400, "model is required: the name of a model that /api/tags lists",
                       param="model", code="missing_required_parameter")
    _checked("model", model, "str")
    _refuse_features(body)
    return model


def _request(body: dict, model: str, kind: str, prompt: Any, n_ctx: int,
             tools: Optional[list[Tool]] = None) -> OllamaRequest:
    stream = _get(body, "stream", "bool", True)          # Ollama streams unless told not to
    keep_alive = parse_keep_alive(body.get("keep_alive"))
    think = _think(body)
    options = _options(body, n_ctx)
    constraint = _format(body)
    logprobs = _logprobs(body)
    if constraint is not None and tools:
        raise APIError(400, "format and tools cannot both shape one answer: send one of them",
                       param="format", code="invalid_value")
    gen = None if prompt is None else GenerationRequest(
        kind=kind, prompt=prompt, max_tokens=options.max_tokens, sampling=options.sampling,
        stop=options.stop, stream=stream, include_usage=False, model=model,
        constraint=constraint, tools=tools, tool_choice="auto" if tools else None,
        logprobs=logprobs, parallel_tool_calls=bool(tools))   # Ollama returns several calls
    return OllamaRequest(model=model, gen=gen, keep_alive=keep_alive, think_ignored=think,
                         num_ctx=options.num_ctx, load_only=gen is None)


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
    _check_size(sum(len(m["content"]) for m in prompt), n_ctx, "messages")
    return _request(body, model, "chat", prompt or None, n_ctx, _tools(body))


def parse_ollama_generate(body: Any, n_ctx: int) -> OllamaRequest:
    """A ``POST /api/generate`` body. With ``raw: true`` the prompt is sent as-is (kind
    ``completion``); otherwise it is a user message (after ``system``, if given) in the
    model's chat template. An empty prompt asks to load the model (``load_only``)."""
    model = _start(body, GENERATE_FIELDS)
    prompt = _get(body, "prompt", "str", "")
    system = _get(body, "system", "str", "")
    raw = _get(body, "raw", "bool", False)
    if _get(body, "template", "str", ""):
        raise unsupported("template", "edgespec applies the model's own chat template: send "
                          "raw: true with a prompt formatted yourself, or use /api/chat")
    if _get(body, "suffix", "str", ""):
        raise unsupported("suffix", "edgespec does not fill in the middle")
    if body.get("context") not in (None, []):
        raise unsupported("context", "the deprecated token-array continuation is not "
                          "available: keep the conversation in /api/chat's messages")
    if body.get("images") not in (None, []):
        raise unsupported("images", "edgespec serves text models")
    if raw and system:
        raise unsupported("system", "raw: true applies no template, so there is no place for "
                          "a system message: put it in the prompt")
    _check_size(len(prompt) + len(system), n_ctx, "prompt")
    if not prompt:
        text = None
    elif raw:
        text = prompt
    else:
        text = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": prompt}]
    return _request(body, model, "completion" if raw else "chat", text, n_ctx)


# ---------------------------------------------------------------------------------------------
# Replies


def rfc3339(ns: int) -> str:
    """A time in nanoseconds since the epoch as Ollama writes it: RFC 3339, UTC, with
    nanoseconds (``2024-07-22T20:33:28.123648000Z``)."""
    seconds, frac = divmod(ns, 10 ** 9)
    day = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{day}.{frac:09d}Z"


def _at(epoch: Optional[float]) -> str:
    """An epoch time in seconds; None: forever, as Ollama writes it (now + Go's longest
    duration)."""
    if epoch is None:
        return rfc3339(time.time_ns() + _MAX_DURATION_NS)
    return rfc3339(int(epoch * 1e9))


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def tagged_name(name: str) -> str:
    """A model's name as Ollama lists it, with a tag: ``x`` → ``x:latest`` (a name that has
    a tag keeps it)."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _details(entry) -> dict:
    details = {"parent_model": "", "format": "gguf", "family": "", "families": None,
               "parameter_size": "", "quantization_level": ""}
    details.update(entry.details or {})
    return details


def metrics(stats, total_seconds: float, load_seconds: float) -> dict:
    """The figures of a final reply, durations in nanoseconds. ``prompt_eval_count`` is the
    whole prompt and ``prompt_eval_duration`` the time spent on its uncached part, as Ollama
    reports them; a cache hit adds ``prompt_eval_cached_count``."""
    out = {"total_duration": _ns(total_seconds), "load_duration": _ns(load_seconds),
           "prompt_eval_count": stats.prompt_tokens,
           "prompt_eval_duration": _ns(stats.prompt_seconds),
           "eval_count": stats.completion_tokens, "eval_duration": _ns(stats.decode_seconds)}
    cached = max(0, stats.prompt_tokens - stats.prompt_tokens_evaluated)
    if cached:
        out["prompt_eval_cached_count"] = cached
    return out


class OllamaReply:
    """The bodies of one ``/api/chat`` (``kind`` "chat") or ``/api/generate`` ("generate")
    response: stream chunks, the final object, a load reply. ``model``: the name the request
    gave; ``token_bytes(id)`` spells tokens for logprobs (needed only when they were asked
    for)."""

    def __init__(self, kind: str, model: str,
                 token_bytes: Optional[Callable[[int], bytes]] = None):
        self.kind = kind
        self.model = model
        self.token_bytes = token_bytes

    def _body(self, text: str, tool_calls: Sequence = ()) -> dict:
        body: dict = {"model": self.model, "created_at": rfc3339(time.time_ns())}
        if self.kind == "chat":
            message: dict = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = calls_to_ollama(tool_calls)
            body["message"] = message
        else:
            body["response"] = text
        return body

    def logprobs(self, entries: Sequence) -> list[dict]:
        """Ollama's ``logprobs``: per token ``{token, logprob, bytes, top_logprobs}``."""
        def one(token: int, logprob: float) -> dict:
            raw = self.token_bytes(token)
            return {"token": raw.decode("utf-8", "replace"), "logprob": logprob,
                    "bytes": list(raw)}
        return [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                for e in entries]

    def chunk(self, text: str, *, logprobs: Optional[Sequence] = None,
              tool_calls: Sequence = ()) -> dict:
        """A stream chunk: a piece of text (with its tokens' :class:`~edgespec.results.
        TokenLogprob`s, if asked for) or, in chat, the calls the answer makes."""
        body = self._body(text, tool_calls)
        if logprobs:
            body["logprobs"] = self.logprobs(logprobs)
        body["done"] = False
        return body

    def final(self, gen, *, total_seconds: float, load_seconds: float = 0.0,
              streamed: bool) -> dict:
        """The last object: ``done``, why, the figures, and how speculation did
        (``edgespec``). Streamed, its text is empty (the chunks carried the text and the
        calls); else it holds the whole answer, its tool calls and logprobs."""
        body = self._body("", ()) if streamed else self._body(gen.text, gen.tool_calls)
        if not streamed and gen.logprobs is not None:
            body["logprobs"] = self.logprobs(gen.logprobs)
        body["done"] = True
        body["done_reason"] = DONE_REASONS.get(gen.finish_reason, gen.finish_reason)
        return {**body, **metrics(gen.stats, total_seconds, load_seconds),
                "edgespec": speculation(gen.stats)}

    def loaded(self, unloaded: bool = False) -> dict:
        """The reply to a load request (``done_reason`` "load"), or an unload ("unload")."""
        return {**self._body(""), "done": True, "done_reason": "unload" if unloaded else "load"}


def tags_body(entries: Sequence) -> dict:
    """``GET /api/tags``: the catalog's models (objects with ``name``, ``draft``, ``kind``,
    ``size``, ``modified`` (epoch seconds), ``digest`` and ``details``)."""
    return {"models": [{"name": tagged_name(e.name), "model": tagged_name(e.name),
                        "modified_at": _at(e.modified), "size": e.size, "digest": e.digest,
                        "details": _details(e),
                        "edgespec": {"kind": e.kind,
                                     "draft": e.draft.name if e.draft else None}}
                       for e in entries]}


def ps_body(loaded: Sequence) -> dict:
    """``GET /api/ps``: the loaded models (objects with ``name``, ``entry`` (a catalog entry),
    ``size``, ``expires_at`` (epoch seconds; None: kept loaded, or in use) and ``n_ctx``
    (the context it was loaded with; None: unknown), as :class:`~.models.LoadedInfo`)."""
    models = []
    for m in loaded:
        body = {"name": tagged_name(m.name), "model": tagged_name(m.name), "size": m.size,
                "digest": m.entry.digest, "details": _details(m.entry),
                "expires_at": _at(m.expires_at), "size_vram": 0}
        if m.n_ctx is not None:
            body["context_length"] = m.n_ctx
        models.append(body)
    return {"models": models}


def show_body(entry, info: dict, template: str, n_ctx: int) -> dict:
    """``POST /api/show`` for a catalog entry. ``info``: :meth:`Engine.info() <edgespec.
    engine.Engine.info>` of the loaded pair ({} when the entry is not loaded); ``template``:
    the chat template (Jinja, not Ollama's Go templates); ``n_ctx``: the context served, which
    ``<arch>.context_length`` reports so that apps size their prompts to it (the trained
    context is in ``edgespec``)."""
    target = (info or {}).get("target") or {}
    arch = target.get("architecture") or (entry.details or {}).get("family") or "llama"
    model_info: dict = {"general.architecture": arch}
    if target.get("n_params"):
        model_info["general.parameter_count"] = target["n_params"]
    model_info[f"{arch}.context_length"] = n_ctx
    if target.get("n_vocab"):
        model_info[f"{arch}.vocab_size"] = target["n_vocab"]
    modelfile = (f"# Modelfile generated by edgespec\nFROM {entry.target}\n"
                 + (f"# draft model (edgespec): {entry.draft}\n" if entry.draft else "")
                 + f"PARAMETER num_ctx {n_ctx}\n")
    return {"modelfile": modelfile, "parameters": f"{'num_ctx':<30} {n_ctx}",
            "template": template, "details": _details(entry), "model_info": model_info,
            "capabilities": ["completion", "tools"], "modified_at": _at(entry.modified),
            "edgespec": {"kind": entry.kind, "target": str(entry.target),
                         "draft": str(entry.draft) if entry.draft else None,
                         "context_length_trained": target.get("n_ctx_train"), "pair": info}}


def version_body() -> dict:
    """``GET /api/version``: an Ollama version clients accept, and edgespec's own."""
    return {"version": OLLAMA_VERSION, "edgespec": __version__}
