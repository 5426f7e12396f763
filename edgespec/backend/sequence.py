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

from ..config import CHECKPOINT_MIB, CHECKPOINTS, REDO_FOLD
from ..errors import BackendError, ContextOverflowError
from ..lm import common_prefix
from .rollback import Checkpoints


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
    module docstring).

    ``tokens`` is what the cache holds for its callers. On a recurrent or hybrid model
    (:mod:`.rollback`) llama.cpp may hold only ``tokens[:held]`` for a while: a truncation that
    went back to a checkpoint below the cut leaves the tokens between them to be evaluated
    again: up to ``REDO_FOLD`` of them go at the front of this sequence's next pass
    (:meth:`fold`; that pass then goes back, if it must, to the same checkpoint), more in a
    pass of their own before it (:meth:`pending`, so that a checkpoint asked for at the end
    of them can be taken)."""

    def __init__(self, model, seq_id: int):
        self.model = model
        self.seq_id = seq_id
        self.tokens: list[int] = []
        self.held = 0                   # positions llama.cpp holds (tokens[:held])
        self.checkpoints = (Checkpoints(model.context, seq_id, CHECKPOINTS,
                                        CHECKPOINT_MIB << 20)
                            if model.recurrent else None)
        self._mark: Optional[int] = None  # a checkpoint asked for at this length
        self.last_run = 0               # tokens of this sequence in its last llama_decode
        self._rolled = False            # a snapshot rollback since that pass (single-use)
        self.rollbacks = self.reevaluated = 0   # recurrent state taken back; tokens redone
        self.redo_seconds = 0.0         # wall time evaluating tokens again
        self.folded = 0                 # tokens evaluated again at the front of this pass

    @property
    def n_ctx(self) -> int:
        """Most positions this sequence may hold."""
        return self.model.n_ctx

    def eval(self, tokens: Seq[int], n_logits: int = 1) -> np.ndarray:
        """This sequence alone: :meth:`LlamaModel.decode` of one part."""
        return self.model.decode([(self, tokens, n_logits)])[0]

    # -- going back --------------------------------------------------------------------------

    @property
    def rollback_seconds(self) -> float:
        """Wall time this sequence spent on going back: copying and restoring its recurrent
        state, evaluating tokens again (0 on an attention-only model)."""
        c = self.checkpoints
        return 0.0 if c is None else c.save_seconds + c.restore_seconds + self.redo_seconds

    def checkpoint(self) -> None:
        """Make a later :meth:`truncate` back to the present length cheap: on a recurrent
        model, copy the recurrent state before the next pass of this sequence (unless that
        pass's own snapshots cover every position after it); elsewhere nothing."""
        if self.checkpoints is not None and not self.checkpoints.has(len(self.tokens)):
            self._mark = len(self.tokens)

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` positions of this sequence."""
        if n >= len(self.tokens):
            return
        if n >= self.held:              # only tokens still to be evaluated go
            del self.tokens[n:]
            self._forget_above(n)
            return
        m = self.model
        with m.lock:
            m.check_open()
            if self.checkpoints is None or n == 0 or self._snapshot_covers(self.held - n):
                if not C.llama_memory_seq_rm(m.memory, self.seq_id, n, -1):
                    raise BackendError(f"{m.path.name}: llama.cpp could not remove positions "
                                       "from this model's cache")
                self._rolled = self.checkpoints is not None and n > 0
                self.rollbacks += self._rolled
                self.held = n
            else:
                self._back_to_checkpoint(n)
            del self.tokens[n:]
            self._forget_above(n)

    def _snapshot_covers(self, back: int) -> bool:
        """Whether llama.cpp's per-token snapshots can take this sequence ``back`` positions
        back: within ``n_rs_seq``, inside its last pass, and not rolled back since."""
        return 0 < back <= self.model.snapshots and back < self.last_run and not self._rolled

    def _back_to_checkpoint(self, n: int) -> None:
        m = self.model
        try:
            pos = self.checkpoints.restore_at_or_below(n)
        except BackendError:
            pos = None
        if pos is None:                 # no copy below the cut: start over
            C.llama_memory_seq_rm(m.memory, self.seq_id, -1, -1)
            self.checkpoints.clear()
            pos = 0
        elif not C.llama_memory_seq_rm(m.memory, self.seq_id, pos, -1):
            raise BackendError(f"{m.path.name}: llama.cpp could not trim the cache after "
                               "restoring a recurrent state")
        self.held = pos
        self._rolled = False
        self.rollbacks += 1
        self.reevaluated += n - pos

    def _forget_above(self, n: int) -> None:
        if self.checkpoints is not None:
            self.checkpoints.drop_above(n)
        if self._mark is not None and self._mark > n:
            self._mark = None

    def fold(self) -> list[int]:
        """The tokens llama.cpp does not hold yet when they are few enough (``REDO_FOLD``) to
        go at the front of this sequence's next pass, taken off ``tokens``; else none. The
        checkpoint asked for after them is then not taken: the one they start from stays
        the way back."""
        todo = len(self.tokens) - self.held
        if not 0 < todo <= REDO_FOLD:
            return []
        out = self.tokens[self.held:]
        del self.tokens[self.held:]
        self._mark = None
        self.folded = todo
        return out

    def pending(self) -> Optional[list[tuple]]:
        """The tokens llama.cpp does not hold yet, as parts for :meth:`LlamaModel.decode`
        (without logits; split where a checkpoint is asked for), taken off ``tokens``; None
        when there are none."""
        if self.held >= len(self.tokens):
            return None
        todo = self.tokens[self.held:]
        del self.tokens[self.held:]
        if self._mark is not None and self.held < self._mark < self.held + len(todo):
            cut = self._mark - self.held
            return [(self, todo[:cut], 0), (self, todo[cut:], 0)]
        return [(self, todo, 0)]

    def before_pass(self, n_tokens: int) -> None:
        """Called with the model's lock held, right before ``n_tokens`` of this sequence go
        into a ``llama_decode``: take the checkpoint asked for at this length, unless the
        pass's own snapshots will cover every position after it."""
        if self._mark is None or self._mark != len(self.tokens):
            return
        self._mark = None
        if 2 <= n_tokens <= self.model.snapshots + 1:
            return
        try:
            self.checkpoints.save(len(self.tokens))
        except BackendError as e:
            raise BackendError(f"{self.model.path.name}: {e}, so rejected drafts cannot be "
                               "taken back: decode without speculation (speculative=False, "
                               "--no-spec)") from None

    def after_pass(self, chunk: Seq[int]) -> None:
        """Record ``chunk`` as evaluated (the last ``llama_decode`` of this sequence)."""
        self.tokens.extend(chunk)
        self.held = len(self.tokens)
        self.last_run = len(chunk)
        self._rolled = False

    def after_failed_pass(self, chunk: Seq[int]) -> None:
        """A ``llama_decode`` of ``chunk`` failed: llama.cpp may have kept some of it; take
        those back too, so that the sequence is as before the pass."""
        pos0 = len(self.tokens)
        kept = C.llama_memory_seq_pos_max(self.model.memory, self.seq_id) + 1
        self.tokens = (self.tokens + list(chunk))[:kept]
        self.held = len(self.tokens)
        self.truncate(pos0)

    # -- copies of the whole cache ---------------------------------------------------------

    def save_state(self, buffer: Optional[Callable[[int], np.ndarray]] = None) -> "ModelState":
        """A copy of this sequence's cells in host memory (``llama_state_seq_get_data``):
        in a new array, or in ``buffer(size)`` (a reused scratch array of at least ``size``
        bytes, for a copy restored at once: touching new memory of tens of MB can cost more
        than the copy itself, docs/decisions.md)."""
        m = self.model
        with m.lock:
            m.check_open()
            m.evaluate_pending([self])
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
            # the checkpoints of the prefix both texts share stay true
            self._forget_above(common_prefix(self.tokens, state.tokens))
            self.tokens, self.held, self.last_run = [], 0, 0
            if state.nbytes and not C.llama_state_seq_set_data(
                    m.context, np.frombuffer(state.data, dtype=np.uint8).ctypes.data_as(_U8P),
                    state.nbytes, self.seq_id):
                C.llama_memory_seq_rm(m.memory, self.seq_id, -1, -1)
                self._forget_above(0)
                raise BackendError(f"{m.path.name}: llama.cpp refused a saved cache state")
            self.tokens = list(state.tokens)
            self.held = len(self.tokens)

    def cache_span(self) -> tuple[int, int]:
        """(first, last) position llama.cpp holds for this sequence; (-1, -1) when empty
        (the tokens still to be evaluated are evaluated first)."""
        m = self.model
        with m.lock:
            m.check_open()
            m.evaluate_pending([self])
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
