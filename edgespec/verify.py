"""The acceptance rule, as pure functions over token ids and distributions.

Names follow Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023), Algorithm 1: the draft proposed ``x_1..x_K`` with probabilities
``q_i(x_i)``; the target's distributions after the committed prefix and each draft prefix are
``p_1..p_{K+1}``. Rows are 0-based here: ``q[i]`` and ``p[i]`` belong to ``x[i]``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .sampling import Dist, residual


def verify_greedy(x: Sequence[int], target_argmax: Sequence[int]) -> tuple[int, int]:
    """Greedy match: accept drafts while they equal the target's argmax.

    ``target_argmax`` has ``len(x) + 1`` entries: the target's choice after the committed
    prefix and after each draft token. Returns ``(n, t)``: the first ``n`` drafts are accepted
    and ``t`` is the target's own next token (the correction, or the bonus when ``n == K``).
    """
    n = 0
    for xi, ai in zip(x, target_argmax):
        if xi != ai:
            break
        n += 1
    return n, int(target_argmax[n])


def speculative_sampling(x: Sequence[int], q: Sequence[Dist], p: Callable[[int], Dist],
                         rng: np.random.Generator, n_vocab: int) -> tuple[int, int]:
    """Algorithm 1 of Leviathan et al. (2023): rejection sampling of a draft.

    ``p(i)`` returns the target's warped distribution for row ``i`` (0..K); it is called
    lazily so that rows after the first rejection are never warped. A drafter without
    probabilities (n-gram lookup) passes one-hot ``q``, for which the rule reduces to
    "accept x with probability p(x), else sample from p with x removed".

    Returns ``(n, t)``: ``x[:n]`` are accepted and ``t`` is drawn from
    ``normalize(max(0, p_{n+1} − q_{n+1}))`` after a rejection, or from ``p_{K+1}`` (the bonus
    token) when all ``K`` are accepted. The emitted sequence is distributed exactly as
    sampling from the target alone.
    """
    K = len(x)
    for i in range(K):
        p_i, q_i = p(i), q[i]
        q_x = q_i.prob(x[i])
        if q_x <= 0.0:
            raise ValueError(f"draft token {x[i]} has q = 0: it cannot have been drawn from q")
        r = rng.random()
        if r < p_i.prob(x[i]) / q_x:
            continue
        # Rejected: resample from the part of p that q under-covers.
        return i, residual(p_i, q_i, n_vocab).sample(rng)
    return K, p(K).sample(rng)


def verify_keyed(x: Sequence[int], p: Callable[[int], Dist],
                 draw: Callable[[Dist, int], int]) -> tuple[int, int]:
    """Seeded sampling with noise keyed by position (:meth:`~edgespec.sampling.Dist.
    sample_keyed`): the target's own sample at each position is a function of its p and the
    position's noise, and the draft drew its x with the same noise, so a draft token is
    accepted iff it equals the target's sample there; at the first mismatch the target's
    sample is emitted. Every position is an exact sample from p (lossless by construction)
    and the output for a seed does not depend on the drafts.

    ``p(i)`` as in :func:`speculative_sampling`; ``draw(p_i, i)`` the keyed sample of row
    ``i``. Returns ``(n, t)`` like the other rules.
    """
    for i, xi in enumerate(x):
        t = draw(p(i), i)
        if t != xi:
            return i, t
    return len(x), draw(p(len(x)), len(x))
