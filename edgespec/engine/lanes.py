"""An Engine's lanes: where its generations run, ``streams`` of them at once.

A :class:`Lane` is one sequence of the target's context and one of the draft's (the KV caches
of one conversation), seen as models by the decoding loop (:class:`~edgespec.engine.stream_model.
StreamModel`), with the draft's reduced output layer for that conversation. :class:`Lanes`
admits a generation to a free lane (the one whose cache already holds the longest part of its
prompt, else the least recently used) or queues it, first come, first served; the generations
in lanes decode together, their passes batched by one :class:`~edgespec.engine.rounds.Rounds`.

The lanes may be more than the KV cache holds full contexts for: the sequences of a context
share its cells (``ModelConfig.n_cells``), and a generation enters only while the positions it
can reach (its prompt, ``max_tokens`` and a round's drafts, at most ``n_ctx``) fit beside
what the generations in lanes can reach. Short requests then run at once beyond the number
of full contexts, and no pass can find the cache full.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from .. import config
from ..errors import EdgespecError, EngineBusyError, InvalidParameterError
from ..gguf_file import vocab_hash
from ..prompt_cache import common_prefix
from .rounds import Member, Rounds
from .stream_model import StreamModel
from .streams import Job

if TYPE_CHECKING:
    from ..drafting import ReducedHead
    from ..drafting.suffix import SuffixIndex


def shared_cells(parallel: int, streams: int, n_ctx: Optional[int], target,
                 draft) -> tuple[int, int]:
    """(the target's KV cells, the draft's) for ``streams`` generations at once over the KV
    cache of ``parallel`` full contexts of ``n_ctx`` (both checked where they entered:
    :func:`~edgespec.config.check_parallel`, :func:`~edgespec.config.check_streams`; cells 0:
    ``n_ctx`` for each sequence, as when ``streams`` is ``parallel``). A generation enters
    while its prompt, ``max_tokens`` and a round's drafts fit beside what the others can reach
    (at most a whole context each: :meth:`Lanes.enter`). A draft of the target's tokenizer
    never holds more than the target's positions and a round's drafts, so it shares as few
    cells; another tokenizer's text may take more, so that draft keeps a context for each."""
    if streams == parallel:
        return 0, 0
    cells = (n_ctx or config.N_CTX) * parallel
    return cells, cells if draft is not None and _same_vocab(target, draft) else 0


def _same_vocab(target, draft) -> bool:
    """Whether two GGUF files have one vocabulary (False when either cannot be read: loading
    them says why)."""
    try:
        return vocab_hash(target) == vocab_hash(draft)
    except (EdgespecError, OSError):
        return False


@dataclass(eq=False)
class Lane:
    """One generation's place: its sequences of both models and its draft head."""

    index: int
    member: Member
    target: StreamModel
    draft: Optional[StreamModel]
    head: Optional["ReducedHead"]
    rounds: Rounds
    # The earlier requests its generation drafts from: told by its Speculation.drafter, read
    # by the lane's n-gram drafter (engine/drafting.py, both).
    suffix: Optional["SuffixIndex"] = None

    def draft_from(self, index: Optional["SuffixIndex"]) -> None:
        """The generation now in this lane drafts from the earlier requests of ``index``
        (None: its context only)."""
        self.suffix = index

    def suffix_index(self) -> Optional["SuffixIndex"]:
        """The earlier requests the generation in this lane drafts from (None: none)."""
        return self.suffix

    def plan(self, ask) -> int:
        """This lane's draft length for the round, planned with the other lanes'."""
        return self.rounds.plan(self.member, ask)


