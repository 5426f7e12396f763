"""The speculative decoding loop: draft → verify in one target pass → accept → trim → emit.

Cache invariant (as in llama.cpp's speculative-simple): the target's KV cache holds exactly the
committed context minus its last token ``id_last``, which is fed first in the next verify batch,
so a rejected suffix is removed with one ``truncate``. The prompt pass may include the last
prompt token (``first_row``, its logits): the first token is then sampled from that row, with
no pass of its own and no draft to wait for, and the first verify batch follows it. The draft's
cache holds a prefix of the committed context; the drafter feeds whatever it is missing.

:func:`decode` yields committed tokens one at a time. Whoever consumes it may stop at any token
(a stop string, a cancel): closing the generator trims both caches to exactly what was
consumed, so the next call starts from a consistent state. With ``drafter=None`` (or K = 0)
the same loop is plain target decoding: Algorithm 1 with K = 0 is ordinary sampling.

With a grammar ``constraint`` every row's p and every draft step's q are masked with the same
allowed set, so the output is the target's constrained distribution; tokens the grammar forces
lead the draft with q = 1 (they cost no draft step), and a rejected suffix rolls the grammar
back with the caches.

Unseeded sampling verifies each draft with block verification (:func:`~edgespec.verify.
verify_block`) unless ``verifier="token"`` asks for token-wise rejection sampling
(:func:`~edgespec.verify.speculative_sampling`); both are lossless, block verification accepts
at least as many tokens in expectation. Greedy and seeded decoding have their own rules.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import numpy as np

from .config import VERIFIERS, SamplingParams
from .drafting import Draft, Drafter
from .lm import LanguageModel
from .results import LoopStats, Round, Step
from .sampling import log_probs, masked_argmax
from .verify import (TargetRows, speculative_sampling, verify_block, verify_greedy,
                     verify_keyed)

if TYPE_CHECKING:
    from .constraints import GrammarState


def decode(target: LanguageModel, context: list[int], *, params: SamplingParams,
           rng: np.random.Generator, max_tokens: int, drafter: Optional[Drafter] = None,
           first_row: Optional[np.ndarray] = None, stats: Optional[LoopStats] = None,
           should_stop: Callable[[], bool] = lambda: False,
           constraint: Optional["GrammarState"] = None,
           logprobs: Optional[int] = None, verifier: str = "block") -> Iterator[Step]:
    """Generate up to ``max_tokens`` tokens after ``context``.

    ``context`` is the committed token list (prompt + tokens generated so far) and is extended
    in place as tokens are committed. Preconditions: ``target.tokens == context[:-1]``, or
    ``target.tokens == context`` with ``first_row`` the target's logits after it (the prompt
    pass's last row, from which the first token is sampled), and the drafter's cache holds a
    prefix of ``context``. The first token never waits for the draft: it comes from
    ``first_row``, or else from a plain first round; the drafter decides each round's draft
    length (:mod:`edgespec.drafting`). Stops after an end-of-generation token (which is yielded),
    after ``max_tokens`` tokens, or when the context window is full; it never asks llama.cpp for
    more than ``n_batch``/``n_outputs_max`` rows or ``n_ctx`` positions. ``should_stop`` is
    polled at every draft step and before each verify pass: when it turns true the loop ends
    without committing the round in progress. ``constraint``: a grammar's state after the
    committed context, advanced as tokens commit. ``logprobs``: give each step its log
    probability and this many alternatives, read from the verify pass's own rows.
    ``verifier``: the rule for unseeded sampling, ``"block"`` (block verification) or
    ``"token"`` (token-wise rejection sampling).
    """
    _check(target, context, first_row, verifier)
    stats = stats if stats is not None else LoopStats()
    eog = target.vocab.eog
    accept = _Acceptance(params, verifier, rng, target.n_vocab)
    max_rows = min(target.n_batch, target.n_outputs_max)
    limit = len(context) + min(max_tokens, target.n_ctx - len(context))   # (the context's end)
    pending = first_row         # the first round's row, already computed (no pass, no draft)
    first = True                # the first token never waits for the draft
    if drafter is not None:
        drafter.begin(context, limit)
    try:
        while len(context) < limit:
            # How many drafts fit: the verify pass commits at most K + 1 tokens.
            room = min(limit - len(context) - 1, max_rows - 1)
            d0 = constraint.depth if constraint is not None else 0

            # 1. Draft K tokens x with the distributions q they came from.
            draft = (_draft(drafter, context, room, params, rng, should_stop, constraint)
                     if drafter is not None and not first else Draft())
            first = False
            K = len(draft.x)
            assert constraint is None or constraint.depth == d0 + K, "a draft the grammar refused"
            _count_draft(stats, draft)
            if should_stop():
                return

            # 2. Verify: one target pass over [id_last, x_1..x_K], logits on all K+1 rows.
            t0, back0 = time.perf_counter(), target.rollback_seconds
            n_base = len(context) - 1
            prompt_row = pending is not None
            rows, pending = _target_rows(target, context, draft.x, pending), None
            masks = _masks(constraint, d0, K)

            # 3. Accept the first n drafts and take the target's own token t after them.
            n, t = accept(draft, rows, masks, context)
            # (less the rollback's cost, which the cost model weighs apart: drafting.economics)
            verify_seconds = time.perf_counter() - t0 - (target.rollback_seconds - back0)
            _record_round(stats, drafter, draft, n, verify_seconds, prompt_row)

            # 4. Roll back: drop the rejected drafts from both caches (and the grammar).
            _roll_back(target, drafter, constraint, n_base + 1 + n, d0 + n, t)

            # 5. Emit, stopping exactly at an end-of-generation token.
            for step in _steps(draft, n, t, rows, logprobs):
                context.append(step.token)
                stats.emitted += 1
                yield step
                if step.token in eog:
                    return
    finally:
        # Whatever the consumer kept is the committed context; caches hold it minus id_last.
        target.truncate(len(context) - 1)
        if drafter is not None:
            drafter.rollback(len(context) - 1)


def _check(target: LanguageModel, context: list[int], first_row: Optional[np.ndarray],
           verifier: str) -> None:
    """A known verifier, and the loop's precondition: the target's cache holds the context
    minus ``id_last``, or the whole context when its last row (``first_row``) comes with it."""
    if verifier not in VERIFIERS:
        raise ValueError(f"verifier must be 'block' or 'token', not {verifier!r}")
    if first_row is not None:
        assert target.tokens == context, "with first_row the target cache holds the context"
    else:
        assert target.tokens == context[:-1], "target cache must hold the context minus id_last"


def _draft(drafter: Drafter, context: list[int], room: int, params: SamplingParams,
           rng: np.random.Generator, should_stop: Callable[[], bool],
           constraint: Optional["GrammarState"]) -> Draft:
    """A round's draft of at most ``room`` tokens: those the grammar forces (free: q = 1, no
    draft step), then as many as the drafter plans, each allowed by the grammar. The grammar
    is left advanced over the whole draft."""
    forced = []
    if constraint is not None:
        forced = constraint.forced()[:room]
        del forced[constraint.consume(forced):]
    K = room - len(forced) if drafter.plan() > 0 else 0
    draft = (drafter.draft(context + forced, K, params, rng, should_stop, constraint)
             if K > 0 else Draft())
    return draft.after(forced) if forced else draft


def _target_rows(target: LanguageModel, context: list[int], x: list[int],
                 pending: Optional[np.ndarray]) -> np.ndarray:
    """The target's logits after ``id_last`` and after each draft (K + 1 rows) from one
    batched pass; or, in the first round, the prompt pass's last row ``pending``."""
    if pending is not None:
        return pending[None, :]
    if x:           # a recurrent target's way back to here if drafts are rejected
        target.checkpoint()
    return target.eval([context[-1], *x], len(x) + 1)


