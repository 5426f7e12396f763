"""Turning logits into a distribution (``warp``) and drawing from it (``sample``).

One warp serves both models: the target's p and the draft's q are always built by the same
function with the same parameters and the same token history, which is what makes rejection
sampling lossless. The order follows llama.cpp's default sampler chain — repeat/presence/
frequency penalties, top-k, top-p, min-p, then temperature — so settings mean what they mean
in llama.cpp.

Large vocabularies (Gemma: 262,144 entries, 1 MiB per row) make careless numpy costly, so the
cut-offs are applied before anything is normalised and work stays in float32 on the full row:
top-k uses an exact two-stage selection (a strided subsample gives a threshold that every
top-k entry must clear), and a distribution is stored on its support only. A verify pass's
rows are warped together (:func:`warp_rows`), to the same bits, into a :class:`DistTable`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .config import SamplingParams


class Dist:
    """A probability distribution over token ids, stored on its support.

    ``ids`` holds the token ids with non-zero probability (``None`` means every id in
    ``range(len(probs))``); ``probs`` holds their probabilities (float64, summing to 1).
    """

    __slots__ = ("ids", "probs", "_cdf")

    def __init__(self, ids: np.ndarray | None, probs: np.ndarray):
        self.ids = ids
        self.probs = probs
        self._cdf: np.ndarray | None = None

    @classmethod
    def one_hot(cls, token: int) -> "Dist":
        return cls(np.array([token], dtype=np.int64), np.ones(1))

    def prob(self, token: int) -> float:
        if self.ids is None:
            return float(self.probs[token]) if 0 <= token < self.probs.size else 0.0
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def argmax(self) -> int:
        i = int(np.argmax(self.probs))
        return i if self.ids is None else int(self.ids[i])

    def dense(self, n_vocab: int) -> np.ndarray:
        if self.ids is None:
            out = np.zeros(n_vocab)
            out[: self.probs.size] = self.probs
            return out
        out = np.zeros(n_vocab)
        out[self.ids] = self.probs
        return out

    def sample_keyed(self, seed: int, position: int) -> int:
        """The token of an exponential race over this distribution with noise keyed by
        (``seed``, ``position``, token id) alone: each token i gets E_i = -log U_i, U_i from
        :func:`keyed_uniforms`, and the smallest E_i / p_i wins — a sample from this
        distribution (the Gumbel-max trick), and the same sample whoever asks for it."""
        ids = self.ids if self.ids is not None else np.arange(self.probs.size)
        live = self.probs > 0
        if live.sum() == 1:
            return int(ids[live][0])
        ids, probs = ids[live], self.probs[live]
        return int(ids[np.argmin(-np.log(keyed_uniforms(seed, position, ids)) / probs)])

    def sample(self, rng: np.random.Generator) -> int:
        if self.probs.size == 1:
            return int(self.ids[0]) if self.ids is not None else 0
        if self._cdf is None:
            self._cdf = np.cumsum(self.probs)
        i = int(np.searchsorted(self._cdf, rng.random() * self._cdf[-1], side="right"))
        i = min(i, self.probs.size - 1)
        return i if self.ids is None else int(self.ids[i])


_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer on a Python int."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def keyed_uniforms(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """Uniform numbers in (0, 1), one per token id, that depend only on (``seed``,
    ``position``, id): a counter-based hash (splitmix64), so only the candidates that survive
    the samplers need one, and the draft and the target draw on the same noise."""
    return _hashed(ids, np.uint64(_mix(_mix(seed & _MASK64) ^ (position & _MASK64))))


def _hashed(ids: np.ndarray, key) -> np.ndarray:
    """splitmix64 of each id under ``key`` (broadcast), as a uniform number in (0, 1)."""
    z = (np.asarray(ids, dtype=np.int64).astype(np.uint64) ^ key) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


def draw(dist: Dist, params: SamplingParams, rng: np.random.Generator, position: int) -> int:
    """A token from ``dist``: keyed by (seed, position) when the request is seeded (so the
    text for a seed does not depend on how it was drafted), else from ``rng``."""
    if params.seed is not None:
        return dist.sample_keyed(params.seed, position)
    return dist.sample(rng)


def apply_penalties(logits: np.ndarray, params: SamplingParams,
                    history: Sequence[int]) -> np.ndarray:
    """Return logits with llama.cpp's repeat, presence and frequency penalties applied.

    The penalties look at the last ``repeat_last_n`` tokens of ``history``. ``logits`` is
    not modified; a copy is returned only when a penalty is active.
    """
    if not params.uses_penalty or not len(history):
        return logits
    recent = np.asarray(history[-params.repeat_last_n:], dtype=np.int64)
    recent = recent[(recent >= 0) & (recent < logits.shape[0])]
    if recent.size == 0:
        return logits
    ids, counts = np.unique(recent, return_counts=True)
    out = np.array(logits, dtype=np.float32, copy=True)
    vals = out[ids]
    if params.repeat_penalty != 1.0:
        vals = np.where(vals <= 0, vals * params.repeat_penalty, vals / params.repeat_penalty)
    vals = vals - counts * params.frequency_penalty - params.presence_penalty
    out[ids] = vals
    return out


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits (unordered), exact, without sorting the whole row.

    A strided subsample's k-th largest value is a lower bound for the full row's k-th largest,
    so every top-k entry lies among the entries that reach it; only those are partitioned.
    """
    n = logits.shape[0]
    if k >= n:
        return np.arange(n)
    stride = n // (k * 64)
    if stride >= 4:
        sub = logits[::stride]
        threshold = np.partition(sub, sub.size - k)[sub.size - k]
        cand = np.flatnonzero(logits >= threshold)
        part = np.argpartition(logits[cand], cand.size - k)[cand.size - k:]
        return cand[part]
    return np.argpartition(logits, n - k)[n - k:]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def _top_p_prefix(sorted_logits: np.ndarray, top_p: float, log_norm: float | None) -> int:
    """How many of the (descending) logits the nucleus keeps.

    ``log_norm`` is the log of the normaliser when the candidates are a prefix of a larger set
    (top-p over the whole vocabulary); ``None`` normalises over ``sorted_logits`` themselves.
    """
    x = sorted_logits.astype(np.float64)
    if log_norm is None:
        probs = _softmax(x)
    else:
        probs = np.exp(x - log_norm)
    cum = np.cumsum(probs)
    n = int(np.searchsorted(cum, top_p, side="left")) + 1
    return min(max(n, 1), x.size)


