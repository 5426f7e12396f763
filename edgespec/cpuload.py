"""How many cores *other* processes use right now, measured rather than guessed from our own
step times.

On Linux the kernel's ``/proc/stat`` counts every core's busy time (including time a
hypervisor gave to other guests: ``steal``); ``os.times()`` counts this process's (all its
threads). Their difference over the last fraction of a second is the other processes' load,
in cores. The thread governors (threads.py) use it to tell a stall caused by another process
from a slow step on an idle machine, and calibration (drafting/calibration.py) to tell whether a
measurement was taken on a busy machine. Elsewhere (macOS, Windows) the meter says ``None``
and both fall back to step times alone.

Reading ``/proc/stat`` costs ~20 µs; a model step costs milliseconds.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Callable, Optional

# Other processes using fewer cores than this, on average, leave the machine quiet.
QUIET = 0.25

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat_busy() -> Optional[float]:
    """Seconds all cores were busy since boot (user, nice, system, irq, softirq, steal), or
    None where there is no /proc/stat."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != b"cpu" or len(fields) < 8:
        return None
    v = [int(x) for x in fields[1:9]]
    v += [0] * (8 - len(v))
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / _HZ


def _rate(busy: float, own: float, span: float) -> float:
    """Cores other processes used: all cores' busy seconds less ours, over ``span`` seconds."""
    return max(0.0, (busy - own) / span)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class CpuMeter:
    """Other processes' load in cores, averaged over the last ``window`` seconds of calls.

    ``others()`` samples on each call and answers from the samples of about the last
    ``window`` seconds: ``None`` until they span ``min_span`` seconds, or where the system
    does not say (no /proc/stat). ``read``/``own``/``clock`` are for tests."""

    def __init__(self, window: float = 0.5, min_span: float = 0.2,
                 read: Callable[[], Optional[float]] = _proc_stat_busy,
                 own: Callable[[], float] = _own_cpu,
                 clock: Callable[[], float] = time.monotonic):
        self.window, self.min_span = window, min_span
        self._read, self._own, self._clock = read, own, clock
        self._samples: deque = deque()
        self.available = read() is not None

    def sample(self) -> None:
        if not self.available:
            return
        busy = self._read()
        if busy is None:
            self.available = False
            return
        now = self._clock()
        s = self._samples
        s.append((now, busy, self._own()))
        # Keep the newest sample that is at least `window` old as the base.
        while len(s) > 2 and now - s[1][0] >= self.window:
            s.popleft()

    def others(self) -> Optional[float]:
        """Cores other processes used over about the last ``window`` seconds (≥ 0)."""
        self.sample()
        if not self.available or len(self._samples) < 2:
            return None
        (t0, b0, o0), (t1, b1, o1) = self._samples[0], self._samples[-1]
        span = t1 - t0
        if span < self.min_span:
            return None
        return _rate(b1 - b0, o1 - o0, span)


class LoadWatch:
    """Other processes' load over one stretch of work (a calibration): start it, do the
    work, read ``others()``. None where the system does not say."""

    def __init__(self, read: Callable[[], Optional[float]] = _proc_stat_busy,
                 own: Callable[[], float] = _own_cpu,
                 clock: Callable[[], float] = time.monotonic):
        self._read, self._own, self._clock = read, own, clock
        self._start = (clock(), read(), own())
        self.available = self._start[1] is not None

    def elapsed(self) -> float:
        """Seconds since the watch started."""
        return self._clock() - self._start[0]

    def others(self) -> Optional[float]:
        t0, b0, o0 = self._start
        b1 = self._read()
        if b0 is None or b1 is None:
            return None
        span = self._clock() - t0
        if span <= 0:
            return None
        return _rate(b1 - b0, self._own() - o0, span)