class Lanes:
    """The lanes of an Engine over backend ``target`` and ``draft`` (each holding ``n``
    sequences), and the queue of generations waiting for one. ``head``: the draft's reduced
    output layer (each lane gets a sibling that follows its own conversation). ``plan``:
    the rounds' joint planner; ``on_pass``: told of every pass (:class:`Rounds`).
    ``deferred`` counts the generations that had to wait. ``cells``: the KV positions the
    sequences share (None: ``n_ctx`` for each); ``margin``: the positions a round's drafts
    may add beyond what a generation keeps."""

    def __init__(self, target, draft, head: Optional["ReducedHead"], n: int = 1,
                 plan: Optional[Callable[[list], list]] = None,
                 on_pass: Optional[Callable] = None, cells: Optional[int] = None,
                 margin: int = 0):
        if any(m is not None and len(m.sequences) < n for m in (target, draft)):
            raise InvalidParameterError("streams", n, "at most the sequences the models were "
                                        "loaded with (ModelConfig.streams)")
        self.n = n
        self.n_ctx = target.n_ctx
        self.cells = cells if cells is not None else self.n_ctx * n
        self.margin = margin
        self._reach: dict[int, int] = {}       # lane index -> positions its job may reach
        self.rounds = Rounds([m for m in (draft, target) if m is not None], plan=plan,
                             on_pass=on_pass)
        self.lanes = []
        for i in range(n):
            member = Member()
            self.lanes.append(Lane(
                i, member, StreamModel(target, target.sequences[i], self.rounds, member),
                StreamModel(draft, draft.sequences[i], self.rounds, member)
                if draft is not None else None,
                (head if i == 0 else head.sibling()) if head is not None else None,
                self.rounds))
        self._cond = threading.Condition()
        self._waiting: deque = deque()
        self.owners: dict[int, Job] = {}      # lane index -> the job in it
        self._used = [0] * n                    # when each lane was last entered
        self._clock = 0
        self.closed = False
        self.deferred = 0

    @property
    def contexts(self) -> int:
        """The whole contexts the shared cells hold (the Engine's ``parallel``)."""
        return self.cells // self.n_ctx

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> list[Job]:
        return list(self.owners.values())

    def mean_context(self) -> int:
        """The mean context of the streams in lanes now (0 with none)."""
        lens = [len(self.lanes[i].target.tokens) for i in list(self.owners)]
        return sum(lens) // len(lens) if lens else 0

    @property
    def rows_per_pass(self) -> float:
        """The mean rows of the last passes (0 before any): how full the batches are."""
        rows = self.rounds.rows_per_pass
        return sum(rows) / len(rows) if rows else 0.0

    def _room(self, reach: int) -> bool:
        """Whether a free lane and the cells for ``reach`` are there now."""
        return len(self.owners) < self.n and \
            sum(self._reach.values()) + reach <= self.cells

    def enter(self, job: Job, prompt: Sequence[int], max_tokens: int) -> Optional[Lane]:
        """Wait for a free lane for ``job``: the one whose target cache holds the longest part
        of ``prompt``, else the least recently used; and for the KV cells the generation can
        reach (its prompt, ``max_tokens`` and a round's drafts, at most a whole context).
        None if the job was cancelled, or the lanes closed, first.

        Raises :class:`EngineBusyError` when the caller would wait for itself: there is no
        room, and every lane taken holds a stream that this very thread advanced and left
        open.
        """
        me = threading.get_ident()
        reach = min(self.n_ctx, len(prompt) + max_tokens + self.margin)
        with self._cond:
            if self.owners and not self._room(reach) and all(
                    not o.advancing and o.consumer == me for o in self.owners.values()):
                raise EngineBusyError(
                    "this thread still has an unfinished stream on this Engine: read it to the "
                    "end or call its close() (or cancel()) before starting another generation")
            self._waiting.append(job)
            if not self._room(reach) or len(self._waiting) > 1:
                self.deferred += 1
                self.rounds.arrived(job.arrival)    # no prompt pass waits for it
            try:
                while not self._room(reach) or self._waiting[0] is not job:
                    if job.cancelled.is_set() or self.closed:
                        return None
                    self._cond.wait()
                if job.cancelled.is_set() or self.closed:
                    return None
                free = [lane for lane in self.lanes if lane.index not in self.owners]
                lane = max(free, key=lambda la: (common_prefix(la.target.tokens, prompt),
                                                 -self._used[la.index]))
                self._clock += 1
                self._used[lane.index] = self._clock
                self.owners[lane.index] = job
                self._reach[lane.index] = reach
                return lane
            finally:
                self._waiting.remove(job)
                self._cond.notify_all()   # whoever is now first in line may go

    def leave(self, lane: Lane) -> None:
        with self._cond:
            self.owners.pop(lane.index, None)
            self._reach.pop(lane.index, None)
            self._cond.notify_all()

    def wake(self) -> None:
        """Let waiters re-check their flags (after a cancel), in the queue and in the
        rounds."""
        with self._cond:
            self._cond.notify_all()
        self.rounds.wake()

    def close(self) -> list[Job]:
        """Admit nobody any more; wake the queue (each waiter ends cancelled). Returns the
        jobs in lanes, which the caller must stop."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
            return list(self.owners.values())

    def wait_idle(self) -> None:
        with self._cond:
            while self.owners:
                self._cond.wait()
