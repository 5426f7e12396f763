"""How many CPU threads each model runs with, chosen while it runs.

llama.cpp's CPU threads spin at every graph barrier, so on a machine whose cores are busy with
other work one descheduled thread stalls the rest: a step can take many times longer with two
threads than with one (docs/decisions.md). No fixed count is right for both a quiet and a busy
machine, and the draft and the target need not agree, so each model gets a
:class:`ThreadGovernor` that watches its own steps:

* a step far slower than this model's recent best at the same thread count means the threads
  are stalling: drop to fewer threads at once;
* on fewer threads than it may use, it probes one more now and then (briefly, at growing
  intervals while probes fail) and keeps it when steps are faster there.

Where the system says how busy its cores are (Linux, :mod:`edgespec.cpuload`), the governor
also asks how many cores other processes use: when they crowd the cores its threads need, it
drops a thread before the first stall; a slow step while nobody else runs is not a stall (no
back-off); one more thread is probed only when a core is free for it, so under a heavy load
no probe sits in a stall; fewer threads are probed only when someone else runs.

Step times are compared per token of work: each step's seconds are divided by the calibrated
cost shape of its batch size (``shape(n)``, 1 for a one-token step), so prefill batches,
verify passes of different K and single draft steps all count. Pure logic: the caller times
the steps and applies the count (``llama_set_n_threads``).
"""

from __future__ import annotations

import math
import os
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from ..drafting.reduced_head import OneThreadBlas
from ..errors import InvalidParameterError
from ..cpuload import QUIET, CpuMeter

if TYPE_CHECKING:
    from ..lm import LoadedModel

# A step this many times slower than the best recent step at the same count is a stall.
STALL = 1.8
# A probe of another count is kept when it is at least this much faster per unit of work, and
# ended at its first step that is more than ABORT times slower (a stall: do not sit in it).
PROBE_GAIN = 0.9
ABORT = 2.0
PROBE_STEPS = 6
PROBE_FIRST = 4.0           # seconds of decoding before the first probe
PROBE_MAX = 16.0            # the longest wait between probes (it doubles while they fail)
# Steps in a row at the full count after which costs measured meanwhile describe it.
SETTLED_STEPS = 64
# One more thread is probed only when other processes leave this much of a core free for it;
# a thread is dropped at once, before any stall, when they crowd the cores by more than
# CROWDED of a core (on 2 cores and 2 threads: others use more than half a core).
ROOM = 0.7
CROWDED = 0.5


