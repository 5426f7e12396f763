"""Drafting with a small model that shares the target's tokenizer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from ..config import SamplingParams
from ..lm import LanguageModel
from ..sampling import Dist, draw, warp
from .base import Draft
from .policy import LengthPolicy
from .reduced_head import ReducedHead

if TYPE_CHECKING:
    from ..constraints import GrammarState

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
        self._planned = 0       # this round's plan

    # -- the contract ---------------------------------------------------------------------

    def plan(self) -> int:
        self._planned = self.policy.plan()
        return self._planned

    def draft(self, context: Sequence[int], k_max: int, params: SamplingParams,
              rng: np.random.Generator, should_stop: Callable[[], bool],
              constraint: Optional["GrammarState"] = None,
              extend: Optional[Extender] = None) -> Draft:
        """Draft up to ``k_max`` tokens, at most as many drawn from the model as :meth:`plan`
        said. ``extend(x)``, asked after each drawn token but the last planned one, may
        return tokens that continue ``x`` (an n-gram match): they end the draft with one-hot
        q and are counted in ``Draft.extended``; the extender bounds their number."""
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
        own_max = min(k_max, self._planned)     # the policy's tokens; free ones come on top
        drawn = 0
        while drawn < own_max:
            allowed = None
            if constraint is not None:      # q is masked exactly as the target's p will be
                allowed = constraint.mask()
                allowed = allowed if ids is None else allowed[ids]
                if not allowed.any():       # no allowed token in the draft's vocabulary
                    break
                vals = np.where(allowed, vals, np.float32(-np.inf))
            # The stop decision uses only this position's distribution (policy.py).
            if plain_greedy:
                j = int(np.argmax(vals))
                q_i = Dist.one_hot(j if ids is None else int(ids[j]))
                confidence = top_probability(vals) if need_conf else None
            else:
                q_i = self._warp(ids, vals, params, tail, allowed)
                confidence = ((top_probability(vals) if params.greedy else
                               float(q_i.probs.max())) if need_conf else None)
            if should_stop() or not self.policy.keep_drafting(drawn, confidence):
                break
            x_i = draw(q_i, params, rng, len(context) + len(d.x))
            d.x.append(x_i)
            d.q.append(q_i)
            d.confidences.append(confidence)
            d.free.append(False)
            drawn += 1
            if constraint is not None:
                constraint.consume([x_i])
            if x_i in self.eog or len(d.x) == k_max:
                break
            more = extend(d.x) if extend is not None and drawn < own_max else []
            if more and constraint is not None:
                more = more[:constraint.consume(more)]
            if more:
                # The continuation is a function of the tokens drawn so far: a one-hot q
                # for each keeps rejection sampling exact.
                d.add(more)
                d.extended = len(more)
                break
            # Tokens the grammar forces next are drafted for free (one-hot q) and evaluated
            # with x_i in one step.
            forced = constraint.forced()[:k_max - len(d.x)] if constraint is not None else []
            forced = forced[:constraint.consume(forced)] if forced else []
            d.add(forced)
            if drawn == own_max or len(d.x) == k_max or self.eog.intersection(forced):
                break
            if tail:
                tail += [x_i, *forced]
            ts = time.perf_counter()
            ids, vals = self._step([x_i, *forced])
            if not forced:      # the cost model's draft cost is a one-token step's
                d.step_seconds.append(time.perf_counter() - ts)
        d.seconds = time.perf_counter() - t0
        return d

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        # The policy learns from the tokens it chose, not from forced or n-gram ones.
        k, n, confidences = draft.own(n_accepted)
        self.policy.observe(k, n, confidences, draft.step_seconds, verify_seconds,
                            k_verified=len(draft.x))

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
              tail: list[int], allowed: Optional[np.ndarray] = None) -> Dist:
        """q for sampling (``vals`` already masked to ``allowed``, the grammar's tokens in
        the same index space). On the reduced head's subset the samplers see only its logits
        (the -inf rest can never be drawn, so q is the same); penalties index the whole
        vocabulary and get the full row."""
        if ids is None:
            return warp(vals, params, tail)
        if tail:
            row = self.head.last_row()
            if allowed is not None:
                keep = np.zeros(row.shape[0], dtype=bool)
                keep[ids[allowed]] = True
                row[~keep] = -np.inf
            return warp(row, params, tail)
        d = warp(vals, params)
        return Dist(ids[d.ids] if d.ids is not None else ids.copy(), d.probs)
