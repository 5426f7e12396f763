"""Fuzzing helpers for the wire-format tests: every path into a JSON value, a copy of a value
with the thing at one path replaced, and the copies with junk at each path."""

from __future__ import annotations

import json


def paths(value, prefix=()):
    """Every path into ``value`` (dict keys and list indices)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


def replaced(value, path, new):
    """A copy of ``value`` with what is at ``path`` replaced by ``new`` (a key that is not
    there is added)."""
    if not path:
        return new
    value = json.loads(json.dumps(value)) if isinstance(value, (dict, list)) else value
    head, rest = path[0], path[1:]
    value[head] = replaced(value[head], rest, new) if rest else new
    return value


def mutations(body, junk, rng, per_path: int = 8):
    """Copies of ``body`` with one thing replaced by junk: at every path, ``per_path``
    pieces of ``junk`` drawn with ``rng``."""
    for path in list(paths(body)):
        for piece in rng.sample(junk, per_path):
            yield replaced(body, path, piece)
