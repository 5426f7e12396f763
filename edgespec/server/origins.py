"""Which web pages may call the server: the origins ``--allow-origin`` names, and the server's
own page. No HTTP stack here (:mod:`.app` wires it into Starlette's CORS middleware and its
``OriginGuard``; :mod:`.command` checks the option with it).

An origin is ``scheme://host[:port]`` as a browser sends it in ``Origin`` (``app://obsidian.md``,
``http://localhost:3000``). A pattern may hold ``*`` wildcards, as Ollama's ``OLLAMA_ORIGINS``
does (``app://*``, ``http://localhost:*``, ``chrome-extension://*``): ``*`` matches any run of
characters, everything else itself, the whole origin (anchored). A bare ``*`` lets in every
origin. Scheme and host are compared in lower case, as browsers send them; a trailing ``/``
typed after an origin is dropped.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence
from urllib.parse import urlsplit

_FORM = re.compile(r"[a-z*][a-z0-9+.\-*]*://[^/?#\s]+|null")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# origins any web page can have (a site anyone could own; a sandboxed frame's "null"): a
# pattern letting one in lets in every page
_ANY_SITE = ("http://evil.example", "https://evil.example", "https://evil.example:8443",
             "null")


def normal(pattern: str) -> str:
    """``pattern`` as it is matched: stripped, in lower case, without a trailing ``/``."""
    return pattern.strip().lower().rstrip("/")


def check_pattern(pattern: str) -> Optional[str]:
    """What is wrong with ``pattern`` as an ``--allow-origin`` (one line), or None."""
    p = normal(pattern)
    if p == "*" or _FORM.fullmatch(p):
        return None
    return (f"--allow-origin {pattern!r} is not an origin: write scheme://host[:port], e.g. "
            "app://obsidian.md or http://localhost:3000 ('*' wildcards allowed: "
            "http://localhost:*)")


def pattern_regex(patterns: Sequence[str]) -> Optional[str]:
    """One regular expression matching the whole of an origin that any pattern holding
    ``*`` matches (None when none does): ``*`` is ``.*``, everything else is escaped."""
    wild = [normal(p) for p in patterns if "*" in p and normal(p) != "*"]
    if not wild:
        return None
    return "(?:" + "|".join(".*".join(map(re.escape, p.split("*"))) for p in wild) + ")"


class Origins:
    """The origins ``patterns`` let in: ``exact`` ones, ``regex`` (:func:`pattern_regex`),
    or ``every`` one (a bare ``*``)."""

    def __init__(self, patterns: Sequence[str]):
        self.patterns = [normal(p) for p in patterns]
        self.every = "*" in self.patterns
        self.exact = sorted({p for p in self.patterns if "*" not in p})
        self.regex = pattern_regex(self.patterns)
        self._regex = re.compile(self.regex) if self.regex else None

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def allows(self, origin: str) -> bool:
        origin = origin.lower()
        return self.every or origin in self.exact or bool(
            self._regex is not None and self._regex.fullmatch(origin))

    def any_site(self) -> bool:
        """Whether they let in web pages of any site (only with an API key)."""
        return any(self.allows(o) for o in _ANY_SITE)


def same_origin(origin: str, scheme: str, host: str) -> bool:
    """Whether ``origin`` is the server's own (``scheme`` and the request's ``Host``
    header): the chat page it serves at ``/``, posting to its API."""
    try:
        o, h = urlsplit(origin), urlsplit(f"//{host}")
        if o.path or o.query or not o.hostname or o.hostname != h.hostname:
            return False
        default = _DEFAULT_PORTS.get(scheme.lower())
        return o.scheme.lower() == scheme.lower() and \
            (o.port or _DEFAULT_PORTS.get(o.scheme.lower())) == (h.port or default)
    except ValueError:              # a port that is not a number
        return False
