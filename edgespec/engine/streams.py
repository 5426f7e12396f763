"""Generation handles, and how generations on one Engine share it.

An Engine's models hold ``streams`` sequences each (one pair of KV caches per lane). Each
generation is a :class:`Stream` over a generator that the Engine writes. The generation waits
for a free lane at the Engine's :class:`~.lanes.Lanes` (first come, first served) when
the stream is first advanced, keeps that lane while it is open, and gives it back when it
ends: after its last token, or when it is cancelled, closed or dropped. The generations in
lanes decode together, their passes batched (:mod:`.rounds`): while a stream's reader
is away it holds nobody up.

Ownership is arranged so that dropping a stream ends it at once: the :class:`Stream` owns the
generator and a :class:`Job`; the generator knows the Job; the Job knows the generator only
weakly. Nothing refers back to the Stream, so in CPython the last reference going away closes
the generator there and then (not at some later garbage collection), and its ``finally`` trims
the caches and hands the turn on.

Threads: a stream may be advanced from any thread (one at a time), and cancelled or closed
from any other. ``cancel()`` never blocks; ``close()`` waits at most for the step in progress.
:class:`AsyncStream` runs a stream in a thread of its own and hands its events to an asyncio
event loop.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any, Callable, Generator, Optional



class Job:
    """The state a :class:`Stream` and its generator share.

    ``result`` is the finished Generation (set by the generator); ``error`` the exception
    that ended it instead (then ``result`` stays None). ``cancelled`` is this
    generation's own flag: a cancel aimed at one generation can never stop another.
    ``step`` is held while a thread advances the generator, so that a close from another
    thread waits for the step in progress instead of racing it.
    """

    def __init__(self, lanes, cancelled_result: Any, arrival: object = None):
        self.lanes = lanes
        self.arrival = arrival          # its key while on its way in (Rounds.arriving)
        self.cancelled = threading.Event()
        self.step = threading.Lock()
        self.advancing = False                 # a thread is inside next() right now
        self.consumer: Optional[int] = None    # the thread that advanced it last
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.cancelled_result = cancelled_result   # the result if it never gets to run
        self.generator: Optional[weakref.ref] = None
        # Its place in the batched passes while it holds a slot: told when its reader asks
        # for a token and when it has it (edgespec.engine.rounds); None outside a slot.
        self.on_advance: Optional[Callable[[bool], None]] = None

    def attach(self, events: Generator) -> None:
        """``events`` is the generator this job's stream advances (known weakly)."""
        self.generator = weakref.ref(events)

    def report_advances(self, on_advance: Optional[Callable[[bool], None]]) -> None:
        """Tell ``on_advance`` when the reader asks for a token (True) and when it has it
        (False): the job's place in the batched passes while it holds a lane; None: no
        one is told."""
        self.on_advance = on_advance

    def begin_advance(self) -> None:
        """A thread (this one) goes inside ``next()``."""
        self.advancing = True
        self.consumer = threading.get_ident()
        if self.on_advance is not None:
            self.on_advance(True)

    def end_advance(self) -> None:
        """The thread inside ``next()`` came out (a token, the end, or an error)."""
        self.advancing = False
        if self.on_advance is not None:
            self.on_advance(False)

    def finish(self, result: Any) -> None:
        """The generation ended with ``result`` (a Generation)."""
        self.result = result

    def fail(self, error: BaseException) -> None:
        """The generation ended with ``error`` (raised to whoever advanced it) instead."""
        self.error = error

    def cancel(self) -> None:
        """Stop this generation; never blocks.

        Queued: it leaves the queue. Between steps: it is closed now (caches trimmed, turn
        handed on). Inside a step in another thread: that step ends it at its next token.
        """
        self.cancelled.set()
        self.lanes.wake()
        if self.step.acquire(blocking=False):
            try:
                self._close_generator()
            finally:
                self.step.release()

    def close(self) -> None:
        """Stop this generation and wait (at most one step) until it has let go of the caches."""
        self.cancelled.set()
        self.lanes.wake()
        with self.step:
            self._close_generator()

    def _close_generator(self) -> None:
        gen = self.generator() if self.generator is not None else None
        if gen is not None:
            gen.close()
        if self.result is None and self.error is None:     # closed before it ever ran
            self.result = self.cancelled_result


class Stream:
    """Iterator of :class:`~edgespec.results.StreamEvent`; ``result`` holds the
    :class:`~edgespec.results.Generation` once it has ended (None if it ended with an error:
    the exception was raised to whoever advanced it, and ``error`` keeps it).

    The generation waits for its turn when first advanced. ``cancel()`` (any thread, never
    blocks) and ``close()`` (any thread, waits at most one step) stop it; so does dropping the
    last reference to it. Either way the caches are left holding exactly what was generated,
    and ``result.finish_reason`` is ``"cancelled"``. Usable as a context manager.
    """

    def __init__(self, job: Job, events: Generator):
        self._job = job
        self._events = events
        job.attach(events)

    @property
    def result(self):
        return self._job.result

    @property
    def error(self) -> Optional[BaseException]:
        return self._job.error

    @property
    def cancelled(self) -> bool:
        return self._job.cancelled.is_set()

    def __iter__(self) -> "Stream":
        return self

    def __next__(self):
        job = self._job
        with job.step:
            job.begin_advance()
            try:
                return next(self._events)
            finally:
                job.end_advance()

    def cancel(self) -> None:
        self._job.cancel()

    def close(self) -> None:
        self._job.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_END = object()


class AsyncStream:
    """An asyncio face of a :class:`Stream`: ``async for event in engine.astream(...)``.

    The generation runs in a thread of its own, started by the first ``__anext__``, so the
    event loop never blocks on llama.cpp. ``cancel()`` stops it within one step without
    blocking; ``aclose()`` also waits until it has let go of the caches. Leaving an
    ``async for`` early, or dropping the object, cancels the generation.
    """

    def __init__(self, stream: Stream):
        self._stream = stream
        self._queue: Optional[asyncio.Queue] = None
        self._done = False

    @property
    def result(self):
        return self._stream.result

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        if self._queue is None:
            self._start()
        item = await self._queue.get()
        if item is _END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        self._queue = queue
        stream = self._stream

        def pump() -> None:
            end: Any = _END
            try:
                for event in stream:
                    loop.call_soon_threadsafe(queue.put_nowait, event)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, who raises it
                end = e
            finally:
                stream.cancel()   # a no-op after the end; frees the Engine if the loop is gone
            try:
                loop.call_soon_threadsafe(queue.put_nowait, end)
            except RuntimeError:
                pass   # the loop is gone: nobody is listening any more

        threading.Thread(target=pump, name="edgespec-astream", daemon=True).start()

    def cancel(self) -> None:
        self._stream.cancel()

    async def aclose(self) -> None:
        """Cancel and wait until the generation has ended."""
        self._stream.cancel()
        if self._queue is None or self._done:
            return
        while True:
            item = await self._queue.get()
            if item is _END or isinstance(item, BaseException):
                self._done = True
                return

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def __del__(self):
        if not self._done:
            self._stream.cancel()
