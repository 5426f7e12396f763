"""Ollama's ``options``: the sampling settings, stop strings and length of one request.

Plain Python. ``options`` carry the sampling settings edgespec has (``temperature``,
``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``, ``repeat_last_n``, ``presence_penalty``,
``frequency_penalty``, ``seed``, ``stop``, ``num_predict``) and ``num_ctx``, the context the
model must be loaded with (:mod:`..contexts`); options that only place or load the model
(``num_thread``, ``num_gpu``, ``use_mmap`` …) are accepted and ignored; samplers edgespec
does not have (Mirostat, typical-p, tail-free) are refused unless they are set to their
neutral value; any other option is refused as unknown. Sampling settings a request leaves
out keep edgespec's defaults (llama.cpp's), not Ollama's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...config import TEMPERATURE_MAX, SamplingParams
from ...engine.request import check_stop
from ..wire import (SAMPLING_KINDS, checked, core_check, invalid, num_ctx, refuse_unknown,
                    sampling_params, unsupported)

MAX_STOP_STRINGS = 16          # Ollama sets no bound; Modelfiles carry a handful

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
# options: name -> the type it must have ("int", "number", "bool"); the sampling settings have
# the types every API gives them (SAMPLING_KINDS)
_OPTION_TYPES = {**SAMPLING_KINDS, **_IGNORED_OPTIONS, **_OTHER_OPTIONS,
                 **{name: "number" for name in _NEUTRAL_OPTIONS}}


@dataclass(frozen=True)
class Options:
    """What a request's ``options`` ask for: ``max_tokens`` resolved against the context
    (Ollama's 0, -1 and -2 run to its end); ``num_ctx``: the context asked for (None: not
    given)."""

    sampling: SamplingParams
    stop: tuple
    max_tokens: int
    num_ctx: Optional[int]


def parse_options(body: dict, n_ctx: int) -> Options:
    """``body['options']`` checked (an APIError names the first bad one)."""
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise invalid("options", options, "an object of model parameters", code="invalid_type")
    refuse_unknown(options, set(_OPTION_TYPES), what="option")
    values = {name: checked(f"options.{name}", v, _OPTION_TYPES[name])
              for name, v in options.items() if v is not None and name != "stop"}
    for name, (neutral, valid) in _NEUTRAL_OPTIONS.items():
        if name in values and values[name] != neutral:
            raise invalid(f"options.{name}", values[name], valid, code="unsupported_value")
    sampling = {name: values[name] for name in SAMPLING_KINDS if name in values}
    if sampling.get("repeat_last_n") == -1:           # Ollama's -1: the whole context
        sampling["repeat_last_n"] = n_ctx
    seed = sampling.get("seed")
    if seed == -1:                                     # Ollama's -1: a random seed
        del sampling["seed"]
    elif seed is not None:
        sampling["seed"] = seed % 2 ** 64
    params = sampling_params(sampling, TEMPERATURE_MAX, where="options")
    if values.get("penalize_newline") is False and params.uses_penalty:
        raise unsupported("options.penalize_newline", "edgespec's penalties apply to newlines "
                          "as to any token: drop it, or the penalty")
    predict = values.get("num_predict", -1)
    valid = "an integer: the most tokens to generate, or -1 or -2 (up to the context's end)"
    if predict < -2:
        raise invalid("options.num_predict", predict, valid)
    context = num_ctx(options.get("num_ctx"), "options.num_ctx")
    stop = options.get("stop")
    return Options(params, () if stop is None else core_check(
                       check_stop, stop, "options.stop", most=MAX_STOP_STRINGS),
                   # 0, -1 and -2 all run to the context's end, as in Ollama
                   min(predict, n_ctx) if predict > 0 else n_ctx, context)
