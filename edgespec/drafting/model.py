"""Drafting with a small model: one that shares the target's tokenizer, or one of another
family through a :class:`~.cross_vocab.Translation` (its proposals restricted to the tokens
both vocabularies hold, :mod:`.cross_vocab`).

Each draft token is drawn from q, the draft's distribution warped exactly as the target's p
will be (and masked alike under a grammar); what the draft's cache reads, and whether bringing
it up to date pays, is its :class:`~.reading.Reading`'s.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from ..config import SamplingParams
from ..lm import LanguageModel
from ..sampling import Dist, apply_penalties, draw, warp
from .base import Draft, Extender, LengthPolicy
from .cross_vocab import Translation, restrict
from .reading import Reading
from .reduced_head import ReducedHead

if TYPE_CHECKING:
    from ..constraints import GrammarState

# Logits this far below the maximum change a probability by less than e^-16 each; ignoring
# them makes the confidence check ~5× cheaper on a 262k-entry row.
_CONFIDENCE_WINDOW = 16.0

# A draft step's q and its confidence (None: not measured); None when nothing may be drawn.
Proposal = Optional[tuple[Dist, Optional[float]]]


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

    Beside the :class:`~.base.Drafter` contract, a hybrid drafter uses its ``policy`` (its cost
    oracle, :class:`~.economics.DraftEconomics`), its ``reading`` (:class:`~.reading.Reading`:
    whether the cache is behind, catching up, what that costs), ``draft(..., extend=)`` and
    :meth:`rest`.
    """

    def __init__(self, model: LanguageModel, eog: frozenset[int], policy: LengthPolicy,
                 head: Optional[ReducedHead] = None,
                 cross: Optional[tuple[Translation, np.ndarray]] = None,
                 donor: Optional[LanguageModel] = None):
        self.model = model
        self.eog = eog
        self.policy = policy
        self.head = head        # None: llama.cpp's own output layer over the whole vocabulary
        # Across vocabularies: the context in the draft's tokens, and its ids to the target's
        # (-1: none). Positions in the draft's cache are then its own tokens'.
        self.translation, self._to_target = cross or (None, None)
        self._shared = self._to_target >= 0 if self._to_target is not None else None
        self.reading = Reading(model, policy, self.translation, donor=donor)
        self._planned = 0       # this round's plan

    # -- the contract ---------------------------------------------------------------------

    def begin(self, context: Sequence[int], limit: int) -> None:
        self.reading.begin(context, limit)

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
        reading = self.reading
        if reading.behind(context):         # a plain round: a chunk of the context, or none
            return reading.catch_up(context)
        t0 = time.perf_counter()
        unread = reading.unread(context)
        if not unread or not reading.reentry_pays(len(unread), self._planned):
            return Draft()
        if self.head is not None:
            self.head.follow(reading.tokens(context))
        ids, vals = self._step(unread)      # the logits of the first draft position
        reading.measured(len(unread), time.perf_counter() - t0)
        d = Draft(source="model", caught_up=max(0, len(unread) - 1))
        need_conf = self.policy.needs_confidence
        tail = list(context[-params.repeat_last_n:]) if params.uses_penalty else []
        if tail and self.translation is not None:
            tail = self.translation.extend(tail)
        own_max = min(k_max, self._planned)     # the policy's tokens; free ones come on top
        drawn = 0
        while drawn < own_max:
            found = self._propose(ids, vals, params, tail, constraint, need_conf)
            if found is None:           # the grammar allows none of the draft's tokens
                break
            q_i, confidence = found
            # The stop decision uses only this position's distribution (policy.py).
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
            if extend is not None and drawn < own_max and self._extended(d, extend, constraint):
                break
            # Tokens the grammar forces next are drafted for free (one-hot q) and evaluated
            # with x_i in one step.
            forced = self._forced(constraint, k_max - len(d.x))
            d.add(forced)
            if drawn == own_max or len(d.x) == k_max or self.eog.intersection(forced):
                break
            step = [x_i, *forced]
            if self.translation is not None:
                step = self.translation.extend(step)
            if tail:
                tail += step
            ts = time.perf_counter()
            self.model.checkpoint()     # a recurrent draft's way back to here, if rejected
            ids, vals = self._step(step)
            if not forced:      # the cost model's draft cost is a one-token step's
                d.step_seconds.append(time.perf_counter() - ts)
        d.took(time.perf_counter() - t0)
        return d

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        self.reading.after_round(drafted=draft.source == "model")
        # The policy learns from the tokens it chose, not from forced or n-gram ones.
        k, n, confidences = draft.own(n_accepted)
        self.policy.observe(k, n, confidences, draft.step_seconds, verify_seconds,
                            k_verified=len(draft.x))

    def rollback(self, n_keep: int) -> None:
        self.reading.rollback(n_keep)

    def rest(self) -> None:
        """Another source drafted this round (a hybrid drafter's)."""
        self.reading.after_round(drafted=False)
        self.policy.rest()

    # -- free tokens ------------------------------------------------------------------------

    @staticmethod
    def _extended(d: Draft, extend: Extender, constraint: Optional["GrammarState"]) -> bool:
        """Whether ``extend`` continued the draft (those tokens added, as far as the grammar
        allows them): the continuation is a function of the tokens drawn so far, so a
        one-hot q for each keeps rejection sampling exact."""
        more = extend(d.x)
        if more and constraint is not None:
            more = more[:constraint.consume(more)]
        if more:
            d.add_extension(more)
        return bool(more)

    @staticmethod
    def _forced(constraint: Optional["GrammarState"], room: int) -> list[int]:
        """The tokens the grammar forces next (at most ``room``), consumed."""
        forced = constraint.forced()[:room] if constraint is not None else []
        return forced[:constraint.consume(forced)] if forced else []

    # -- each draft step's q ----------------------------------------------------------------

    def _propose(self, ids: Optional[np.ndarray], vals: np.ndarray, params: SamplingParams,
                 tail: list[int], constraint: Optional["GrammarState"],
                 need_conf: bool) -> Proposal:
        """q for the next draft token over the target's ids, and its confidence (the draft's
        top probability; measured when ``need_conf``); None when nothing may be drawn. From
        the row ``(ids, vals)`` (:meth:`_step`); ``tail``: the penalties' history."""
        if self.translation is None:
            return self._own_q(ids, vals, params, tail, constraint, need_conf)
        tq = time.perf_counter()
        found = self._cross_q(ids, vals, params, tail, constraint, need_conf)
        self.translation.count_q_seconds(time.perf_counter() - tq)
        return found

    def _own_q(self, ids: Optional[np.ndarray], vals: np.ndarray, params: SamplingParams,
               tail: list[int], constraint: Optional["GrammarState"],
               need_conf: bool) -> Proposal:
        """The same vocabulary: the draft's warped distribution (greedy without penalties:
        its argmax), masked to the grammar's tokens; None when it allows none of them."""
        allowed = None
        if constraint is not None:
            masked = self._masked(ids, vals, constraint)
            if masked is None:
                return None
            vals, allowed = masked
        if params.greedy and not params.uses_penalty:
            j = int(np.argmax(vals))
            return (Dist.one_hot(j if ids is None else int(ids[j])),
                    top_probability(vals) if need_conf else None)
        q = self._warp(ids, vals, params, tail, allowed)
        return q, ((top_probability(vals) if params.greedy else float(q.probs.max()))
                   if need_conf else None)

    @staticmethod
    def _masked(ids: Optional[np.ndarray], vals: np.ndarray,
                constraint: "GrammarState") -> Optional[tuple[np.ndarray, np.ndarray]]:
        """The row's logits masked to the tokens the grammar allows, exactly as the target's p
        will be, and that mask (both in the row's index space); None when it allows none."""
        allowed = constraint.mask()
        allowed = allowed if ids is None else allowed[ids]
        if not allowed.any():       # no allowed token in the draft's vocabulary
            return None
        return np.where(allowed, vals, np.float32(-np.inf)), allowed

    def _step(self, tokens: Sequence[int]) -> tuple[Optional[np.ndarray], np.ndarray]:
        """Evaluate ``tokens``; the draft's logits after the last of them as (ids, logits):
        the reduced head's subset, or (None, the whole row)."""
        if self.head is None:
            return None, self.model.eval(tokens, 1)[0]
        hidden = self.model.eval_hidden(tokens)
        if hidden is None:
            return None, self.model.last_logits()
        return self.head.subset_logits(hidden)

    def _cross_q(self, ids: Optional[np.ndarray], vals: np.ndarray, params: SamplingParams,
                 tail: list[int], constraint: Optional["GrammarState"],
                 need_conf: bool) -> Proposal:
        """(q over the target's ids, confidence) of a draft across vocabularies: the draft's
        distribution over the tokens both vocabularies hold (greedy: their argmax), a grammar
        applied to their target ids; None when no such token is allowed. ``tail``: the
        penalties' history in the draft's tokens."""
        tids = self._to_target if ids is None else self._to_target[ids]
        ok = self._shared if ids is None else tids >= 0     # (in this row's index space)
        if constraint is not None:      # q is masked exactly as the target's p will be
            ok = ok & constraint.mask()[np.maximum(tids, 0)]
        if not ok.any():
            return None
        if params.greedy:
            # The argmax over the shared (and allowed) tokens; penalties first, as warp does.
            row = vals if not tail else self._penalised(ids, vals, params, tail)
            j = int(np.argmax(row))
            if ok[j]:       # the usual case: only the logits near the top are masked
                near = np.flatnonzero(row > row[j] - _CONFIDENCE_WINDOW)
                near = near[ok[near]]
                confidence = (float(1.0 / np.exp(row[near] - row[j], dtype=np.float32).sum(
                    dtype=np.float64)) if need_conf else None)
                return Dist.one_hot(int(tids[j])), confidence
            masked = np.where(ok, row, np.float32(-np.inf))
            j = int(np.argmax(masked))
            return (Dist.one_hot(int(tids[j])),
                    top_probability(masked) if need_conf else None)
        # Unshared tokens keep their place in the warp (top-k/top-p see the draft's own
        # distribution); restrict() then removes them and renormalises.
        shown = None if constraint is None else ok | (tids < 0)
        if shown is not None:
            vals = np.where(shown, vals, np.float32(-np.inf))
        q_d = self._warp(ids, vals, params, tail, shown)
        q_i = restrict(q_d, self._to_target)
        if q_i is None:
            return None
        return q_i, float(q_i.probs.max()) if need_conf else None

    def _penalised(self, ids: Optional[np.ndarray], vals: np.ndarray, params: SamplingParams,
                   tail: list[int]) -> np.ndarray:
        """This row's logits with the penalties applied (in its own index space)."""
        if ids is None:
            return apply_penalties(vals, params, tail)
        return apply_penalties(self.head.last_row(), params, tail)[ids]

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