def _logsumexp(logits: np.ndarray) -> float:
    m = float(logits.max())
    return m + float(np.log(np.exp(logits - np.float32(m), dtype=np.float32).sum(dtype=np.float64)))


def masked_argmax(logits: np.ndarray, allowed: np.ndarray | None) -> int:
    """The most likely token among the ``allowed`` ones (a boolean mask; None: all)."""
    best = int(np.argmax(logits))
    if allowed is None or allowed[best]:
        return best
    return int(np.argmax(np.where(allowed, logits, np.float32(-np.inf))))


def warp(logits: np.ndarray, params: SamplingParams, history: Sequence[int] = (),
         allowed: np.ndarray | None = None) -> Dist:
    """The distribution a model's next token is drawn from under ``params``.

    ``logits``: one row, shape ``(n_vocab,)``; it is not modified. ``history``: the tokens
    before this position (prompt and generated), used by the penalties. ``allowed``: a boolean
    mask of the tokens a grammar allows here (None: all); the others get probability 0 before
    any sampler runs, so the target's p and the draft's q are masked alike. At temperature 0
    the result is one-hot on the (allowed) argmax, so greedy decoding is a special case of
    sampling.
    """
    logits = apply_penalties(logits, params, history)
    if allowed is not None:
        logits = np.where(allowed, logits, np.float32(-np.inf))
    n = logits.shape[0]
    if params.greedy:
        return Dist.one_hot(int(np.argmax(logits)))

    ids: np.ndarray | None = None
    vals: np.ndarray | None = None  # logits of the candidates, sorted descending

    if 0 < params.top_k < n:
        ids = top_k_ids(logits, params.top_k)
        vals = logits[ids]
        order = np.argsort(-vals, kind="stable")
        ids, vals = ids[order], vals[order]

    if params.top_p < 1.0:
        if ids is not None:
            keep = _top_p_prefix(vals, params.top_p, None)
        else:
            # Nucleus over the whole vocabulary: grow a sorted prefix until it holds top_p mass.
            log_norm = _logsumexp(logits)
            m = 256
            while True:
                ids = top_k_ids(logits, min(m, n))
                vals = logits[ids]
                order = np.argsort(-vals, kind="stable")
                ids, vals = ids[order], vals[order]
                keep = _top_p_prefix(vals, params.top_p, log_norm)
                if keep < vals.size or vals.size == n:
                    break
                m *= 8
        ids, vals = ids[:keep], vals[:keep]

    if params.min_p > 0.0:
        if ids is not None:
            cut = float(vals[0]) + float(np.log(params.min_p))
            keep = int(np.count_nonzero(vals >= cut))
            ids, vals = ids[:keep], vals[:keep]
        else:
            cut = float(logits.max()) + float(np.log(params.min_p))
            ids = np.flatnonzero(logits >= cut)
            vals = logits[ids]

    if ids is None:
        probs = np.exp((logits - logits.max()) / np.float32(params.temperature),
                       dtype=np.float32).astype(np.float64)
        return Dist(None, probs / probs.sum())
    return Dist(ids.astype(np.int64, copy=False), _softmax(vals / params.temperature))


