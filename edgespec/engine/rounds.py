"""Several streams on one Engine, their passes batched round by round: :class:`Rounds`.

Each stream's generation is the decoding loop as it is (Algorithm 1, one stream), advanced by
whichever thread reads that stream. Its models are :class:`StreamModel` views: the target's
and the draft's sequences that are this stream's cache. A view's ``eval`` does not call
llama.cpp at once: the request waits in the rounds, and when no member stream is computing
(each is waiting for a pass or a plan, or its reader has not asked for its next token), one
waiting thread makes one ``llama_decode`` for every request on one model, hands each its
rows, and all go on. When several kinds wait, plans come first (the draft lengths of a round
are chosen together: :mod:`edgespec.drafting.batch`), then a new stream's prompt (the target's
pass goes at once, with whatever verify rows already wait: a first token waits for no one's
drafts), then the draft model's steps, then the target's pass: the drafting streams finish
their drafts before the target's pass, which then holds every stream's verify rows, plain rows
and prompt chunks.

While the streams *take turns* (``turns()``: the batch gate measured that sharing passes
loses to running them one after another, :mod:`edgespec.drafting.gate`), a pass serves one
member only: the one whose turn it is plans alone, drafts and has its verify pass, and when
it asks for its next round the turn goes to the next member with a request; prompts still go
first. Each stream's rounds are then those it would run alone, so the streams together go as
fast as one after another, and none waits for another's whole answer for its first token.

Clients that send at once reach the Engine a few milliseconds apart (a server reads their
requests one by one), so a prompt pass that could fire waits while a stream is *arriving*
(submitted, its prompt being made ready, not yet joined): its prompt is then read in the same
pass rather than after the first's whole pass. The wait ends when the stream joins, when it
queues for a lane instead, and after at most half a prompt pass (``HOLD``, ``HOLD_MAX``).

A stream whose reader is away (between two tokens, or not reading) is *parked*: it holds no
one up, except for a short ``grace`` right after it parked, so that a reader only moving its
token along (a server writing it to a socket) joins the same pass. One pass is in flight at a
time (the cores are one resource). A member that leaves, or is cancelled while it waits, lets
the others go on at once.

Every pass runs on one thread of the rounds' own: llama.cpp's CPU backend computes a pass
with an OpenMP team of the calling thread, whose threads spin a while after it; passes from
several streams' threads keep several teams on the cores (Gemma 270M pair, 2 cores, two
streams taking turns: 6.5 s from their threads, 5.0 s from one, 3.5 s one after another).

The rows a pass returns are views of llama.cpp's buffer, valid until that model's next pass
(which waits for every member to wait again, i.e. to be done with its rows).
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

RUNNING, PARKED, WAITING = "running", "parked", "waiting"
GRACE = 0.002       # seconds a freshly parked member is waited for (a reader moving a token)
HOLD = 0.5          # of a prompt pass: the longest a prompt pass waits for streams arriving
HOLD_MAX = 0.05     # seconds: and never longer (a long prompt's chunks are slow passes)


@dataclass(eq=False)
class Member:
    """One stream's place in the rounds."""

    state: str = RUNNING
    since: float = field(default_factory=time.monotonic)    # when it parked
    cancelled: Callable[[], bool] = lambda: False
    prompting: bool = False     # its prompt is being evaluated (its passes go first)

    def enter(self, cancelled: Callable[[], bool]) -> None:
        """A generation takes this place (``cancelled``: its flag); its prompt goes first."""
        self.cancelled, self.prompting = cancelled, True

    def prompted(self) -> None:
        """Its prompt is read: its passes no longer go first."""
        self.prompting = False

    def compute(self) -> None:
        """Its stream computes (until it waits for a pass or parks)."""
        self.state = RUNNING

    def park(self) -> None:
        """Its reader has its token and is away (since now)."""
        self.state, self.since = PARKED, time.monotonic()

    def wait(self) -> None:
        """Its stream waits for a pass or a plan."""
        self.state = WAITING


