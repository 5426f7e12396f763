"""Goodness-of-fit tests of sampled tokens against exactly known distributions.

The statistical tests compare what the real loop emitted with the closed-form distribution of
plain target sampling. Each comparison is a G-test (the log-likelihood ratio statistic
``G = 2 Σ o·ln(o/e)``, asymptotically chi-square under the null) with Williams' correction,
the cells whose expected count is under ``MIN_EXPECTED`` pooled into one, so that the
chi-square tail stays accurate where the test reads it; a count in a cell of probability 0
is an impossible outcome (p-value 0).

A test fails when a p-value is under ``ALPHA`` divided by the number of comparisons it makes
(Bonferroni): the chance that a correct implementation fails any one test is at most ``ALPHA``
(one in a million), so the tests do not flake, whatever their seeds.
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 1e-6
MIN_EXPECTED = 5.0


def chi2_sf(x: float, df: int) -> float:
    """P(χ²_df > x), exact for an integer ``df`` (the closed forms of the regularised upper
    incomplete gamma function at integer and half-integer shape)."""
    if df <= 0:
        return 1.0 if x <= 0 else 0.0
    if x <= 0:
        return 1.0
    half = x / 2
    if df % 2 == 0:
        logs = [i * math.log(half) - math.lgamma(i + 1) for i in range(df // 2)]
        head = 0.0
    else:
        logs = [(i + 0.5) * math.log(half) - math.lgamma(i + 1.5) for i in range(df // 2)]
        head = math.erfc(math.sqrt(half))
    if not logs:
        return head
    top = max(logs)
    return head + math.exp(top - half) * sum(math.exp(v - top) for v in logs)


def chi2_isf(p: float, df: int) -> float:
    """The ``x`` with ``chi2_sf(x, df) == p`` (bisection; ``0 < p < 1``)."""
    lo, hi = 0.0, df + 10.0
    while chi2_sf(hi, df) > p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > p else (lo, mid)
    return (lo + hi) / 2


def _pooled(observed: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every cell whose expected count is under MIN_EXPECTED merged into one, with the
    smallest of the others while that one is still under it."""
    order = np.argsort(expected, kind="stable")
    e, o = expected[order], observed[order]
    cut = int(np.searchsorted(e, MIN_EXPECTED))
    if cut == 0:
        return o, e
    while cut < e.size and e[:cut].sum() < MIN_EXPECTED:
        cut += 1
    return (np.concatenate([[o[:cut].sum()], o[cut:]]),
            np.concatenate([[e[:cut].sum()], e[cut:]]))


def _williams(e: np.ndarray) -> float:
    """Williams' correction q for a G-test over cells expecting ``e``: under the null
    E[G] ≈ df·q, and G/q follows the chi-square law closely into its far tail even where
    some cells expect only a few counts (Williams, Biometrika 63, 1976)."""
    return 1.0 + (float((1.0 / e).sum()) - 1.0 / float(e.sum())) / (6.0 * (e.size - 1))


def g_statistic(observed, expected) -> tuple[float, int]:
    """``(G/q, df)`` of counts against expected counts with the same total, cells pooled as
    MIN_EXPECTED asks, q Williams' correction (``df``: the pooled cells less one); ``inf``
    for a count where nothing was expected."""
    observed = np.asarray(observed, dtype=np.float64).ravel()
    expected = np.asarray(expected, dtype=np.float64).ravel()
    if observed[expected <= 0].sum() > 0:
        return math.inf, 0
    live = expected > 0
    o, e = _pooled(observed[live], expected[live])
    if o.size < 2:
        return 0.0, 0
    seen = o > 0
    return 2.0 * float((o[seen] * np.log(o[seen] / e[seen])).sum()) / _williams(e), o.size - 1


def g_test(counts, probs) -> tuple[float, int, float]:
    """``(G, df, p-value)`` of sampled counts against a distribution."""
    counts = np.asarray(counts)
    g, df = g_statistic(counts, np.asarray(probs, dtype=np.float64) * counts.sum())
    return g, df, (0.0 if math.isinf(g) else chi2_sf(g, df))


def excess(g: float, df: int, limit: float) -> float:
    """G over its critical value at p-value ``limit``: at least 1 fails (inf for an impossible
    outcome, 0 when pooling left one cell)."""
    if math.isinf(g):
        return math.inf
    return g / chi2_isf(limit, df) if df > 0 else 0.0


def transition_test(seqs: np.ndarray, transitions: np.ndarray, start: int
                    ) -> tuple[float, int, float]:
    """``(G, df, p-value)`` of every step of the sequences against a Markov chain: the rows of
    ``seqs`` should be independent runs of the chain from ``start``, so the counts of ``(a,
    b)`` at positions ``(j-1, j)``, given how often ``a`` was at ``j-1``, are multinomial with
    ``transitions[a]``. The statistics of every (position, previous token) sum to one G with
    the sum of their degrees of freedom. This sees a wrong conditional at any position even
    when the marginals average it out."""
    n_vocab = transitions.shape[0]
    prev = np.concatenate([np.full((seqs.shape[0], 1), start), seqs[:, :-1]], axis=1)
    total, dfs = 0.0, 0
    for j in range(seqs.shape[1]):
        pairs = np.bincount(prev[:, j] * n_vocab + seqs[:, j], minlength=n_vocab * n_vocab)
        pairs = pairs.reshape(n_vocab, n_vocab)
        for a in np.flatnonzero(pairs.sum(axis=1)):
            g, df = g_statistic(pairs[a], pairs[a].sum() * transitions[a])
            total += g
            dfs += df
    return total, dfs, (0.0 if math.isinf(total) else chi2_sf(total, dfs))


# --- the total-variation check that the real-model tests (tests/test_rpc.py) still use ----------

def tv(counts: np.ndarray, p: np.ndarray) -> float:
    """Total-variation distance between the empirical distribution of ``counts`` and ``p``."""
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


def noise_bound(p: np.ndarray, n: int) -> float:
    """3× the expected TV of an n-sample empirical distribution around p."""
    return 3 * 0.5 * float(np.sqrt(2 * p * (1 - p) / (np.pi * n)).sum())
