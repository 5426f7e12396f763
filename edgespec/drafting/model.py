"""Drafting with a small model: one that shares the target's tokenizer, or one of another
family through a :class:`~.cross_vocab.Translation` (its proposals restricted to the tokens
both vocabularies hold, :mod:`.cross_vocab`).

The draft never delays the target's first token (the loop takes it from the prompt pass's
last row, without asking the drafter), and a draft cache far behind the context (a long
prompt, a long n-gram run) catches up one chunk per round, between target steps, and only
while the cost model says that drafting for the rest of the answer repays what catching up
costs. It may read a long prompt through a window, its first tokens and its last few hundred,
when that is expected to save more time than the acceptance it costs (docs/decisions.md, "The
first token of a long prompt"). What the draft reads changes only how fast the answer comes,
never what it is.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from ..config import SamplingParams
from ..lm import LanguageModel
from ..prompt_cache import common_prefix
from ..sampling import Dist, apply_penalties, draw, warp
from .base import Draft
from .cross_vocab import Translation, restrict
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

    # A cache more than this many tokens behind the context catches up this many per round (a
    # plain round for the draft): a chunk batches well, and the answer's tokens keep flowing.
    CATCH_UP_CHUNK = 64
    # How fast the typical answer length (what catching up is repaid over) follows new answers.
    ANSWER_EMA = 0.3
    # A long prompt may be read through a window: its first HEAD tokens and its last W, for
    # these W, each keeping this share of the acceptance the whole prompt gives (the least
    # of both registry pairs, scripts/bench_draft_window.py, docs/decisions.md).
    HEAD = 32
    WINDOWS = ((256, 0.80), (1024, 0.90))
    # Until a catch-up was measured, a prompt token is taken to cost this share of a draft
    # step (measured: 0.2-0.4 on both pairs); the first chunk measures it.
    PROMPT_TOKEN_SHARE = 0.5

    def __init__(self, model: LanguageModel, eog: frozenset[int], policy: LengthPolicy,
                 head: Optional[ReducedHead] = None,
                 cross: Optional[tuple[Translation, np.ndarray]] = None):
        self.model = model
        self.eog = eog
        self.policy = policy
        self.head = head        # None: llama.cpp's own output layer over the whole vocabulary
        # Across vocabularies: the context in the draft's tokens, and its ids to the target's
        # (-1: none). Positions in the draft's cache are then its own tokens'.
        self.translation, self._to_target = cross or (None, None)
        self._shared = self._to_target >= 0 if self._to_target is not None else None
        # Seconds per token to bring the cache up to the context after others committed
        # tokens it has not seen (n-gram rounds); None until measured on a batch of 4+.
        self.catch_up_cost: Optional[float] = None
        self._planned = 0       # this round's plan
        # The generation in progress: where it started and must end (context lengths) and the
        # committed length last seen. The typical answer's length in tokens (None until one
        # answer ended).
        self._start, self._limit = 0, float("inf")
        self._seen = 0
        self.answer_tokens: Optional[float] = None
        # The context the cache leaves out, [a, b), when a window was chosen (the cache holds
        # context[:a] + context[b:]); whether this generation chose already.
        self._skip: Optional[tuple[int, int]] = None
        self._chosen = False
        self._plain_rounds = 0      # plain rounds of this answer since the model last drafted

    # -- the contract ---------------------------------------------------------------------

    def begin(self, context: Sequence[int], limit: int) -> None:
        if self._seen > self._start:        # the previous answer's length, learned
            n = self._seen - self._start
            self.answer_tokens = (n if self.answer_tokens is None else
                                  self.answer_tokens + self.ANSWER_EMA * (n - self.answer_tokens))
        self._start = self._seen = len(context)
        self._limit = limit
        self._plain_rounds = 0
        if self._skip is not None:      # a window of the last conversation: read afresh
            self.model.truncate(min(len(self.model.tokens), self._skip[0]))
        self._skip, self._chosen = None, False

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
        if self.behind(context):
            return self.catch_up(context)
        t0 = time.perf_counter()
        m = self.model
        seen = self._view(context)          # what the draft reads: the context, or a window
        if not seen:
            return Draft()
        n_cached = len(m.tokens)
        assert m.tokens == seen[:n_cached], "draft cache diverged from the context"
        if n_cached == len(seen):       # (across vocabularies: the last token added none)
            n_cached -= 1
            m.truncate(n_cached)
        if not self._reentry_pays(len(seen) - n_cached):
            return Draft()
        if self.head is not None:
            self.head.follow(self._tokens(context))
        ids, vals = self._step(seen[n_cached:])
        self._measure_catch_up(len(seen) - n_cached, time.perf_counter() - t0)
        d = Draft(source="model", caught_up=max(0, len(seen) - n_cached - 1))
        need_conf = self.policy.needs_confidence
        plain_greedy = params.greedy and not params.uses_penalty
        tail = list(context[-params.repeat_last_n:]) if params.uses_penalty else []
        if tail and self.translation is not None:
            tail = self.translation.extend(tail)
        own_max = min(k_max, self._planned)     # the policy's tokens; free ones come on top
        drawn = 0
        while drawn < own_max:
            if self.translation is not None:
                tq = time.perf_counter()
                found = self._cross_q(ids, vals, params, tail, constraint, need_conf)
                self.translation.q_seconds += time.perf_counter() - tq
                if found is None:           # nothing allowed among the shared tokens
                    break
                q_i, confidence = found
            else:
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
            step = [x_i, *forced]
            if self.translation is not None:
                step = self.translation.extend(step)
            if tail:
                tail += step
            ts = time.perf_counter()
            ids, vals = self._step(step)
            if not forced:      # the cost model's draft cost is a one-token step's
                d.step_seconds.append(time.perf_counter() - ts)
        d.seconds = time.perf_counter() - t0
        return d

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        self._plain_rounds = 0 if draft.source == "model" else self._plain_rounds + 1
        # The policy learns from the tokens it chose, not from forced or n-gram ones.
        k, n, confidences = draft.own(n_accepted)
        self.policy.observe(k, n, confidences, draft.step_seconds, verify_seconds,
                            k_verified=len(draft.x))

    def rollback(self, n_keep: int) -> None:
        self._seen = n_keep + 1
        if self.translation is not None:
            # The cache may keep what it holds past the translation known so far (the
            # accepted drafts): the next draft trims it where it stops matching (_view).
            n = self.translation.truncate(n_keep)
            if self._skip is not None and n < self._skip[1]:
                self.model.truncate(min(n, self._skip[0]))
                self._skip = None
            return
        if self._skip is not None and n_keep < self._skip[1]:
            self.model.truncate(min(n_keep, self._skip[0]))     # back into the window's gap
            self._skip = None
        else:
            self.model.truncate(self._seen_len(n_keep))

    # -- catching up ------------------------------------------------------------------------

    def behind(self, context: Sequence[int]) -> bool:
        """Whether this round is a plain one for the model: its cache is more than a chunk
        behind. (The first token never waits for the draft: the loop gives it from the
        prompt pass, or from a plain first round, without asking the drafter.)"""
        return self._lag(context) > self.CATCH_UP_CHUNK

    def catch_up(self, context: Sequence[int], worth: Optional[bool] = None) -> Draft:
        """A plain round while :meth:`behind`: one chunk of the context the cache lacks is
        evaluated when catching up is ``worth`` it (default: this drafter's own judgement,
        :meth:`catch_up_worth`)."""
        t0 = time.perf_counter()
        d = Draft()
        if worth if worth is not None else self.catch_up_worth(context):
            n = len(self.model.tokens)
            chunk = list(self._view(context)[n:n + self.CATCH_UP_CHUNK])
            self.model.eval(chunk, 0)
            self._measure_catch_up(len(chunk), time.perf_counter() - t0)
            d.caught_up = len(chunk)
        d.seconds = time.perf_counter() - t0
        return d

    def _reentry_pays(self, lag: int) -> bool:
        """Whether drafting again after plain rounds of this answer is worth it: the first
        step must then also evaluate the tokens those rounds committed (``lag`` tokens where
        one is the rule), and a batch of a few tokens costs a small model about a step per
        token on a CPU (docs/decisions.md). This round's expected saving must repay that, or
        the round stays plain: a pair that barely pays would otherwise lose more on each
        return than its drafts gain. (The prompt's tokens are not counted: reading them is
        repaid over the whole answer, :meth:`catch_up_worth`.)"""
        extra = min(lag - 1, self._plain_rounds)
        expected = getattr(self.policy, "expected", None)
        if extra <= 0 or expected is None:      # (a pinned draft length drafts regardless)
            return True
        costs = self.policy.costs
        per_token = self.catch_up_cost or self.PROMPT_TOKEN_SHARE * costs.draft
        tokens, seconds = expected(max(1, self._planned))
        return tokens * costs.t(1) > seconds + extra * per_token

    def tokens_ahead(self, position: int) -> float:
        """How many more tokens this answer is expected to have at ``position`` (a context
        length), within what the generation may still make: what the typical answer has
        left, or, past the typical length, as many as it has made so far."""
        left = self._limit - position
        if self.answer_tokens is None:
            return left
        made = position - self._start
        return min(left, max(self.answer_tokens - made, made))

    def catch_up_worth(self, context: Sequence[int]) -> bool:
        """Whether bringing the cache up to the context is repaid by drafting for the rest of
        the answer (the tokens decoded plainly while catching up not counted). The first time
        in a generation, a window of a long prompt may be chosen (:meth:`_choose_window`).
        Unmeasured, one chunk is the measurement, when drafting pays at all."""
        if not self._chosen:
            self._chosen = True
            self._choose_window(context)
        lag = self._lag(context)
        ahead = self.tokens_ahead(len(context)) - lag / self.CATCH_UP_CHUNK
        if ahead <= 1:
            return False
        seconds = self.catch_up_seconds(context)
        return self.policy.catch_up_pays(seconds or 0.0, ahead)

    def _choose_window(self, context: Sequence[int]) -> None:
        """Read the prompt whole, or through a window (its first HEAD tokens, its last W):
        whichever the cost model expects to save the most over the rest of the answer, the
        saving at a window's acceptance less what reading it costs. Only under a cost model
        (a pinned draft length reads the whole prompt)."""
        saving = getattr(self.policy, "saving", None)
        if saving is None:
            return
        n, size = len(self.model.tokens), len(self._tokens(context))     # (the draft's tokens)
        cost = self.catch_up_cost or self.PROMPT_TOKEN_SHARE * self.policy.costs.draft
        ahead = self.tokens_ahead(len(context))

        def net(read: int, keep: float) -> float:
            return saving(ahead - read / self.CATCH_UP_CHUNK, keep) - read * cost

        best, choice = net(size - n, 1.0), None
        a = max(n, self.HEAD)
        for w, keep in self.WINDOWS:
            b = size - w
            if b - a > self.CATCH_UP_CHUNK:
                value = net(a - n + w, keep)
                if value > best:
                    best, choice = value, (a, b)
        self._skip = choice

    def _tokens(self, context: Sequence[int]) -> Sequence[int]:
        """The context in the draft's tokens."""
        return context if self.translation is None else self.translation.tokens(context)

    def _view(self, context: Sequence[int]) -> Sequence[int]:
        """The context as the draft reads it (all of it, or the window chosen), in its own
        tokens. Across vocabularies the cache is first trimmed to what still matches it (a
        re-tokenised run, drafts that were rejected)."""
        seen = self._tokens(context)
        if self._skip is not None:
            a, b = self._skip
            seen = list(seen[:a]) + list(seen[b:])
        if self.translation is not None:
            m = self.model
            n = len(m.tokens)
            if m.tokens != seen[:n]:
                m.truncate(common_prefix(m.tokens, seen))
        return seen

    def _seen_len(self, n: int) -> int:
        """How long the first ``n`` context tokens are as the draft reads them (the same
        vocabulary)."""
        return n if self._skip is None else n - (self._skip[1] - self._skip[0])

    def _lag(self, context: Sequence[int]) -> int:
        if self.translation is not None:
            return len(self._view(context)) - len(self.model.tokens)
        return self._seen_len(len(context)) - len(self.model.tokens)

    # -- for a hybrid drafter -------------------------------------------------------------

    def rest(self) -> None:
        """Another source drafted this round."""
        self._plain_rounds += 1
        self.policy.rest()

    def catch_up_seconds(self, context: Sequence[int]) -> Optional[float]:
        """What evaluating the context tokens this cache has not seen would cost (None: not
        measured yet, or only a few tokens behind)."""
        lag = self._lag(context)
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

    def _cross_q(self, ids: Optional[np.ndarray], vals: np.ndarray, params: SamplingParams,
                 tail: list[int], constraint: Optional["GrammarState"],
                 need_conf: bool) -> Optional[tuple[Dist, Optional[float]]]:
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
