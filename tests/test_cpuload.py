"""The CPU meter: other processes' load in cores (edgespec/cpuload.py). The arithmetic on
hand-made counters; the real counters against busy processes this test starts and ends."""

from __future__ import annotations

import os
import time

import pytest

from edgespec.bench.load import BusyProcesses
from edgespec.cpuload import CpuMeter, LoadWatch, _proc_stat_busy


class Counters:
    """A machine whose cores' busy seconds, this process's CPU seconds and clock the test sets."""

    def __init__(self):
        self.t = self.busy = self.own = 0.0

    def advance(self, seconds: float, others: float, own: float) -> None:
        self.t += seconds
        self.own += own * seconds
        self.busy += (others + own) * seconds


def test_the_meter_subtracts_this_process_and_answers_over_its_window():
    c = Counters()
    meter = CpuMeter(window=0.5, min_span=0.2, read=lambda: c.busy, own=lambda: c.own,
                     clock=lambda: c.t)
    assert meter.others() is None                   # one sample: no span yet
    c.advance(0.1, others=1.0, own=2.0)
    assert meter.others() is None                   # 0.1 s < min_span
    for _ in range(10):
        c.advance(0.1, others=1.0, own=2.0)
        meter.sample()
    assert meter.others() == pytest.approx(1.0)     # our two spinning threads do not count
    for _ in range(10):                             # the other process ended 1 s ago
        c.advance(0.1, others=0.0, own=1.0)
        meter.sample()
    assert meter.others() == pytest.approx(0.0, abs=1e-9)


def test_without_system_counters_the_meter_says_nothing():
    meter = CpuMeter(read=lambda: None)
    assert not meter.available and meter.others() is None
    assert LoadWatch(read=lambda: None).others() is None


needs_proc = pytest.mark.skipif(_proc_stat_busy() is None, reason="no /proc/stat here")


@needs_proc
def test_the_meter_sees_real_busy_processes_and_not_our_own_work():
    with BusyProcesses(1) as busy:
        watch = LoadWatch()
        meter = CpuMeter()
        t0, cpu0 = time.monotonic(), sum(os.times()[:2])
        end = t0 + 0.8
        x = 0
        while time.monotonic() < end:               # this process spins too: not counted
            x += 1
            meter.sample()
        own = (sum(os.times()[:2]) - cpu0) / (time.monotonic() - t0)   # cores we used
        seen, whole = meter.others(), watch.others()
        assert busy.pids
    # The spinning process is seen, whatever else this machine runs (it gets a fair share of
    # the cores); and others plus our own use never exceed the machine, which they would by
    # our own share if our spinning were counted as someone else's.
    cores = os.cpu_count()
    assert whole >= 0.3 and seen >= 0.3, (whole, seen)
    assert whole + own <= cores + 0.25 and seen + own <= cores + 0.25, (whole, seen, own)