@dataclass(eq=False)
class _Call:
    """A member's call waiting in the rounds: its part of a pass on ``model``, or its ask of
    the draft-length planner; answered with ``result`` (or ``error``) when ``done``."""

    member: Member
    model: Any                    # the backend model (its decode/decode_hidden), or "plan"
    part: tuple = ()              # (sequence, tokens, n_logits) or (sequence, tokens) hidden
    hidden: bool = False
    since: float = field(default_factory=time.monotonic)    # when it was asked
    done: bool = False
    result: Any = None
    error: Optional[BaseException] = None

    def answer(self, result: Any) -> None:
        """What its pass or plan gave it (done once :meth:`served`)."""
        self.result = result

    def fail(self, error: BaseException) -> None:
        self.error = error              # (the pass raised it: the request's caller raises it)

    def served(self) -> None:
        """Done: its stream computes from now on, though its thread has yet to wake."""
        self.done = True
        self.member.compute()


class Rounds:
    """The members' passes, batched (see the module docstring). ``models``: the backend models
    in the order their waiting passes go first (the draft's, then the target's). ``plan``:
    chooses the draft lengths of the members waiting to plan, from what each asked
    (``plan(asks) -> list of K``); None: each gets what it asked. ``on_pass``: told of every
    decoding pass (whether it was the target's, its rows, seconds and its parts' mean
    context); a pass holding a prompt's chunk is not told."""

    def __init__(self, models: Sequence[Any], plan: Optional[Callable[[list], list]] = None,
                 grace: float = GRACE,
                 on_pass: Optional[Callable[[bool, int, float, int], None]] = None):
        self.models = list(models)
        self._plan = plan
        # told of each pass: (the target's?, rows, seconds, mean context of its parts)
        self._on_pass = on_pass
        self.grace = grace
        self._cond = threading.Condition()
        # Streams on their way in (submitted, not yet joined): when each arrived. A prompt
        # pass holds for them, at most HOLD of the last prompt pass's seconds.
        self._arrivals: dict[object, float] = {}
        self._prompt_seconds = 0.02
        self._members: dict[Member, None] = {}     # (ordered: the order turns go in)
        # Whether the streams take turns now (the batch gate's regime); whose turn it is.
        self.turns: Callable[[], bool] = lambda: False
        self._turn: Optional[Member] = None
        self._turn_over = False
        self._queue: list[_Call] = []
        self._busy = False
        self.passes = 0                 # llama_decode calls made for several members
        self.prompt_passes = 0          # passes that held a prompt's tokens
        self.joins = 0                  # streams that joined
        # Tokens the streams committed, counted at the target's decoding passes: a stream's
        # pass starts where its last one committed (its cache holds its context but the
        # last token), so the difference between two starts is what that round committed.
        self.committed = 0
        self._starts: dict = {}         # sequence -> where its last decoding pass started
        self.rows_per_pass: list[int] = []
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="edgespec-pass")

    # -- membership -----------------------------------------------------------------------

    @contextlib.contextmanager
    def arriving(self) -> Iterator[object]:
        """A stream is on its way in (its prompt is being made ready): a prompt pass waits a
        moment for it (:meth:`_held`), until it joins or :meth:`arrived` says it will not
        come soon. Yields its key; an error inside ends the arrival."""
        key = object()
        with self._cond:
            self._arrivals[key] = time.monotonic()
        try:
            yield key
        except BaseException:
            self.arrived(key)
            raise

    def arrived(self, key: object) -> None:
        """The stream ``key`` names is no longer on its way (it joined, queues, or ended)."""
        with self._cond:
            if self._arrivals.pop(key, None) is not None:
                self._cond.notify_all()

    def join(self, member: Member, arrival: object = None) -> None:
        """``member``'s stream decodes from now on (it computes until it waits or parks);
        ``arrival``: its key from :meth:`arriving`."""
        with self._cond:
            member.compute()
            self._members[member] = None
            self._arrivals.pop(arrival, None)
            self.joins += 1

    def leave(self, member: Member) -> None:
        with self._cond:
            self._members.pop(member, None)
            if self._turn is member:
                self._turn = None
            self._queue = [r for r in self._queue if r.member is not member]
            self._cond.notify_all()

    def running(self, member: Member) -> None:
        """The member's reader asks for its next token: it computes again."""
        with self._cond:
            member.compute()

    def parked(self, member: Member) -> None:
        """The member's reader has its token and is away."""
        with self._cond:
            member.park()
            self._cond.notify_all()

    def close(self) -> None:
        """End the passes' thread (no member may be left)."""
        self._worker.shutdown(wait=True)

    def wake(self) -> None:
        """Let waiting members look at their cancel flags again."""
        with self._cond:
            self._cond.notify_all()

    def take_turns_when(self, turns: Callable[[], bool]) -> None:
        """The streams take turns while ``turns()`` says so (the batch gate's regime)."""
        self.turns = turns

    @property
    def size(self) -> int:
        return len(self._members)

    # -- calls ----------------------------------------------------------------------------

    def eval_part(self, member: Member, model, seq, tokens: Sequence[int], n_logits: int
                  ) -> np.ndarray:
        """``model.decode`` of this member's part, batched with the others'."""
        return self._wait(_Call(member, model, (seq, list(tokens), n_logits)))

    def eval_hidden_part(self, member: Member, model, seq, tokens: Sequence[int]
                         ) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """``model.decode_hidden`` of this member's part, batched: (its hidden state, None),
        or (None, its logits row) when the hidden state could not be read."""
        return self._wait(_Call(member, model, (seq, list(tokens)), hidden=True))

    def plan(self, member: Member, ask: Any) -> Any:
        """This member's draft length for the round, chosen with the others' (``ask``: what
        the planner needs of it)."""
        return self._wait(_Call(member, "plan", (ask,)))

    def _wait(self, call: _Call) -> Any:
        with self._cond:
            call.member.wait()
            self._queue.append(call)
            try:
                while not call.done:
                    if call.member.cancelled() and call in self._queue:     # (not in flight)
                        self._queue.remove(call)
                        self._cond.notify_all()
                        raise Cancelled()
                    timeout = self._ready()
                    if timeout == 0.0:
                        self._fire()
                    else:
                        self._cond.wait(timeout)
            finally:
                call.member.compute()
        if call.error is not None:
            raise call.error
        return call.result

    def _ready(self) -> Optional[float]:
        """0 when a pass may fire now; else how long to wait before looking again (None:
        until told)."""
        if self._busy or not self._queue:
            return None
        now, wait = time.monotonic(), None
        for m in self._members:
            if m.state == RUNNING:
                return None
            if m.state == PARKED and now - m.since < self.grace:
                left = self.grace - (now - m.since)
                wait = left if wait is None else min(wait, left)
        return self._held(now) if wait is None else wait

    def _held(self, now: float) -> float:
        """0, or how long a prompt pass that could fire now waits for the streams arriving:
        one that joins in time has its prompt read in the same pass instead of waiting for
        this one (several clients sending at once arrive a few milliseconds apart). At most
        HOLD of a prompt pass from when the oldest prompt asked, so that a stream caught
        saves more than the others wait."""
        if not self._arrivals or any(r.model == "plan" for r in self._queue):
            return 0.0      # (plans go before prompts)
        hold = min(HOLD * self._prompt_seconds, HOLD_MAX)
        self._arrivals = {k: t for k, t in self._arrivals.items() if now - t < hold}
        asked = [r.since for r in self._queue
                 if r.member.prompting and r.model is self.models[-1]]
        if not self._arrivals or not asked:
            return 0.0
        return max(0.0, min(asked) + hold - now)

    def _fire(self) -> None:
        """Serve one group of waiting requests (called holding the lock; the pass itself runs
        without it)."""
        queue = self._queue
        if self.turns() and len(self._members) > 1:
            queue = self._turn_queue()
        plans = [r for r in queue if r.model == "plan"]
        if plans:
            asks = [r.part[0] for r in plans]
            ks = self._plan(asks) if self._plan is not None else asks
            for r, k in zip(plans, ks):
                r.answer(k)
                r.served()          # it computes from here, before it wakes
            self._queue = [r for r in self._queue if r not in plans]
            self._cond.notify_all()
            return
        # A new stream's prompt goes first: its first token waits for no one's drafts.
        prompting = any(r.member.prompting and r.model is self.models[-1] for r in self._queue)
        if prompting:
            queue = self._queue         # (with the verify rows that wait, turn or not)
        model = self.models[-1] if prompting else \
            next(m for m in self.models if any(r.model is m for r in queue))
        group = [r for r in queue if r.model is model]
        hidden = [r for r in group if r.hidden]
        group = hidden or group         # a model's tapped and plain passes go apart
        self._queue = [r for r in self._queue if r not in group]
        self._busy = True
        self._cond.release()
        try:
            self._worker.submit(self._run, model, group).result()
        finally:
            self._cond.acquire()
            self._busy = False
            if model is self.models[-1]:
                self._pass_turn(group)
            for r in group:
                # Served: its stream computes from now on, though its thread has yet to
                # wake; no other pass may fire without its next request.
                r.served()
            self._cond.notify_all()

    def _turn_queue(self) -> list[_Call]:
        """The waiting requests of the member whose turn it is. A turn is one round: it ends
        when the holder, its target pass done, asks for the next (its work on the last one
        is then over: no stream's Python runs beside another's passes, which on a CPU would
        take a core from llama.cpp's threads), or when the holder has no request waiting;
        then the next member in joining order that has one takes it."""
        waiting = {r.member for r in self._queue}
        if self._turn not in waiting or self._turn_over:
            order = list(self._members)
            start = order.index(self._turn) + 1 if self._turn in self._members else 0
            nxt = [m for m in order[start:] + order[:start] if m in waiting]
            self._turn = nxt[0] if nxt else self._queue[0].member
            self._turn_over = False
        return [r for r in self._queue if r.member is self._turn]

    def _pass_turn(self, group: list[_Call]) -> None:
        """A target pass that held the holder's rows: its turn ends at its next request."""
        if self._turn is not None and any(r.member is self._turn for r in group):
            self._turn_over = True

    def _run(self, model, group: list[_Call]) -> None:
        context = sum(len(r.part[0].tokens) for r in group) // len(group)
        starts = [(r.part[0], len(r.part[0].tokens)) for r in group]
        t0 = time.perf_counter()
        try:
            if group[0].hidden:
                hidden = model.decode_hidden([r.part for r in group])
                rows = model.last_rows() if hidden is None else None
                for i, r in enumerate(group):
                    r.answer((hidden[i], None) if hidden is not None else (None, rows[i]))
            else:
                out = model.decode([r.part for r in group])
                for r, rows in zip(group, out):
                    r.answer(rows)
            rows = sum(len(r.part[1]) for r in group)      # the tokens the pass evaluated
            if len(group) > 1:
                self.passes += 1
            self.rows_per_pass.append(rows)
            del self.rows_per_pass[:-256]
            # Only decoding passes teach the costs (a prompt's chunk is another regime, and
            # its few logits are not its size).
            decoding = all(r.hidden or r.part[2] == len(r.part[1]) for r in group)
            if not decoding:
                self.prompt_passes += 1
                if model is self.models[-1]:
                    self._prompt_seconds = time.perf_counter() - t0
            if model is self.models[-1]:
                self._count(starts, decoding)
            if decoding and self._on_pass is not None:
                self._on_pass(model is self.models[-1], rows, time.perf_counter() - t0,
                              context)
        except BaseException as e:  # noqa: BLE001 - each request's caller raises it
            for r in group:
                r.fail(e)

    def _count(self, starts: list, decoding: bool) -> None:
        """Add what each stream committed since its last pass of the target (a prompt's
        pass starts the count of its stream afresh)."""
        for seq, start in starts:
            last = self._starts.get(seq)
            if decoding and last is not None and start > last:
                self.committed += start - last
            self._starts[seq] = start if decoding else None


class Cancelled(Exception):
    """A member's request was dropped because its stream was cancelled while it waited."""
