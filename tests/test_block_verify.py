"""Block verification is lossless: an exact proof by enumeration, with negative controls.

For small vocabularies (V = 3..5) and drafts of γ = 1..3 tokens, the target's p and the
draft's q depend on the whole prefix (a seeded generator per prefix) and include the edge cases
(p == q, disjoint supports, q = 0 where p > 0, one-hot q as an n-gram or a grammar proposes,
p(x) = 0 for a token q proposes), in every storage form a Dist has (dense, dense with the zero
tail cut off, sparse ids in any order). The exact law of one round's output is computed by
enumerating every draft sequence (with its q probability) and the acceptance outcomes
analytically: with thresholds h_i, the last position that passes is τ = i with probability
h_i · Π_{j>i} (1 − h_j), and τ = 0 with probability Π_j (1 − h_j). The round's tokens are then
completed to γ + 1 tokens with the target's own sampling; the law of those γ + 1 tokens must
equal the target's joint distribution to 1e-9.

The thresholds and correction distributions come from the production code
(:func:`edgespec.verify.block_thresholds`); :func:`edgespec.verify.verify_block`'s own choice
of τ (the last passing position) is pinned separately with forced uniforms. A reference
written here from the paper's formulas matches the production numbers, and its mutants — the
residual with weight 1 instead of w_τ, τ as the first failure instead of the last pass, the
thresholds h_i = w_i — must fail the same check.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Callable, Optional

import numpy as np
import pytest

from edgespec import verify
from edgespec.sampling import Dist
from edgespec.verify import residual

TOL = 1e-9
KINDS = ("random", "equal", "disjoint", "q_zero", "one_hot", "p_zero", "peaked", "mixed")
EDGE_KINDS = ("random", "equal", "disjoint", "q_zero", "one_hot", "p_zero", "peaked")


class Case:
    """Prefix-dependent target and draft distributions over ``V`` tokens."""

    def __init__(self, V: int, kind: str, seed: int):
        self.V, self.kind, self.seed = V, kind, seed
        self._arrays: dict = {}

    def _rng(self, salt: int, prefix: tuple) -> np.random.Generator:
        return np.random.default_rng([self.seed, salt, len(prefix), *prefix])

    def arrays(self, prefix: tuple) -> tuple[np.ndarray, np.ndarray, str, str]:
        """(p, q, p's storage form, q's storage form) after ``prefix``."""
        if prefix in self._arrays:
            return self._arrays[prefix]
        V, rng = self.V, self._rng(0, prefix)
        kind = self.kind if self.kind != "mixed" else str(rng.choice(EDGE_KINDS))
        p = rng.dirichlet(np.full(V, 0.7))
        q = rng.dirichlet(np.full(V, 0.7))
        if kind == "equal":
            q = p.copy()
        elif kind == "disjoint":
            side = rng.permutation(V) < V // 2
            p[side], q[~side] = 0.0, 0.0
        elif kind == "q_zero":
            q[rng.choice(V, max(1, V // 2), replace=False)] = 0.0
        elif kind == "one_hot":
            q = np.eye(V)[rng.integers(V)]
        elif kind == "p_zero":
            p[rng.choice(V, max(1, V // 2), replace=False)] = 0.0
        elif kind == "peaked":
            e = np.exp(rng.normal(0, 3, V))
            p = e / e.sum()
        forms = ("dense", "short", "sparse")
        out = (p / p.sum(), q / q.sum(), str(rng.choice(forms)),
               "one_hot" if kind == "one_hot" and rng.random() < 0.5 else str(rng.choice(forms)))
        self._arrays[prefix] = out
        return out

    def P(self, prefix: tuple) -> np.ndarray:
        return self.arrays(prefix)[0]

    def Q(self, prefix: tuple) -> np.ndarray:
        return self.arrays(prefix)[1]

    def p_dist(self, prefix: tuple) -> Dist:
        p, _, form, _ = self.arrays(prefix)
        return as_dist(p, form, self._rng(1, prefix))

    def q_dist(self, prefix: tuple) -> Dist:
        _, q, _, form = self.arrays(prefix)
        return as_dist(q, form, self._rng(2, prefix))


def as_dist(a: np.ndarray, form: str, rng: np.random.Generator) -> Dist:
    nz = np.flatnonzero(a)
    if form == "one_hot":
        assert nz.size == 1
        return Dist.one_hot(int(nz[0]))
    if form == "short":             # dense, the zero tail cut off (shorter than n_vocab)
        return Dist(None, a[: nz[-1] + 1].copy())
    if form == "sparse":            # the support only, ids in any order
        ids = rng.permutation(nz)
        return Dist(ids.astype(np.int64), a[ids])
    return Dist(None, a.copy())


def tau_law(h: list[float], last_pass: bool = True) -> list[tuple[int, float]]:
    """P(τ = i) for i = 0..K from the thresholds, analytically over the uniforms."""
    K = len(h)
    out = []
    for i in range(K + 1):
        if last_pass:       # position i passes, every later one fails
            pr = (h[i - 1] if i else 1.0) * float(np.prod([1 - hj for hj in h[i:]]))
        else:               # mutant: the first i pass, then one fails (or all pass)
            pr = float(np.prod(h[:i])) * ((1 - h[i]) if i < K else 1.0)
        out.append((i, pr))
    return out


# A rule maps (x, q, p, V) to its law: a list of (probability, n accepted, law of the token).
Rule = Callable[[list, list, Callable[[int], Dist], int], list]


def block_rule(x, q, p, V):
    """The production rule: thresholds and corrections from edgespec.verify."""
    h, correction = verify.block_thresholds(x, q, p)
    assert all(0.0 <= hi <= 1.0 for hi in h)
    return [(pr, n, correction(n).dense(V)) for n, pr in tau_law(h) if pr > 0]


def token_rule(x, q, p, V):
    """The production token-wise rule (Algorithm 1), analytically."""
    K = len(x)
    a = [min(1.0, p(i).prob(x[i]) / q[i].prob(x[i])) for i in range(K)]
    out = []
    for n in range(K + 1):
        pr = float(np.prod(a[:n])) * ((1 - a[n]) if n < K else 1.0)
        if pr > 0:
            t = residual(p(n), q[n]) if n < K else p(K)
            out.append((pr, n, t.dense(V)))
    return out


def reference_thresholds(x, q, p, V, mutant: Optional[str] = None):
    """Block verification written from the paper's formulas on dense arrays; ``mutant`` breaks
    one piece of it."""
    K = len(x)
    P = [p(i).dense(V) for i in range(K + 1)]
    Q = [qi.dense(V) for qi in q]
    w = [1.0]
    for i in range(K):
        w.append(min(1.0, w[i] * P[i][x[i]] / Q[i][x[i]]))
    h = []
    for i in range(1, K + 1):
        if i == K or mutant == "h_equals_w":
            h.append(w[i])
            continue
        r = float(np.maximum(w[i] * P[i] - Q[i], 0).sum())
        d = r + (1 - w[i])
        h.append(r / d if d > 0 else 1.0)

    def correction(n):
        if n == K:
            return P[K]
        wt = 1.0 if mutant == "weight_one" else w[n]
        r = np.maximum(wt * P[n] - Q[n], 0)
        return r / r.sum() if r.sum() > 1e-12 else P[n]
    return h, correction


def reference_rule(mutant: Optional[str] = None) -> Rule:
    def rule(x, q, p, V):
        h, correction = reference_thresholds(x, q, p, V, mutant)
        return [(pr, n, correction(n)) for n, pr in tau_law(h, mutant != "first_failure")
                if pr > 0]
    return rule


def drafts(case: Case, gamma: int, stop=None, peek_stop=None):
    """Every draft sequence with its probability under q. ``stop(prefix)``: the draft ends
    after ``prefix`` (a rule that sees only what was drafted); ``peek_stop(q, t)``: broken on
    purpose, the draft ends before a drawn token ``t`` that q found unlikely."""
    def rec(xs: tuple, pr: float):
        if len(xs) == gamma or (xs and stop is not None and stop(case, xs)):
            yield list(xs), pr
            return
        qv = case.Q(xs)
        for t in np.flatnonzero(qv):
            if peek_stop is not None and peek_stop(qv, int(t)):
                yield list(xs), pr * qv[t]
            else:
                yield from rec(xs + (int(t),), pr * qv[t])
    yield from rec((), 1.0)


def emitted_law(case: Case, rule: Rule, gamma: int, **how) -> tuple[dict, float]:
    """The law of one round's emitted tokens (accepted drafts + the target's token), and the
    expected number of accepted drafts."""
    out: dict = defaultdict(float)
    accepted = 0.0
    for x, px in drafts(case, gamma, **how):
        q = [case.q_dist(tuple(x[:i])) for i in range(len(x))]
        for pr, n, t_law in rule(x, q, lambda i, x=x: case.p_dist(tuple(x[:i])), case.V):
            accepted += px * pr * n
            for t in np.flatnonzero(t_law):
                out[tuple(x[:n]) + (int(t),)] += px * pr * t_law[t]
    return out, accepted


def completion_error(case: Case, law: dict, L: int) -> float:
    """Max |P(γ+1 tokens) − target's joint| once the round's output is completed by sampling
    from the target."""
    worst = abs(sum(law.values()) - 1.0)
    for seq in itertools.product(range(case.V), repeat=L):
        cond = [case.P(seq[:j])[seq[j]] for j in range(L)]
        target = float(np.prod(cond))
        got = sum(law.get(seq[:m], 0.0) * float(np.prod(cond[m:])) for m in range(1, L + 1))
        worst = max(worst, abs(got - target))
    return worst


def cases():
    for V, gamma, kind in itertools.product((3, 4, 5), (1, 2, 3), KINDS):
        yield Case(V, kind, seed=1000 * V + 10 * gamma + KINDS.index(kind)), gamma


CASES = list(cases())
IDS = [f"V{c.V}-g{g}-{c.kind}" for c, g in CASES]


@pytest.mark.parametrize("case,gamma", CASES, ids=IDS)
def test_block_verification_is_exactly_lossless(case, gamma):
    law, accepted_block = emitted_law(case, block_rule, gamma)
    assert completion_error(case, law, gamma + 1) < TOL
    # The token-wise rule is exact too, and never accepts more (the paper's Theorem 2).
    token_law, accepted_token = emitted_law(case, token_rule, gamma)
    assert completion_error(case, token_law, gamma + 1) < TOL
    assert accepted_block >= accepted_token - 1e-12


@pytest.mark.parametrize("case,gamma", CASES[::3], ids=IDS[::3])
def test_production_matches_the_reference_formulas(case, gamma):
    for x, _ in drafts(case, gamma):
        q = [case.q_dist(tuple(x[:i])) for i in range(len(x))]

        def p(i, x=x):
            return case.p_dist(tuple(x[:i]))
        h, correction = verify.block_thresholds(x, q, p)
        h_ref, corr_ref = reference_thresholds(x, q, p, case.V)
        np.testing.assert_allclose(h, h_ref, rtol=0, atol=1e-12)
        for n, pr in tau_law(h):
            if pr > 0:
                np.testing.assert_allclose(correction(n).dense(case.V), corr_ref(n),
                                           rtol=0, atol=1e-12)


def test_the_reference_itself_is_exact():
    for case, gamma in CASES[::5]:
        law, _ = emitted_law(case, reference_rule(), gamma)
        assert completion_error(case, law, gamma + 1) < TOL


@pytest.mark.parametrize("mutant", ["weight_one", "first_failure", "h_equals_w"])
def test_mutants_fail_the_same_exact_check(mutant):
    """Negative controls: each broken piece is caught (γ = 1 is the token rule whatever the
    mutant, so the drafts here are longer)."""
    errors = [completion_error(case, emitted_law(case, reference_rule(mutant), gamma)[0],
                               gamma + 1)
              for case, gamma in CASES if gamma >= 2 and case.kind in ("random", "mixed")]
    assert max(errors) > 1e-3, f"{mutant}: worst error {max(errors):.2e}: the check is blind"
    assert sum(e > TOL for e in errors) >= len(errors) // 2


def test_the_papers_example_accepts_11_9_tokens():
    """Sun et al., section 2: p = (1/3, 2/3), q = (2/3, 1/3) after every prefix, γ = 2:
    token-wise verification accepts 10/9 tokens per round in expectation, block
    verification 11/9."""
    case = Case(2, "random", 0)
    for prefix in itertools.product(range(2), repeat=3):
        for m in range(4):
            case._arrays[prefix[:m]] = (np.array([1, 2]) / 3, np.array([2, 1]) / 3,
                                        "dense", "dense")
    law, block = emitted_law(case, block_rule, 2)
    assert completion_error(case, law, 3) < TOL
    _, token = emitted_law(case, token_rule, 2)
    assert token == pytest.approx(10 / 9, abs=1e-12)
    assert block == pytest.approx(11 / 9, abs=1e-12)


# --- a draft whose length depends on what was drafted ----------------------------------------

def stop_when_unsure(case, xs):     # p_min / a length policy: q's confidence at the next step
    return case.Q(xs).max() < 0.55


def stop_after_token_0(case, xs):   # an end-of-generation token ends the draft
    return xs[-1] == 0


@pytest.mark.parametrize("stop", [stop_when_unsure, stop_after_token_0])
@pytest.mark.parametrize("case", [Case(4, "random", 7), Case(4, "mixed", 8),
                                  Case(3, "one_hot", 9)], ids=lambda c: c.kind)
def test_a_draft_length_decided_from_the_drafted_prefix_stays_exact(stop, case):
    """The loop's drafters end a draft on what they drafted so far (the policy's confidence
    gate, p_min, an end-of-generation token, an n-gram continuation): each draft length is
    then fixed by its prefix, and block verification stays exact."""
    law, _ = emitted_law(case, block_rule, 3, stop=stop)
    assert completion_error(case, law, 4) < TOL


def test_a_draft_cut_on_the_next_drawn_token_is_caught():
    """Negative control: ending the draft before a drawn token that q found unlikely biases
    the proposals; the exact check sees it under both rules."""
    case = Case(4, "random", 7)

    def peek(qv, t):
        return qv[t] < 0.2
    for rule in (block_rule, token_rule):
        law, _ = emitted_law(case, rule, 3, peek_stop=peek)
        assert completion_error(case, law, 4) > 1e-3


# --- verify_block's own choice of τ, with forced uniforms ---------------------------------

class ForcedRng:
    def __init__(self, values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def test_verify_block_takes_the_last_passing_position():
    """With the uniforms forced, verify_block returns the last position whose uniform is below
    its threshold, and draws the token from that position's correction. Its scan runs from the
    last position back, stops at the first pass and skips positions of weight 0, so the
    uniforms are given in that order; most cases also take its shortcut (η >= w_i fails
    without h_i's residual mass)."""
    rng = np.random.default_rng(0)
    patterns = set()
    for seed in range(400):
        case, gamma = Case(5, KINDS[seed % len(KINDS)], seed), 1 + seed % 4
        x: list = []
        for _ in range(gamma):
            qv = case.Q(tuple(x))
            x.append(int(rng.choice(case.V, p=qv)))
        q = [case.q_dist(tuple(x[:i])) for i in range(gamma)]

        def p(i, case=case, x=x):
            return case.p_dist(tuple(x[:i]))
        h, correction = verify.block_thresholds(x, q, p)
        w = [1.0]
        for i in range(gamma):
            w.append(min(1.0, w[i] * case.P(tuple(x[:i]))[x[i]] / case.Q(tuple(x[:i]))[x[i]]))
        for _ in range(10):
            eta, u = rng.random(gamma), float(rng.random())
            last = max((i + 1 for i in range(gamma) if eta[i] < h[i]), default=0)
            used = [eta[i - 1] for i in range(gamma, max(last, 1) - 1, -1) if w[i] > 0]
            n, t = verify.verify_block(x, q, p, ForcedRng(used + [u]), case.V)
            assert n == last
            assert t == correction(n).sample(ForcedRng([u]))
            patterns.add((gamma, tuple(eta < np.array(h))))
    assert len(patterns) > 20
