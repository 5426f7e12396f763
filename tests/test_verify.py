"""The acceptance rule on hand-made distributions (deterministic cases)."""

import numpy as np
import pytest

from edgespec.sampling import Dist, residual
from edgespec.verify import speculative_sampling, verify_greedy


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
    r = residual(p0, q0, 2)
    assert r.prob(1) == pytest.approx(1.0) and r.prob(0) == 0.0
    n, t = speculative_sampling([0], [q0], lambda i: p0, FixedRng(0.7, 0.1), 2)
    assert (n, t) == (0, 1)


def test_draft_token_with_q_zero_is_refused():
    with pytest.raises(ValueError, match="q = 0"):
        speculative_sampling([1], [dense(1.0, 0.0)], lambda i: dense(0.5, 0.5), FixedRng(0.1), 2)


def test_residual_aligns_sparse_supports_by_token_id():
    p = Dist(np.array([7, 3]), np.array([0.6, 0.4]))
    q = Dist(np.array([3, 9]), np.array([0.5, 0.5]))
    r = residual(p, q, 10)
    assert r.prob(7) == pytest.approx(1.0)
    assert r.prob(3) == 0.0 and r.prob(9) == 0.0


def test_residual_of_equal_distributions_falls_back_to_p():
    p = dense(0.25, 0.75)
    assert residual(p, dense(0.25, 0.75), 2) is p
