"""The acceptance rules, as pure functions over token ids and distributions.

Names follow Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023), Algorithm 1: the draft proposed ``x_1..x_K`` with probabilities
``q_i(x_i)``; the target's distributions after the committed prefix and each draft prefix are
``p_1..p_{K+1}``. Rows are 0-based here: ``q[i]`` and ``p[i]`` belong to ``x[i]``.

Unseeded sampling has two lossless rules: token-wise rejection sampling
(:func:`speculative_sampling`, Algorithm 1) and block verification (:func:`verify_block`; Sun,
Mendlovic, Leviathan, Aharoni, Ro, Beirami & Suresh, "Block Verification Accelerates
Speculative Decoding", ICLR 2025, Algorithm 2), which decides on the draft as a whole and
accepts at least as many tokens in expectation.

The loop hands the rules its target rows as :class:`TargetRows`, which warps all of them at once
(:func:`~edgespec.sampling.warp_rows`) and holds them as arrays, so that every ``p_i(x_i)`` is
one lookup over the rows and the keyed samples one race over them; the rules also accept any
``p(i)`` callable, whose rows they ask for one at a time, only as far as they need.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .config import SamplingParams
from .sampling import Dist, DistTable, warp, warp_rows


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


class TargetRows:
    """``p(i)`` of one verify pass: the target's row ``i`` warped as the draft's rows were,
    ``warp(logits[i], params, history + x[:i], masks[i])``, each computed once. Without a
    penalty or a grammar mask (``masks`` None) the rows are warped together when first needed
    and :attr:`table` holds them; otherwise (and for the single row of a plain round over a
    vocabulary under 2^17 entries, which numpy warps faster alone) ``table`` is None and each
    row is warped when first asked for."""

    def __init__(self, logits: np.ndarray, params: SamplingParams, history: list[int],
                 x: list[int], masks: Sequence[np.ndarray | None] | None = None):
        self.logits, self.params, self.history, self.x, self.masks = (
            logits, params, history, x, masks)
        self.rows: dict[int, Dist] = {}
        self._table: DistTable | None = None
        self._together = masks is None and not params.uses_penalty and (
            len(logits) > 1 or logits.shape[1] >= 1 << 17)

    @property
    def table(self) -> DistTable | None:
        if self._together and self._table is None:
            self._table = warp_rows(self.logits, self.params)
            self._together = self._table is not None
        return self._table

    def __call__(self, i: int) -> Dist:
        d = self.rows.get(i)
        if d is None:
            table = self.table
            d = self.rows[i] = table.dist(i) if table is not None else warp(
                self.logits[i], self.params, self.history + self.x[:i],
                self.masks[i] if self.masks is not None else None)
        return d


def _table(p: Callable[[int], Dist]) -> DistTable | None:
    """p's rows as arrays, when p has them (:class:`TargetRows`)."""
    return getattr(p, "table", None)


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
    table = _table(p)
    p_x = table.probs_at(x) if table is not None else None
    for i in range(K):
        p_i = p(i) if p_x is None else None
        q_x = q[i].prob(x[i])
        if q_x <= 0.0:
            raise ValueError(f"draft token {x[i]} has q = 0: it cannot have been drawn from q")
        r = rng.random()
        if r < (p_i.prob(x[i]) if p_i is not None else p_x[i]) / q_x:
            continue
        # Rejected: resample from the part of p that q under-covers.
        return i, residual(p_i if p_i is not None else p(i), q[i]).sample(rng)
    return K, p(K).sample(rng)


def verify_keyed(x: Sequence[int], p: Callable[[int], Dist], seed: int,
                 start: int) -> tuple[int, int]:
    """Seeded sampling with noise keyed by position (:meth:`~edgespec.sampling.Dist.
    sample_keyed`): the target's own sample at each position is a function of its p and the
    position's noise, and the draft drew its x with the same noise, so a draft token is
    accepted iff it equals the target's sample there; at the first mismatch the target's
    sample is emitted. Every position is an exact sample from p (lossless by construction)
    and the output for a seed does not depend on the drafts.

    ``p(i)`` as in :func:`speculative_sampling`; row ``i``'s noise is keyed by (``seed``,
    ``start + i``), ``start`` being the position of the first draft token. Returns ``(n, t)``
    like the other rules.
    """
    table = _table(p)
    drawn = table.sample_keyed(seed, start) if table is not None else None
    i = 0
    while True:
        t = drawn[i] if drawn is not None else p(i).sample_keyed(seed, start + i)
        if i == len(x) or t != x[i]:
            return i, t
        i += 1


