"""Hybrid drafting: an n-gram match from the context when it is worth drafting, else the
draft model, each source with a length policy of its own."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from ..config import SamplingParams
from .base import Draft
from .model import ModelDrafter
from .ngram import NgramDrafter

if TYPE_CHECKING:
    from ..constraints import GrammarState


class HybridDrafter:
    """An n-gram match of at least ``ngram.ngram_min`` tokens when the n-gram policy finds it
    worth drafting, else the draft model.

    Copying from the context (quotes, code, summaries) costs nothing to draft and is accepted
    in long runs; everything else goes to the model. An n-gram draft costs nothing and its
    acceptance depends on the match, a model draft costs a forward pass per token: mixing their
    evidence in one policy would make each wrong about the other, so each source learns on its
    own rounds and rests (its evidence fades, so it re-probes later) while the other drafts.

    After long n-gram runs the draft model lags the context; when catching it up would cost
    more than drafting with it saves before the next match is likely, the round is plain.
    While the model drafts, a match of at least ``extend_match`` tokens of context + draft
    continues the draft for free.
    """

    def __init__(self, model: ModelDrafter, ngram: NgramDrafter, extend_match: int = 6):
        self.model, self.ngram = model, ngram
        self.reading = model.reading        # the model's cache: behind, catching up, its cost
        self.extend_match = extend_match
        self._planned = (0, 0)          # (model, ngram) plans for this round
        # Stretches without a usable n-gram match, in tokens: an estimate of how long the
        # draft model would draft after catching up (decaying mean), and where the current
        # stretch began.
        self.miss_tokens = 16.0
        self._miss_start: Optional[int] = None
        # The share of the answer's rounds that found no match (decaying mean): the part of
        # the rest of an answer the model would draft once caught up.
        self.miss_share = 1.0

    def begin(self, context: Sequence[int], limit: int) -> None:
        self.model.begin(context, limit)
        self.ngram.begin(context, limit)

    def plan(self) -> int:
        self._planned = (self.model.plan(), self.ngram.plan())
        return max(self._planned)

    def draft(self, context: Sequence[int], k_max: int, params: SamplingParams,
              rng: np.random.Generator, should_stop: Callable[[], bool],
              constraint: Optional["GrammarState"] = None) -> Draft:
        """Up to ``k_max`` tokens (the loop's bound: budget, context, batch), each source
        capped further by its own plan."""
        t0 = time.perf_counter()
        k_model = min(k_max, self._planned[0])
        # (Asked with the loop's bound: a long match of an earlier request may draft past its
        # plan, :class:`~.ngram.NgramDrafter`; a short one keeps to the plan.)
        d = self.ngram.draft(context, k_max, params, rng, should_stop, constraint) \
            if k_max > 0 else Draft(source="ngram")
        long_match = bool(d.x) and self.ngram.long_match
        if d.x:
            self._match_found(len(context))
        elif self._miss_start is None:
            self._miss_start = len(context)
        self.miss_share += 0.1 * ((not d.x) - self.miss_share)
        if k_model > 0 and self.reading.behind(context):
            # The model catches up (a chunk when that pays, never on the first round) while
            # the n-gram drafts, or the round is plain. While the n-gram matches, catching up
            # must pay before its next miss; without a match the model's reading judges for
            # itself over the rest of the answer (and may read a long prompt through a window).
            worth = self._catch_up_pays(context, self._model_is_better(k_model)) \
                if d.x else None
            caught = self.reading.catch_up(context, worth).caught_up
            if not d.x:
                d = Draft()
            d.count_catch_up(caught)
        elif (not d.x or not long_match and self._model_is_better(k_model)) and k_model > 0 \
                and self._catch_up_pays(context):
            if constraint is not None:
                constraint.rollback(len(d.x))
            # A long n-gram match of the context and the draft so far (the answer has started
            # to quote) continues the draft for free, up to the loop's bound rather than the
            # model's plan, since those tokens cost no draft steps.
            d = self.model.draft(context, k_max, params, rng, should_stop, constraint,
                                 extend=self.ngram.extender(context, k_max, self.extend_match))
        elif not d.x:
            # No match, and the model is not worth drafting with (its plan, or catching it
            # up): a plain round for both sources.
            d = Draft() if k_model > 0 else Draft(source="model")
        d.took(time.perf_counter() - t0)
        return d

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        if draft.source == "ngram":
            self.ngram.observe(draft, n_accepted, verify_seconds)
            self.model.rest()
        elif draft.source == "model":
            self.model.observe(draft, n_accepted, verify_seconds)
            self.ngram.rest()
        else:                       # nobody drafted: a plain round for both
            self.model.observe(draft, 0, verify_seconds)
            self.ngram.observe(draft, 0, verify_seconds)

    def rollback(self, n_keep: int) -> None:
        self.model.rollback(n_keep)

    # -- inside -------------------------------------------------------------------------------

    def _match_found(self, position: int) -> None:
        if self._miss_start is not None:
            stretch = position - self._miss_start
            if stretch >= 0:    # (negative: a new, shorter conversation)
                self.miss_tokens += 0.2 * (stretch - self.miss_tokens)
            self._miss_start = None

    def _model_is_better(self, k_model: int) -> bool:
        """Whether the model's planned round is expected to go faster than the n-gram's (a
        match is a poor bet when sampled text has left the context behind)."""
        mine, theirs = self.model.policy.economics, self.ngram.policy.economics
        return (k_model > 0 and mine is not None and theirs is not None
                and mine.planned_rate > theirs.planned_rate)

    def _catch_up_pays(self, context: Sequence[int], everywhere: bool = False) -> bool:
        """Whether catching the model up is repaid before the next n-gram match is likely
        (and before the answer is expected to end). ``everywhere``: the model's rounds are
        expected to beat the n-gram's, so it would draft where matches are found too: it is
        repaid over the rest of the answer (short matches in chat text come every few
        tokens, and their drafts are seldom accepted: judged by the stretch between two
        matches, a draft model that pays would never be caught up). Otherwise over the
        stretch to the next match, or the share of the rest that finds none, the longer."""
        seconds = self.reading.catch_up_seconds(context)
        if seconds is None:
            return True
        rest = self.reading.tokens_ahead(len(context))
        stretch = len(context) - self._miss_start if self._miss_start is not None else 0
        # Caught up once, the model drafts in every stretch without a match from here on (an
        # n-gram round puts it behind by only what that round committed).
        ahead = rest if everywhere else max(min(max(self.miss_tokens, stretch), rest),
                                            self.miss_share * rest)
        economics = self.model.policy.economics     # (a pinned length: it always pays)
        return economics is None or economics.catch_up_pays(seconds, ahead)
