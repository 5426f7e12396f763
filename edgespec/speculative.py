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
           rng: np.random.Generator, max_new: int, drafter: Optional[Drafter] = None,
           first_row: Optional[np.ndarray] = None,
           stats: Optional[LoopStats] = None,
           should_stop: Callable[[], bool] = lambda: False,
           constraint: Optional["GrammarState"] = None,
           logprobs: Optional[int] = None, verifier: str = "block") -> Iterator[Step]:
    """Generate up to ``max_new`` tokens after ``context``.

    ``context`` is the committed token list (prompt + tokens generated so far) and is extended
    in place as tokens are committed. Preconditions: ``target.tokens == context[:-1]``, or
    ``target.tokens == context`` with ``first_row`` the target's logits after it (the prompt
    pass's last row, from which the first token is sampled), and the drafter's cache holds a
    prefix of ``context``. The first token never waits for the draft: it comes from
    ``first_row``, or else from a plain first round; the drafter decides each round's draft
    length (:mod:`edgespec.drafting`). Stops after an end-of-generation token (which is yielded),
    after ``max_new`` tokens, or when the context window is full; it never asks llama.cpp for
    more than ``n_batch``/``n_outputs_max`` rows or ``n_ctx`` positions. ``should_stop`` is
    polled at every draft step and before each verify pass: when it turns true the loop ends
    without committing the round in progress. ``constraint``: a grammar's state after the
    committed context, advanced as tokens commit. ``logprobs``: give each step its log
    probability and this many alternatives, read from the verify pass's own rows.
    ``verifier``: the rule for unseeded sampling, ``"block"`` (block verification) or
    ``"token"`` (token-wise rejection sampling).
    """
    if verifier not in VERIFIERS:
        raise ValueError(f"verifier must be 'block' or 'token', not {verifier!r}")
    stats = stats if stats is not None else LoopStats()
    eog = target.vocab.eog
    n_vocab = target.n_vocab
    plain_greedy = params.greedy and not params.uses_penalty
    keyed = params.seed is not None and not params.greedy
    max_rows = min(target.n_batch, target.n_outputs_max)
    limit = len(context) + min(max_new, target.n_ctx - len(context))
    if first_row is not None:
        assert target.tokens == context, "with first_row the target cache holds the context"
    else:
        assert target.tokens == context[:-1], "target cache must hold the context minus id_last"
    pending = first_row         # the first round's row, already computed (no pass, no draft)
    first = True                # the first token never waits for the draft
    if drafter is not None:
        drafter.begin(context, limit)
    try:
        while len(context) < limit:
            # How many drafts fit: the verify pass commits at most K + 1 tokens.
            room = min(limit - len(context) - 1, max_rows - 1)
            d0 = constraint.depth if constraint is not None else 0

            # 1. Draft: tokens the grammar forces (free), then up to K tokens x from the
            #    drafter, each allowed by the grammar, with the distributions q they came from.
            forced = []
            if constraint is not None and drafter is not None and not first:
                forced = constraint.forced()[:room]
                del forced[constraint.consume(forced):]
            K = room - len(forced) if drafter and not first and drafter.plan() > 0 else 0
            first = False
            draft = (drafter.draft(context + forced, K, params, rng, should_stop, constraint)
                     if K > 0 else Draft())
            if forced:
                draft = draft.after(forced)
            x, q = draft.x, draft.q
            K = len(x)
            assert constraint is None or constraint.depth == d0 + K, "a draft the grammar refused"
            stats.drafted += K
            stats.draft_seconds += draft.seconds
            stats.caught_up += draft.caught_up
            if should_stop():
                return

            # 2. Verify: one target pass over [id_last, x_1..x_K], logits on all K+1 rows.
            t0, back0 = time.perf_counter(), target.rollback_seconds
            n_base = len(context) - 1
            prompt_row = pending is not None
            if prompt_row:
                rows, pending = pending[None, :], None
            else:
                if K:       # a recurrent target's way back to here if drafts are rejected
                    target.checkpoint()
                rows = target.eval([context[-1], *x], K + 1)
            masks = ([constraint.mask(d0 + i) for i in range(K + 1)] if constraint is not None
                     else [None] * (K + 1))

            # 3. Accept: greedy match; block verification or token-wise rejection sampling
            #    (Algorithm 1); or, seeded, the match of keyed samples. p is masked as q was.
            if plain_greedy:
                n, t = verify_greedy(x, rows.argmax(axis=1) if constraint is None else
                                     [masked_argmax(rows[i], masks[i]) for i in range(K + 1)])
            else:
                tail = context[-params.repeat_last_n:] if params.uses_penalty else []
                # p(i): the target's warped row i of this round (all of them warped at once
                # unless a penalty or a grammar makes each row's warp its own)
                p = TargetRows(rows, params, tail, x, masks if constraint is not None else None)
                if keyed:
                    n, t = verify_keyed(x, p, params.seed, len(context))
                elif verifier == "block":
                    n, t = verify_block(x, q, p, rng, n_vocab)
                else:
                    n, t = speculative_sampling(x, q, p, rng, n_vocab)
            # (a recurrent target's checkpoint and the last round's tokens evaluated again
            # are the rollback's cost, which the cost model weighs apart: drafting.economics)
            verify_seconds = time.perf_counter() - t0 - (target.rollback_seconds - back0)
            stats.verify_seconds += verify_seconds
            if K == 0 and not prompt_row:
                stats.plain_passes += 1
                stats.plain_seconds += verify_seconds
            stats.target_passes += 1        # (the prompt pass's, for the first row)
            stats.rounds += 1
            stats.accepted += n
            stats.record_round(K, n)
            if drafter is not None and not prompt_row:
                drafter.observe(draft, n, verify_seconds)

            # 4. Trim: drop the rejected drafts from both caches (and the grammar).
            target.truncate(n_base + 1 + n)
            if drafter is not None:
                drafter.rollback(n_base + 1 + n)
            if constraint is not None:
                constraint.rollback(constraint.depth - d0 - n)
                constraint.consume([t])

            # 5. Emit, stopping exactly at an end-of-generation token.
            for i, token in enumerate(x[:n] + [t]):
                context.append(token)
                stats.emitted += 1
                yield Step(token, i < n, log_probs(rows[i], token, logprobs)
                           if logprobs is not None else None,
                           Round(tuple(x), n, draft.source) if i == n else None)
                if token in eog:
                    return
    finally:
        # Whatever the consumer kept is the committed context; caches hold it minus id_last.
        target.truncate(len(context) - 1)
        if drafter is not None:
            drafter.rollback(len(context) - 1)