def _masks(constraint: Optional["GrammarState"], d0: int, k: int) -> Optional[list]:
    """The grammar's allowed set at each of a round's k + 1 rows, the grammar ``d0`` tokens
    deep at its start (None without a grammar)."""
    return [constraint.mask(d0 + i) for i in range(k + 1)] if constraint is not None else None


class _Acceptance:
    """The rule that accepts a prefix of a draft and draws the target's own next token:
    greedy match; block verification or token-wise rejection sampling (Algorithm 1); or,
    seeded, the match of keyed samples. With a grammar, p is masked as q was."""

    def __init__(self, params: SamplingParams, verifier: str, rng: np.random.Generator,
                 n_vocab: int):
        self.params, self.verifier, self.rng, self.n_vocab = params, verifier, rng, n_vocab
        self.plain_greedy = params.greedy and not params.uses_penalty
        self.keyed = params.seed is not None and not params.greedy

    def __call__(self, draft: Draft, rows: np.ndarray, masks: Optional[list],
                 context: list[int]) -> tuple[int, int]:
        """(n, t): how many of the drafts ``x`` the target accepts, and its own token after
        them. ``masks``: the grammar's allowed set at each of the K + 1 rows (None: none)."""
        x, q, params = draft.x, draft.q, self.params
        if self.plain_greedy:
            return verify_greedy(x, rows.argmax(axis=1) if masks is None else
                                 [masked_argmax(rows[i], masks[i]) for i in range(len(x) + 1)])
        tail = context[-params.repeat_last_n:] if params.uses_penalty else []
        # p(i): the target's warped row i of this round (all of them warped at once unless a
        # penalty or a grammar makes each row's warp its own)
        p = TargetRows(rows, params, tail, x, masks)
        if self.keyed:
            return verify_keyed(x, p, params.seed, len(context))
        if self.verifier == "block":
            return verify_block(x, q, p, self.rng, self.n_vocab)
        return speculative_sampling(x, q, p, self.rng, self.n_vocab)