def _on_support(p: Dist, q: Dist) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """p's support (token ids; None: ``range(len(p.probs))``), p's probabilities there and q's
    at the same ids. Outside p's support ``w·p − q`` is never positive, so the residual and its
    mass only need these."""
    ids, pv = p.ids, p.probs
    if ids is None:
        m = pv.size
        if q.ids is None:
            qv = q.probs[:m]
            if qv.size < m:
                qv = np.concatenate([qv, np.zeros(m - qv.size)])
        else:
            qv = np.zeros(m)
            inside = q.ids < m
            qv[q.ids[inside]] = q.probs[inside]
        return None, pv, qv
    if q.ids is None:
        inside = ids < q.probs.size
        qv = np.where(inside, q.probs[np.where(inside, ids, 0)], 0.0)
        return ids, pv, qv
    order = np.argsort(q.ids, kind="stable")
    q_ids = q.ids[order]
    at = np.minimum(np.searchsorted(q_ids, ids), q_ids.size - 1)
    qv = np.where(q_ids[at] == ids, q.probs[order][at], 0.0)
    return ids, pv, qv


def _residual_terms(p: Dist, q: Dist, w: float) -> tuple[np.ndarray | None, np.ndarray]:
    """``max(0, w·p − q)`` on p's support (ids as :func:`_on_support` gives them)."""
    ids, pv, qv = _on_support(p, q)
    r = np.multiply(pv, w)
    np.subtract(r, qv, out=r)
    np.maximum(r, 0.0, out=r)
    return ids, r


def _residual_mass(p: Dist, q: Dist, w: float) -> float:
    """``Σ_y max(0, w·p(y) − q(y))``, aligned by token id. A dense p with a sparse q (the
    draft's top-k against a target without cut-offs) needs only q's support: off it the terms
    are ``w·p(y)``."""
    if p.ids is None and q.ids is not None:
        pv = p.probs
        inside = q.ids < pv.size
        p_s = pv[q.ids[inside]]
        off = max(0.0, float(pv.sum()) - float(p_s.sum()))
        return w * off + float(np.maximum(w * p_s - q.probs[inside], 0.0).sum())
    return float(_residual_terms(p, q, w)[1].sum())


def residual(p: Dist, q: Dist, w: float = 1.0) -> Dist:
    """``normalize(max(0, w·p − q))``, aligned by token id: what a rejection resamples from
    (``w = 1``: token-wise; block verification weights p by the accepted prefix).

    A mass of (nearly) zero makes this an event of probability zero that rounding made
    possible (p and q agree to rounding error; the position's threshold is 0 or 1); p itself
    stands in for it."""
    ids, r = _residual_terms(p, q, w)
    total = float(r.sum())
    if total <= 1e-12:
        return p
    if ids is None:
        return Dist(None, r / total)
    nz = r > 0
    return Dist(ids[nz], r[nz] / total)