class DistTable:
    """Distributions over the same vocabulary as arrays, one per row: row ``r`` is ``Dist(ids[r,
    :size[r]], probs[r, :size[r]])`` (entries past ``size`` hold id -1 and probability 0), or,
    with ``ids`` None, ``Dist(None, probs[r])``."""

    __slots__ = ("ids", "probs", "size")

    def __init__(self, ids: np.ndarray | None, probs: np.ndarray, size: np.ndarray | None):
        self.ids, self.probs, self.size = ids, probs, size

    def dist(self, r: int) -> Dist:
        if self.ids is None:
            return Dist(None, self.probs[r])
        c = int(self.size[r])
        return Dist(self.ids[r, :c], self.probs[r, :c])

    def probs_at(self, tokens: Sequence[int]) -> list[float]:
        """Row ``r``'s probability of ``tokens[r]``, for ``r < len(tokens)`` (Dist.prob's)."""
        t = np.asarray(tokens, dtype=np.int64)
        if self.ids is None:
            inside = (t >= 0) & (t < self.probs.shape[1])
            at = self.probs[np.arange(t.size), np.where(inside, t, 0)]
            return np.where(inside, at, 0.0).tolist()
        hit = self.ids[:t.size] == t[:, None]
        return np.where(hit, self.probs[:t.size], 0.0).max(axis=1, initial=0.0).tolist()

    def sample_keyed(self, seed: int, start: int) -> list[int]:
        """Every row's :meth:`Dist.sample_keyed`, row ``r`` at position ``start + r``."""
        n_rows = self.probs.shape[0]
        ids = (np.broadcast_to(np.arange(self.probs.shape[1]), self.probs.shape)
               if self.ids is None else self.ids)
        keys = np.array([_mix(_mix(seed & _MASK64) ^ ((start + r) & _MASK64))
                         for r in range(n_rows)], dtype=np.uint64)
        with np.errstate(divide="ignore"):      # p = 0 (and padding): never drawn
            race = -np.log(_hashed(ids, keys[:, None])) / self.probs
        return ids[np.arange(n_rows), np.argmin(race, axis=1)].tolist()


_GROUP = 64     # entries per group in warp_rows' top-k search
# Dense rows (no cut-off) are warped together only while they fit in a cache: past that every
# step of the warp streams all of them through memory, where one row at a time stays cached.
_DENSE_TOGETHER = 1 << 16