def _count_draft(stats: LoopStats, draft: Draft) -> None:
    stats.drafted += len(draft.x)
    stats.draft_seconds += draft.seconds
    stats.caught_up += draft.caught_up


def _record_round(stats: LoopStats, drafter: Optional[Drafter], draft: Draft, n: int,
                  verify_seconds: float, prompt_row: bool) -> None:
    """A verify round's counters: its pass (the prompt pass's, for the first row), its
    acceptance by position, and a plain round's pass cost (the speed-up's reference); then
    what the drafter learns from it (its length policy's evidence), unless no pass was made."""
    K = len(draft.x)
    stats.verify_seconds += verify_seconds
    if K == 0 and not prompt_row:
        stats.plain_passes += 1
        stats.plain_seconds += verify_seconds
    stats.target_passes += 1
    stats.rounds += 1
    stats.accepted += n
    stats.record_round(K, n)
    if drafter is not None and not prompt_row:
        drafter.observe(draft, n, verify_seconds)


def _roll_back(target: LanguageModel, drafter: Optional[Drafter],
               constraint: Optional["GrammarState"], keep: int, depth: int, t: int) -> None:
    """Trim both caches to the ``keep`` tokens now committed but the last (``t``, fed first
    in the next verify pass), and the grammar back to ``depth`` tokens then over ``t``."""
    target.truncate(keep)
    if drafter is not None:
        drafter.rollback(keep)
    if constraint is not None:
        constraint.rollback(constraint.depth - depth)
        constraint.consume([t])


def _steps(draft: Draft, n: int, t: int, rows: np.ndarray,
           logprobs: Optional[int]) -> Iterator[Step]:
    """A round's committed tokens, the accepted drafts then ``t``, which carries the round
    (what was drafted, how much was accepted); each with its log probability when asked."""
    x = draft.x
    for i, token in enumerate(x[:n] + [t]):
        yield Step(token, i < n, log_probs(rows[i], token, logprobs)
                   if logprobs is not None else None,
                   Round(tuple(x), n, draft.source) if i == n else None)
