"""Drafting with a small model that shares the target's tokenizer."""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import numpy as np

from ..config import SamplingParams
from ..lm import LanguageModel
from ..sampling import Dist, warp
from .base import Draft
from .policy import LengthPolicy
from .reduced_head import ReducedHead

# Logits this far below the maximum change a probability by less than e^-16 each; ignoring
# them makes the confidence check ~5× cheaper on a 262k-entry row.
_CONFIDENCE_WINDOW = 16.0

# An extender: given the draft so far, tokens that continue it for free (an n-gram match).
Extender = Callable[[list[int]], list[int]]


def top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the most likely token (temperature 1)."""
    m = logits.max()
    near = logits[logits > m - _CONFIDENCE_WINDOW]
    return float(1.0 / np.exp(near - m, dtype=np.float32).sum(dtype=np.float64))


class ModelDrafter:
    """A small model samples tokens from its own q, warped exactly as the target's p.

    Its KV cache follows the same invariant as the target's: it holds a prefix of the
    committed context; the missing tail (at least the last committed token) is fed at the
    start of the next draft. With a :class:`ReducedHead` each step skips llama.cpp's output
    layer and applies the head's rows instead.
    """

    def __init__(self, model: LanguageModel, eog: frozenset[int], policy: LengthPolicy,
                 head: Optional[ReducedHead] = None):
        self.model = model
        self.eog = eog
        self.policy = policy
        self.head = head        # None: llama.cpp's own output layer over the whole vocabulary
        # Seconds per token to bring the cache up to the context after others committed
        # tokens it has not seen (n-gram rounds); None until measured on a batch of 4+.
        self.catch_up_cost: Optional[float] = None

    # -- the contract ---------------------------------------------------------------------

    def plan(self) -> int:
        return self.policy.plan()

    def draft(self, context: Sequence[int], k_max: int, params: SamplingParams,
              rng: np.random.Generator, should_stop: Callable[[], bool],
              extend: Optional[Extender] = None) -> Draft:
        """Draft up to ``k_max`` tokens. ``extend(x)``, asked after each drawn token, may
        return tokens that continue ``x`` (an n-gram match): they end the draft with one-hot
        q and are counted in ``Draft.extended``. The extender bounds their number."""
        t0 = time.perf_counter()
        m = self.model
        n_cached = len(m.tokens)
        assert m.tokens == context[:n_cached], "draft cache diverged from the context"
        if self.head is not None:
            self.head.follow(context)
        ids, vals = self._step(context[n_cached:])
        self._measure_catch_up(len(context) - n_cached, time.perf_counter() - t0)
        d = Draft(source="model")
        need_conf = self.policy.needs_confidence
        plain_greedy = params.greedy and not params.uses_penalty
        tail = list(context[-params.repeat_last_n:]) if params.uses_penalty else []
        for i in range(k_max):
            # The stop decision uses only this position's distribution (policy.py).
            if plain_greedy:
                j = int(np.argmax(vals))
                q_i = Dist.one_hot(j if ids is None else int(ids[j]))
                confidence = top_probability(vals) if need_conf else None
            else:
                q_i = self._warp(ids, vals, params, tail)
                confidence = ((top_probability(vals) if params.greedy else
                               float(q_i.probs.max())) if need_conf else None)
            if should_stop() or not self.policy.keep_drafting(i, confidence):
                break
            x_i = q_i.sample(rng)
            d.x.append(x_i)
            d.q.append(q_i)
            d.confidences.append(confidence)
            if x_i in self.eog or i == k_max - 1:
                break
            more = extend(d.x) if extend is not None else []
            if more:
                # The continuation is a function of the tokens drawn so far: a one-hot q
                # for each keeps rejection sampling exact.
                d.x.extend(more)
                d.q.extend(Dist.one_hot(t) for t in more)
                d.confidences.extend([None] * len(more))
                d.extended = len(more)
                break
            if tail:
                tail.append(x_i)
            ts = time.perf_counter()
            ids, vals = self._step([x_i])
            d.step_seconds.append(time.perf_counter() - ts)
        d.seconds = time.perf_counter() - t0
        return d

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        # The policy learns from the tokens it chose; an n-gram continuation is not one.
        k = len(draft.x) - draft.extended
        self.policy.observe(k, min(n_accepted, k), draft.confidences[:k], draft.step_seconds,
                            verify_seconds, k_verified=len(draft.x))

    def rollback(self, n_keep: int) -> None:
        self.model.truncate(n_keep)

    # -- for a hybrid drafter -------------------------------------------------------------

    def rest(self) -> None:
        """Another source drafted this round."""
        self.policy.rest()

    def catch_up_seconds(self, context: Sequence[int]) -> Optional[float]:
        """What evaluating the context tokens this cache has not seen would cost (None: not
        measured yet, or only a few tokens behind)."""
        lag = len(context) - len(self.model.tokens)
        if self.catch_up_cost is None or lag < 4:
            return None
        return lag * self.catch_up_cost

    # -- inside -----------------------------------------------------------------------------

    def _measure_catch_up(self, lag: int, seconds: float) -> None:
        if lag >= 4:
            per_token = seconds / lag
            self.catch_up_cost = (per_token if self.catch_up_cost is None else
                                  self.catch_up_cost + 0.2 * (per_token - self.catch_up_cost))

    def _step(self, tokens: Sequence[int]) -> tuple[Optional[np.ndarray], np.ndarray]:
        """Evaluate ``tokens``; the draft's logits after the last of them as (ids, logits):
        the reduced head's subset, or (None, the whole row)."""
        if self.head is None:
            return None, self.model.eval(tokens, 1)[0]
        hidden = self.model.eval_hidden(tokens)
        if hidden is None:
            return None, self.model.last_logits()
        return self.head.subset_logits(hidden)

    def _warp(self, ids: Optional[np.ndarray], vals: np.ndarray, params: SamplingParams,
              tail: list[int]) -> Dist:
        """q for sampling. On the reduced head's subset the samplers see only its logits
        (the -inf rest can never be drawn, so q is the same); penalties index the whole
        vocabulary and get the full row."""
        if ids is None:
            return warp(vals, params, tail)
        if tail:
            return warp(self.head.last_row(), params, tail)
        d = warp(vals, params)
        return Dist(ids[d.ids] if d.ids is not None else ids.copy(), d.probs)
