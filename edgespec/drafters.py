"""Drafters: where the K proposed tokens of a round come from.

A drafter proposes up to ``k`` tokens after the committed context and returns, for each, the
distribution q it was drawn from (one-hot when it has no probabilities). The decision to stop
drafting early may depend only on the draft's distribution at that position, never on the
token drawn from it: stopping on the sampled token would make the proposals a biased sample of
q and break the losslessness of rejection sampling.
"""

from __future__ import annotations

import time
from typing import Protocol, Sequence

import numpy as np

from .backend import LlamaModel
from .config import SamplingParams
from .sampling import Dist, warp

# Logits this far below the maximum change a probability by less than e^-16 each; ignoring
# them makes the confidence check ~5× cheaper on a 262k-entry row.
_CONFIDENCE_WINDOW = 16.0


def top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the most likely token (temperature 1)."""
    m = logits.max()
    near = logits[logits > m - _CONFIDENCE_WINDOW]
    return float(1.0 / np.exp(near - m, dtype=np.float32).sum(dtype=np.float64))


class Drafter(Protocol):
    """What the speculative loop needs from a source of draft tokens."""

    seconds: float

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator) -> tuple[list[int], list[Dist]]:
        """Propose up to ``k`` tokens after ``context``; return them and their q."""

    def rollback(self, n_keep: int) -> None:
        """Forget anything after the first ``n_keep`` tokens of the context."""


class ModelDrafter:
    """A small model that shares the target's tokenizer samples K tokens from its own q.

    Its KV cache follows the same invariant as the target's: it holds a prefix of the
    committed context; the missing tail (at least the last committed token) is fed at the
    start of the next draft.
    """

    def __init__(self, model: LlamaModel, eog: frozenset[int], p_min: float = 0.0):
        self.model = model
        self.eog = eog
        self.p_min = p_min
        self.seconds = 0.0

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator) -> tuple[list[int], list[Dist]]:
        t0 = time.perf_counter()
        m = self.model
        n_cached = len(m.tokens)
        assert m.tokens == context[:n_cached], "draft cache diverged from the context"
        row = m.eval(context[n_cached:], 1)[0]
        x: list[int] = []
        q: list[Dist] = []
        plain_greedy = params.greedy and not params.uses_penalty
        tail = list(context[-params.repeat_last_n:]) if params.uses_penalty else []
        for i in range(k):
            if plain_greedy:
                if self.p_min > 0 and top_probability(row) < self.p_min:
                    break
                q_i = Dist.one_hot(int(np.argmax(row)))
            else:
                q_i = warp(row, params, tail)
                confidence = (top_probability(row) if params.greedy else float(q_i.probs.max()))
                if confidence < self.p_min:
                    break
            x_i = q_i.sample(rng)
            x.append(x_i)
            q.append(q_i)
            if x_i in self.eog or i == k - 1:
                break
            if tail:
                tail.append(x_i)
            row = m.eval([x_i], 1)[0]
        self.seconds += time.perf_counter() - t0
        return x, q

    def rollback(self, n_keep: int) -> None:
        self.model.truncate(n_keep)


class NgramDrafter:
    """Prompt lookup: propose the continuation of the latest earlier occurrence of the context's
    last n tokens (n from ``ngram_max`` down to ``ngram_min``). Needs no model; q is one-hot.
    """

    def __init__(self, ngram_min: int = 2, ngram_max: int = 4, window: int = 4096):
        self.ngram_min, self.ngram_max, self.window = ngram_min, ngram_max, window
        self.seconds = 0.0

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator) -> tuple[list[int], list[Dist]]:
        t0 = time.perf_counter()
        x = self.lookup(context, k)
        self.seconds += time.perf_counter() - t0
        return x, [Dist.one_hot(t) for t in x]

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        hay = np.asarray(context[-self.window:], dtype=np.int64)
        n_hay = hay.size
        for n in range(min(self.ngram_max, n_hay - 1), self.ngram_min - 1, -1):
            pattern = hay[n_hay - n:]
            # Candidate starts: positions where the first token matches, excluding the suffix.
            starts = np.flatnonzero(hay[: n_hay - n] == pattern[0])
            for s in starts[::-1]:
                if np.array_equal(hay[s:s + n], pattern):
                    cont = hay[s + n: s + n + k]
                    if cont.size:
                        return [int(t) for t in cont]
        return []

    def rollback(self, n_keep: int) -> None:
        pass
