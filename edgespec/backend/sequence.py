"""One llama.cpp sequence of a model's context: what a stream's cache is when a context holds
several (``n_seq_max``).

A :class:`KVSequence` keeps ``tokens``, the exact token sequence its KV cells hold (position
``i`` holds ``tokens[i]``), as a whole model does for one conversation; its passes go through
the model's :meth:`~edgespec.backend.LlamaModel.decode`, which evaluates the rows of several
sequences in one ``llama_decode``. Trimming, saving and restoring act on this sequence's cells
alone (``llama_memory_seq_rm``, ``llama_state_seq_get_data``/``_set_data`` with its id).
Nothing above :mod:`edgespec.backend` sees the id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional
from typing import Sequence as Seq

import numpy as np

import llama_cpp.llama_cpp as C

from ..errors import BackendError, ContextOverflowError


_U8P = C.ctypes.POINTER(C.ctypes.c_uint8)


def check_eval(model, tokens: Seq[int], n_logits: int) -> int:
    """The bounds of ``eval(tokens, n_logits)`` on ``model`` (which has ``tokens``, ``n_ctx``
    and ``n_outputs_max``), checked before llama.cpp would abort; returns ``len(tokens)``."""
    n = len(tokens)
    if n == 0:
        raise ValueError("eval() needs at least one token")
    if not 0 <= n_logits <= min(n, model.n_outputs_max):
        raise ValueError(f"n_logits={n_logits} must be in [0, min({n}, "
                         f"{model.n_outputs_max})]")
    if len(model.tokens) + n > model.n_ctx:
        raise ContextOverflowError(len(model.tokens) + n, model.n_ctx)
    return n


@dataclass(frozen=True)
class ModelState:
    """A model's cache contents copied to host memory: the tokens it holds, and llama.cpp's
    serialised KV cells for them (``nbytes`` of ``data``, a buffer: numpy or bytes)."""

    tokens: tuple
    data: object
    nbytes: int




class KVSequence:
    """Sequence ``seq_id`` of ``model``'s context (a :class:`~.model.LlamaModel`; see the
    module docstring)."""

    def __init__(self, model, seq_id: int):
        self.model = model
        self.seq_id = seq_id
        self.tokens: list[int] = []

    @property
    def n_ctx(self) -> int:
        """Most positions this sequence may hold."""
        return self.model.n_ctx

    def eval(self, tokens: Seq[int], n_logits: int = 1) -> np.ndarray:
        """This sequence alone: :meth:`LlamaModel.decode` of one part."""
        return self.model.decode([(self, tokens, n_logits)])[0]

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` positions of this sequence."""
        if n >= len(self.tokens):
            return
        m = self.model
        with m.lock:
            m.check_open()
            if not C.llama_memory_seq_rm(m.memory, self.seq_id, n, -1):
                raise BackendError(
                    f"{m.path.name}: llama.cpp cannot remove positions from this model's cache "
                    "(recurrent or hybrid architecture); speculative decoding needs a model "
                    "whose cache can be trimmed — decode plainly (speculative=False)",
                    options=("speculative",))
            del self.tokens[n:]

    def save_state(self, buffer: Optional[Callable[[int], np.ndarray]] = None) -> "ModelState":
        """A copy of this sequence's cells in host memory (``llama_state_seq_get_data``):
        in a new array, or in ``buffer(size)`` (a reused scratch array of at least ``size``
        bytes, for a copy restored at once: touching new memory of tens of MB can cost more
        than the copy itself, docs/decisions.md)."""
        m = self.model
        with m.lock:
            m.check_open()
            size = C.llama_state_seq_get_size(m.context, self.seq_id)
            # (not zeroed first, as a ctypes array is)
            data = np.empty(size, dtype=np.uint8) if buffer is None else buffer(size)
            written = C.llama_state_seq_get_data(m.context, data.ctypes.data_as(_U8P), size,
                                                 self.seq_id)
            if written == 0 and self.tokens:
                raise BackendError(f"{m.path.name}: llama.cpp could not copy this model's cache")
            return ModelState(tuple(self.tokens), data, written)

    def restore_state(self, state: "ModelState") -> None:
        """Make this sequence hold ``state`` (saved from any sequence of this model) instead of
        what it holds. On failure it is left empty, never half-written."""
        m = self.model
        with m.lock:
            m.check_open()
            C.llama_memory_seq_rm(m.memory, self.seq_id, -1, -1)
            self.tokens = []
            if state.nbytes and not C.llama_state_seq_set_data(
                    m.context, np.frombuffer(state.data, dtype=np.uint8).ctypes.data_as(_U8P),
                    state.nbytes, self.seq_id):
                C.llama_memory_seq_rm(m.memory, self.seq_id, -1, -1)
                raise BackendError(f"{m.path.name}: llama.cpp refused a saved cache state")
            self.tokens = list(state.tokens)

    def cache_span(self) -> tuple[int, int]:
        """(first, last) position llama.cpp holds for this sequence; (-1, -1) when empty."""
        m = self.model
        with m.lock:
            m.check_open()
            return (C.llama_memory_seq_pos_min(m.memory, self.seq_id),
                    C.llama_memory_seq_pos_max(m.memory, self.seq_id))


def check_parts(model, parts) -> int:
    """The bounds of ``model.decode(parts)`` checked before llama.cpp would abort (each
    sequence's context, each part's logits rows, all the rows of one call); the number of
    tokens."""
    seen = set()
    total = rows = 0
    for seq, tokens, n_logits in parts:
        if seq.seq_id in seen:
            raise ValueError("decode() takes at most one part per sequence")
        seen.add(seq.seq_id)
        total += check_eval(_Bounds(seq, model), tokens, n_logits)
        rows += n_logits
    if rows > model.n_outputs_total:
        raise ValueError(f"{rows} logits rows in one decode(): at most {model.n_outputs_total}")
    return total


class _Bounds:
    """What :func:`~edgespec.backend.model.check_eval` reads of a sequence."""

    def __init__(self, seq: KVSequence, model):
        self.tokens, self.n_ctx, self.n_outputs_max = seq.tokens, model.n_ctx, \
            model.n_outputs_max


def plan_calls(parts, n_batch: int, n_outputs: int) -> list[list[tuple]]:
    """The ``llama_decode`` calls for ``parts`` ((sequence, tokens, n_logits) each): lists of
    (part index, sequence, tokens, index of the first token with logits), each within
    ``n_batch`` tokens and ``n_outputs`` rows; a part longer than ``n_batch`` is chunked, its
    chunks in order, never two of them in one call."""
    segments = []
    for i, (seq, tokens, n_logits) in enumerate(parts):
        first = len(tokens) - n_logits
        for start in range(0, len(tokens), n_batch):
            segments.append((i, seq, tokens[start:start + n_batch], max(0, first - start)))
    calls: list[list[tuple]] = [[]]
    size = rows = 0
    for seg in segments:
        n = len(seg[2])
        r = n - min(seg[3], n)
        same = any(s[1] is seg[1] for s in calls[-1])
        if calls[-1] and (same or size + n > n_batch or rows + r > n_outputs):
            calls.append([])
            size = rows = 0
        calls[-1].append(seg)
        size, rows = size + n, rows + r
    return calls
