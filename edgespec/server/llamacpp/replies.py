"""llama-server's replies to ``/infill`` (its route: :mod:`.routes`): the whole body, a
stream's chunks and its last one, and :class:`Cutoff`, where llama-server would have stopped
the answer. Plain Python.

A reply is llama-server's ``/completion`` object: ``content``, ``stop`` (true at the end),
``stop_type`` (``eos``, ``limit``, ``word``) and ``stopping_word``, ``tokens_predicted``,
``tokens_evaluated``, ``tokens_cached``, ``truncated``, ``has_new_line``, ``model``,
``generation_settings``, ``timings`` (``prompt_n`` counts the tokens evaluated, ``cache_n``
those found in the cache; ``draft_n`` and ``draft_n_accepted`` when it was drafted), and
edgespec's ``edgespec`` field, as every answer of the server has it.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from ...results import Generation, StreamEvent
from .request import InfillRequest
from ..reply_fields import speculation

INDENT = " \t"


class Cutoff:
    """What of a generation the reply holds: its text and tokens up to where llama-server
    stops it. ``n_indent``: a line after the first one indented less than this ends the
    answer, cut after that line's indentation; ``t_max_ms``: so does a newline once this long
    has passed since the first token (0: never); ``n_predict`` 0: the prompt alone was asked
    for, the answer holds nothing. :meth:`push` takes each event; ``piece`` is what of it the
    reply holds, ``ended`` whether the answer is complete."""

    def __init__(self, n_predict: int, n_indent: int = 0, t_max_ms: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.n_predict, self.n_indent, self.t_max_ms, self.clock = (n_predict, n_indent,
                                                                     t_max_ms, clock)
        self.text, self.piece = "", ""
        self.tokens: list[int] = []
        self.ended = False
        self._line = -1                 # where the line under watch starts (-1: none yet)
        self._t0: Optional[float] = None

    def push(self, event: StreamEvent) -> bool:
        """Take ``event``; whether the answer is complete with it."""
        if self.n_predict == 0:
            self.piece, self.ended = "", True
            return True
        now = self.clock()
        self._t0 = now if self._t0 is None else self._t0
        start = len(self.text)
        self.text += event.text
        self.tokens.append(event.token)
        cut = self._indent_cut() if self.n_indent > 0 else None
        if cut is not None:
            self.text, self.ended = self.text[:cut], True
        elif self.t_max_ms > 0 and "\n" in self.text and (now - self._t0) * 1000 > self.t_max_ms:
            self.ended = True
        self.piece = self.text[start:]
        return self.ended

    def _indent_cut(self) -> Optional[int]:
        """Where the first line after the first one whose code starts less indented than
        ``n_indent`` has its code (a blank line counts as not indented), or None."""
        text = self.text
        while True:
            if self._line < 0:
                nl = text.find("\n")
                if nl < 0:
                    return None
                self._line = nl + 1
            pos = self._line
            while pos < len(text) and text[pos] in INDENT:
                pos += 1
            if pos == len(text):
                return None             # nothing but indentation on it yet
            if pos - self._line < self.n_indent:
                return pos
            nl = text.find("\n", self._line)
            if nl < 0:
                return None
            self._line = nl + 1


class InfillReply:
    """The bodies of one ``/infill`` reply from ``model`` for ``ireq``; ``token_bytes(id)``
    spells tokens (to tell which stop string ended an answer)."""

    def __init__(self, model: str, ireq: InfillRequest, token_bytes: Callable[[int], bytes]):
        self.model, self.ireq, self.spell = model, ireq, token_bytes

    def chunk(self, piece: str, token: int) -> dict:
        """A stream's chunk of text."""
        return {"index": 0, "content": piece, "tokens": [token] if token >= 0 else [],
                "stop": False}

    def final(self, result: Generation, cut: Cutoff, streamed: bool) -> dict:
        """The whole answer (``streamed``: the stream's last chunk, its text already sent)."""
        stats, gen = result.stats, self.ireq.gen.generation
        n = len(cut.tokens) if cut.ended else stats.completion_tokens
        tokens = cut.tokens if cut.ended else result.tokens
        text = cut.text if cut.ended else result.text
        stop_type, word = self._stop(result, cut)
        body = {"index": 0, "content": "" if streamed else text,
                "tokens": list(tokens) if self.ireq.return_tokens else [], "stop": True,
                "model": self.model, "tokens_predicted": n,
                "tokens_evaluated": stats.prompt_tokens,
                "generation_settings": self.settings(), "has_new_line": "\n" in text,
                "truncated": stop_type == "limit" and not cut.ended and n < gen.max_tokens,
                "stop_type": stop_type, "stopping_word": word,
                "tokens_cached": stats.prompt_tokens - stats.prompt_tokens_evaluated,
                "timings": timings(stats, n), "edgespec": speculation(stats)}
        return body if streamed else project(body, self.ireq.response_fields)

    def settings(self) -> dict:
        """llama-server's ``generation_settings``: what the answer was generated with."""
        gen, ireq = self.ireq.gen.generation, self.ireq
        s = gen.sampling
        return {"n_predict": ireq.n_predict, "temperature": s.temperature, "top_k": s.top_k,
                "top_p": s.top_p, "min_p": s.min_p, "seed": s.seed,
                "repeat_penalty": s.repeat_penalty, "stop": list(gen.stop),
                "n_indent": ireq.n_indent, "t_max_predict_ms": ireq.t_max_predict_ms,
                "speculative": gen.speculative}

    def _stop(self, result: Generation, cut: Cutoff) -> tuple[str, str]:
        """(``stop_type``, ``stopping_word``): a stop string is told from the end-of-text
        token by the tokens' text going on past the answer's."""
        if cut.ended or result.finish_reason != "stop":
            return "limit", ""
        spelt = b"".join(self.spell(t) for t in result.tokens).decode("utf-8", "replace")
        after = spelt[len(result.text):]
        found = [(after.find(s), s) for s in self.ireq.gen.generation.stop if s in after]
        return ("word", min(found)[1]) if found else ("eos", "")


def timings(stats, predicted: int) -> dict:
    """llama-server's ``timings`` from a generation's statistics; ``predicted``: the tokens
    the answer holds."""
    prompt_n, prompt_ms = stats.prompt_tokens_evaluated, stats.prompt_seconds * 1000
    predicted_ms = stats.decode_seconds * 1000
    out = {"cache_n": stats.prompt_tokens - prompt_n, "prompt_n": prompt_n,
           "prompt_ms": round(prompt_ms, 3),
           "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
           "prompt_per_second": round(prompt_n * 1000 / prompt_ms, 3) if prompt_ms else 0.0,
           "predicted_n": predicted, "predicted_ms": round(predicted_ms, 3),
           "predicted_per_token_ms": round(predicted_ms / predicted, 3) if predicted else 0.0,
           "predicted_per_second": (round(predicted * 1000 / predicted_ms, 3)
                                    if predicted_ms else 0.0)}
    if stats.speculative:
        out.update(draft_n=stats.drafted, draft_n_accepted=stats.accepted)
    return out


def project(body: dict, fields: Optional[tuple[str, ...]]) -> dict:
    """``body`` holding only ``fields`` (None: all), as llama-server's ``response_fields``:
    each a path of keys joined by ``/`` (``timings/prompt_n``), kept under that path as one
    key; a path that leads nowhere is left out."""
    if fields is None:
        return body
    out = {}
    for path in fields:
        value: object = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out
