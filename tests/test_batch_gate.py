"""The batch gate (edgespec/drafting/gate.py): several streams draft only while drafting
measures faster than plain batching. Pure logic: a simulated batch whose regimes commit
tokens at given rates, on a clock the test moves."""

from __future__ import annotations

import pytest

from edgespec.drafting.gate import MAX_INTERVAL, PLAIN, SPEC, TURNS, BatchGate


class World:
    """``n`` streams whose passes take ``seconds[regime]`` and commit ``tokens[regime]``."""

    def __init__(self, n: int = 4, tokens=None, seconds=None):
        self.n, self.now, self.committed, self.prompts = n, 0.0, 0, 0
        # (taking turns: one stream's round of 4 tokens a pass, 70 tok/s)
        self.tokens = {SPEC: 8, PLAIN: 4, TURNS: 4, **(tokens or {})}
        self.seconds = {SPEC: 0.1, PLAIN: 0.04, TURNS: 4 / 70, **(seconds or {})}
        self.gate = BatchGate(lambda: self.n, lambda: self.prompts, lambda: self.committed,
                              clock=lambda: self.now)
        self.regimes: list[str] = []

    def round(self, ask: bool = True) -> str:
        if ask:         # (a stream's drafter asks; the rounds see whether it is turns)
            drafts = self.gate.drafts()
            regime = TURNS if self.gate.turns() else SPEC if drafts else PLAIN
        else:
            regime = SPEC
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
    assert w.gate._interval[(4, SPEC)] == w.gate._interval[(4, TURNS)] == MAX_INTERVAL
    assert w.gate.figure(4, SPEC).phases >= 3          # still looked at now and then
    assert w.gate.figure(4, TURNS).phases >= 3


def test_drafting_that_measures_faster_wins():
    w = World(tokens={SPEC: 14, PLAIN: 4})      # spec 140 tok/s, plain 100
    for _ in range(2000):
        w.round()
    assert w.share(SPEC, 1000) > 0.9


def test_taking_turns_wins_when_neither_way_of_sharing_passes_beats_it():
    # A CPU whose cores one stream's passes already fill: batching adds rows that cost what
    # they save. Running the streams in turn (one after another's speed) is kept, and the
    # rounds are told so (Rounds.turns).
    w = World(tokens={TURNS: 6})            # turns 105 tok/s, plain 100, spec 80
    for _ in range(3000):
        w.round()
    assert w.gate.figure(4, TURNS).rate == pytest.approx(105.0)
    assert w.share(TURNS, 1000) > 0.9 and w.gate.turns()
    w.n = 1                                 # a stream alone: never gated, never in turns
    assert not w.gate.turns() and w.gate.drafts()


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
    # Its rate is measured (what the streams would get taking turns), nothing else.
    assert [k for k, f in w.gate.figures.items() if f.phases] == [(1, SPEC)]
    assert w.gate.lone() == pytest.approx(80.0)
    w.n = 2
    for _ in range(400):
        w.round()
    assert w.gate.figure(2, PLAIN).phases and w.gate.figure(2, SPEC).phases
    assert not w.gate.figure(2, TURNS).phases       # judged by the lone rate: not explored
    assert not w.gate.figure(4, SPEC).phases


def test_turns_are_judged_by_the_rate_of_a_stream_alone():
    # Measured alone, a stream commits 120 tok/s; batched, spec 80 and plain 100. A phase of
    # turns measures itself low (it starts and ends mid-turn: here 60), so the lone rate
    # judges it: four streams take turns, and the others are looked at now and then.
    w = World(n=1, tokens={SPEC: 12})
    for _ in range(200):
        w.round()
    assert w.gate.lone() == pytest.approx(120.0)
    w.n, w.tokens[SPEC], w.seconds[TURNS] = 4, 8, 4 / 60
    for _ in range(3000):
        w.round()
    assert w.share(TURNS, 1000) > 0.9 and w.gate.turns()
    assert w.gate.figure(4, SPEC).phases >= 3 and w.gate.figure(4, PLAIN).phases >= 3


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
