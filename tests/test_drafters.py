"""Draft-length policies (pure logic, hand-made costs) and the n-gram drafter."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.config import SamplingParams
from edgespec.drafters import AdaptiveLength, Costs, FixedLength, NgramDrafter
from edgespec.sampling import Dist, residual

# Per-call costs measured on this kind of machine (../shared/docs/pitfalls.md, seconds).
GEMMA = {1: 0.0394, 4: 0.0551, 8: 0.0739, 16: 0.1027, 33: 0.17}, 0.0139   # F32 + Q4_K_M
# The same pair measured on a slower draft day (draft 0.48 of a target pass): it pays only at
# high acceptance, not at the policy's prior.
GEMMA_SLOW_DRAFT = ({1: 0.0296, 2: 0.0449, 4: 0.0504, 8: 0.0669, 16: 0.095, 33: 0.1624},
                    0.0141)
SMOL_F16 = {1: 0.0102, 4: 0.0234, 8: 0.0312, 16: 0.0461, 33: 0.08}, 0.0095  # F16 + Q4_1


def simulate(costs, acceptance, rounds=600, fixed=None, seed=0):
    """Tokens per second of a policy when draft i is accepted with acceptance(round, conf)."""
    target, draft = costs
    c = Costs(dict(target), draft)
    pol = AdaptiveLength(c, k_max=32) if fixed is None else FixedLength(fixed)
    rng = np.random.default_rng(seed)
    tokens = seconds = 0.0
    per_round = []
    for r in range(rounds):
        K = pol.plan()
        confs = []
        for i in range(K):
            conf = rng.uniform(0.05, 1.0)
            if not pol.keep_drafting(i, conf):
                break
            confs.append(conf)
        n = 0
        while n < len(confs) and rng.random() < acceptance(r, confs[n]):
            n += 1
        dt = len(confs) * draft + c.t(len(confs) + 1)
        tokens += n + 1
        seconds += dt
        pol.observe(len(confs), n, confs, [draft] * max(0, len(confs) - 1), dt - len(confs) * draft)
        per_round.append(len(confs))
    simulate.policy = pol
    return tokens / seconds, per_round


@pytest.mark.parametrize("costs", [GEMMA, SMOL_F16])
@pytest.mark.parametrize("alpha", [0.99, 0.9, 0.7, 0.5])
def test_adaptive_is_close_to_the_best_fixed_k(costs, alpha):
    rate, _ = simulate(costs, lambda r, c: alpha)
    best = max(simulate(costs, lambda r, c: alpha, fixed=k)[0] for k in (0, 1, 2, 4, 8, 16, 32))
    assert rate >= 0.95 * best


def test_falls_back_to_plain_when_drafting_cannot_pay():
    rate, ks = simulate(SMOL_F16, lambda r, c: 0.9)        # draft costs ~ the target
    plain = 1 / SMOL_F16[0][1]
    assert rate >= 0.95 * plain
    assert sum(k == 0 for k in ks[100:]) > 0.95 * len(ks[100:])


def test_recovers_when_acceptance_rises():
    rate, ks = simulate(GEMMA, lambda r, c: 0.05 if r < 300 else 0.99, rounds=900)
    assert sum(ks[200:300]) < 30                            # gave up while drafts failed
    assert np.mean(ks[-200:]) > 3                           # drafting again afterwards


def test_confidence_gate_learns_which_drafts_fail():
    # Drafts are accepted only when the draft is confident: the gate must learn that.
    accept = lambda r, c: 0.99 if c > 0.3 else 0.1
    rate, ks = simulate(GEMMA, accept)
    pol = simulate.policy
    assert pol._acceptance_at(0.15) < 0.5 and pol._acceptance_at(0.9) > 0.9
    best = max(simulate(GEMMA, accept, fixed=k)[0] for k in (0, 1, 2, 4, 8))
    assert rate >= 0.95 * best


def test_fixed_length_cuts_on_top_probability():
    pol = FixedLength(8, p_min=0.5)
    assert pol.plan() == 8
    assert pol.keep_drafting(0, 0.6) and not pol.keep_drafting(1, 0.4)


def test_cutoff_on_the_drawn_tokens_probability_would_be_biased():
    """Why the stop rule may look only at q, never at the drawn x (drafters.py docstring).

    p = (0.5, 0.5), q = (0.9, 0.1); stopping whenever the drawn x has q(x) < 0.5 and letting
    the target sample that position itself gives P(token 0) = 0.55, not p(0) = 0.5.
    """
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    r = residual(Dist(None, p), Dist(None, q), 2).dense(2)
    out = np.zeros(2)
    for x in range(2):
        if q[x] < 0.5:                      # cut: the target samples from p
            out += q[x] * p
        else:                               # Algorithm 1 on x
            a = min(1.0, p[x] / q[x])
            out[x] += q[x] * a
            out += q[x] * (1 - a) * r
    assert out[0] == pytest.approx(0.55)


def test_ngram_lookup_finds_the_latest_longest_match():
    d = NgramDrafter(ngram_min=1, ngram_max=3)
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert d.lookup(ctx, 3) == [7, 8, 5]      # [2, 3] last seen before 7
    assert d.last_match == 2
    assert d.lookup([4, 5, 6], 4) == []
    x, q = d.draft([1, 2, 1, 2, 1], 2, SamplingParams(), np.random.default_rng(0), FixedLength(2))
    assert x == [2, 1] and all(qi.prob(xi) == 1.0 for xi, qi in zip(x, q))


class _Recorder:
    """A length policy that records what it is told (pure logic, for HybridPolicy routing)."""

    def __init__(self, k):
        self.k, self.observed, self.rested, self.asked = k, [], 0, 0

    def plan(self):
        return self.k

    def keep_drafting(self, i, confidence):
        self.asked += 1
        return True

    def observe(self, *args):
        self.observed.append(args[:2])

    def rest(self):
        self.rested += 1


class _FakeModelDrafter:
    """Proposes token 7 repeatedly; stands in for the draft model in pure routing tests."""

    def __init__(self):
        self.seconds, self.step_seconds, self.confidences = 0.0, [], []
        self.catch_up_cost = None
        self.extended = 0

    def lag(self, context):
        return 1

    def draft(self, context, k, params, rng, policy, extend=None):
        x = []
        for i in range(k):
            if not policy.keep_drafting(i, 0.9):
                break
            x.append(7)
        self.confidences = [0.9] * len(x)
        return x, [Dist.one_hot(t) for t in x]

    def rollback(self, n_keep):
        pass


def test_hybrid_policy_routes_each_source_to_its_own_policy():
    from edgespec.drafters import HybridDrafter, HybridPolicy
    model, ngram = _Recorder(3), _Recorder(6)
    pol = HybridPolicy(model, ngram)
    hyb = HybridDrafter(_FakeModelDrafter())
    rng, params = np.random.default_rng(0), SamplingParams()

    assert pol.plan() == 6
    x, _ = hyb.draft([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], 16, params, rng, pol)
    assert x == [4, 5, 6, 7, 8, 9] and pol.active is ngram      # n-gram, capped by its plan
    pol.observe(len(x), 2, [], [], 0.01)
    assert ngram.observed == [(6, 2)] and model.observed == [] and model.rested == 1

    pol.plan()
    x, _ = hyb.draft([1, 2, 3, 4], 16, params, rng, pol)        # no match: the model drafts
    assert x == [7, 7, 7] and pol.active is model
    pol.observe(len(x), 3, [], [], 0.01)
    assert model.observed == [(3, 3)] and ngram.rested == 1

    pol.plan()
    x, _ = hyb.draft([1, 2, 3, 1, 2], 2, params, rng, pol)      # the loop's bound wins
    assert len(x) <= 2


def test_a_resting_adaptive_policy_forgets_and_reprobes():
    c = Costs(dict(GEMMA[0]), 1e-4)
    pol = AdaptiveLength(c, k_max=32)
    for _ in range(200):                       # n-gram drafts that always fail
        k = pol.plan()
        pol.observe(k, 0, [None] * k, [], c.t(k + 1))
    assert pol.plan() == 0
    for _ in range(3000):                      # the model drafts meanwhile
        pol.rest()
    for _ in range(8):
        k = pol.plan()
        if k:
            break
    assert k > 0


def test_hybrid_decodes_plainly_when_the_draft_lags_too_far_to_catch_up():
    """After long n-gram runs the draft model has not seen many committed tokens; evaluating
    them costs more than drafting with it saves before the next match: a plain round."""
    from edgespec.drafters import HybridDrafter, HybridPolicy
    model = _FakeModelDrafter()
    model.catch_up_cost = 0.010                                # 10 ms per lagging token
    hyb = HybridDrafter(model)
    pol = HybridPolicy(AdaptiveLength(Costs(dict(GEMMA[0]), GEMMA[1])), _Recorder(8))
    rng, params = np.random.default_rng(0), SamplingParams()
    no_match = list(range(100, 400))

    model.lag = lambda context: 200                            # 2 s to catch up
    pol.plan()
    assert hyb.draft(no_match, 8, params, rng, pol) == ([], []) and pol.active is None

    model.lag = lambda context: 1                              # up to date: the model drafts
    pol.plan()
    x, _ = hyb.draft(no_match, 8, params, rng, pol)
    assert x and set(x) == {7} and pol.active is pol.model


def test_one_unlucky_first_round_does_not_stop_drafting():
    # Gemma's pair pays only at high acceptance; its first drafts happen to be rejected.
    rate, ks = simulate(GEMMA_SLOW_DRAFT, lambda r, c: 0.0 if r < 2 else 0.97, rounds=200)
    assert np.mean([k > 0 for k in ks[20:]]) > 0.9
    best = max(simulate(GEMMA_SLOW_DRAFT, lambda r, c: 0.97, fixed=k)[0] for k in (4, 8, 16))
    assert rate >= 0.9 * best


def test_plain_passes_rescale_every_cost():
    """While decoding plainly only a 1-token pass is measured; the machine speeding up must
    not make batches and drafts look dearer relative to it than they are."""
    c = Costs({1: 0.030, 9: 0.070, 33: 0.160}, draft=0.014)
    for _ in range(200):
        c.observe_target(1, 0.024)
    assert c.t(1) == pytest.approx(0.024, rel=0.02)
    assert c.t(9) / c.t(1) == pytest.approx(0.070 / 0.030, rel=1e-6)
    assert c.draft / c.t(1) == pytest.approx(0.014 / 0.030, rel=1e-6)
    c.observe_target(9, 0.050)                 # a batch pass updates its own entry only
    assert c.t(1) == pytest.approx(0.024, rel=0.02)


def test_free_drafts_are_not_cut_by_the_slow_start_cap():
    """n-gram drafts cost ~0, so the uncapped best K is long and its rate high. After a round
    with no match the slow start caps the plan at 4; valuing those 4 tokens' time at the
    uncapped rate made every continuation look too dear: the draft stopped at once, and
    then round after round (measured: n-gram drafting fell to 1.09x on summaries)."""
    free = {1: 0.0202, 2: 0.0272, 4: 0.0305, 8: 0.0401, 16: 0.0565, 33: 0.0946}
    pol = AdaptiveLength(Costs(dict(free), 1e-4))
    drafted = []
    for r in range(60):
        k, n = pol.plan(), 0
        while n < k and pol.keep_drafting(n, 0.25):
            n += 1
        if r % 5 == 4:
            n = 0                                   # no n-gram match this round
        drafted.append(n)
        pol.observe(n, n, [0.25] * n, [], free[1] if n == 0 else 0.03)
    assert all(d > 0 for i, d in enumerate(drafted) if i % 5 != 4)
