"""One chat with an Engine: settings, turns, interruption and statistics, with no terminal code.

The terminal loop and the pipe loop both drive a :class:`ChatSession`; the conversation itself
is a :class:`~edgespec.conversation.Conversation`. The engine reuses both models' KV caches whenever
the next prompt extends the previous one, which a chat turn does, so each turn evaluates only
its new tokens — unless the oldest turns had to be dropped to make room.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ..config import CHAT_MAX_TOKENS, SamplingParams
from ..conversation import Conversation
from ..engine.request import check_max_tokens
from ..errors import EdgespecError, InvalidParameterError
from ..thinking import Shown

if TYPE_CHECKING:  # the engine (numpy, llama.cpp) loads only when a chat starts
    from ..constraints import Constraint
    from ..engine.engine import Engine
    from ..results import Generation

SAMPLING_SETTINGS = ("temperature", "top_k", "top_p", "min_p")
SETTINGS = SAMPLING_SETTINGS + ("seed", "max_tokens", "draft_max")

class ChatError(EdgespecError):
    """A chat command that cannot be carried out (the message says what is valid)."""


@dataclass
class Turn:
    """What one answer did."""

    generation: "Generation"
    interrupted: bool
    dropped: int                  # oldest turns dropped to make room for this one

    @property
    def context_used(self) -> int:
        s = self.generation.stats
        return s.prompt_tokens + s.completion_tokens


@dataclass
class SessionTotals:
    """Sums over every answer of the session."""

    answers: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    interrupted: int = 0

    def add(self, turn: Turn) -> None:
        s = turn.generation.stats
        self.answers += 1
        self.tokens += s.completion_tokens
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.interrupted += turn.interrupted


def _number(text: str):
    """``text`` as an int, else a float, else unchanged (so validation names the bad value)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class ChatSession:
    """A conversation with ``engine`` and the settings its answers use."""

    def __init__(self, engine: "Engine", *, label: str, sampling: Optional[SamplingParams] = None,
                 max_tokens: int = CHAT_MAX_TOKENS, system: Optional[str] = None):
        info = engine.info()
        self.engine = engine
        self.label = label
        self.backend: str = info["backend"]
        self.can_speculate = engine.can_speculate
        # the draft chosen for the target on this machine, and why (None: named, or none)
        self.draft_choice = getattr(engine, "draft_choice", None)
        self.speculative = self.can_speculate
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.max_tokens = max_tokens
        self.conversation = Conversation(system)
        self.last: Optional[Turn] = None
        self.totals = SessionTotals()
        self.constraint: Optional["Constraint"] = None     # /format: answers' required shape
        self.format_label = "text"
        self.told_busy = False      # said once that threads backed off on a busy machine
        self._interrupted = False

    # -- answering ------------------------------------------------------------------------

    def ask(self, text: str, on_piece: Callable[[str, bool], None],
            on_drop: Callable[[int], None] = lambda n: None) -> Turn:
        """Answer ``text``, streaming ``on_piece(text, from_draft)``; record the turn.

        Makes room first (``on_drop(n)`` is told how many old turns went). An interrupted
        answer is kept, marked. If the engine fails, the turn is not recorded.
        """
        self._interrupted = False
        n_ctx = self.engine.n_ctx
        reserve = min(self.max_tokens, n_ctx // 4)   # room the answer should have
        dropped = self.conversation.make_room(text, self._count, n_ctx - reserve, n_ctx)
        if dropped:
            on_drop(dropped)
        stream = self.engine.stream(self.conversation.for_model(text),
                                    max_tokens=self.max_tokens, sampling=self.sampling,
                                    speculative=self.speculative, constraint=self.constraint)
        try:
            # A Ctrl-C that came before the engine started listening is honoured here.
            shown = Shown()        # a thinking model's reasoning, marked, before its answer
            for event in (stream if not self._interrupted else ()):
                piece = shown(event)
                if piece:
                    on_piece(piece, event.from_draft)
                if self._interrupted:
                    break
        finally:
            stream.close()      # (an answer that never started ends "cancelled")
        generation = stream.result
        interrupted = self._interrupted or generation.finish_reason == "cancelled"
        self.conversation.add_turn(text, generation.text, interrupted)
        turn = Turn(generation, interrupted, dropped)
        self._record(turn)
        return turn

    def interrupt(self) -> None:
        """Stop the answer in progress within one step. Safe to call from a signal handler:
        the engine is told from another thread, so a lock the interrupted code holds cannot
        deadlock it."""
        self._interrupted = True
        threading.Thread(target=self.engine.cancel, daemon=True).start()

    def _count(self, messages: list[dict]) -> int:
        return len(self.engine.prompt_tokens(messages))

    def _record(self, turn: Turn) -> None:
        self.last = turn
        self.totals.add(turn)

    @property
    def context_used(self) -> int:
        return self.last.context_used if self.last else 0

    # -- settings -------------------------------------------------------------------------

    def settings(self) -> dict:
        s, spec = self.sampling, self.engine.spec
        return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                "min_p": s.min_p, "seed": "random" if s.seed is None else s.seed,
                "max_tokens": self.max_tokens,
                "draft_max": "auto" if spec.is_adaptive else spec.fixed_k}

    def set(self, name: str, value: str) -> None:
        """Change one setting from its text; raises a one-line error naming what is valid."""
        if name in SAMPLING_SETTINGS:
            self.sampling = self.sampling.replace(**{name: _number(value)})
        elif name == "seed":
            # A seed makes an answer reproducible: the same conversation, settings and seed
            # give the same text, with speculation on or off (noise keyed by position).
            # (SamplingParams' check, the only one, refuses a bad one)
            seed = None if value.lower() in ("random", "off", "none") else _number(value)
            self.sampling = self.sampling.replace(seed=seed)
        elif name == "max_tokens":
            self.max_tokens = check_max_tokens(_number(value), most=self.engine.n_ctx)
        elif name == "draft_max":
            if not self.can_speculate:
                raise ChatError("draft_max has no effect: no draft model is loaded (start with "
                                "--pair NAME or --target T --draft D)")
            auto = self.engine.spec.adaptive      # (--no-adaptive: no cost model to return to)
            k = None if value == "auto" and auto else _number(value)
            if k is not None and (not isinstance(k, int) or isinstance(k, bool)):
                raise InvalidParameterError(name, k, "an integer" + (" or auto" if auto else ""))
            self.engine.set_draft_max(k)
        else:
            raise ChatError(f"unknown setting '{name}'; settings are {', '.join(SETTINGS)}")

    def set_format(self, arg: str) -> str:
        """``/format json | schema FILE|JSON | regex REGEX | grammar FILE | off``: the shape
        every answer must have; returns what it is now. A bad schema, regex or grammar is a
        one-line error and changes nothing."""
        from ..constraints import Constraint
        from ..shell import read_text_arg
        kind, _, value = arg.partition(" ")
        value = value.strip()
        if kind in ("off", "text") and not value:
            self.constraint, self.format_label = None, "text"
        elif kind == "json" and not value:
            self.constraint, self.format_label = Constraint.json(), "json"
        elif kind == "schema" and value:
            self.constraint = Constraint.json_schema(read_text_arg(value, "/format schema"))
            self.format_label = f"schema {value if not value.lstrip().startswith('{') else ''}"
        elif kind == "regex" and value:
            self.constraint, self.format_label = Constraint.regex(value), f"regex {value}"
        elif kind == "grammar" and value:
            self.constraint = Constraint.grammar(read_text_arg(value, "/format grammar"))
            self.format_label = f"grammar {value}"
        else:
            raise ChatError("usage: /format json | schema FILE|JSON | regex REGEX | "
                            "grammar FILE | off")
        self.format_label = self.format_label.strip()
        return self.format_label

    def set_speculative(self, on: bool) -> None:
        if on and not self.can_speculate:
            raise ChatError("speculation needs a draft model: start with --pair NAME or "
                            "--target T --draft D")
        self.speculative = on
