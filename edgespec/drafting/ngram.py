"""Prompt lookup: drafts copied from the context itself, at no model cost."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from ..config import SamplingParams
from ..sampling import Dist
from .base import Draft, Extender, LengthPolicy
from .suffix import SuffixIndex

if TYPE_CHECKING:
    from ..constraints import GrammarState


# The n-gram drafter's lookup: the context's last 2-8 tokens, searched in its last 4096.
NGRAM_MIN, NGRAM_MAX, WINDOW = 2, 8, 4096


def lookup(context: Sequence[int], k: int, ngram_min: int, ngram_max: int,
           window: int) -> tuple[list[int], int]:
    """The continuation (at most ``k`` tokens) after the longest, most recent earlier
    occurrence of the context's last n tokens, n from ``ngram_max`` down to ``ngram_min``,
    searched in the last ``window`` tokens; and n (0: no match)."""
    if k <= 0:
        return [], 0
    hay = np.asarray(context[-window:], dtype=np.int64)
    n_hay = hay.size
    for n in range(min(ngram_max, n_hay - 1), ngram_min - 1, -1):
        pattern = hay[n_hay - n:]
        starts = np.flatnonzero(hay[: n_hay - n] == pattern[0])
        for s in starts[::-1]:
            if np.array_equal(hay[s:s + n], pattern):
                cont = hay[s + n: s + n + k]
                if cont.size:
                    return [int(t) for t in cont], n
    return [], 0


def match_confidence(n: int) -> float:
    """A match's confidence from its length in tokens: log2(n) / 6, at most 1, so that the
    context's matches (2-8 tokens: 0.17-0.5) and the suffix index's longer ones (up to 64:
    0.5-1) fall in confidence bins of their own."""
    return min(1.0, float(np.log2(n)) / 6.0) if n > 0 else 0.0


class NgramDrafter:
    """Propose the continuation of the latest earlier occurrence of the context's last n
    tokens (n from ``ngram_max`` down to ``ngram_min``). Needs no model; q is one-hot, so under
    sampling a proposal x is accepted with probability p(x).

    Its confidence is the length of the match (:func:`match_confidence`): a continuation of
    a long match is accepted far more often than one of a two-token match, and the policy's
    gate learns by how much. A match longer than ``ngram_max`` (an earlier request's text met
    again: a regenerated answer, a repeated step) drafts as far as its confidence's acceptance
    pays (:meth:`~.policy.AdaptiveLength.length_for`), past the round's plan, which was
    learned from the context's short matches: the draft is as long as the evidence for that
    match, as in SuffixDecoding, not as the other matches'.
    """

    def __init__(self, policy: LengthPolicy, ngram_min: int = NGRAM_MIN,
                 ngram_max: int = NGRAM_MAX, window: int = WINDOW,
                 index: Optional[Callable[[], Optional[SuffixIndex]]] = None):
        self.policy = policy
        self.index = index      # earlier requests' tokens (suffix.py), as of this generation
        self.ngram_min, self.ngram_max, self.window = ngram_min, ngram_max, window
        self._planned = 0       # this round's plan
        self.long_match = False     # this round's draft is a long match's, past the plan

    def begin(self, context: Sequence[int], limit: int) -> None:
        """A new answer: the policy weighs its own rounds above earlier answers' (the
        context is all a lookup needs)."""
        self.policy.new_answer()

    def plan(self) -> int:
        """The policy's plan, or, when a match of the context's longest kind would pay on its
        own evidence (:meth:`~.policy.LengthPolicy.length_for`), that: the round then looks
        for one, and the match found sets the draft's length (:meth:`draft`)."""
        self._planned = self.policy.plan()
        best = self.policy.length_for(match_confidence(self.ngram_max), self.window)
        return max(self._planned, best)

    def draft(self, context: Sequence[int], k_max: int, params: SamplingParams,
              rng: np.random.Generator, should_stop: Callable[[], bool],
              constraint: Optional["GrammarState"] = None) -> Draft:
        t0 = time.perf_counter()
        k = min(k_max, self._planned)
        x, n = lookup(context, k_max, self.ngram_min, self.ngram_max, self.window)
        index = self.index() if self.index is not None else None
        if index is not None and k_max > 0:
            # An earlier request that matches the context's end for longer (a regenerated
            # answer, a repeated step) predicts better than the context's own match.
            y, m = index.lookup(context, k_max)
            if m > n and y:
                x, n = y, m
        # A match drafts as far as drafts of its length have paid (its confidence bin's
        # acceptance against the verify pass's rows), past the round's plan (even a plan of
        # none): the plan is learned over every match, and a copy of 8 tokens of the context
        # (a file being edited: measured, half of them continue for 32 tokens or more) is
        # accepted far longer than one of 2 (chat text: half are rejected at once).
        confidence = match_confidence(n)
        short = n <= self.ngram_max
        k_match = self.policy.length_for(confidence, k_max, slow_start=short) if x else 0
        if short:
            # (the plan too: one learned over an edit's copies would send a chat's first
            # short match 32 tokens on)
            k = min(k, self.policy.probe_cap(confidence))
        self.long_match = k_match > k
        k = max(k, k_match)
        del x[k:]
        # Free to know (no pass over logits): every round teaches the policy's confidence
        # bins, which a long match's length is drawn from; the gate cuts on it as it asks.
        gate = confidence if self.policy.needs_confidence else None
        if not self.long_match:
            for i in range(len(x)):
                if should_stop() or not self.policy.keep_drafting(i, gate):
                    del x[i:]
                    break
        if constraint is not None:      # only what the grammar allows, in order
            del x[constraint.consume(x):]
        return Draft(x, [Dist.one_hot(t) for t in x], [confidence] * len(x), source="ngram",
                     seconds=time.perf_counter() - t0)

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        k, n, confidences = draft.own(n_accepted)
        self.policy.observe(k, n, confidences, draft.step_seconds, verify_seconds,
                            k_verified=len(draft.x))

    def rollback(self, n_keep: int) -> None:
        pass

    def rest(self) -> None:
        """Another source drafted this round."""
        self.policy.rest()

    def extender(self, context: Sequence[int], k: int, min_match: int) -> Extender:
        """While another source drafts after ``context``: the continuation of a match of at
        least ``min_match`` tokens of the context and the draft so far (up to ``k`` tokens
        in all, as far as the policy says drafts of that match's length pay), else none."""
        tail = list(context[-self.window:])

        def extend(x: list[int]) -> list[int]:
            more, n = lookup(tail + x, k - len(x), self.ngram_min, self.ngram_max, self.window)
            if n < min_match:
                return []
            return more[:self.policy.extension_for(match_confidence(n), len(more))]
        return extend
