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
    from .economics import DraftEconomics

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


class LengthPolicy(Protocol):
    """Decides how many tokens to draft; learns from each verified round."""

    # What drafting is expected to cost and save, on this policy's estimates (None: a length
    # that is not the cost model's, as a pinned one).
    economics: Optional[DraftEconomics]

    @property
    def needs_confidence(self) -> bool:
        """Whether the drafter should measure its confidence this round (it costs a pass over
        the draft's logits)."""

    def plan(self) -> int:
        """Most tokens to draft this round (0: decode this round with the target alone)."""

    def keep_drafting(self, i: int, confidence: Optional[float]) -> bool:
        """Before drawing draft token ``i`` (0-based) whose distribution has this confidence
        (the draft's top probability; ``None`` when not measured)."""

    def length_for(self, confidence: float, k_max: int, slow_start: bool = False) -> int:
        """How many tokens a free draft of this ``confidence`` (an n-gram match's length,
        :func:`~.ngram.match_confidence`) is worth, up to ``k_max``, whatever this round's
        plan: 0 when none (a pinned length: always 0, the plan is the user's). ``slow_start``:
        while drafts of this confidence have little evidence, 4, 8, 16… tokens as it comes
        in, rather than what the optimistic prior says."""

    def extension_for(self, confidence: float, room: int) -> int:
        """How many tokens of a match's continuation (of this ``confidence``) to append to
        another source's draft, up to ``room``: as far as free drafts of that confidence pay
        for their rows (:meth:`length_for`); all of them where the length is not this
        policy's to weigh (pinned, or planned jointly with other streams)."""

    def observe(self, k: int, n: int, confidences: Sequence[Optional[float]],
                draft_step_seconds: Sequence[float], verify_seconds: float,
                k_verified: Optional[int] = None) -> None:
        """A round drafted ``k`` tokens and ``n`` were accepted; what each part cost.
        ``k_verified``: how many drafts the verify pass checked, when it also checked tokens
        this policy did not choose (an n-gram continuation of the draft)."""

    def rest(self) -> None:
        """A round this policy took no part in (another source drafted)."""

    def new_answer(self) -> None:
        """A new answer begins: what earlier answers taught becomes a prior that this
        answer's own rounds soon outweigh."""

    def probe_cap(self, confidence: float) -> int:
        """At most how many tokens a draft of this ``confidence`` may take while this answer
        has tried few of them: 4, 8, 16… as it tries more (a pinned length: no cap)."""
