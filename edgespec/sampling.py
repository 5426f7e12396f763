"""Turning logits into a distribution (``warp``) and drawing from it (``sample``).

One warp serves both models: the target's p and the draft's q are always built by the same
function with the same parameters and the same token history, which is what makes rejection
sampling lossless. The order follows llama.cpp's default sampler chain — repeat/presence/
frequency penalties, top-k, top-p, min-p, then temperature — so settings mean what they mean
in llama.cpp.

Large vocabularies (Gemma: 262,144 entries, 1 MiB per row) make careless numpy costly, so the
cut-offs are applied before anything is normalised and work stays in float32 on the full row:
top-k uses an exact two-stage selection (a strided subsample gives a threshold that every
top-k entry must clear), and a distribution is stored on its support only.
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
    key = np.uint64(_mix(_mix(seed & _MASK64) ^ (position & _MASK64)))
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
