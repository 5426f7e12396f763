"""The joint plan of a round's draft lengths (edgespec/drafting/batch.py), on hand-made costs:
it keeps a lone stream's own choice, never plans below plain batched decoding, and finds the
best plan a brute-force search over every combination finds (to within a hair)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgespec.drafting.batch import Ask, BatchCosts, expected_tokens, plan_round


def costs(one=0.030, per_row=0.0015, draft=0.008, draft_row=0.002, attention=0.0):
    """A target pass of n rows: one + per_row·(n-1); a draft pass over b streams:
    draft + draft_row·(b-1) (the shapes measured on these CPUs: rows are cheap next to the
    first)."""
    return BatchCosts(lambda n: one + per_row * (np.asarray(n, float) - 1), attention,
                      lambda b: draft + draft_row * (np.asarray(b, float) - 1))


def goodput(asks, ks, c):
    rows = np.array(ks) + 1
    steps = np.arange(1, max(ks) + 1) if max(ks) else np.array([], int)
    b = np.array([(np.array(ks) >= s).sum() for s in steps])
    seconds = float(np.sum(c.draft(b))) + float(c.target(rows.sum())) + \
        c.attention * float(rows @ np.array([a.position for a in asks]))
    return sum(expected_tokens(a)[k] for a, k in zip(asks, ks)) / seconds


def test_a_lone_stream_keeps_its_own_choice():
    ask = Ask(np.full(8, 0.9), cap=8, alone=5)
    assert plan_round([ask], costs()) == [5]


def test_drafts_that_are_never_accepted_are_not_planned():
    asks = [Ask(np.zeros(8), cap=8, alone=0) for _ in range(4)]
    assert plan_round(asks, costs()) == [0, 0, 0, 0]


def test_good_drafts_are_planned_and_a_bad_stream_decodes_plainly():
    asks = [Ask(np.full(8, 0.95), cap=8, alone=6), Ask(np.full(8, 0.95), cap=8, alone=6),
            Ask(np.full(8, 0.05), cap=8, alone=0)]
    ks = plan_round(asks, costs())
    assert ks[0] > 0 and ks[1] > 0 and ks[2] == 0


def test_a_draft_as_slow_as_the_target_is_not_planned():
    asks = [Ask(np.full(8, 0.8), cap=8, alone=0) for _ in range(4)]
    assert plan_round(asks, costs(draft=0.030, draft_row=0.01)) == [0, 0, 0, 0]


@pytest.mark.parametrize("seed", range(12))
def test_the_plan_is_as_good_as_a_brute_force_search_and_never_below_plain(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 4))
    asks = [Ask(np.minimum(0.99, rng.uniform(0, 1) * np.ones(5) + rng.uniform(-0.1, 0.1, 5)),
                cap=int(rng.integers(0, 6)), alone=0, position=int(rng.integers(0, 500)))
            for _ in range(n)]
    c = costs(one=rng.uniform(0.02, 0.04), per_row=rng.uniform(0.0005, 0.004),
              draft=rng.uniform(0.003, 0.02), draft_row=rng.uniform(0.0005, 0.005),
              attention=rng.uniform(0, 1e-6))
    ks = plan_round(asks, c, margin=0.0)
    best = max(goodput(asks, list(combo), c)
               for combo in itertools.product(*[range(a.cap + 1) for a in asks]))
    plain = goodput(asks, [0] * n, c)
    assert goodput(asks, ks, c) >= plain
    assert goodput(asks, ks, c) >= 0.97 * best
    assert all(0 <= k <= a.cap for k, a in zip(ks, asks))
