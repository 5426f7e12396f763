"""The draft model's output layer over a subset of the vocabulary (the idea of FR-Spec,
Zhao et al. 2025), applied in numpy to the hidden state that
:meth:`~edgespec.lm.HiddenStateModel.eval_hidden` reads.

A small draft with a large vocabulary spends most of its step in its output layer: the
Gemma-3-270M Q4_K_M draft, 8 of 13 ms for 262,144 rows. The draft never proposes a token
outside the subset (its q is 0 there), so rejection sampling stays exact.
"""

from __future__ import annotations

import threading
import time
from typing import Optional, Sequence

import numpy as np

from ..lm import HiddenStateModel

# The lowest token ids (BPE and SentencePiece vocabularies number their pieces in merge order,
# so low ids are the common ones): 16,384 measured fastest (docs/decisions.md).
HEAD_ROWS = 16384
HEAD_MIN_VOCAB = 4 * HEAD_ROWS    # below this the output layer is a small share of a step


class OneThreadBlas:
    """BLAS's matrix-vector product on the calling thread only.

    numpy's BLAS (OpenBLAS in the wheels) computes the subset's logits from a transposed,
    contiguous weight matrix about twice as fast as ``einsum`` (docs/decisions.md), but with
    its own threads, which keep spinning after the product and stall llama.cpp's threads on
    the same cores. So the product runs with BLAS limited to one thread, through
    threadpoolctl, and the count is put back at once (~2 µs): for those ~2 ms a host app's own
    BLAS calls on other threads run single-threaded too. Where the BLAS's thread count cannot
    be set, ``einsum`` does the product (no BLAS threads at all)."""

    _lock = threading.Lock()      # one product at a time: the count is process-wide
    _libs: Optional[list] = None

    @classmethod
    def libraries(cls) -> list:
        if cls._libs is None:
            try:
                from threadpoolctl import ThreadpoolController
                found = ThreadpoolController().select(user_api="blas").lib_controllers
            except Exception:  # noqa: BLE001 - not installed, or a library it cannot read
                found = []
            cls._libs = [lib for lib in found if lib.internal_api in ("openblas", "mkl",
                                                                       "blis")]
        return cls._libs

    @classmethod
    def vec_mat(cls, vec: np.ndarray, mat: np.ndarray, out: np.ndarray) -> None:
        """``out[:] = vec @ mat`` for a C-contiguous ``mat`` of shape (len(vec), len(out))."""
        libs = cls.libraries()
        if not libs:
            np.einsum("j,ji->i", vec, mat, out=out)
            return
        with cls._lock:
            before = [lib.get_num_threads() for lib in libs]
            for lib in libs:
                lib.set_num_threads(1)
            try:
                np.dot(vec, mat, out=out)
            finally:
                for lib, n in zip(libs, before):
                    lib.set_num_threads(n)


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

    def __init__(self, model: HiddenStateModel, rows: int = HEAD_ROWS, max_extra: int = 16384,
                 shared: Optional[np.ndarray] = None):
        n = model.n_vocab
        ids = set(range(min(rows, n))) | set(model.vocab.eog)
        for i in range(min(rows, n), n):
            text = model.token_text(i).replace(b"\xe2\x96\x81", b" ")
            if len(text) <= 2 and all(c < 128 for c in text):
                ids.add(i)
        self.model, self.n_vocab = model, n
        self.ids = np.array(sorted(ids), dtype=np.int64)
        # A draft of another vocabulary proposes only the tokens both hold (``shared``, a mask
        # over its ids): the head has no rows for the others.
        self._shared = shared
        if shared is not None:
            self.ids = self.ids[shared[self.ids]]
        # Stored transposed (n_embd × rows, contiguous): the layout BLAS multiplies fastest.
        self.wt = np.ascontiguousarray(model.output_rows(self.ids).T)
        self._start(max_extra)

    def _start(self, max_extra: int) -> None:
        """The rows of no conversation yet: the base subset, room for ``max_extra`` more."""
        self._member = np.zeros(self.n_vocab, dtype=bool)
        self._member[self.ids] = True
        nb = len(self.ids)
        # Subset ids and their logits: the base rows, then the extra rows in order added.
        self._all_ids = np.empty(nb + max_extra, dtype=np.int64)
        self._all_ids[:nb] = self.ids
        self._vals = np.empty(nb + max_extra, dtype=np.float32)
        self._extra_ids = self._all_ids[nb:]
        self._extra_w = np.empty((max_extra, self.wt.shape[0]), dtype=np.float32)
        self._n_extra = 0
        self._context: list[int] = []     # the conversation the extra rows were added for
        self.seconds = 0.0      # spent in the products, cumulative

    def sibling(self) -> "ReducedHead":
        """A head over the same base rows (shared, not copied: Gemma's are ~40 MB) with extra
        rows of its own: one per stream of an Engine that decodes several at once, each
        following its own conversation."""
        other = object.__new__(ReducedHead)
        other._share_base(self)
        return other

    def _share_base(self, base: "ReducedHead") -> None:
        """Made by ``base.sibling()``: its base rows, extra rows of this head's own."""
        self.model, self.n_vocab, self.ids, self._shared, self.wt = (
            base.model, base.n_vocab, base.ids, base._shared, base.wt)
        self._start(len(base._extra_ids))

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

    def snapshot(self) -> tuple:
        """The rows added for the conversation served now, copied (for a prompt cache that
        keeps this conversation aside: :meth:`restore` brings them back without reading
        the rows from the model file again)."""
        n = self._n_extra
        return (list(self._context), self._extra_ids[:n].copy(), self._extra_w[:n].copy())

    @staticmethod
    def snapshot_bytes(snap: tuple) -> int:
        return snap[1].nbytes + snap[2].nbytes + 8 * len(snap[0])

    def restore(self, snap: tuple) -> None:
        """Serve the conversation of ``snap`` (from :meth:`snapshot`) again."""
        context, ids, rows = snap
        self._member[self._extra_ids[:self._n_extra]] = False
        n = len(ids)
        self._extra_ids[:n] = ids
        self._extra_w[:n] = rows
        self._member[ids] = True
        self._n_extra = n
        self._context = list(context)

    def include(self, tokens: Sequence[int]) -> None:
        """Add the output rows of these tokens (those not in the subset yet)."""
        t = np.unique(np.asarray(tokens, dtype=np.int64))
        t = t[(t >= 0) & (t < self.n_vocab)]
        if self._shared is not None:
            t = t[self._shared[t]]
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

        On this thread: BLAS's own threads would spin against llama.cpp's on the same cores
        (:class:`OneThreadBlas`, docs/decisions.md).
        """
        t0 = time.perf_counter()
        nb, k = len(self.ids), self._n_extra
        OneThreadBlas.vec_mat(np.ascontiguousarray(hidden, dtype=np.float32), self.wt,
                              self._vals[:nb])
        if k:
            np.einsum("ij,j->i", self._extra_w[:k], hidden, out=self._vals[nb:nb + k])
        self.seconds += time.perf_counter() - t0
        return self._all_ids[:nb + k], self._vals[:nb + k]

    def last_row(self) -> np.ndarray:
        """The last product as a full-vocabulary row (-inf outside the subset)."""
        row = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        row[self._all_ids[:self.size]] = self._vals[:self.size]
        return row

