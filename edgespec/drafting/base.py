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
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

from ..config import SamplingParams
from ..sampling import Dist


@dataclass
class Draft:
    """Proposed tokens ``x_1..x_K`` and the distributions ``q`` they were drawn from.

    ``confidences`` (the draft's top probability at each step, None where not measured) and
    ``step_seconds`` (each single-token draft step) feed the length policy; ``seconds`` is the
    whole call. ``source`` says who drafted: ``"model"``, ``"ngram"``, or ``"none"`` when the
    drafter chose a plain round. ``extended``: how many trailing tokens continue an n-gram
    match found while the model drafted (proposed with one-hot q, not chosen by the model's
    policy).
    """

    x: list[int] = field(default_factory=list)
    q: list[Dist] = field(default_factory=list)
    confidences: list[Optional[float]] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    source: str = "none"
    seconds: float = 0.0
    extended: int = 0

    def __post_init__(self) -> None:
        assert len(self.x) == len(self.q) == len(self.confidences), "one q and confidence per x"


class Drafter(Protocol):
    """What the speculative loop needs from a source of draft tokens."""

    def plan(self) -> int:
        """Most tokens worth drafting this round (0: decode it plainly)."""

    def draft(self, context: Sequence[int], k_max: int, params: SamplingParams,
              rng: np.random.Generator, should_stop: Callable[[], bool]) -> Draft:
        """Propose at most ``k_max`` tokens after ``context`` (the committed tokens), drawn
        with the same warp as the target's (``params``). ``should_stop`` is polled before each
        draft step: when it is true the draft ends there."""

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        """The verify pass of ``draft`` (or of a plain round, when ``draft.x`` is empty)
        accepted ``n_accepted`` tokens and took ``verify_seconds``."""

    def rollback(self, n_keep: int) -> None:
        """Forget anything after the first ``n_keep`` tokens of the context."""
