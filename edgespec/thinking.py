"""Reasoning ("thinking") models: a chat template's thinking mode, the ``think`` setting that
turns it on or off, and the reasoning separated from the answer.

A template has a thinking mode when it reads a variable that switches reasoning
(``enable_thinking`` as Qwen3's, ``thinking``, ``reasoning_effort`` as gpt-oss's) and writes
the tags that mark the reasoning in the output (``<think>…</think>``): :func:`thinking_mode`.
``think`` (Ollama's values: true, false, ``"low"``, ``"medium"``, ``"high"``; None: the
template's own default) becomes those variables (:func:`template_variables`); true on a
model without a thinking mode is refused, as Ollama refuses it.

The model writes its reasoning first, inside the tags, or right after a generation prompt
that opened them already (:attr:`Thinking.opened`). A :class:`Splitter` separates it from the
answer as the text arrives: only a leading block is reasoning (a tag later in the answer is
part of the answer), whitespace around the reasoning and before the answer is dropped, and
an unfinished block (cut by ``max_tokens``) is reasoning. :meth:`Thinking.events` applies it
to a stream, :meth:`Thinking.finish` to a result, with the same code, so a stream's pieces
add up to the result. A constraint on the output shapes the answer: with thinking on it
starts where the reasoning ends (:meth:`~edgespec.constraints.Constraint.after_reasoning`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator, Optional

from .errors import InvalidParameterError

if TYPE_CHECKING:       # the engine's types; chat templates and shells import this module
    from .constraints import Constraint
    from .results import Generation, StreamEvent

Finish = Optional[Callable[["Generation"], "Generation"]]

LEVELS = ("high", "medium", "low")
VARIABLES = ("enable_thinking", "thinking", "reasoning_effort")
TAGS = (("<think>", "</think>"),)       # how templates mark reasoning, first match wins
_READS = re.compile(r"\b(" + "|".join(VARIABLES) + r")\b")


@dataclass(frozen=True)
class ThinkingMode:
    """A template's thinking mode: the tags around the reasoning in the output."""

    open: str
    close: str


def thinking_mode(source: Optional[str]) -> Optional[ThinkingMode]:
    """The thinking mode of the chat template ``source`` (None: it has none, or no template)."""
    if not source or not _READS.search(source):
        return None
    for open_tag, close_tag in TAGS:
        if open_tag in source and close_tag in source:
            return ThinkingMode(open_tag, close_tag)
    return None


def check_think(think: Any) -> None:
    """Raise :class:`~edgespec.errors.InvalidParameterError` unless ``think`` is None, a bool
    or a level."""
    if think is not None and not isinstance(think, bool) and think not in LEVELS:
        raise InvalidParameterError("think", think, "true, false, 'high', 'medium', 'low' or "
                                    "None (the template's default)")


def template_variables(think: Any) -> dict:
    """The template variables ``think`` sets: none for None; ``enable_thinking`` and
    ``thinking`` (a level turns them on) and, for a level, ``reasoning_effort``."""
    if think is None:
        return {}
    on = think is not False
    out: dict = {"enable_thinking": on, "thinking": on}
    if isinstance(think, str):
        out["reasoning_effort"] = think
    return out


def separates(mode: Optional[ThinkingMode], think: Any, raw: bool) -> Optional[ThinkingMode]:
    """The mode whose reasoning a generation separates from its answer (None: nothing is
    separated): the template's, unless ``think`` is false or the prompt is ``raw`` (no
    template renders it). Raises :class:`~edgespec.errors.InvalidParameterError` for a bad
    ``think``, and for thinking asked of a raw prompt or of a model whose template has no
    thinking mode."""
    check_think(think)
    if think is None or think is False:
        return None if raw or think is False else mode
    if raw:
        raise InvalidParameterError("think", think, "unset or false with a raw prompt (no chat "
                                    "template renders it, so nothing can turn thinking on)")
    if mode is None:
        raise InvalidParameterError("think", think, "false or unset: this model does not "
                                    "support thinking (its chat template has no thinking "
                                    "mode)")
    return mode


def reads_thinking(mode: Optional[ThinkingMode], prompt: str,
                   constraint: Optional["Constraint"], finish: Finish,
                   special_id: Callable[[str], Optional[int]]
                   ) -> tuple[Optional["Thinking"], Optional["Constraint"], Finish]:
    """How a generation reads its output after the rendered ``prompt`` when it separates
    ``mode``'s reasoning (None: it does not; nothing changes): the :class:`Thinking`, the
    ``constraint`` moved after the reasoning, and ``finish`` preceded by the split.
    ``special_id(tag)``: the id of ``tag`` where it is one special token (None: text)."""
    if mode is None:
        return None, constraint, finish
    thinking = Thinking.after(mode, prompt)
    if constraint is not None:
        constraint = constraint.after_reasoning(mode.open, mode.close, thinking.opened,
                                                thinking.tag_tokens(special_id))
    return thinking, constraint, thinking.finish(finish)


