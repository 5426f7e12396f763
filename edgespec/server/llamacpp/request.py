"""llama-server's ``/infill`` bodies → the generation they ask for (its route:
:mod:`.routes`; its replies: :mod:`.replies`).

Plain Python, no HTTP stack. Fields as llama.cpp's server reads them, what code editors'
autocomplete plugins (llama.vscode, llama.vim) send: ``input_prefix`` and ``input_suffix``
(required, as there), ``input_extra`` (other files: ``{"filename", "text"}`` objects, other
keys ignored), ``prompt`` (text appended to the prefix: the cursor's line), ``n_predict`` (-1:
to the context's end; 0: the prompt alone, what editors send to warm the cache), the sampling
fields (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed`` with -1 for a random one,
the penalties), ``stop``, ``stream``, ``n_indent``, ``t_max_predict_ms``, ``response_fields``,
``return_tokens`` and ``model`` (default: the server's own); ``speculative`` is edgespec's.
Fields edgespec need not act on are accepted and ignored (:data:`IGNORED`: ``cache_prompt``,
since a prompt's cached prefix is always reused; ``samplers``, since edgespec's order is
fixed; ``id_slot``; ``t_max_prompt_ms`` …); samplers and features it does not have are
accepted only when off (:data:`OFF`); any other field is refused as unknown, so that a typo
is not silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ...config import TEMPERATURE_MAX      # llama-server states no bound of its own
from ...engine.request import check_stop
from ..wire import (APIError, APIRequest, check_size, checked, core_check, generation_request,
                    get_field, invalid, refuse_unknown, sampling_fields, sampling_params,
                    unsupported)

SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty",
            "repeat_last_n", "presence_penalty", "frequency_penalty")
USED = {"input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "stop", "stream",
        "model", "n_indent", "t_max_predict_ms", "response_fields", "return_tokens",
        "speculative", *SAMPLING}
# llama-server's fields that change nothing edgespec does (or that it cannot honour and a
# client can do without): accepted, not read.
IGNORED = {"id_slot", "cache_prompt", "samplers", "t_max_prompt_ms", "timings_per_token",
           "n_keep", "min_keep", "n_cmpl", "post_sampling_probs", "return_progress",
           "dynatemp_exponent", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
           "dry_sequence_breakers", "xtc_threshold", "mirostat_tau", "mirostat_eta"}
# llama-server's samplers and features edgespec does not have: accepted when off.
OFF = {"typical_p": 1.0, "top_n_sigma": -1.0, "mirostat": 0, "dynatemp_range": 0.0,
       "xtc_probability": 0.0, "dry_multiplier": 0.0, "n_probs": 0, "ignore_eos": False,
       "lora": [], "grammar": ""}
RANDOM_SEED = -1               # llama-server's seed for "pick one"
DEFAULT_FILENAME = "tmp"       # llama-server's name of a chunk sent without one
CHUNK = '{"filename": string, "text": string}'


@dataclass(frozen=True)
class InfillRequest:
    """What one ``/infill`` request asks for: ``gen``, the generation (its prompt the prefix
    and ``prompt``, its suffix ``input_suffix``, its files ``input_extra``); what the reply
    does with it: ``n_predict`` as asked (0: the prompt alone, no text), ``n_indent`` and
    ``t_max_predict_ms`` (where llama-server would stop it; 0: never), ``response_fields``
    (the reply holds only these; None: all), ``return_tokens``."""

    gen: APIRequest
    n_predict: int
    n_indent: int = 0
    t_max_predict_ms: int = 0
    response_fields: Optional[tuple[str, ...]] = None
    return_tokens: bool = False


def parse_infill(body: Any, n_ctx: int) -> InfillRequest:
    """A ``POST /infill`` body, checked against the context ``n_ctx`` it will be served with
    (an :class:`~..wire.APIError` for any mistake, the first one found)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown(body, USED | IGNORED | set(OFF))
    _refuse_features(body)
    prefix, suffix = (_required(body, name) for name in ("input_prefix", "input_suffix"))
    cursor = get_field(body, "prompt", "str", "")
    files = _files(body)
    check_size(len(prefix) + len(cursor) + len(suffix) + sum(len(t) for _, t in files),
               n_ctx, "input_prefix")
    model = get_field(body, "model", "str") or None
    n_predict = _n_predict(body)
    values = sampling_fields(body, SAMPLING)
    if values.get("seed") == RANDOM_SEED:
        del values["seed"]
    stop = body.get("stop")
    stop = () if stop is None else core_check(check_stop, stop, "stop", one_string=False)
    generation = generation_request(
        prefix + cursor, {"max_tokens": "n_predict"}, max_tokens=_max_tokens(n_predict, n_ctx),
        sampling=sampling_params(values, TEMPERATURE_MAX), raw=True, stop=stop,
        speculative=get_field(body, "speculative", "bool", True), suffix=suffix,
        infill_files=files)
    gen = APIRequest(kind="completion", model=model, generation=generation,
                     stream=get_field(body, "stream", "bool", False))
    return InfillRequest(gen, n_predict, n_indent=_at_least(body, "n_indent", 0),
                         t_max_predict_ms=max(0, get_field(body, "t_max_predict_ms", "int", 0)),
                         response_fields=_response_fields(body),
                         return_tokens=get_field(body, "return_tokens", "bool", False))


