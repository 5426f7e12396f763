"""Draft-length policies (pure logic, hand-made costs), the n-gram drafter, and how a hybrid
drafter routes rounds between its sources (real drafters over the numpy Markov model)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.config import SamplingParams
from edgespec.drafting import (AdaptiveLength, Costs, Draft, FixedLength, HybridDrafter,
                               ModelDrafter, NgramDrafter)
from edgespec.drafting.ngram import lookup
from edgespec.drafting.reading import Reading

from markov import MarkovLM

# Per-call costs measured on this kind of machine (docs/decisions.md, seconds).
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
        dt = len(confs) * draft + c.pass_seconds(len(confs) + 1)
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
    accept = lambda r, c: 0.99 if c > 0.3 else 0.1  # noqa: E731
    rate, ks = simulate(GEMMA, accept)
    pol = simulate.policy
    assert pol._acceptance_at(0.15) < 0.5 and pol._acceptance_at(0.9) > 0.9
    best = max(simulate(GEMMA, accept, fixed=k)[0] for k in (0, 1, 2, 4, 8))
    assert rate >= 0.95 * best


def test_fixed_length_cuts_on_top_probability():
    pol = FixedLength(8, p_min=0.5)
    assert pol.plan() == 8
    assert pol.keep_drafting(0, 0.6) and not pol.keep_drafting(1, 0.4)


NEVER = lambda: False   # noqa: E731  (should_stop)


def test_ngram_lookup_finds_the_latest_longest_match():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert lookup(ctx, 3, 1, 3, 4096) == ([7, 8, 5], 2)     # [2, 3] last seen before 7
    assert lookup([4, 5, 6], 4, 1, 3, 4096) == ([], 0)
    ngram = NgramDrafter(FixedLength(2), ngram_min=1, ngram_max=3)
    ngram.plan()
    d = ngram.draft([1, 2, 1, 2, 1], 5, SamplingParams(), np.random.default_rng(0), NEVER)
    assert d.x == [2, 1] and d.source == "ngram"
    assert all(qi.prob(xi) == 1.0 for xi, qi in zip(d.x, d.q))


class _Recorder:
    """A length policy that records what it is told (pure logic, for the hybrid's routing)."""

    needs_confidence = True
    economics = None        # as a pinned length: no cost oracle

    def __init__(self, k):
        self.k, self.observed, self.rested, self.asked = k, [], 0, 0

    def plan(self):
        return self.k

    def keep_drafting(self, i, confidence):
        self.asked += 1
        return True

    def extension_for(self, confidence, room):
        return room

    def length_for(self, confidence, k_max, slow_start=False):
        return 0            # as a pinned length: the plan is the draft's length

    def observe(self, k, n, *args, **kwargs):
        self.observed.append((k, n))

    def rest(self):
        self.rested += 1

    def new_answer(self):
        pass

    def probe_cap(self, confidence):
        return self.k


def sevens(policy, n_vocab=16):
    """A real ModelDrafter over a Markov model whose next token is always 7 (greedy)."""
    table = np.zeros((n_vocab, n_vocab), dtype=np.float32)
    table[:, 7] = 10.0
    return ModelDrafter(MarkovLM(table), frozenset(), policy)


GREEDY = SamplingParams(temperature=0.0)


def test_hybrid_routes_each_source_to_its_own_policy():
    model, ngram = _Recorder(3), _Recorder(6)
    hyb = HybridDrafter(sevens(model), NgramDrafter(ngram))
    rng = np.random.default_rng(0)

    assert hyb.plan() == 6
    d = hyb.draft([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], 16, GREEDY, rng, NEVER)
    assert d.x == [4, 5, 6, 7, 8, 9] and d.source == "ngram"    # capped by its own plan
    hyb.observe(d, 2, 0.01)
    assert ngram.observed == [(6, 2)] and model.observed == [] and model.rested == 1

    hyb.plan()
    hyb.rollback(0)
    d = hyb.draft([1, 2, 3, 4], 16, GREEDY, rng, NEVER)          # no match: the model drafts
    assert d.x == [7, 7, 7] and d.source == "model"
    hyb.observe(d, 3, 0.01)
    assert model.observed == [(3, 3)] and ngram.rested == 1

    hyb.plan()
    hyb.rollback(0)
    assert len(hyb.draft([1, 2, 3, 1, 2], 2, GREEDY, rng, NEVER).x) <= 2   # the loop's bound

    hyb.rollback(0)
    d = Draft()                                                  # a plain round for both
    hyb.observe(d, 0, 0.01)
    assert model.observed[-1] == (0, 0) and ngram.observed[-1] == (0, 0)


def test_a_model_draft_continued_by_an_ngram_match_teaches_its_policy_only_its_own_tokens():
    model = _Recorder(4)
    hyb = HybridDrafter(sevens(model), NgramDrafter(_Recorder(8), ngram_min=3), extend_match=3)
    context = [1, 7, 7, 7, 2, 3, 4, 5, 9, 7, 7]  # no 3-token match until the model adds a 7
    hyb.plan()
    d = hyb.draft(context, 8, GREEDY, np.random.default_rng(0), NEVER)
    assert d.source == "model" and d.x == [7, 2, 3, 4, 5, 9, 7, 7] and d.extended == 7
    assert all(qi.prob(xi) == 1.0 for xi, qi in zip(d.x, d.q))
    hyb.observe(d, 8, 0.05)
    assert model.observed == [(1, 1)]


def test_a_continuation_appended_to_a_model_draft_is_as_long_as_its_match_pays():
    """An n-gram continuation appended to the model's draft costs no draft step but a verify
    row each; at a long prompt's context a row costs what attention over it does, and a
    6-8-token match there is often the passage quoted, not the answer (measured: a 49-row pass
    of 418 ms, fifteen plain passes, for 4 accepted tokens). An adaptive n-gram policy whose
    matches of that length were seldom accepted appends none; one whose were appends them;
    a pinned one appends all (the length is the user's)."""
    from edgespec.drafting.ngram import match_confidence
    context = [1, 7, 7, 7, 2, 3, 4, 5, 9, 7, 7]  # no 3-token match until the model adds a 7

    def appended(ngram_policy) -> int:
        hyb = HybridDrafter(sevens(_Recorder(4)), NgramDrafter(ngram_policy, ngram_min=3),
                            extend_match=3)
        hyb.plan()
        return hyb.draft(context, 8, GREEDY, np.random.default_rng(0), NEVER).extended

    def taught(rate: float, at: int) -> AdaptiveLength:
        c = Costs(dict(SMOL_EMPTY), 1e-4, attention=SMOL_ATTENTION, position=lambda: at)
        pol = AdaptiveLength(c, k_max=8, learns_costs=False)
        rng = np.random.default_rng(1)
        for r in range(300):                    # matches of 3-8 tokens, as the context's are
            n = 0
            while n < 4 and rng.random() < rate:
                n += 1
            pol.observe(4, n, [match_confidence(3 + r % 6)] * 4, [], c.pass_seconds(5))
        return pol

    assert appended(taught(0.2, at=1900)) == 0
    assert appended(taught(0.95, at=100)) == 7
    assert appended(FixedLength(4)) == 7


def test_should_stop_ends_a_draft_at_once():
    calls = []
    drafter = sevens(FixedLength(8))
    drafter.plan()
    d = drafter.draft([1, 2], 8, GREEDY, np.random.default_rng(0),
                      lambda: calls.append(1) or len(calls) > 2)
    assert d.x == [7, 7]


@pytest.mark.parametrize("carried", [4.0, 0.0])
def test_a_new_answer_learns_its_own_copy_lengths_over_what_earlier_answers_taught(carried):
    """How a copy from the context fares is the answer's: after an edit (half its two-token
    matches rejected at once, the rest copied for ~17 tokens), a chat's copies, all rejected
    at once, are drafted short within a few rounds (measured on the Xeon: carried over whole,
    a chat after edits drafted 3 copies of ~11 tokens, 1 of 34 accepted, 0.92× plain).
    Negative control: the evidence carried whole (``carried=0``) keeps them long."""
    from edgespec.drafting.ngram import match_confidence
    c = Costs(dict(GEMMA[0]), 1e-4)
    pol = AdaptiveLength(c, k_max=32, learns_costs=False, carried=carried)
    ngram = NgramDrafter(pol)
    conf = match_confidence(2)
    rng = np.random.default_rng(0)
    ngram.begin([], 0)
    for _ in range(150):                    # the edit
        k = pol.length_for(conf, 32)
        n = 0 if rng.random() < 0.5 else min(k, int(rng.geometric(1 / 17)))
        pol.observe(k, n, [conf] * k, [], c.pass_seconds(k + 1))
    edit_length = pol.length_for(conf, 32)
    assert edit_length >= 8
    ngram.begin([], 0)                      # the chat
    # Its first match: the round's plan, learned over the edit's copies, is no licence
    # either; a new answer's first match of a kind drafts a short probe.
    context = [5, 6, *range(100, 140), 5, 6]        # a two-token match, 40 tokens on
    ngram.plan()
    drafted = len(ngram.draft(context, 32, GREEDY, rng, NEVER).x)
    assert drafted <= 4 if carried else drafted >= 0.8 * edit_length, drafted
    pol.observe(drafted, 0, [conf] * drafted, [], c.pass_seconds(drafted + 1))
    lengths = []
    for _ in range(5):
        lengths.append(pol.length_for(conf, 32))
        pol.observe(lengths[-1], 0, [conf] * lengths[-1], [], c.pass_seconds(lengths[-1] + 1))
    if carried:
        assert lengths[1] <= 4 and sum(lengths[1:]) <= 12, lengths
    else:
        assert min(lengths) >= 0.8 * edit_length, lengths


def test_a_resting_adaptive_policy_forgets_and_reprobes():
    c = Costs(dict(GEMMA[0]), 1e-4)
    pol = AdaptiveLength(c, k_max=32)
    for _ in range(200):                       # n-gram drafts that always fail
        k = pol.plan()
        pol.observe(k, 0, [None] * k, [], c.pass_seconds(k + 1))
    assert pol.plan() == 0
    for _ in range(3000):                      # the model drafts meanwhile
        pol.rest()
    for _ in range(8):
        k = pol.plan()
        if k:
            break
    assert k > 0


def test_a_stalled_catch_up_is_counted_at_most_a_draft_step_per_token():
    """A batch of context tokens never costs more than as many draft steps: a catch-up that
    a stall made slower must not make catching up look too dear to be tried again."""
    costs = Costs(dict(GEMMA[0]), GEMMA[1])
    model = sevens(AdaptiveLength(costs), n_vocab=400)
    model.reading.measured(10, 5.0)                             # 0.5 s a token: a stall
    assert model.reading.catch_up_cost == costs.draft
    model.reading.measured(10, 10 * 0.2 * costs.draft)          # a real batch: a fifth
    assert model.reading.catch_up_cost < costs.draft


def test_the_calibrations_reading_cost_prices_the_first_catch_up():
    """Before its first catch-up, the draft's reading is priced as the calibration measured
    it: a long prompt for a short answer is not read, not even one chunk as a measurement.
    Without that figure (the negative control) the first chunk is the measurement."""
    def reading(draft_read: float):
        costs = Costs(dict(GEMMA[0]), GEMMA[1], draft_read=draft_read)
        model = sevens(AdaptiveLength(costs), n_vocab=400)
        context = list(range(100, 400))                 # 300 tokens the cache has not read
        model.reading.begin(context, len(context) + 16)  # for a 16-token answer
        return model.reading, context

    r, context = reading(0.010)                          # 10 ms a token: 3 s for the prompt
    assert r.catch_up_seconds(context) == pytest.approx(0.010 * r._lag(context))
    assert not r.catch_up_worth(context)
    d = r.catch_up(context)
    assert d.caught_up == 0 and r.model.tokens == []     # nothing read
    r, context = reading(0.0)                            # not measured
    assert r.catch_up_seconds(context) is None and r.catch_up_worth(context)
    r.catch_up(context)
    assert len(r.model.tokens) == r.CATCH_UP_CHUNK and r.catch_up_cost is not None


def test_hybrid_decodes_plainly_when_the_draft_lags_too_far_to_catch_up():
    """After long n-gram runs the draft model has not seen many committed tokens; evaluating
    them costs more than drafting with it saves before the next match: a plain round."""
    model = sevens(AdaptiveLength(Costs(dict(GEMMA[0]), GEMMA[1])), n_vocab=400)
    model.reading.catch_up_cost = 0.010                        # 10 ms per lagging token
    hyb = HybridDrafter(model, NgramDrafter(_Recorder(8)))
    rng = np.random.default_rng(0)
    no_match = list(range(100, 400))

    model.model.eval(no_match[:100], 0)                        # 199 tokens behind: 2 s
    hyb.begin(no_match, len(no_match) + 8)                     # for an 8-token answer
    hyb.plan()
    d = hyb.draft(no_match, 8, GREEDY, rng, NEVER)
    assert d.x == [] and d.source == "none"

    model.model.eval(no_match[100:-1], 0)                      # up to date: the model drafts
    hyb.plan()
    d = hyb.draft(no_match, 8, GREEDY, rng, NEVER)
    assert d.x and set(d.x) == {7} and d.source == "model"


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
    assert c.pass_seconds(1) == pytest.approx(0.024, rel=0.02)
    assert c.pass_seconds(9) / c.pass_seconds(1) == pytest.approx(0.070 / 0.030, rel=1e-6)
    assert c.draft / c.pass_seconds(1) == pytest.approx(0.014 / 0.030, rel=1e-6)
    c.observe_target(9, 0.050)                 # a batch pass updates its own entry only
    assert c.pass_seconds(1) == pytest.approx(0.024, rel=0.02)


# SmolLM2's F32 target on the 2-core AMX machine over an empty context (seconds per pass of n
# tokens) and what every batch token adds per context token (measured after 16, 500, 1,500
# and 2,900 tokens: t(9) / t(1) 1.8, 2.1, 2.4, 3.5).
SMOL_EMPTY = {1: 0.0367, 2: 0.0458, 3: 0.0483, 5: 0.0513, 9: 0.0658, 16: 0.09, 33: 0.15}
SMOL_ATTENTION = 7e-6


def _smol_pass(n, context, rng):
    return (float(Costs(dict(SMOL_EMPTY), 0.017).bare(n)) + SMOL_ATTENTION * n * context) \
        * rng.uniform(0.95, 1.05)


def test_batches_over_a_long_context_teach_the_attention_term():
    """The table is measured over an empty context; over a long one every batch token attends
    to every context token. Plain and drafting rounds over ~1,500 tokens (the machine's speed
    unchanged) must teach the cost model both, so that a batch is not taken for as cheap
    against a plain pass as it was after an empty context."""
    rng = np.random.default_rng(3)
    at = [0]
    c = Costs(dict(SMOL_EMPTY), 0.017, position=lambda: at[0])
    for L in range(1500, 1700):
        at[0] = L
        n = 1 if rng.random() < 0.6 else int(rng.choice([2, 3, 5, 9]))
        c.observe_target(n, _smol_pass(n, L, rng))
    assert c.attention == pytest.approx(SMOL_ATTENTION, rel=0.25)
    truth = Costs(dict(SMOL_EMPTY), 0.017, attention=SMOL_ATTENTION, position=lambda: 1600)
    for n in (1, 5, 9):
        assert c.pass_seconds(n) == pytest.approx(truth.pass_seconds(n), rel=0.08)
    # The same costs after a short context are the table's again (a new short prompt).
    at[0] = 20
    assert c.pass_seconds(9) / c.pass_seconds(1) == pytest.approx(truth.bare(9) / truth.bare(1),
                                                                  rel=0.1)
    # Without the attention term (the negative control) the shape is the empty context's.
    assert truth.pass_seconds(9) / truth.pass_seconds(1) > 1.25 * float(truth.bare(9)
                                                                        / truth.bare(1))


def test_short_contexts_refine_the_table_and_leave_the_attention_term():
    at = [100]
    c = Costs(dict(SMOL_EMPTY), 0.017, attention=SMOL_ATTENTION, position=lambda: at[0])
    for _ in range(100):
        c.observe_target(9, 0.060 + SMOL_ATTENTION * 9 * 100)
    assert c.attention == SMOL_ATTENTION
    assert float(c.bare(9)) == pytest.approx(0.060, rel=0.02)


# The 1.5B Qwen's passes on the 2-core EPYC (seconds per pass of n rows over an empty context):
# llama.cpp's kernels work in tiles of rows, so 9-16 rows cost alike, and the line between the
# calibrated 8 and 16 underestimates 12 rows by 15%.
QWEN_EPYC = {1: 0.045, 2: 0.080, 4: 0.155, 8: 0.284, 16: 0.400, 33: 0.779}


def _qwen_rows(n: int) -> float:
    if 9 <= n <= 16:
        return QWEN_EPYC[16]
    return float(Costs(dict(QWEN_EPYC), 0.015).bare(n))


def test_real_passes_teach_each_row_count_at_any_context():
    """A code edit's verify passes after ~1,000 tokens: each row count's cost is learned from
    its own passes, not only the attention term (which, alone, spreads a 12-row pass's
    surprise over every row count)."""
    rng = np.random.default_rng(8)
    at = [1000]
    att = 2e-6
    c = Costs(dict(QWEN_EPYC), 0.015, position=lambda: at[0])
    for _ in range(400):
        at[0] = int(rng.integers(900, 1100))
        n = 1 if rng.random() < 0.5 else int(rng.choice([3, 6, 12]))
        c.observe_target(n, (_qwen_rows(n) + att * n * at[0]) * rng.uniform(0.95, 1.05))
    at[0] = 1000
    for n in (1, 3, 6, 12):
        assert c.pass_seconds(n) == pytest.approx(_qwen_rows(n) + att * n * 1000, rel=0.04), n
    # (the attention term alone, learned from the same passes, came out 3.8 times the truth
    # and 9% short at 12 rows)
    assert c.attention == pytest.approx(att, rel=0.5)
    # The control: the calibrated line with the true attention term is 14% short at 12 rows.
    line = Costs(dict(QWEN_EPYC), 0.015, attention=att, position=lambda: 1000)
    assert line.pass_seconds(12) < 0.87 * (_qwen_rows(12) + att * 12 * 1000)


def test_one_slow_pass_does_not_move_a_learned_row_count_far():
    c = Costs(dict(QWEN_EPYC), 0.015, position=lambda: 100)
    for _ in range(100):
        c.observe_target(12, _qwen_rows(12))
    before = c.pass_seconds(12)
    c.observe_target(12, 10 * before)          # another process took the cores for a moment
    assert c.pass_seconds(12) < 1.2 * before


def test_a_draft_step_costs_its_attention_over_the_context():
    """A draft of the target's own architecture attends to as long a context: SmolLM2's Q8_0
    step is 8-10 ms after 100 tokens and 15-16 ms after 1,900 (the calibration measures the
    term with bare steps). The loop's steps, whatever the context, refine the step's fixed
    part (which carries the loop's own costs per step) and leave the term as measured."""
    rng = np.random.default_rng(5)
    at = [0]
    c = Costs(dict(SMOL_EMPTY), 0.0085, draft_attention=4e-6, position=lambda: at[0])
    at[0] = 1600
    assert c.draft_step() == pytest.approx(0.0085 + 4e-6 * 1600)
    for L in range(1500, 1700):                 # each step 1 ms dearer than the calibration's
        at[0] = L
        c.observe_draft((0.0095 + 4e-6 * L) * rng.uniform(0.97, 1.03))
    assert c.draft == pytest.approx(0.0095, rel=0.05) and c.draft_attention == 4e-6
    at[0] = 20                                  # a new short prompt: the step is the short one
    assert c.draft_step() == pytest.approx(0.0095 + 4e-6 * 20, rel=0.05)
    at[0] = 1
    faster = 0.5 * c.pass_seconds(1)
    for _ in range(200):                        # a faster machine: the term follows its speed
        c.observe_target(1, faster)
    assert c.draft_attention == pytest.approx(2e-6, rel=0.1)


def test_a_draft_model_that_pays_on_a_short_prompt_stops_once_its_long_steps_are_known():
    """Drafts accepted 80% of the time, a step of 12 ms after an empty context: K = 3 pays
    there. After 1,900 tokens the step costs 31 ms and drafting no longer pays, which only the
    draft's attention term shows (the negative control without it keeps drafting)."""
    def policy(draft_attention):
        at = [0]
        c = Costs(dict(SMOL_EMPTY), 0.012, attention=SMOL_ATTENTION,
                  draft_attention=draft_attention, position=lambda: at[0])
        pol = AdaptiveLength(c, k_max=8)
        rng = np.random.default_rng(0)
        for _ in range(300):
            n = 0
            while n < 4 and rng.random() < 0.8:
                n += 1
            pol.observe(4, n, [None] * 4, [], c.pass_seconds(5))
        return pol, at

    pol, at = policy(1e-5)
    assert pol.best()[0] > 0
    at[0] = 1900
    assert pol.best()[0] == 0
    control, at = policy(0.0)
    at[0] = 1900
    assert control.best()[0] > 0


def test_drafting_over_a_long_prompt_stops_when_its_batches_no_longer_pay():
    """With n-gram-like drafts accepted 40% of the time, SmolLM2's costs pay for short drafts
    after an empty context but not after 2,900 tokens, once the attention term is known."""
    at = [0]
    c = Costs(dict(SMOL_EMPTY), 1e-4, attention=SMOL_ATTENTION, position=lambda: at[0])
    pol = AdaptiveLength(c, k_max=8)
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = 0 if rng.random() >= 0.4 else 1 if rng.random() >= 0.4 else 2
        pol.observe(2, n, [None, None], [], c.pass_seconds(3))
    assert pol.best()[0] > 0
    at[0] = 2900
    assert pol.best()[0] == 0


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


def test_a_disturbed_measurement_never_makes_a_batch_cost_less_or_below_zero():
    # Two sizes measured on a busy machine: the 2-token pass happened to be faster.
    c = Costs({1: 0.083, 2: 0.031}, draft=0.01)
    sizes = np.array([1, 2, 4, 8, 16, 33, 64])
    t = c.pass_seconds(sizes)
    assert np.all(np.diff(t) >= 0) and np.all(t > 0)
    assert c.pass_seconds(33) > c.pass_seconds(2)


# -- a long prompt: the first token never waits for the draft ------------------------------

def _sevens_loop(policy, prompt_len, max_new, n_vocab=400, drafter=None, cycle=False,
                 prompt_row=True):
    """The real loop over a Markov target whose greedy choice is always 7 (``cycle``: the
    token after t is t + 1, from 100 to 349 and round again, the prompt's own pattern) and the
    sevens draft (none of the prompt in its cache): the steps and the loop's counters. As
    the engine does, the prompt pass includes the last prompt token and its row gives the
    first token (``prompt_row=False``: the pass stops before it, as a bare loop may)."""
    from edgespec.results import LoopStats
    from edgespec.speculative import decode
    table = np.zeros((n_vocab, n_vocab), dtype=np.float32)
    if cycle:
        table[np.arange(100, 350), np.r_[101:350, 100]] = 10.0
    else:
        table[:, 7] = 10.0
    target = MarkovLM(table)
    drafter = drafter or sevens(policy, n_vocab=n_vocab)
    prompt = [100 + i % 250 for i in range(prompt_len)]
    first_row = target.eval(prompt, 1)[0] if prompt_row else target.eval(prompt[:-1], 0)
    stats = LoopStats()
    steps = list(decode(target, list(prompt), params=GREEDY, rng=np.random.default_rng(0),
                        max_tokens=max_new, drafter=drafter, stats=stats,
                        first_row=first_row if prompt_row else None))
    return steps, stats, drafter


@pytest.mark.parametrize("prompt_row", [True, False])
def test_the_first_round_is_plain_and_a_long_prompt_is_caught_up_in_chunks(prompt_row):
    steps, stats, drafter = _sevens_loop(FixedLength(4), prompt_len=300, max_new=40,
                                         prompt_row=prompt_row)
    assert steps[0].round is not None and steps[0].round.drafted == ()   # the target's own
    # The prompt pass's row gives the first token: one pass fewer than a plain first round.
    assert stats.plain_passes == (-(-(300 - Reading.CATCH_UP_CHUNK)
                                    // Reading.CATCH_UP_CHUNK) + (not prompt_row))
    chunk = Reading.CATCH_UP_CHUNK
    # ~300 tokens behind: one chunk a round from the second round on, each round plain,
    # until the cache is within a chunk of the context; then the draft drafts.
    behind_rounds = -(-(300 - chunk) // chunk)
    plain = [s.round for s in steps if s.round is not None][:1 + behind_rounds]
    assert all(r.drafted == () for r in plain)
    assert stats.caught_up >= 300 - chunk and stats.drafted > 0
    assert stats.accepted == stats.drafted                     # the draft agrees: all 7s
    assert [s.token for s in steps] == [7] * 40
    held = drafter.model.tokens            # a prefix of the committed context, past the prompt
    assert held == ([100 + i % 250 for i in range(300)] + [7] * 40)[:len(held)]
    assert len(held) > 300


def test_a_catch_up_that_does_not_pay_is_skipped_and_the_output_is_the_targets():
    """A draft that would cost 10 ms a prompt token to catch up for a 12-token answer: the
    loop decodes plainly, never evaluating the prompt on the draft."""
    pol = AdaptiveLength(Costs(dict(GEMMA[0]), GEMMA[1]))
    model = sevens(pol, n_vocab=400)
    model.reading.catch_up_cost = 0.010
    steps, stats, _ = _sevens_loop(None, prompt_len=1500, max_new=12, drafter=model)
    assert stats.caught_up == 0 and stats.drafted == 0 and model.model.tokens == []
    assert [s.token for s in steps] == [7] * 12
    # The same prompt with a long answer ahead: catching up (15 s) is repaid.
    model = sevens(AdaptiveLength(Costs(dict(GEMMA[0]), GEMMA[1])), n_vocab=400)
    model.reading.catch_up_cost = 0.010
    steps, stats, _ = _sevens_loop(None, prompt_len=1500, max_new=3000, drafter=model)
    assert stats.caught_up > 1400 and stats.drafted > 0


def test_the_typical_answer_bounds_what_catching_up_is_repaid_over():
    model = sevens(FixedLength(4), n_vocab=400)
    _sevens_loop(None, prompt_len=10, max_new=20, drafter=model)
    assert model.reading.answer_tokens is None
    model.begin([1] * 50, 2000)                 # 20 tokens, cut by its budget: not typical
    assert model.reading.answer_tokens is None
    model.rollback(69)                          # ended by itself after 20 tokens
    model.begin([1] * 50, 2000)
    assert model.reading.answer_tokens == 20
    model.begin([1] * 50, 55)                   # a 5-token budget, used up
    model.rollback(54)
    model.begin([1] * 50, 2000)                 # cut short: the typical length stays
    assert model.reading.answer_tokens == 20
    assert model.reading.tokens_ahead(50) == 20 and model.reading.tokens_ahead(58) == 12
    assert model.reading.tokens_ahead(90) == 40     # longer than typical: as long again
    model.rollback(1500)
    model.begin([1] * 1600, 1700)               # a 1451-token answer moves the estimate
    assert model.reading.answer_tokens == pytest.approx(20 + 0.3 * 1431)
    assert model.reading.tokens_ahead(1600) == 100  # the budget bounds it


def test_a_pinned_length_catches_up_whatever_the_typical_answer():
    """The typical answer's length is the cost model's guess: a pinned length, which has
    none, reads a long prompt even after short answers (a few stopped early made the typical
    one 3 tokens long, where 300 tokens of prompt are 4.7 chunks): at once, not once the
    answer has outgrown the typical one."""
    model = sevens(FixedLength(4), n_vocab=400)
    model.reading.answer_tokens = 3.0
    steps, stats, _ = _sevens_loop(None, prompt_len=300, max_new=40, drafter=model)
    # From the second round on, a chunk a round until within a chunk: none waits for the
    # answer to grow longer than the typical one.
    assert stats.plain_passes == -(-(300 - Reading.CATCH_UP_CHUNK) // Reading.CATCH_UP_CHUNK)
    assert stats.caught_up >= 300 - Reading.CATCH_UP_CHUNK and stats.drafted > 0
    assert [s.token for s in steps] == [7] * 40
    # Nothing is read when the generation can make no more than the token the round gives.
    model = sevens(FixedLength(4), n_vocab=400)
    steps, stats, _ = _sevens_loop(None, prompt_len=300, max_new=2, drafter=model)
    assert stats.caught_up == 0 and [s.token for s in steps] == [7] * 2


def test_the_hybrid_drafts_ngrams_while_the_model_catches_up():
    """The target continues the prompt's own pattern (it repeats every 250 tokens), so the
    n-gram finds matches from the first verify round on (the first token is the prompt
    pass's), while the model, 400 tokens behind, catches up a chunk per round."""
    drafter = HybridDrafter(sevens(FixedLength(4), n_vocab=400), NgramDrafter(FixedLength(8)))
    steps, stats, _ = _sevens_loop(None, prompt_len=400, max_new=60, drafter=drafter,
                                   cycle=True)
    rounds = [s.round for s in steps if s.round is not None]
    assert rounds[0].drafted == () and [r.source for r in rounds[1:4]] == ["ngram"] * 3
    assert stats.caught_up >= 400 - Reading.CATCH_UP_CHUNK
    assert [s.token for s in steps] == [100 + i % 250 for i in range(400, 460)]


def test_a_long_prompt_is_read_through_a_window_when_that_saves_the_most():
    """1,500 prompt tokens at 10 ms each (15 s) are not repaid by a 300-token answer; its
    first 32 and last 256 (2.9 s) are, at the window's lower acceptance: the draft reads
    those, and the output is the target's."""
    model = sevens(AdaptiveLength(Costs(dict(GEMMA[0]), GEMMA[1])), n_vocab=400)
    model.reading.catch_up_cost = 0.010
    steps, stats, _ = _sevens_loop(None, prompt_len=1500, max_new=300, drafter=model)
    prompt = [100 + i % 250 for i in range(1500)]
    held = model.model.tokens
    window = prompt[:32] + prompt[1501 - 256:]     # chosen after the first (plain) round
    assert held[:len(window)] == window and set(held[len(window):]) == {7}
    assert stats.caught_up < 400 and stats.drafted > 0
    assert [s.token for s in steps] == [7] * 300
    # A next generation reads afresh: its context is not the window's.
    model.begin(prompt + [7] * 300, 2000)
    assert model.model.tokens == prompt[:32]


def test_saving_scales_with_the_acceptance_kept():
    pol = AdaptiveLength(Costs(dict(GEMMA[0]), GEMMA[1])).economics
    whole, window = pol.saving(300), pol.saving(300, keep=0.8)
    assert whole > window > 0
    assert pol.saving(600) == pytest.approx(2 * whole)
    assert pol.saving(0) == 0.0 and pol.saving(300, keep=0.1) == 0.0


def test_a_context_match_drafts_as_far_as_matches_of_its_length_have_paid():
    """The n-gram draft's length follows the match found, not one plan for every match: a
    kind of match never tried is probed with 4 tokens, then 8, 16… as its drafts are accepted;
    once 2-token matches have been rejected they draft nothing while 8-token ones (a file
    being copied) draft long — past a plan of none."""
    from edgespec.drafting.ngram import match_confidence
    costs = Costs({1: 0.078, 2: 0.119, 3: 0.145, 5: 0.199, 9: 0.271, 17: 0.360, 33: 0.451},
                  0.0)       # Qwen2.5-Coder-1.5B Q4_K_M on 2 cores: passes of n rows
    pol = AdaptiveLength(costs)
    drafter = NgramDrafter(pol)
    text = list(range(100, 200))
    long_ctx = text + [7] + text[:8]        # the last 8 tokens occur earlier: copy on
    short_ctx = [1, 2, 3, 4] + text[:40] + [9, 1, 2]    # only a 2-token match
    rng = np.random.default_rng(0)
    assert drafter.plan() > 0
    assert len(drafter.draft(long_ctx, 60, GREEDY, rng, lambda: False).x) == 4
    for _ in range(3):          # 8-token matches accepted whole, 2-token ones rejected
        pol.observe(16, 16, [match_confidence(8)] * 16, [], 0.3)
        pol.observe(4, 0, [match_confidence(2)] * 4, [], 0.2)
    pol._planned = 0
    d = drafter.draft(long_ctx, 60, GREEDY, rng, lambda: False)
    assert drafter.long_match and len(d.x) >= 16 and d.x == text[8:8 + len(d.x)]
    assert drafter.draft(short_ctx, 60, GREEDY, rng, lambda: False).x == []


def test_a_rejection_on_a_recurrent_model_is_priced_by_its_redo():
    """Going back on a recurrent model: a checkpoint each drafting round; after a rejection a
    restore and the kept tokens evaluated again, as rows in front of the next pass (at most
    REDO_FOLD of them), more as a pass of their own."""
    from edgespec.config import REDO_FOLD
    table = {1: 0.045, 4: 0.155, 8: 0.284, 16: 0.400}
    c = Costs(dict(table), draft=0.01, checkpoint=0.0014, restore=0.001, redo=True)
    assert Costs(dict(table), draft=0.01).rollback(np.array([0.5, 0.2])).tolist() == [0, 0, 0]
    for kept in (1, REDO_FOLD, REDO_FOLD + 1, 9):
        reach = np.array([1.0] * (kept - 1) + [0.0])      # exactly kept - 1 drafts accepted
        back = c.rollback(reach)[kept] - c.checkpoint - c.restore
        redo = (c.bare(kept + 1) - c.bare(1)) if kept <= REDO_FOLD else c.bare(kept)
        assert back == pytest.approx(float(redo)), kept
    assert c.rollback(np.array([1.0, 1.0]))[2] == pytest.approx(c.checkpoint)  # no rejection


def test_perfect_drafts_give_the_cheapest_rows_per_token():
    """The bound `edgespec bench` reports: the least seconds a token of a pass of n rows,
    as a share of a one-row pass (the EPYC's measured rows of Qwen2.5-Coder-1.5B)."""
    c = Costs({1: 0.045, 4: 0.155, 8: 0.284, 16: 0.400, 33: 0.779}, draft=0.02)
    assert c.perfect_drafts(33) == (pytest.approx(0.779 / 33 / 0.045), 33)
    assert c.perfect_drafts(8) == (pytest.approx(0.284 / 8 / 0.045), 8)
    flat = Costs({1: 0.05, 4: 0.25}, draft=0.02)          # rows no cheaper than passes
    assert flat.perfect_drafts(16) == (1.0, 2)
