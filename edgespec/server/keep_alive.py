"""How long a model stays loaded after a request: Ollama's ``keep_alive`` (its generating and
embedding bodies) and the server's ``--keep-alive``, in seconds. Plain Python, no HTTP stack."""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from .wire import as_float, invalid, is_number

FOREVER = -1.0                 # keep_alive: a negative number of seconds keeps the model loaded

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
    if is_number(value) and not math.isnan(as_float(value)):
        seconds = as_float(value)
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
