"""Going back in a recurrent or hybrid model's cache: :class:`Checkpoints`.

An attention layer's cache holds one entry per position, so dropping the last positions
(``llama_memory_seq_rm``) leaves exactly the cache of a shorter text. A recurrent layer (Gated
DeltaNet, Mamba2, LFM2's short convolutions) holds one running state that every token
overwrites; llama.cpp cannot cut it back, so a speculative round that rejects drafts would
leave it a few tokens ahead. What brings it back, exactly:

- a **checkpoint**: a copy of the sequence's recurrent part
  (``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the recurrent
  or sliding-window part only, not the attention KV cells) taken before a pass that may be
  rolled back; restoring it puts the state at that position, after which ``seq_rm`` trims the
  attention part as usual and the accepted tokens past the checkpoint are evaluated again;
- **snapshots** (``llama_context_params.n_rs_seq``, llama.cpp's experimental per-token copies
  for qwen35, lfm2 and nemotron_h): each pass also writes the state after each of its last
  ``n_rs_seq + 1`` tokens, and ``seq_rm`` of up to that many positions then succeeds once; only
  positions inside the last pass of the sequence are covered (a slot not written by that pass
  holds an older state, which llama.cpp does not check), :class:`~.sequence.KVSequence` checks
  that bound.

A checkpoint at position ``p`` stands for the state after ``tokens[:p]`` and stays valid while
those tokens do. The copies live in buffers reused from a small pool: touching tens of fresh
megabytes per copy would cost more than the copy (docs/decisions.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

import llama_cpp.llama_cpp as C

from ..errors import BackendError

_U8P = C.ctypes.POINTER(C.ctypes.c_uint8)
PARTIAL = C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def is_recurrent(weights) -> bool:
    """Whether a llama.cpp model's cache has a recurrent part (pure recurrent models report
    ``llama_model_is_recurrent``, the hybrids only ``llama_model_is_hybrid``)."""
    return bool(C.llama_model_is_recurrent(weights) or C.llama_model_is_hybrid(weights))


@dataclass
class _Copy:
    pos: int
    data: np.ndarray
    nbytes: int


class Checkpoints:
    """Copies of one sequence's recurrent state, at most ``limit`` of them and ``max_bytes``
    in all (but two at least; kept spread out: :meth:`_thinnest`), each at the position whose
    state it holds. Calls into llama.cpp are the caller's to serialise (under the model's
    lock)."""

    def __init__(self, context, seq_id: int, limit: int, max_bytes: int = 1 << 62):
        self._ctx, self.seq_id, self.limit = context, seq_id, max(1, limit)
        self.max_bytes = max_bytes
        self._copies: list[_Copy] = []        # by position, ascending
        self._pool: list[np.ndarray] = []
        self.saved = self.restored = 0        # counters (statistics, the cost model)
        self.save_seconds = self.restore_seconds = 0.0     # wall time spent on each

    def __len__(self) -> int:
        return len(self._copies)

    @property
    def positions(self) -> list[int]:
        return [c.pos for c in self._copies]

    def has(self, pos: int) -> bool:
        return any(c.pos == pos for c in self._copies)

    def save(self, pos: int) -> None:
        """Copy the recurrent state, which is the state after ``pos`` tokens."""
        t0 = time.perf_counter()
        ctx, seq = self._ctx, self.seq_id
        size = C.llama_state_seq_get_size_ext(ctx, seq, PARTIAL)
        buf = self._buffer(size)
        written = C.llama_state_seq_get_data_ext(ctx, buf.ctypes.data_as(_U8P), size, seq,
                                                 PARTIAL)
        if written == 0:
            self._pool.append(buf)
            raise BackendError("llama.cpp could not copy this model's recurrent state")
        self.drop_above(pos - 1)
        self._copies.append(_Copy(pos, buf, written))
        if len(self._copies) > min(self.limit, max(2, self.max_bytes // written)):
            self._pool.append(self._copies.pop(self._thinnest()).data)
        self.saved += 1
        self.save_seconds += time.perf_counter() - t0

    def _thinnest(self) -> int:
        """Which copy to give up when there are too many: the one nearest to the copy before
        it (the older on a tie), never the newest. Copies stay spread out, so one far back
        (the start of an answer, for a regeneration) outlives the dense ones of earlier
        speculative rounds."""
        gaps = [c.pos - (self._copies[i - 1].pos if i else 0)
                for i, c in enumerate(self._copies[:-1])]
        return gaps.index(min(gaps))

    def restore_at_or_below(self, n: int) -> Optional[int]:
        """Put back the latest copy at a position ``<= n``; returns that position (None: no
        copy there, nothing changed). On a failure the sequence's recurrent part is left
        empty and BackendError is raised."""
        best = None
        for c in self._copies:
            if c.pos <= n:
                best = c
        if best is None:
            return None
        t0 = time.perf_counter()
        if not C.llama_state_seq_set_data_ext(self._ctx, best.data.ctypes.data_as(_U8P),
                                              best.nbytes, self.seq_id, PARTIAL):
            raise BackendError("llama.cpp refused a recurrent state it had copied")
        self.restored += 1
        self.restore_seconds += time.perf_counter() - t0
        return best.pos

    def drop_above(self, n: int) -> None:
        """Forget the copies at positions past ``n`` (their tokens are gone)."""
        while self._copies and self._copies[-1].pos > n:
            self._pool.append(self._copies.pop().data)

    def clear(self) -> None:
        self.drop_above(-1)

    def _buffer(self, size: int) -> np.ndarray:
        while self._pool:
            buf = self._pool.pop()
            if buf.nbytes >= size:
                return buf
        return np.empty(size, dtype=np.uint8)
