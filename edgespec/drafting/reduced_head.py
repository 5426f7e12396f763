"""The draft model's output layer over a subset of the vocabulary (the idea of FR-Spec,
Zhao et al. 2025), applied in numpy to the hidden state that
:meth:`~edgespec.lm.HiddenStateModel.eval_hidden` reads.

A small draft with a large vocabulary spends most of its step in its output layer: the
Gemma-3-270M Q4_K_M draft, 8 of 13 ms for 262,144 rows. The draft never proposes a token
outside the subset (its q is 0 there), so rejection sampling stays exact.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..lm import HiddenStateModel

# The lowest token ids (BPE and SentencePiece vocabularies number their pieces in merge order,
# so low ids are the common ones): 16,384 measured fastest (docs/decisions.md).
HEAD_ROWS = 16384
HEAD_MIN_VOCAB = 4 * HEAD_ROWS    # below this the output layer is a small share of a step


class ReducedHead:
    """The draft's output rows for a subset of the vocabulary: the ``rows`` lowest ids, every
    short ASCII token and end-of-generation token, and every token of the conversation being
    drafted for.

    Tokens outside the subset get q = 0: they are never proposed, and rejection sampling
    stays exact because q is still the distribution each draft token was drawn from. The
    tokens of the conversation being drafted for join the subset (a name, an identifier)
    before the next draft, and leave it when another conversation starts (:meth:`follow`):
    the subset stays bounded on a server that runs for days, and a generation's speed does
    not depend on what was generated before it.
    """

    def __init__(self, model: HiddenStateModel, rows: int = HEAD_ROWS, max_extra: int = 16384):
        n = model.n_vocab
        ids = set(range(min(rows, n))) | set(model.vocab.eog)
        for i in range(min(rows, n), n):
            text = model.token_text(i).replace(b"\xe2\x96\x81", b" ")
            if len(text) <= 2 and all(c < 128 for c in text):
                ids.add(i)
        self.model, self.n_vocab = model, n
        self.ids = np.array(sorted(ids), dtype=np.int64)
        self.w = model.output_rows(self.ids)
        self._member = np.zeros(n, dtype=bool)
        self._member[self.ids] = True
        nb = len(self.ids)
        # Subset ids and their logits: the base rows, then the extra rows in order added.
        self._all_ids = np.empty(nb + max_extra, dtype=np.int64)
        self._all_ids[:nb] = self.ids
        self._vals = np.empty(nb + max_extra, dtype=np.float32)
        self._extra_ids = self._all_ids[nb:]
        self._extra_w = np.empty((max_extra, self.w.shape[1]), dtype=np.float32)
        self._n_extra = 0
        self._context: list[int] = []     # the conversation the extra rows were added for
        self.seconds = 0.0      # spent in the products, cumulative

    @property
    def size(self) -> int:
        return len(self.ids) + self._n_extra

    def follow(self, context: Sequence[int]) -> None:
        """Serve this context: add the rows of its tokens; when it does not continue the
        context served before (another conversation, an edited or regenerated turn), first
        drop the rows added for that one."""
        n = len(self._context)
        if n > len(context) or context[:n] != self._context:
            self._member[self._extra_ids[:self._n_extra]] = False
            self._n_extra = 0
            self._context = []
            n = 0
        self.include(context[n:])
        self._context.extend(context[n:])

    def include(self, tokens: Sequence[int]) -> None:
        """Add the output rows of these tokens (those not in the subset yet)."""
        t = np.unique(np.asarray(tokens, dtype=np.int64))
        t = t[(t >= 0) & (t < self.n_vocab)]
        new = t[~self._member[t]][:len(self._extra_ids) - self._n_extra]
        if new.size:
            k = self._n_extra
            self._extra_w[k:k + new.size] = self.model.output_rows(new)
            self._extra_ids[k:k + new.size] = new
            self._member[new] = True
            self._n_extra += new.size

    def subset_logits(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, logits) of the subset for this hidden state; views valid until the next
        call. Greedy drafting needs no more: its argmax and confidence read these ~18k
        entries instead of building and scanning a full row.

        ``einsum`` on this thread, not ``@``: BLAS's own threads would spin against
        llama.cpp's on the same cores (docs/decisions.md).
        """
        t0 = time.perf_counter()
        nb, k = len(self.ids), self._n_extra
        np.einsum("ij,j->i", self.w, hidden, out=self._vals[:nb])
        if k:
            np.einsum("ij,j->i", self._extra_w[:k], hidden, out=self._vals[nb:nb + k])
        self.seconds += time.perf_counter() - t0
        return self._all_ids[:nb + k], self._vals[:nb + k]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """A full-vocabulary logits row: the subset's logits, -inf elsewhere."""
        self.subset_logits(hidden)
        return self.last_row()

    def last_row(self) -> np.ndarray:
        """The last product as a full-vocabulary row (-inf outside the subset)."""
        row = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        row[self._all_ids[:self.size]] = self._vals[:self.size]
        return row

