"""The batch gate (edgespec/drafting/gate.py): several streams draft only while drafting
measures faster than plain batching. Pure logic: a simulated batch whose regimes commit
tokens at given rates, on a clock the test moves."""

from __future__ import annotations

import pytest

from edgespec.drafting.gate import MAX_INTERVAL, PLAIN, SPEC, BatchGate


class World:
    """``n`` streams whose passes take ``seconds[regime]`` and commit ``tokens[regime]``."""

    def __init__(self, n: int = 4, tokens=None, seconds=None):
        self.n, self.now, self.committed, self.prompts = n, 0.0, 0, 0
        self.tokens = tokens or {SPEC: 8, PLAIN: 4}
        self.seconds = seconds or {SPEC: 0.1, PLAIN: 0.04}
        self.gate = BatchGate(lambda: self.n, lambda: self.prompts, lambda: self.committed,
                              clock=lambda: self.now)
        self.regimes: list[str] = []

    def round(self, ask: bool = True) -> str:
        regime = (SPEC if self.gate.drafts() else PLAIN) if ask else SPEC
        self.now += self.seconds[regime]
        self.committed += self.tokens[regime]
        self.gate.passed()
        self.regimes.append(regime)
        return regime

    def share(self, regime: str, last: int) -> float:
        return self.regimes[-last:].count(regime) / last


def test_plain_batching_that_measures_faster_wins_and_drafting_is_looked_at_ever_less():
    w = World()     # spec 80 tok/s, plain 100 tok/s
    for _ in range(3000):
        w.round()
    assert w.gate.figure(4, SPEC).rate == pytest.approx(80.0)
    assert w.gate.figure(4, PLAIN).rate == pytest.approx(100.0)
    # Looking at the loser costs little once its interval has grown.
    assert w.share(PLAIN, 1000) > 0.93
    assert w.gate._interval[4] == MAX_INTERVAL
    assert w.gate.figure(4, SPEC).phases >= 3          # still looked at now and then


def test_drafting_that_measures_faster_wins():
    w = World(tokens={SPEC: 14, PLAIN: 4})      # spec 140 tok/s, plain 100
    for _ in range(2000):
        w.round()
    assert w.share(SPEC, 1000) > 0.9


def test_a_change_in_the_batch_is_followed():
    w = World()
    for _ in range(2000):
        w.round()
    assert w.regimes[-1] == PLAIN
    w.tokens[SPEC] = 16                             # the streams now draft well: 160 tok/s
    for _ in range(800):
        w.round()
    assert w.share(SPEC, 300) > 0.85


def test_one_stream_alone_is_never_gated_and_counts_are_kept_apart():
    w = World(n=1)
    assert all(w.round() == SPEC for _ in range(200))
    assert not any(f.phases for f in w.gate.figures.values())
    w.n = 2
    for _ in range(400):
        w.round()
    assert w.gate.figure(2, PLAIN).phases and w.gate.figure(2, SPEC).phases
    assert not w.gate.figure(4, SPEC).phases


def test_a_phase_with_a_prompts_pass_is_not_counted():
    w = World()
    for _ in range(5):
        w.round()
    w.prompts += 1          # a new stream's prompt went by: 8 passes, but the phase restarts
    for _ in range(3):
        w.round()
    assert not any(f.phases for f in w.gate.figures.values())
    for _ in range(3):
        w.round()
    assert w.gate.figure(4, SPEC).phases == 1


def test_a_phase_without_a_stream_that_could_draft_is_not_counted():
    w = World()
    for i in range(50):
        w.round(ask=False)          # plain requests only: nobody asked the gate
        if i == 20:
            w.now += 100.0
    assert not any(f.phases for f in w.gate.figures.values())
    for _ in range(20):
        w.round()
    assert w.gate.figure(4, SPEC).rate == pytest.approx(80.0)    # the idle stretch did not count