class _Block:
    """Block verification's quantities for one draft, each computed when first asked for.

    Weights (1-based like the paper): ``w_0 = 1``, ``w_i = min(1, w_{i-1} · p_i(x_i) /
    q_i(x_i))``; they need rows ``0..K-1`` of p, all asked for up front (the bonus row ``K``
    only when the whole draft is accepted), except after a draft token the target excludes
    (``p_i(x_i) = 0``): every later weight is 0 and those rows are never asked for."""

    def __init__(self, x: Sequence[int], q: Sequence[Dist], p: Callable[[int], Dist]):
        self.K, self.q, self.p = len(x), q, p
        q_x = [q[i].prob(x[i]) for i in range(self.K)]
        for xi, qi in zip(x, q_x):
            if qi <= 0.0:
                raise ValueError(f"draft token {xi} has q = 0: it cannot have been drawn from q")
        table = _table(p)
        p_x = table.probs_at(x) if table is not None else None
        self.rows: list[Dist] = []
        self.w = [1.0]
        for i in range(self.K):
            p_xi = self.row(i).prob(x[i]) if p_x is None else p_x[i]
            w_i = min(1.0, self.w[i] * p_xi / q_x[i])
            self.w.append(w_i)
            if w_i <= 0.0:          # no longer prefix can pass
                break

    def row(self, i: int) -> Dist:
        """p's row ``i``, the rows before it asked for first (in order)."""
        while len(self.rows) <= i:
            self.rows.append(self.p(len(self.rows)))
        return self.rows[i]

    def weight(self, i: int) -> float:
        return self.w[i] if i < len(self.w) else 0.0

    def threshold(self, i: int) -> float:
        """``h_i``, the probability that position ``i`` (1..K) passes: ``h_K = w_K``, and for
        ``i < K`` ``h_i = r_i / (r_i + 1 − w_i)`` with ``r_i = Σ_y max(0, w_i · p_{i+1}(y) −
        q_{i+1}(y))``; ``h_i = 1`` when ``w_i = 1`` (the denominator is 0 when ``r_i`` is).
        Always ``h_i <= w_i``, since ``r_i <= w_i``."""
        w_i = self.weight(i)
        if i == self.K or w_i <= 0.0 or w_i >= 1.0:
            return w_i
        r_i = _residual_mass(self.row(i), self.q[i], w_i)
        return r_i / (r_i + (1.0 - w_i))

    def correction(self, tau: int) -> Dist:
        """The token after an accepted prefix of ``tau`` drafts: ``p_{K+1}`` (the bonus) when
        ``tau == K``, else ``normalize(max(0, w_τ · p_{τ+1} − q_{τ+1}))`` (``w_0 = 1``:
        Algorithm 1's residual)."""
        if tau == self.K:
            return self.row(tau)
        return residual(self.row(tau), self.q[tau], self.weight(tau))


def block_thresholds(x: Sequence[int], q: Sequence[Dist], p: Callable[[int], Dist]
                     ) -> tuple[list[float], Callable[[int], Dist]]:
    """Block verification's thresholds and corrections for one draft, all of them (for
    analysis and tests; :func:`verify_block` computes only those its uniforms need).

    Returns ``(h, correction)``: ``h[i]`` is the probability that position ``i + 1`` passes
    (see :meth:`_Block.threshold`), ``correction(τ)`` the distribution of the token after an
    accepted prefix of ``τ`` drafts. Raises ValueError for a draft token with ``q = 0``.
    """
    b = _Block(x, q, p)
    return [b.threshold(i) for i in range(1, b.K + 1)], b.correction


def verify_block(x: Sequence[int], q: Sequence[Dist], p: Callable[[int], Dist],
                 rng: np.random.Generator, n_vocab: int) -> tuple[int, int]:
    """Block verification (Sun et al., Algorithm 2), the optimal lossless rule for one draft.

    Same contract as :func:`speculative_sampling` (``n_vocab`` is kept for it: rows align by
    token id), except that it needs rows ``0..K-1`` of p (and row ``K`` for the bonus).
    Returns ``(n, t)``: ``x[:n]`` are accepted, ``t`` is drawn from the correction after them.

    Position ``i`` passes when ``η_i < h_i`` for independent ``η_i ~ U(0, 1)``, and ``n`` is
    the *last* position that passed (0 if none): a failed position does not end the draft, a
    later one may still accept the whole prefix. The positions are scanned from the last one
    back and the scan stops at the first pass, which is the same ``n``; ``η_i >= w_i >= h_i``
    fails without computing ``h_i``'s residual mass. Uniforms: one per position with a
    non-zero weight, from position K down to the one that passes, then the token's.
    """
    b = _Block(x, q, p)
    n = 0
    for i in range(b.K, 0, -1):
        w_i = b.weight(i)
        if w_i <= 0.0:
            continue
        eta = rng.random()
        if eta < w_i and eta < b.threshold(i):
            n = i
            break
    return n, b.correction(n).sample(rng)
