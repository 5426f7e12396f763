"""An Engine's lanes: where its generations run, ``parallel`` of them at once.

A :class:`Lane` is one sequence of the target's context and one of the draft's (the KV caches
of one conversation), seen as models by the decoding loop (:class:`~edgespec.engine.stream_model.
StreamModel`), with the draft's reduced output layer for that conversation. :class:`Lanes`
admits a generation to a free lane (the one whose cache already holds the longest part of its
prompt, else the least recently used) or queues it, first come, first served; the generations
in lanes decode together, their passes batched by one :class:`~edgespec.engine.rounds.Rounds`.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from ..errors import EngineBusyError, InvalidParameterError
from ..prompt_cache import common_prefix
from .rounds import Member, Rounds
from .stream_model import StreamModel
from .streams import Job

if TYPE_CHECKING:
    from ..drafting import ReducedHead
    from ..drafting.suffix import SuffixIndex


@dataclass(eq=False)
class Lane:
    """One generation's place: its sequences of both models and its draft head."""

    index: int
    member: Member
    target: StreamModel
    draft: Optional[StreamModel]
    head: Optional["ReducedHead"]
    rounds: Rounds
    # The earlier requests its generation drafts from: set by its Speculation.drafter, read
    # by the lane's n-gram drafter (engine/drafting.py, both).
    suffix: Optional["SuffixIndex"] = None

    def plan(self, ask) -> int:
        """This lane's draft length for the round, planned with the other lanes'."""
        return self.rounds.plan(self.member, ask)


class Lanes:
    """The lanes of an Engine over backend ``target`` and ``draft`` (each holding ``n``
    sequences), and the queue of generations waiting for one. ``head``: the draft's reduced
    output layer (each lane gets a sibling that follows its own conversation). ``plan``:
    the rounds' joint planner; ``on_pass``: told of every pass (:class:`Rounds`).
    ``deferred`` counts the generations that had to wait."""

    def __init__(self, target, draft, head: Optional["ReducedHead"], n: int = 1,
                 plan: Optional[Callable[[list], list]] = None,
                 on_pass: Optional[Callable] = None):
        if any(m is not None and len(m.sequences) < n for m in (target, draft)):
            raise InvalidParameterError("parallel", n, "at most the sequences the models were "
                                        "loaded with (ModelConfig.n_seq)")
        self.n = n
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

    def enter(self, job: Job, prompt: Sequence[int] = ()) -> Optional[Lane]:
        """Wait for a free lane for ``job``: the one whose target cache holds the longest part
        of ``prompt``, else the least recently used. None if the job was cancelled, or the
        lanes closed, first.

        Raises :class:`EngineBusyError` when the caller would wait for itself: every lane
        holds a stream that this very thread advanced and left open.
        """
        me = threading.get_ident()
        with self._cond:
            if len(self.owners) == self.n and all(
                    not o.advancing and o.consumer == me for o in self.owners.values()):
                raise EngineBusyError(
                    "this thread still has an unfinished stream on this Engine: read it to the "
                    "end or call its close() (or cancel()) before starting another generation")
            self._waiting.append(job)
            if len(self.owners) == self.n or len(self._waiting) > 1:
                self.deferred += 1
            try:
                while len(self.owners) == self.n or self._waiting[0] is not job:
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
                return lane
            finally:
                self._waiting.remove(job)
                self._cond.notify_all()   # whoever is now first in line may go

    def leave(self, lane: Lane) -> None:
        with self._cond:
            self.owners.pop(lane.index, None)
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
