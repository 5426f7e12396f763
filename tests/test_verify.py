"""The acceptance rules on hand-made distributions (deterministic cases)."""

import numpy as np
import pytest

from edgespec.config import SpecConfig
from edgespec.errors import InvalidParameterError
from edgespec.sampling import Dist
from edgespec.verify import residual
from edgespec.verify import block_thresholds, speculative_sampling, verify_block, verify_greedy


def dense(*probs):
    a = np.array(probs, dtype=float)
    return Dist(None, a / a.sum())


class FixedRng:
    """Returns the given uniforms in order, so each branch of Algorithm 1 is forced."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def test_greedy_accepts_all_and_takes_bonus():
    assert verify_greedy([5, 6, 7], [5, 6, 7, 9]) == (3, 9)


def test_greedy_rejects_first_position_and_corrects():
    assert verify_greedy([5, 6, 7], [4, 6, 7, 9]) == (0, 4)


def test_greedy_stops_at_first_mismatch():
    assert verify_greedy([5, 6, 7], [5, 1, 7, 9]) == (1, 1)


def test_greedy_with_no_drafts_is_plain_argmax():
    assert verify_greedy([], [3]) == (0, 3)


def test_full_accept_then_bonus_from_p_k_plus_1():
    p = [dense(0.5, 0.5, 0), dense(0.2, 0.8, 0), dense(0, 0, 1)]
    q = [dense(0.5, 0.5, 0), dense(0.2, 0.8, 0)]
    # p == q on both drafts: ratio 1 always accepts; bonus from p[2] which is one-hot on 2.
    n, t = speculative_sampling([0, 1], q, lambda i: p[i], FixedRng(0.99, 0.99, 0.5), 3)
    assert (n, t) == (2, 2)


def test_first_position_reject_samples_from_residual():
    p0 = dense(0.9, 0.1, 0.0)
    q0 = dense(0.1, 0.9, 0.0)
    # x=1: p/q = 0.111; r = 0.5 rejects. Residual max(0, p-q) = (0.8, 0, 0) -> token 0.
    n, t = speculative_sampling([1, 2], [q0, dense(0, 0, 1)],
                                lambda i: [p0, dense(1, 0, 0), dense(1, 0, 0)][i],
                                FixedRng(0.5, 0.3), 3)
    assert (n, t) == (0, 0)


def test_rows_after_rejection_are_never_warped():
    asked = []
    p = [dense(0.0, 1.0), dense(1.0, 0.0), dense(1.0, 0.0)]

    def p_of(i):
        asked.append(i)
        return p[i]
    speculative_sampling([0, 0], [dense(1.0, 0.0), dense(1.0, 0.0)], p_of, FixedRng(0.5, 0.5), 2)
    assert asked == [0]


def test_accept_probability_is_p_over_q():
    p0, q0 = dense(0.3, 0.7), dense(0.6, 0.4)  # x=0: ratio 0.5
    assert speculative_sampling([0], [q0], lambda i: [p0, dense(1, 0)][i],
                                FixedRng(0.49, 0.0), 2)[0] == 1
    assert speculative_sampling([0], [q0], lambda i: [p0, dense(1, 0)][i],
                                FixedRng(0.51, 0.0), 2) == (0, 1)


def test_one_hot_q_accepts_with_probability_p_of_x():
    # An n-gram draft: q one-hot on x=2. p(2) = 0.25 -> accept iff r < 0.25.
    p0 = dense(0.5, 0.25, 0.25)
    q0 = Dist.one_hot(2)
    assert speculative_sampling([2], [q0], lambda i: [p0, dense(1, 0, 0)][i],
                                FixedRng(0.2, 0.0), 3)[0] == 1
    n, t = speculative_sampling([2], [q0], lambda i: [p0, dense(1, 0, 0)][i],
                                FixedRng(0.3, 0.9), 3)
    # Residual is p with x removed, renormalised: (2/3, 1/3, 0); u=0.9 -> token 1.
    assert (n, t) == (0, 1)


def test_q_zero_where_p_positive_reaches_those_tokens_through_residual():
    p0 = dense(0.5, 0.5)
    q0 = dense(1.0, 0.0)  # q never proposes token 1
    r = residual(p0, q0)
    assert r.prob(1) == pytest.approx(1.0) and r.prob(0) == 0.0
    n, t = speculative_sampling([0], [q0], lambda i: p0, FixedRng(0.7, 0.1), 2)
    assert (n, t) == (0, 1)


def test_draft_token_with_q_zero_is_refused():
    with pytest.raises(ValueError, match="q = 0"):
        speculative_sampling([1], [dense(1.0, 0.0)], lambda i: dense(0.5, 0.5), FixedRng(0.1), 2)


def test_residual_aligns_sparse_supports_by_token_id():
    p = Dist(np.array([7, 3]), np.array([0.6, 0.4]))
    q = Dist(np.array([3, 9]), np.array([0.5, 0.5]))
    r = residual(p, q)
    assert r.prob(7) == pytest.approx(1.0)
    assert r.prob(3) == 0.0 and r.prob(9) == 0.0


def test_residual_of_equal_distributions_falls_back_to_p():
    p = dense(0.25, 0.75)
    assert residual(p, dense(0.25, 0.75)) is p


# --- block verification (tests/test_block_verify.py proves it lossless exactly) -------------

def rows(*dists):
    return lambda i: dists[i]


def test_block_equal_distributions_accept_everything_and_take_the_bonus():
    p = [dense(0.5, 0.5, 0), dense(0.2, 0.8, 0), dense(0, 0, 1)]
    q = [dense(0.5, 0.5, 0), dense(0.2, 0.8, 0)]
    # w = 1 and r = 0: the threshold's denominator is 0 and the position passes for sure.
    assert block_thresholds([0, 1], q, rows(*p))[0] == [1.0, 1.0]
    assert verify_block([0, 1], q, rows(*p), FixedRng(0.99, 0.5), 3) == (2, 2)


def test_block_a_failed_position_does_not_end_the_draft():
    # x1 = 1: w1 = 0.3/0.6 = 1/2. x2 = 0: w2 = min(1, 1/2 · 0.6/0.2) = 1.
    # r1 = sum max(0, w1·p2 − q2) = 0.1, h1 = 0.1 / (0.1 + 1/2) = 1/6; h2 = w2 = 1.
    p = [dense(0.5, 0.3, 0.2), dense(0.6, 0.2, 0.2), dense(0, 0, 1)]
    q = [dense(0.2, 0.6, 0.2), dense(0.2, 0.2, 0.6)]
    h, _ = block_thresholds([1, 0], q, rows(*p))
    assert h == pytest.approx([1 / 6, 1.0])
    # Position 2 passes for sure, so both drafts are accepted whatever position 1's uniform
    # (the scan runs from the last position back and stops at the first pass), and the bonus
    # follows. The token-wise rule rejects x1 half of the time (here with u = 0.9).
    assert verify_block([1, 0], q, rows(*p), FixedRng(0.999, 0.5), 3) == (2, 2)
    assert speculative_sampling([1, 0], q, rows(*p), FixedRng(0.9, 0.0), 3) == (0, 0)


def test_block_residual_is_weighted_by_the_accepted_prefix():
    # w1 = 1/2, w2 = 1/2 · 0.1/0.6 = 1/12; r1 = max(0, 0.25 − 0.2) = 0.05, h1 = 0.05/0.55.
    p = [dense(0.5, 0.3, 0.2), dense(0.5, 0.4, 0.1), dense(1, 0, 0)]
    q = [dense(0.2, 0.6, 0.2), dense(0.2, 0.2, 0.6)]
    h, correction = block_thresholds([1, 2], q, rows(*p))
    assert h == pytest.approx([1 / 11, 1 / 12])
    # After x1 only: normalize(max(0, w1·p2 − q2)) = (1, 0, 0), not Algorithm 1's
    # normalize(max(0, p2 − q2)) = (0.6, 0.4, 0).
    assert correction(1).dense(3) == pytest.approx([1.0, 0.0, 0.0])
    assert correction(0).dense(3) == pytest.approx(residual(p[0], q[0]).dense(3))
    # Uniforms from the last position back: η2 = 0.5 fails, η1 = 0.05 passes, u = 0.9.
    assert verify_block([1, 2], q, rows(*p), FixedRng(0.5, 0.05, 0.9), 3) == (1, 0)
    assert verify_block([1, 2], q, rows(*p), FixedRng(0.5, 0.1, 0.9), 3) == (0, 0)


def test_block_one_hot_q_has_the_closed_form_threshold():
    # An n-gram draft: w_i = prod p_j(x_j) and r_i = w_i · (1 − p_{i+1}(x_{i+1})).
    p = [dense(0.2, 0.7, 0.1), dense(0.5, 0.1, 0.4), dense(0.3, 0.3, 0.4), dense(1, 0, 0)]
    x = [1, 2, 0]
    h, _ = block_thresholds(x, [Dist.one_hot(t) for t in x], rows(*p))
    w1, w2 = 0.7, 0.7 * 0.4
    r1, r2 = w1 * (1 - 0.4), w2 * (1 - 0.3)
    assert h == pytest.approx([r1 / (r1 + 1 - w1), r2 / (r2 + 1 - w2), w2 * 0.3])


def test_block_draft_token_with_q_zero_is_refused():
    with pytest.raises(ValueError, match="q = 0"):
        verify_block([1], [dense(1.0, 0.0)], lambda i: dense(0.5, 0.5), FixedRng(0.1), 2)
    with pytest.raises(ValueError, match="q = 0"):      # at a later position too
        verify_block([0, 1], [dense(1.0, 0.0), Dist.one_hot(0)], lambda i: dense(0.5, 0.5),
                     FixedRng(0.1), 2)


def test_block_rows_after_a_token_the_target_excludes_are_never_warped():
    asked = []
    p = [dense(1.0, 0.0), dense(0.5, 0.5), dense(0.5, 0.5), dense(0.5, 0.5)]

    def p_of(i):
        asked.append(i)
        return p[i]
    # p(x1) = 0: every later weight and threshold is 0; no uniform is drawn for them, and the
    # token comes from normalize(max(0, p1 − q1)) = token 0.
    q = [dense(0.5, 0.5)] * 3
    assert verify_block([1, 1, 1], q, p_of, FixedRng(0.7), 2) == (0, 0)
    assert asked == [0]


def test_block_without_drafts_is_plain_sampling():
    assert verify_block([], [], rows(dense(0.2, 0.8)), FixedRng(0.1), 2) == (0, 0)
    assert verify_block([], [], rows(dense(0.2, 0.8)), FixedRng(0.3), 2) == (0, 1)


def test_block_with_one_draft_is_the_token_wise_rule():
    rng = np.random.default_rng(5)
    for _ in range(200):
        p0, p1, q0 = (Dist(None, rng.dirichlet(np.ones(4))) for _ in range(3))
        x = [q0.sample(rng)]
        u = list(rng.random(3))
        assert verify_block(x, [q0], rows(p0, p1), FixedRng(*u), 4) == \
            speculative_sampling(x, [q0], rows(p0, p1), FixedRng(*u), 4)


def test_block_aligns_sparse_and_dense_rows_by_token_id():
    rng = np.random.default_rng(11)
    V = 12
    for _ in range(50):
        arrays = []
        for _ in range(7):
            a = rng.dirichlet(np.full(V, 0.5))
            a[rng.choice(V, 5, replace=False)] = 0.0
            arrays.append(a / a.sum())
        P, Q = arrays[:4], arrays[4:]
        x = [int(rng.choice(V, p=qa)) for qa in Q]

        def sparse(a):
            ids = rng.permutation(np.flatnonzero(a))     # any order, as warp leaves them
            return Dist(ids, a[ids])

        def short(a):                                    # dense, the zero tail cut off
            return Dist(None, a[: np.flatnonzero(a)[-1] + 1])
        ref_h, ref_c = block_thresholds(x, [Dist(None, a) for a in Q],
                                        rows(*[Dist(None, a) for a in P]))
        for fp, fq in [(sparse, sparse), (sparse, short), (short, sparse), (short, short)]:
            h, c = block_thresholds(x, [fq(a) for a in Q], rows(*[fp(a) for a in P]))
            assert h == pytest.approx(ref_h, abs=1e-15)
            for n in range(4):
                assert c(n).dense(V) == pytest.approx(ref_c(n).dense(V), abs=1e-15)


def test_spec_config_names_its_verifier():
    assert SpecConfig().verifier == "block"
    assert SpecConfig(verifier="token").verifier == "token"
    with pytest.raises(InvalidParameterError, match="verifier='tokens' is invalid.*'block' or"):
        SpecConfig(verifier="tokens")


def test_spec_config_and_engine_load_share_one_default_drafter():
    assert SpecConfig().drafter == SpecConfig.default_drafter(True) == "hybrid"
    assert SpecConfig.default_drafter(False) == "none"


def test_engine_load_checks_the_verifier_before_opening_anything():
    from edgespec import Engine
    with pytest.raises(InvalidParameterError, match="verifier='tokens' is invalid"):
        Engine.load("never-opened.gguf", verifier="tokens")


def test_engine_load_verifier_token_reaches_the_loop(smollm2_q4_path, monkeypatch):
    """``Engine.load(verifier="token")``: the Engine's settings say so, and its sampled rounds
    are accepted token-wise; block verification never runs."""
    from edgespec import Engine, SamplingParams, speculative
    token_wise = []
    real = speculative.speculative_sampling
    monkeypatch.setattr(speculative, "speculative_sampling",
                        lambda *a: token_wise.append(len(a[0])) or real(*a))
    monkeypatch.setattr(speculative, "verify_block",
                        lambda *a: pytest.fail("block verification ran"))
    # The model as its own draft, the length pinned: every round drafts (an n-gram drafter
    # drafts only where a sampled answer happens to repeat itself).
    with Engine.load(smollm2_q4_path, smollm2_q4_path, drafter="model", draft_max=4,
                     verifier="token", n_ctx=256, n_threads=2) as eng:
        assert eng.spec.verifier == "token"
        out = eng.generate("1 2 3 1 2 3 1 2 3 1 2 3", raw=True, max_tokens=16,
                           sampling=SamplingParams(temperature=0.8))
    assert out.tokens and token_wise and any(token_wise)    # rounds with drafts among them


def test_decode_refuses_an_unknown_verifier():
    from edgespec.config import SamplingParams
    from edgespec.speculative import decode
    from markov import MarkovLM
    target = MarkovLM(np.zeros((4, 4)))
    target.eval([1], 0)
    with pytest.raises(ValueError, match="verifier must be 'block' or 'token'"):
        next(decode(target, [1, 2], params=SamplingParams(), rng=np.random.default_rng(0),
                    max_tokens=2, verifier="tokens"))