@dataclass(frozen=True)
class Thinking:
    """How one generation's output is read: its template's ``mode``, and whether the prompt
    ``opened`` the reasoning block (the output then starts inside it)."""

    mode: ThinkingMode
    opened: bool

    @classmethod
    def after(cls, mode: ThinkingMode, prompt: str) -> "Thinking":
        """The reading of the output that follows the rendered ``prompt``."""
        return cls(mode, prompt.rstrip().endswith(mode.open))

    def tag_tokens(self, special_id: Callable[[str], Optional[int]]
                   ) -> Optional[tuple[int, int]]:
        """The ids of the two tags when each is one special token of the vocabulary
        (``special_id(tag)``), else None: they are written as text."""
        ids = (special_id(self.mode.open), special_id(self.mode.close))
        return None if None in ids else ids

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) of a whole output."""
        s = Splitter(self.mode, self.opened)
        (t1, a1), (t2, a2) = s.feed(text), s.flush()
        return t1 + t2, a1 + a2

    def finish(self, then: Finish = None) -> Callable[["Generation"], "Generation"]:
        """A result's final form: the reasoning moved to ``thinking``, then ``then`` (the
        tool calls read from the answer)."""
        def finish(gen: "Generation") -> "Generation":
            gen.thinking, gen.text = self.split(gen.text)
            return then(gen) if then is not None else gen
        return finish

    def events(self, events: Generator["StreamEvent", None, None]) -> Iterator["StreamEvent"]:
        """``events`` with each one's text split into ``thinking`` and ``text`` (held back
        while it may be part of a tag; what is held at the end comes in a last event).
        Closing it closes ``events`` (a stream's generation is cancelled the same way)."""
        s = Splitter(self.mode, self.opened)
        last = None
        try:
            for last in events:
                thinking, text = s.feed(last.text)
                yield dataclasses.replace(last, text=text, thinking=thinking)
            thinking, text = s.flush()
            if thinking or text:         # (something was held: there was an event)
                yield dataclasses.replace(last, text=text, thinking=thinking, token=-1,
                                          from_draft=False, logprob=None, round=None)
        finally:
            events.close()


_START, _THINKING, _AFTER, _ANSWER = range(4)


class Splitter:
    """Output text in, (reasoning, answer) pieces out: see the module docstring."""

    def __init__(self, mode: ThinkingMode, opened: bool):
        self.mode = mode
        self.state = _THINKING if opened else _START
        self.fresh = True           # no reasoning released yet: its leading space is dropped
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning and answer text that ``text`` releases."""
        self.pending += text
        thinking = answer = ""
        while self.pending:
            if self.state == _START:
                rest = self.pending.lstrip()
                if rest.startswith(self.mode.open):
                    self.pending, self.state = rest[len(self.mode.open):], _THINKING
                elif not rest or self.mode.open.startswith(rest):
                    break                               # may still become the tag
                else:
                    self.state = _ANSWER
            elif self.state == _THINKING:
                released, done = self._reasoning()
                thinking += released
                if not done:
                    break
            elif self.state == _AFTER:
                self.pending = self.pending.lstrip()
                if self.pending:
                    self.state = _ANSWER
            else:
                answer, self.pending = answer + self.pending, ""
        return thinking, answer

    def _reasoning(self) -> tuple[str, bool]:
        """Reasoning released from ``pending``, and whether its block closed."""
        if self.fresh:
            self.pending = self.pending.lstrip()
        i = self.pending.find(self.mode.close)
        if i >= 0:
            out = self.pending[:i].rstrip()
            self.pending, self.state = self.pending[i + len(self.mode.close):], _AFTER
        else:
            # held back: a tail that may begin the closing tag, and the space before it
            body = self.pending[:len(self.pending) - _tag_start(self.pending, self.mode.close)]
            cut = len(body.rstrip())
            out, self.pending = body[:cut], body[cut:] + self.pending[len(body):]
        self.fresh = self.fresh and not out
        return out, i >= 0

    def flush(self) -> tuple[str, str]:
        """What is held back once the output has ended: an unclosed block's reasoning, or
        the answer's (a start that never became a tag)."""
        held, self.pending = self.pending, ""
        if self.state == _THINKING:
            return (held.strip() if self.fresh else held.rstrip()), ""
        return "", (held if self.state in (_START, _ANSWER) else held.lstrip())


def _tag_start(text: str, tag: str) -> int:
    """How many of ``text``'s last characters may be the start of ``tag``."""
    return next((n for n in range(min(len(tag) - 1, len(text)), 0, -1)
                 if tag.startswith(text[-n:])), 0)


class Shown:
    """What a terminal shows of a stream's events (``shown(event)``, one call per event): a
    thinking model's reasoning between a ``Thinking...`` line and ``...done thinking.``, as
    Ollama's command line shows it, then the answer."""

    def __init__(self):
        self._thinking = False

    def __call__(self, event: "StreamEvent") -> str:
        out = ""
        if event.thinking:
            out = event.thinking if self._thinking else "Thinking...\n" + event.thinking
            self._thinking = True
        if event.text:
            out += "\n...done thinking.\n\n" + event.text if self._thinking else event.text
            self._thinking = False
        return out
