"""The thread governor's decisions, on step times shaped like those measured on 2 cores
(pure logic: the real runs are in `edgespec bench --load`)."""

from __future__ import annotations

import numpy as np

from edgespec.engine.threads import ThreadGovernor

# Seconds per one-token step of the Gemma F32 target (docs/decisions.md): idle, 2 threads
# 45 ms and 1 thread 52 ms; one busy process on the other core, 2 threads 127 ms (stalls at
# barriers) and 1 thread 57 ms.
IDLE = {2: 0.045, 1: 0.052}
BUSY = {2: 0.127, 1: 0.057}


def run(gov: ThreadGovernor, phases, seed=0):
    """Feed steps; phases: [(seconds of decoding, {threads: step seconds})]. Returns the thread
    count of each step and the total time."""
    rng = np.random.default_rng(seed)
    used, total = [], 0.0
    for duration, cost in phases:
        spent = 0.0
        while spent < duration:
            t = gov.threads
            step = cost[t] * rng.lognormal(0, 0.08)
            used.append(t)
            gov.observe(1, step)
            spent += step
            total += step
    return used, total


def test_an_idle_machine_keeps_every_thread():
    gov = ThreadGovernor(2)
    used, total = run(gov, [(60, IDLE)])
    assert np.mean(np.array(used) == 2) > 0.97
    assert total <= 60.5 and not gov.backed_off
    assert len(used) >= 0.98 * (60 / IDLE[2])        # ≥ 98% of the pinned count's steps


def test_a_busy_core_drops_a_thread_at_once_and_comes_back_when_it_frees():
    gov = ThreadGovernor(2)
    used, _ = run(gov, [(10, IDLE), (30, BUSY), (40, IDLE)])
    n1 = int(10 / IDLE[2])
    busy = used[n1:n1 + int(30 / BUSY[1])]
    assert 2 not in busy[5:30]                          # backed off within a few steps
    assert np.mean(np.array(busy) == 1) > 0.95
    assert gov.backed_off
    assert used[-50:].count(2) >= 45                    # back to 2 once the machine freed


def test_busy_from_the_start_finds_fewer_threads_by_probing():
    gov = ThreadGovernor(2)
    used, total = run(gov, [(60, BUSY)])
    assert np.mean(np.array(used[len(used) // 4:]) == 1) > 0.95
    pinned_1 = 60 / BUSY[1]
    assert len(used) > 0.9 * pinned_1                    # close to the best pinned count


def test_probing_up_into_a_stall_costs_one_step():
    gov = ThreadGovernor(2)
    run(gov, [(5, IDLE), (5, BUSY)])
    assert gov.threads == 1
    stall = {2: 3.0, 1: 0.057}                          # a heavily loaded machine
    used, total = run(gov, [(120, stall)])
    assert used.count(2) <= 8                           # probes end at their first stall step
    assert total < 120 + 8 * 3.0


# --- with the machine's load known (Linux /proc/stat; edgespec/cpuload.py) -------------------

class Load:
    """Other processes' cores, as the governor's meter would report them."""

    def __init__(self, cores: float):
        self.cores = cores

    def __call__(self) -> float:
        return self.cores


def run_loaded(gov: ThreadGovernor, load: Load, phases, seed=0):
    """run(), with each phase's other load: [(seconds, {threads: step seconds}, others)]."""
    used, total = [], 0.0
    starts = []                          # where each phase's steps begin in `used`
    for i, (duration, cost, others) in enumerate(phases):
        load.cores = others
        starts.append(len(used))
        u, t = run(gov, [(duration, cost)], seed=seed + i)
        used += u
        total += t
    run_loaded.starts = starts
    return used, total


def test_slow_steps_while_nobody_else_runs_are_not_a_stall():
    # Without the load, a stretch of slow steps (page faults, a cold cache, the hypervisor)
    # looks like a stall and costs a thread; with it, nobody else runs: keep both threads.
    hiccup = {2: 0.110, 1: 0.120}
    blind = ThreadGovernor(2)
    used_blind, _ = run(blind, [(5, IDLE), (3, hiccup), (20, IDLE)])
    assert blind.backed_off and 1 in used_blind             # the negative control
    load = Load(0.0)
    gov = ThreadGovernor(2, others=load, cores=2)
    used, _ = run_loaded(gov, load, [(5, IDLE, 0.02), (3, hiccup, 0.05), (20, IDLE, 0.02)])
    assert set(used) == {2} and not gov.backed_off          # no probe down on a quiet machine


def test_under_heavy_load_no_probe_sits_in_a_stall_and_the_free_machine_is_seen():
    load = Load(0.0)
    gov = ThreadGovernor(2, others=load, cores=2)
    stall = {2: 3.0, 1: 0.057}
    used, total = run_loaded(gov, load, [(5, IDLE, 0.0), (120, stall, 1.6), (30, IDLE, 0.0)])
    n_idle, freed = run_loaded.starts[1:]
    loaded = used[n_idle:freed]
    assert loaded[:3].count(2) <= 2 and loaded[3:].count(2) == 0    # one stall, no probes
    assert gov.backed_off and used[-50:].count(2) >= 45            # back once it freed
    assert 2 in used[freed:freed + 10]             # at once: no wait of seconds for a probe
    blind = ThreadGovernor(2)                                        # the negative control
    blind_used, _ = run(blind, [(5, IDLE), (120, stall)])
    assert blind_used[n_idle + 3:].count(2) > loaded[3:].count(2)


def test_busy_from_the_start_with_the_load_known_probes_down():
    load = Load(1.0)
    gov = ThreadGovernor(2, others=load, cores=2)
    used, _ = run_loaded(gov, load, [(60, BUSY, 1.0)])
    assert np.mean(np.array(used[len(used) // 4:]) == 1) > 0.95


def test_a_crowded_machine_costs_no_stall_at_all():
    # Others already use a core when decoding starts: one thread from the first step on.
    load = Load(1.0)
    gov = ThreadGovernor(2, others=load, cores=2)
    used, _ = run_loaded(gov, load, [(30, BUSY, 1.0)])
    assert used[0] == 2 and set(used[1:]) == {1}
    # Half a core of someone else, with both our threads running, is not crowded.
    load2 = Load(0.4)
    gov2 = ThreadGovernor(2, others=load2, cores=2)
    used2, _ = run_loaded(gov2, load2, [(30, IDLE, 0.4)])
    assert np.mean(np.array(used2) == 2) > 0.97


def test_a_prompt_batch_on_a_crowded_machine_starts_on_fewer_threads():
    load = Load(2.0)                     # two busy processes took both cores while we waited
    gov = ThreadGovernor(2, others=load, cores=2)
    assert gov.before() == 1 and gov.backed_off     # before the first step, not after it
    quiet = ThreadGovernor(2, others=Load(0.05), cores=2)
    assert quiet.before() == 2 and not quiet.backed_off
    assert ThreadGovernor(2).before() == 2          # no meter: step times decide