def _top_k_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's ``k`` largest logits, sorted descending, and their ids, shape ``(R, k)``, and
    whether the row has a single answer: False where equal logits make the choice or its order
    depend on how it is made (top_k_ids's partition; :func:`warp` then decides).

    Entries ``j, j + g, j + 2g, …`` (``g = n // _GROUP``) of a row form group ``j``. The k
    groups with the largest maxima (and the ``n mod _GROUP`` entries past the groups) hold k
    entries at least as large as any other group's maximum, so when the k-th largest of them
    is above every other group's maximum, they hold the row's top k: one pass over the rows
    (the groups' maxima, read contiguously), then ``k · _GROUP`` candidates per row."""
    n_rows, n = logits.shape
    g = n // _GROUP
    rr = np.arange(n_rows)[:, None]
    body = logits[:, :g * _GROUP].reshape(n_rows, _GROUP, g)
    gmax = body.max(axis=1)
    top = np.argpartition(gmax, g - k, axis=1)[:, g - k:]
    gmax[rr, top] = -np.inf
    others = gmax.max(axis=1)                   # the largest maximum of the other groups
    cand = body[rr, :, top].reshape(n_rows, k * _GROUP)
    if n > g * _GROUP:
        cand = np.concatenate([cand, logits[:, g * _GROUP:]], axis=1)
    m = cand.shape[1]
    sel = np.argpartition(cand, m - k, axis=1)[:, m - k:]
    vals = cand[rr, sel]
    cand[rr, sel] = -np.inf
    others = np.maximum(others, cand.max(axis=1))   # … and of the other candidates
    order = np.argsort(-vals, axis=1, kind="stable")
    vals, sel = vals[rr, order], sel[rr, order]
    group, member = np.divmod(sel, _GROUP)
    ids = top[rr, np.minimum(group, k - 1)] + g * member
    if m > k * _GROUP:                          # the entries past the groups
        ids = np.where(sel < k * _GROUP, ids, sel + (g - k) * _GROUP)
    single = (vals[:, -1] > others) & (vals[:, :-1] > vals[:, 1:]).all(axis=1)
    single &= np.isfinite(vals[:, 0]) & np.isfinite(vals[:, -1])
    return ids, vals, single


def warp_rows(logits: np.ndarray, params: SamplingParams) -> DistTable | None:
    """``[warp(row, params) for row in logits]`` (no penalty, no grammar mask) as one
    :class:`DistTable`, the same distributions to the last bit, numpy working on all the rows
    at once; None where ``params`` take a path this does not cover (greedy, top-p or min-p
    without top-k, a top-k of at least ``n_vocab / 64``, dense rows too large to warp together
    faster): warp each row instead."""
    n_rows, n = logits.shape
    k = params.top_k
    if params.greedy or n_rows == 0:
        return None
    if not 0 < k < n:
        if params.top_p < 1.0 or params.min_p > 0.0 or n_rows * n > _DENSE_TOGETHER:
            return None
        e = np.exp((logits - logits.max(axis=1, keepdims=True)) / np.float32(params.temperature),
                   dtype=np.float32).astype(np.float64)
        return DistTable(None, e / e.sum(axis=1, keepdims=True), None)
    if n // _GROUP <= k:
        return None
    ids, vals, single = _top_k_rows(logits, k)
    keep = np.full(n_rows, k)
    x = vals.astype(np.float64)
    if params.top_p < 1.0:          # as _top_p_prefix: the nucleus of the k
        e = np.exp(x - x[:, :1])
        cum = np.cumsum(e / e.sum(axis=1, keepdims=True), axis=1)
        keep = np.minimum((cum < params.top_p).sum(axis=1) + 1, k)
    if params.min_p > 0.0:          # the cut compared in float32, as warp's is
        cut = (x[:, 0] + float(np.log(params.min_p))).astype(np.float32)
        keep = np.minimum(keep, (vals >= cut[:, None]).sum(axis=1))
    z = (vals / params.temperature).astype(np.float64)
    e = np.exp(z - z[:, :1])
    past = np.arange(k) >= keep[:, None]
    e[past] = 0.0
    ids[past] = -1
    # each row's normaliser summed over its own kept entries, as warp's (numpy's pairwise
    # sum depends on the length)
    total = np.array([e[r, :c].sum() for r, c in enumerate(keep.tolist())])
    table = DistTable(ids, e / total[:, None], keep)
    for r in np.flatnonzero(~single).tolist():
        d = warp(logits[r], params)
        c = d.probs.size
        table.ids[r], table.probs[r], table.size[r] = -1, 0.0, c
        table.ids[r, :c], table.probs[r, :c] = d.ids, d.probs
    return table


def log_probs(logits: np.ndarray, token: int, top_n: int = 0) -> tuple[float, list]:
    """``token``'s log probability under the softmax of ``logits`` (temperature 1, no cut-off)
    and the ``top_n`` most likely tokens as (id, log probability), best first."""
    norm = _logsumexp(logits)
    top = []
    if top_n > 0:
        ids = top_k_ids(logits, min(top_n, logits.shape[0]))
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        top = [(int(i), float(logits[i]) - norm) for i in ids]
    return float(logits[token]) - norm, top