class ThreadGovernor:
    """One model's thread count (see the module docstring). ``observe`` is told each step's
    size and duration and returns the count to use from the next step on."""

    def __init__(self, max_threads: int, shape: Callable[[int], float] = lambda n: 1.0,
                 reference: Optional[float] = None,
                 others: Callable[[], Optional[float]] = lambda: None,
                 cores: Optional[int] = None):
        """``reference``: seconds per unit of work at ``max_threads`` measured on a quiet
        machine (calibration), so a machine that is busy from the first step is noticed.
        ``others``: cores other processes use now (:meth:`CpuMeter.others`), None where
        unknown; ``cores``: the machine's."""
        self.max_threads = max(1, max_threads)
        self._others = others
        self.cores = cores or os.cpu_count() or self.max_threads
        self.threads = self.max_threads
        self.shape = shape
        # Per thread count: a fast-moving average and the best recent level of seconds per
        # unit of work (the best fades upwards slowly, so an old quiet figure is forgotten).
        self._avg: dict[int, float] = {}
        self._best: dict[int, float] = {}
        if reference is not None and reference > 0:
            self._best[self.max_threads] = reference
        self._since_probe = 0.0
        self._probe_wait = PROBE_FIRST
        self._probe: Optional[list[float]] = None      # units measured while probing
        self._probe_from = 0
        self.backed_off = False     # ran below max_threads at least once because of stalls
        self.steady = 0             # steps in a row at max_threads (0 while below it)

    def observe(self, n_tokens: int, seconds: float) -> int:
        unit = seconds / max(self.shape(max(n_tokens, 1)), 1e-9)
        self.steady = self.steady + 1 if self.threads == self.max_threads else 0
        load = self._others()
        if self._probe is not None:
            self._probe.append(unit)
            here = self._avg.get(self._probe_from, math.inf)
            if unit > ABORT * here:
                self._end_probe(keep=False)
            elif len(self._probe) >= PROBE_STEPS:
                median = sorted(self._probe)[len(self._probe) // 2]
                self._end_probe(keep=median < PROBE_GAIN * here, median=median)
            return self.threads
        t = self.threads
        avg = self._avg.get(t)
        self._avg[t] = unit if avg is None else avg + 0.3 * (unit - avg)
        self._best[t] = min(unit, self._best.get(t, math.inf) * 1.002)
        quiet = load is not None and load < QUIET
        if t > 1 and (self._crowded(load) or (self._avg[t] > STALL * self._best[t]
                                  and unit > STALL * self._best[t] and not quiet)):
            self._move(t - 1)               # stalling: fewer threads, now
            self.backed_off = True
            return self.threads
        self._since_probe += seconds
        up = t < self.max_threads
        room = up and load is not None and load <= self.cores - t - ROOM
        # A core came free and no probe has failed since the last move: try it now rather
        # than after a wait (the load that made it back off has gone).
        if (self._since_probe >= self._probe_wait or (room and self._probe_wait == PROBE_FIRST)) \
                and self.max_threads > 1:
            # Try a neighbour: one more thread (the machine may have freed) when a core is
            # free for it, or, at the most, one fewer (the machine may have been busy since
            # the start) when someone else runs.
            if load is not None and (not room if up else quiet):
                self._since_probe = 0.0     # no room / nobody else: look again later
                return self.threads
            self._probe, self._probe_from = [], t
            self.threads = t + 1 if up else t - 1
        return self.threads

    def before(self) -> int:
        """The count for the step about to run (a prompt's batch too): one fewer, before any
        stall, when other processes crowd the cores these threads need."""
        if self._probe is None and self.threads > 1:
            if self._crowded(self._others()):
                self._move(self.threads - 1)
                self.backed_off = True
        return self.threads

    def _crowded(self, load: Optional[float]) -> bool:
        """Whether other processes' ``load`` leaves too little of the cores for these threads."""
        return load is not None and load > self.cores - self.threads + CROWDED

    @property
    def settled(self) -> bool:
        """Whether the last SETTLED_STEPS steps ran on every thread this model may use."""
        return self.steady >= SETTLED_STEPS

    def _move(self, t: int) -> None:
        self._avg.pop(self.threads, None)
        self.threads = t
        self._since_probe, self._probe_wait = 0.0, PROBE_FIRST

    def _end_probe(self, keep: bool, median: float = 0.0) -> None:
        self._probe = None
        self._since_probe = 0.0
        if keep:
            if self.threads < self._probe_from:
                self.backed_off = True
            self._avg[self.threads] = self._best[self.threads] = median
            self._probe_wait = PROBE_FIRST
        else:
            self.threads = self._probe_from
            self._probe_wait = min(2 * self._probe_wait, PROBE_MAX)


def govern(target: "LoadedModel", draft: Optional["LoadedModel"], costs=None,
           pin: Optional[int] = None, governors: Optional[dict] = None) -> dict:
    """Give each model (``draft`` may be None) a
    governor over the thread count it was loaded with (those in ``governors`` are taken
    back, with what they learned); or, with ``pin``, run both on that many threads and govern
    nothing. ``costs`` (:class:`~edgespec.drafting.Costs`, or None) gives the target's cost
    shape by batch size and both models' calibrated step costs."""
    out = {}
    meter = CpuMeter()          # one for both models: it only reads the system's counters
    for name, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        model.set_step_hooks(None, None)
        model.set_threads(pin or model.config.n_threads)
        if pin is not None:
            continue
        gov = (governors or {}).get(name)
        if gov is None:
            shape = reference = None
            if costs is not None:
                if model is target:
                    shape, reference = (
                        lambda n: costs.pass_seconds(n) / costs.pass_seconds(1),
                        costs.pass_seconds(1))
                else:
                    reference = costs.draft
            gov = ThreadGovernor(model.n_threads, shape or (lambda n: 1.0), reference,
                                 others=meter.others)
        else:
            model.set_threads(gov.threads)
        _attach(model, gov, shaped=name == "target" and costs is not None)
        out[name] = gov
    return out


class BlasHold:
    """numpy's BLAS held to one thread while any Engine is open (``acquire`` at load,
    ``release`` at close; the count it had comes back with the last close).

    OpenBLAS's threads keep spinning after a product, on the cores llama.cpp's threads need;
    the draft head already ran its own products on one thread
    (:class:`~edgespec.drafting.reduced_head.OneThreadBlas`), but putting the count back after
    each one left the pool awake for every other product (a verify, another stream's head)
    to spin it up again. Measured (Gemma 270M pair, 2 cores, two streams taking turns): every
    pass took 2-7 times as long, a draft step 19-67 ms instead of 9, until the count stayed
    at one. A host app's own BLAS work runs on one thread while an Engine is open."""

    _lock = threading.Lock()
    _holders = 0
    _before: list = []

    @classmethod
    def acquire(cls) -> None:
        with cls._lock:
            cls._holders += 1
            if cls._holders == 1:
                libs = OneThreadBlas.libraries()
                cls._before = [(lib, lib.get_num_threads()) for lib in libs]
                for lib in libs:
                    lib.set_num_threads(1)

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._holders = max(0, cls._holders - 1)
            if cls._holders == 0:
                for lib, n in cls._before:
                    lib.set_num_threads(n)
                cls._before = []


class EngineThreads:
    """An Engine's thread counts: a governor per model that follows the machine's load
    (``adaptive``), or a count the caller pinned; pinned governors are kept, so that letting
    them follow again resumes what they knew."""

    def __init__(self, target: "LoadedModel", draft: Optional["LoadedModel"], costs,
                 adaptive: bool):
        self.target, self.draft, self.costs = target, draft, costs
        self.governors = govern(target, draft, costs) if adaptive else {}
        self._parked = self.governors

    def pin(self, n_threads: Optional[int]) -> None:
        """Both models on ``n_threads`` threads, or (None) following the load again."""
        limit = self.target.config.n_threads
        if n_threads is not None and (not isinstance(n_threads, int) or isinstance(
                n_threads, bool) or not 1 <= n_threads <= limit):
            raise InvalidParameterError("n_threads", n_threads,
                                        f"None or an integer in [1, {limit}] for this Engine")
        self.governors = govern(self.target, self.draft, self.costs, pin=n_threads,
                                governors=self._parked)
        self._parked = self.governors or self._parked

    @property
    def settled(self) -> bool:
        """Whether every governor ran its last steps at its full count."""
        return all(g.settled for g in self.governors.values())

    def describe(self) -> dict:
        return {"target": self.target.n_threads,
                "draft": self.draft.n_threads if self.draft is not None else None,
                "max": self.target.config.n_threads, "adaptive": bool(self.governors),
                "backed_off": any(g.backed_off for g in self.governors.values())}


def _attach(model: "LoadedModel", gov: ThreadGovernor, shaped: bool, longest: int = 64) -> None:
    """Only steps a governor can compare feed it: one-token steps, and with a cost shape
    verify passes (logits on every row, as calibrated) up to ``longest`` tokens; prompt
    batches, with no logits, cost far less per token and would look like a lost speed."""
    def on_step(n_tokens: int, n_logits: int, seconds: float) -> int:
        if n_tokens == 1 or (shaped and n_logits == n_tokens <= longest):
            return gov.observe(n_tokens, seconds)
        return gov.threads
    model.set_step_hooks(on_step, gov.before)


@contextmanager
def governors_suspended(*models: Optional["LoadedModel"]) -> Iterator[None]:
    """Run ``models`` on every thread they were loaded with, unseen by their governors (a
    calibration measures the machine itself, and a governor that backed off in a busy spell
    must not skew it), then hand the governors back their hooks and thread counts. With
    :func:`govern`, the only code that sets the models' step hooks."""
    saved = [(m, m.on_step, m.before_step, m.n_threads) for m in models if m is not None]
    for m, _, _, _ in saved:
        m.set_step_hooks(None, None)
        m.set_threads(m.config.n_threads)
    try:
        yield
    finally:
        for m, after, before, n in saved:
            m.set_step_hooks(after, before)
            m.set_threads(n)
