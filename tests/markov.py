"""A numpy Markov "language model": the :class:`edgespec.lm.LanguageModel` protocol in numpy.

The logits after a token depend only on that token (a bigram model), so the exact distribution
of any generated sequence is known in closed form. Used only for statistical tests of the loop's
pure logic; everything about llama.cpp is tested against real models.
"""

from __future__ import annotations

import numpy as np

from edgespec.lm import VocabInfo


class MarkovLM:
    def __init__(self, logits: np.ndarray, eog=(), n_ctx: int = 4096):
        self.table = np.asarray(logits, dtype=np.float32)
        self.n_vocab = self.table.shape[1]
        self.vocab = VocabInfo(n_vocab=self.n_vocab, vocab_type=0, bos=-1, eos=-1,
                               add_bos=False, add_eos=False, eog=frozenset(eog))
        self.n_ctx = n_ctx
        self.n_batch = 512
        self.n_outputs_max = 64
        self.tokens: list[int] = []
        self.seconds = 0.0
        self.rollback_seconds = 0.0

    def eval(self, tokens, n_logits=1):
        assert len(self.tokens) + len(tokens) <= self.n_ctx
        assert n_logits <= min(len(tokens), self.n_outputs_max)
        self.tokens.extend(tokens)
        return self.table[list(tokens[len(tokens) - n_logits:])] if n_logits else \
            np.empty((0, self.n_vocab), np.float32)

    def truncate(self, n):
        del self.tokens[n:]

    def checkpoint(self):
        """(an attention-only cache needs none)"""


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class MarkovSequence(MarkovLM):
    """One sequence of a :class:`MarkovContext` (its own tokens; the table is shared)."""

    def __init__(self, context: "MarkovContext"):
        super().__init__(context.table, context.vocab.eog, context.n_ctx)
        self.context = context


class MarkovContext(MarkovLM):
    """A :class:`MarkovLM` that holds several sequences and evaluates several of them in one
    call, as a llama.cpp context with ``n_seq_max`` does (the backend's ``sequences`` and
    ``decode``): what the Engine's batched rounds run on, in numpy. ``calls`` counts the
    calls and ``parts`` their parts, so a test can see the passes were batched."""

    def __init__(self, logits: np.ndarray, n_seq: int, eog=(), n_ctx: int = 4096):
        super().__init__(logits, eog, n_ctx)
        self.sequences = tuple(MarkovSequence(self) for _ in range(n_seq))
        self.calls = self.parts = 0
        self.path = "markov.gguf"

    def decode(self, parts):
        self.calls += 1
        self.parts += len(parts)
        return [seq.eval(tokens, n) for seq, tokens, n in parts]
