"""What the chat writes: answers as they stream, notices, errors and the status line.

Colours are plain ANSI codes chosen to read on light and dark terminals; with ``colors`` off
(``--plain``, ``NO_COLOR``, or output that is not a terminal) nothing but text is written.
"""

from __future__ import annotations

import re
from typing import Optional, TextIO

from ..shell import DRAFT_COLOR, RESET
from .session import ChatSession, Turn

DIM, YELLOW, RED = "\x1b[2m", "\x1b[33m", "\x1b[31m"
INTERRUPTED = "[interrupted]"

# Control characters a model could emit to drive the terminal (escape sequences, carriage
# returns that overwrite a line, bells); newlines and tabs are text.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Printer:
    """Writes to ``out`` (answers, command output) and ``err`` (status, notices, errors).

    In a terminal both are the screen; in a pipe, ``out`` carries only what was asked for.
    ``can_color`` says whether colours may ever be used; ``colors`` is the current choice
    (``/colors`` toggles it). ``terminal``: answers are cleaned of control characters.
    """

    def __init__(self, out: TextIO, err: TextIO, *, can_color: bool, terminal: bool = False):
        self.out, self.err = out, err
        self.terminal = terminal
        self.can_color = can_color
        self.colors = can_color
        self._answer_open = False

    def _paint(self, text: str, code: str) -> str:
        return f"{code}{text}{RESET}" if self.colors and text else text

    # -- answers --------------------------------------------------------------------------

    def piece(self, text: str, from_draft: bool) -> None:
        """One streamed piece; accepted draft tokens in the draft colour."""
        if self.terminal:
            text = _CONTROLS.sub("", text)
        self.out.write(self._paint(text, DRAFT_COLOR) if from_draft else text)
        self.out.flush()
        self._answer_open = True

    def break_line(self) -> None:
        """End an answer's line that was cut short by an error."""
        if self._answer_open:
            self.out.write("\n")
            self.out.flush()
            self._answer_open = False

    def end_answer(self, interrupted: bool) -> None:
        if interrupted:
            self.out.write((" " if self._answer_open else "") + self._paint(INTERRUPTED, YELLOW))
        self.out.write("\n")
        self.out.flush()
        self._answer_open = False

    # -- everything else ------------------------------------------------------------------

    def say(self, text: str) -> None:
        """Command output (``/help``, ``/stats`` …)."""
        self.out.write(text + "\n")
        self.out.flush()

    def status(self, text: str) -> None:
        self.err.write(self._paint(text, DIM) + "\n")
        self.err.flush()

    def notice(self, text: str) -> None:
        self.err.write(self._paint(text, YELLOW) + "\n")
        self.err.flush()

    def error(self, text: str) -> None:
        self.err.write(self._paint(f"error: {text}", RED) + "\n")
        self.err.flush()


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def status_line(session: ChatSession, turn: Optional[Turn] = None) -> str:
    """Pair, backend, speed, acceptance, tokens per target pass, the estimated speed-up (only
    with the evidence for it) or that the draft does not pay, context used."""
    parts = [session.label, session.backend]
    if turn is not None:
        parts.append(turn.generation.stats.summary())
    parts.append(f"context {session.context_used}/{session.engine.n_ctx}")
    return " · ".join(parts)


def settings_line(session: ChatSession) -> str:
    spec = "on" if session.speculative else ("off" if session.can_speculate else "unavailable")
    return (" ".join(f"{k}={v}" for k, v in session.settings().items())
            + f" speculation={spec} format={session.format_label}")


def stats_text(session: ChatSession) -> str:
    """The ``/stats`` report: the last answer in detail, the session's totals, the settings."""
    t = session.totals
    lines = []
    if session.last is not None:
        g = session.last.generation
        lines.append(f"last answer: [{g.finish_reason}] {g.stats.summary(detail=True)}")
    else:
        lines.append("last answer: none yet")
    acc = f", acceptance {t.accepted / t.drafted:.0%} ({t.accepted}/{t.drafted})" \
        if t.drafted else ""
    lines.append(f"session: {plural(t.answers, 'answer')} ({t.interrupted} interrupted), "
                 f"{plural(t.tokens, 'token')}{acc}, "
                 f"{plural(session.conversation.n_turns, 'turn')} in the conversation")
    if session.last is not None and session.last.generation.stats.speculative:
        lines.append("speed-up: " + speedup_basis(session.last.generation.stats))
    lines.append("settings: " + settings_line(session))
    if session.draft_choice is not None:        # chosen at start: which, and why
        lines.append(session.draft_choice.line())
    return "\n".join(lines)


def speedup_basis(s) -> str:
    """How the last answer's speed-up was estimated, or why it was not (``s``: its stats)."""
    lp = s.loop
    if s.decoding_plainly:
        return (f"none: {lp.plain_passes} of {lp.target_passes} rounds drafted nothing (the "
                "cost model found that drafting does not pay on this machine now)")
    rounds = lp.target_passes - lp.plain_passes
    if not s.plain_pass_seconds or not lp.emitted:
        return "not estimated: no plain target pass was measured (a pinned draft length)"
    per_token = (lp.draft_seconds + lp.verify_seconds) / lp.emitted
    basis = (f"a plain target pass {1000 * s.plain_pass_seconds:.1f} ms against "
             f"{1000 * per_token:.1f} ms per token drafting and verifying")
    x = s.speedup_estimate
    if x is None:
        return (f"not estimated: {plural(rounds, 'drafting round')}, fewer than "
                f"{s.MIN_DRAFT_ROUNDS} ({basis})")
    return f"≈{x:.2f}× ({basis}; at most the tokens per target pass)"