def _required(body: dict, name: str) -> str:
    if name not in body:
        raise APIError(400, f"{name} is required: a string (the code "
                            f"{'before' if name == 'input_prefix' else 'after'} the cursor, "
                            "may be empty)", param=name, code="missing_required_parameter")
    return checked(name, body[name], "str")


def _refuse_features(body: dict) -> None:
    """What edgespec does not have, refused when a request turns it on."""
    for name, off in OFF.items():
        value = body.get(name)
        if value is not None and value != off:
            raise unsupported(name, f"edgespec does not have it (send {off!r} or leave it "
                                    "out)")


def _files(body: dict) -> tuple[tuple[str, str], ...]:
    """``input_extra`` as (filename, text) pairs."""
    extra = body.get("input_extra")
    if extra is None:
        return ()
    if not isinstance(extra, list):
        raise invalid("input_extra", type(extra).__name__, f"a list of {CHUNK} objects",
                      code="invalid_type")
    files = []
    for i, chunk in enumerate(extra):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict):
            raise invalid(where, type(chunk).__name__, f"an object {CHUNK}",
                          code="invalid_type")
        if not isinstance(chunk.get("text"), str):
            raise invalid(f"{where}.text", chunk.get("text"), "a string (the chunk's text)",
                          code="invalid_type")
        files.append((get_field(chunk, "filename", "str", DEFAULT_FILENAME, where),
                      chunk["text"]))
    return tuple(files)


def _n_predict(body: dict) -> int:
    n = get_field(body, "n_predict", "int", -1)
    if n < -1:
        raise invalid("n_predict", n, "an integer >= -1 (-1: until the model stops or the "
                                      "context is full; 0: the prompt alone)")
    return n


def _max_tokens(n_predict: int, n_ctx: int) -> int:
    """The generation's token budget: to the context's end for -1 (llama-server stops there
    too, so a larger ``n_predict`` is held to it); 1 for 0 (its text is not sent)."""
    return n_ctx if n_predict < 0 else max(1, min(n_predict, n_ctx))


def _at_least(body: dict, name: str, least: int) -> int:
    n = get_field(body, name, "int", least)
    if n < least:
        raise invalid(name, n, f"an integer >= {least}")
    return n


def _response_fields(body: dict) -> Optional[tuple[str, ...]]:
    fields = body.get("response_fields")
    if fields is None:
        return None
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise invalid("response_fields", fields, "a list of field names ('content', "
                      "'timings/prompt_n' …)", code="invalid_type")
    return tuple(fields) if fields else None
