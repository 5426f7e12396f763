"""The drafting contract: what the speculative loop asks of a source of draft tokens.

Each round the loop asks the drafter how many tokens to try (:meth:`Drafter.plan`), asks for
a :class:`Draft` of at most that many (:meth:`Drafter.draft`), verifies it, tells the drafter
how many were accepted and what the verify pass cost (:meth:`Drafter.observe`), and trims the
drafter's state to what was committed (:meth:`Drafter.rollback`). Each drafter owns its length
policy (:mod:`.policy`); everything the loop learns about a draft is in the :class:`Draft`
it got back, and nothing is read back from a drafter after a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Sequence

import numpy as np

from ..config import SamplingParams
from ..sampling import Dist

if TYPE_CHECKING:
    from ..constraints import GrammarState

# An extender: given the draft so far, tokens that continue it for free (an n-gram match).
Extender = Callable[[list[int]], list[int]]


@dataclass
class Draft:
    """Proposed tokens ``x_1..x_K`` and the distributions ``q`` they were drawn from.

    ``confidences`` (the draft's top probability at each step, None where not measured) and
    ``step_seconds`` (each single-token draft step) feed the length policy; ``seconds`` is the
    whole call. ``source`` says who drafted: ``"model"``, ``"ngram"``, or ``"none"`` when the
    drafter chose a plain round. ``free`` marks the tokens that cost no draft step and that
    the drafter's length policy did not choose (one-hot q): tokens a grammar forced, and an
    n-gram continuation found while the model drafted (``extended`` counts those).
    ``caught_up``: committed tokens the draft model evaluated in this call to reach the
    context (those of a long prompt, a chunk at a time, come in plain rounds).
    """

    x: list[int] = field(default_factory=list)
    q: list[Dist] = field(default_factory=list)
    confidences: list[Optional[float]] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    source: str = "none"
    seconds: float = 0.0
    free: list[bool] = field(default_factory=list)
    extended: int = 0
    caught_up: int = 0

    def __post_init__(self) -> None:
        assert len(self.x) == len(self.q) == len(self.confidences), "one q and confidence per x"
        self.free += [False] * (len(self.x) - len(self.free))

    def add(self, tokens: Sequence[int], free: bool = True) -> None:
        """Append tokens proposed with certainty (one-hot q)."""
        self.x.extend(tokens)
        self.q.extend(Dist.one_hot(t) for t in tokens)
        self.confidences.extend([None] * len(tokens))
        self.free.extend([free] * len(tokens))

    def after(self, forced: list[int]) -> "Draft":
        """This draft behind ``forced`` tokens (a grammar's)."""
        d = Draft(source=self.source, seconds=self.seconds, step_seconds=self.step_seconds,
                  extended=self.extended, caught_up=self.caught_up)
        d.add(forced)
        d._append(self)
        return d

    def _append(self, other: "Draft") -> None:
        self.x += other.x
        self.q += other.q
        self.confidences += other.confidences
        self.free += other.free

    def add_extension(self, tokens: Sequence[int]) -> None:
        """Append an n-gram continuation found while the model drafted (free tokens, counted
        in ``extended``)."""
        self.add(tokens)
        self.extended = len(tokens)

    def count_catch_up(self, n: int) -> None:
        """The draft model evaluated ``n`` committed tokens in this call to reach the
        context (``caught_up``)."""
        self.caught_up = n

    def took(self, seconds: float) -> None:
        """The whole call that made this draft took ``seconds``."""
        self.seconds = seconds

    def own(self, n_accepted: int) -> tuple[int, int, list[Optional[float]]]:
        """(k, n, confidences) of the tokens the drafter's policy chose: how many it drafted,
        how many of them the target accepted (the first ``n`` of them: a prefix), their
        confidences. When the first rejected token was a free one, the policy's next token
        was never checked, so it is not counted as drafted."""
        mine = [i for i, f in enumerate(self.free) if not f]
        n = sum(1 for i in mine if i < n_accepted)
        k = len(mine)
        if n < k and n_accepted < len(self.x) and self.free[n_accepted]:
            k = n
        return k, n, [self.confidences[i] for i in mine[:k]]


class Drafter(Protocol):
    """What the speculative loop needs from a source of draft tokens."""

    def begin(self, context: Sequence[int], limit: int) -> None:
        """A generation starts after ``context`` (the prompt) and ends by the time the
        context is ``limit`` tokens long. Called once, before its first :meth:`plan`."""

    def plan(self) -> int:
        """How many tokens of its own are worth drafting this round (0: decode it
        plainly). Called once per round, before :meth:`draft`."""

    def draft(self, context: Sequence[int], k_max: int, params: SamplingParams,
              rng: np.random.Generator, should_stop: Callable[[], bool],
              constraint: Optional["GrammarState"] = None) -> Draft:
        """Propose at most ``k_max`` tokens after ``context`` (the committed tokens), drawn
        with the same warp as the target's (``params``): at most as many of its own as
        :meth:`plan` said, free ones (``Draft.free``) on top. ``should_stop`` is polled before each
        draft step: when it is true the draft ends there. With a grammar ``constraint`` every
        token is drawn from q masked to the tokens the grammar allows, and the constraint is
        left advanced through the proposed tokens (the loop rolls it back)."""

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        """The verify pass of ``draft`` (or of a plain round, when ``draft.x`` is empty)
        accepted ``n_accepted`` tokens and took ``verify_seconds``."""

    def rollback(self, n_keep: int) -> None:
        """Forget anything after the first ``n_keep`` tokens of the context."""
