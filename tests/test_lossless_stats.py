"""Statistical losslessness: speculative sampling emits exactly the target's distribution.

Every comparison is a G-test of what the real code emitted against the exact distribution of
plain target sampling (tests/goodness.py), and a test fails when a p-value is below
``ALPHA = 1e-6`` divided by the number of comparisons it makes: a correct implementation
fails a test with probability about one in a million, whatever its seeds (the statistic's
null law was checked against multinomial and Markov-chain simulations of these very laws down
to p = 1e-5). Every negative control must fail the same test by a wide margin, which shows
the test has the power to notice. Power is stated as the noncentrality
``λ = n · Σ (f − p)² / p`` of an emitted law f that the test catches.

1. Single position: 100 seeded (p, q) pairs over a vocabulary of 10, twenty of each kind
   (random, p == q, disjoint supports, q = 0 where p > 0, peaked p); 10k draws each through
   the real verifier; each pair's counts against p. Three broken verifiers must fail.
2. Several positions: 4000 runs of 10 tokens through the real decoding loop with K in
   {1, 2, 4, 8}, a Markov target and a deliberately skewed Markov draft; every position's
   marginal, the joint of positions 1–3, and every step given the previous token against the
   closed form of plain target sampling. Unseeded runs go through block verification (the
   default) for every drafter and K, and token-wise rejection sampling for K = 4, the
   adaptive model drafter and the adaptive hybrid; a broken rule of either kind must fail the
   same test. A second, sharper pair on three tokens (where block verification's weighted
   residual matters most) runs both rules and catches the subtle block mutant: the residual
   not weighted by the accepted prefix.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
from dataclasses import dataclass

import numpy as np
import pytest

from edgespec import verify
from edgespec.config import SamplingParams
from edgespec.drafting import (AdaptiveLength, Costs, FixedLength, HybridDrafter, ModelDrafter,
                               NgramDrafter)
from edgespec.drafting.suffix import SuffixIndex
from edgespec.sampling import Dist
from edgespec.verify import residual
from edgespec.results import LoopStats
from edgespec.speculative import decode

from goodness import ALPHA, excess, g_test, transition_test
from markov import MarkovLM, softmax

V = 10
N_DRAWS = 10_000
N_PAIRS = 100
PAIR_LIMIT = ALPHA / N_PAIRS        # each pair's p-value must be at least this


def make_pair(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A (p, q) pair; ``seed % 5`` is its kind, four of the five are edge cases."""
    rng = np.random.default_rng(seed)
    kind = seed % 5
    p = rng.dirichlet(np.full(V, 0.5))
    q = rng.dirichlet(np.full(V, 0.5))
    if kind == 1:                                   # p == q
        q = p.copy()
    elif kind == 2:                                 # disjoint supports
        p[V // 2:] = 0
        q[: V // 2] = 0
    elif kind == 3:                                 # q = 0 where p > 0
        q[rng.choice(V, 4, replace=False)] = 0
    elif kind == 4:                                 # peaked p, flat q
        p = softmax(rng.normal(0, 4, V))
    return p / p.sum(), q / q.sum()


def draw(method: str, p_arr: np.ndarray, q_arr: np.ndarray, seed: int, n: int) -> np.ndarray:
    """Emit n first tokens with the real verifier (or a broken variant) and count them."""
    xs = np.random.default_rng(seed + 10_000).choice(V, n, p=q_arr)
    if method == "always_accept":
        return np.bincount(xs, minlength=V)
    rng = np.random.default_rng(seed + 20_000)
    p = Dist(None, p_arr)
    q_seen = Dist(None, q_arr)
    if method == "wrong_temperature":               # x drawn from q, verified against q^(1/2)
        q_seen = Dist(None, np.sqrt(q_arr) / np.sqrt(q_arr).sum())
    target = lambda i: p                            # noqa: E731
    sampling = verify.speculative_sampling
    counts = [0] * V
    for x in xs.tolist():
        m, t = sampling([x], [q_seen], target, rng, V)
        counts[x if m == 1 else t] += 1
    return np.array(counts)


def _job(args):
    method, seed, n = args
    p, q = make_pair(seed)
    if method == "resample_from_p":                 # the residual replaced by p itself
        verify.residual = lambda p_, q_, w=1.0: p_
    counts = draw(method, p, q, seed, n)
    verify.residual = residual
    g, df, p_value = g_test(counts, p)
    return seed, g, df, p_value, int(counts.sum())


def run_method(method: str, seeds, n: int):
    """(seed, G, df, p-value, draws) of each pair."""
    with mp.get_context("fork").Pool(2) as pool:
        return pool.map(_job, [(method, s, n) for s in seeds])


@pytest.mark.slow
def test_single_position_verifier_is_lossless():
    """Each pair's G-test against p has p-value >= 1e-6 / 100. Power: λ = 80 fails with
    probability 98% (0.02 of probability moved between two tokens of p ≈ 0.1); the controls
    below fail by far more."""
    results = run_method("real", range(N_PAIRS), N_DRAWS)
    least = min(results, key=lambda r: r[3])
    assert all(r[4] == N_DRAWS for r in results)
    assert least[3] >= PAIR_LIMIT, f"pair {least[0]}: G {least[1]:.1f} ({least[2]} df), " \
                                   f"p = {least[3]:.2e} < {PAIR_LIMIT:.0e}"


@pytest.mark.slow
@pytest.mark.parametrize("method,failing,at_least", [("always_accept", 16, 100),
                                                      ("resample_from_p", 10, 10),
                                                      ("wrong_temperature", 13, 10)])
def test_negative_controls_fail_the_same_test(method, failing, at_least):
    """The same test on the first twenty pairs (four of each kind): at least ``failing`` of
    them fail it (p == q leaves every one of these broken verifiers exact, disjoint supports
    all but the first; then a peaked p barely moves), and the worst one's G is at least
    ``at_least`` times the critical value (measured: 16 pairs and inf, 11 and 38×, 15 and
    25×)."""
    results = run_method(method, range(20), N_DRAWS)
    failed = [r for r in results if r[3] < PAIR_LIMIT]
    worst = max(excess(r[1], r[2], PAIR_LIMIT) for r in results)
    assert len(failed) >= failing, f"{method}: only {len(failed)} pairs failed the test"
    assert worst >= at_least, f"{method}: the worst G is only {worst:.1f} × critical"


# --- several positions through the real loop ------------------------------------------------

N_RUNS = 4_000
# The two acceptance rules at K = 4, the defaults, keep the earlier suite's sample size: a
# shift of one marginal's probability that 4,000 runs miss below ~0.048 is seen from ~0.021.
FULL_RUNS = 20_000
N_NEW = 10


@dataclass(frozen=True, eq=False)
class Chain:
    """A Markov target and draft (logits; row ``a``: after token ``a``), the context every
    run starts from, and the exact law of plain target sampling after it."""

    target: np.ndarray
    draft: np.ndarray
    context: tuple

    @property
    def n(self) -> int:
        return self.target.shape[0]

    @property
    def P(self) -> np.ndarray:
        """The target's transitions, from the float32 logits the model serves."""
        return softmax(self.target.astype(np.float32).astype(np.float64))

    def marginals(self) -> list[np.ndarray]:
        dist, out = np.eye(self.n)[self.context[-1]], []
        for _ in range(N_NEW):
            dist = dist @ self.P
            out.append(dist)
        return out

    def joint3(self) -> np.ndarray:
        """P(positions 1, 2, 3) as an (n, n, n) array."""
        P = self.P
        return P[self.context[-1]][:, None, None] * P[:, :, None] * P[None, :, :]


def _main_chain(seed=3) -> Chain:
    rng = np.random.default_rng(seed)
    target = rng.normal(0, 1.5, (6, 6))
    # Skewed draft: prefers token 0 everywhere and flattens the rest.
    draft = 0.3 * target + np.where(np.arange(6) == 0, 2.0, 0.0)
    return Chain(target, draft, (1, 2, 3, 1, 2))


MAIN = _main_chain()
# Three tokens. After 0 the target all but surely says 1 where the draft says 0 or 1 evenly;
# after 1 the draft all but surely says 2, which the target says two times in three. A draft
# from 0 often keeps a prefix whose weight w_τ is about 1/2 and is rejected after it, which is
# where block verification's residual max(0, w_τ·p − q) differs most from max(0, p − q)
# (found by computing that mutant's exact output law over such pairs).
SHARP = Chain(np.array([[-3.0, 1.3, -3.0], [-0.6, -1.6, 0.3], [0.8, -1.0, 2.0]]),
              np.array([[3.0, 3.0, -1.3], [-3.0, -1.5, 3.0], [-3.0, 3.0, 3.0]]),
              (1, 2, 0))
CHAINS = {"main": MAIN, "sharp": SHARP}


def make_policy(K, free=False):
    if K in ("adaptive", "hybrid-adaptive"):
        # Costs under which drafting pays, so the adaptive policy drafts varying lengths. They
        # are not learned from this machine's timings: the lengths drafted, and so the counts
        # the tests assert on, must not depend on how busy the machine is.
        return AdaptiveLength(Costs({1: 1.0, 2: 1.1, 9: 1.8}, 1e-4 if free else 0.05), k_max=8,
                              learns_costs=False)
    return FixedLength(K)


def make_drafter(kind: str, draft: MarkovLM, K):
    if kind == "model":
        return ModelDrafter(draft, frozenset(), make_policy(K))
    if kind == "model-p-min":       # cut where the draft's top probability is below 0.5
        return ModelDrafter(draft, frozenset(), FixedLength(K, p_min=0.5))
    if kind == "cut-on-drawn-token":
        return _StopsOnTheDrawnToken(draft, frozenset(), make_policy(K))
    if kind == "ngram":
        return NgramDrafter(make_policy(K), ngram_min=1, ngram_max=3)
    if kind in ("suffix", "hybrid-suffix"):
        # Drafts from the earlier runs' samples too (drafting/suffix.py: run_loop feeds it):
        # the proposals now depend on what earlier runs drew, the output must not.
        index = _CountingIndex()
        ngram = _CountingNgram(make_policy(K, free=kind != "suffix"), ngram_min=2, ngram_max=3,
                               index=lambda: index)
        ngram.suffix = index
        if kind == "suffix":
            return ngram
        hybrid = HybridDrafter(ModelDrafter(draft, frozenset(), make_policy(K)), ngram)
        hybrid.suffix = index
        return hybrid
    ngram = NgramDrafter(make_policy(K, free=True), ngram_min=3 if kind == "hybrid-extend" else 2)
    if kind == "hybrid-extend":
        # The model drafts when there is no 3-token match, and a match of the context plus
        # its draft ends the draft with the n-gram's continuation.
        return HybridDrafter(_CountingModelDrafter(draft, frozenset(), make_policy(K)), ngram,
                             extend_match=2)
    return HybridDrafter(ModelDrafter(draft, frozenset(), make_policy(K)), ngram)


class _CountingIndex(SuffixIndex):
    """Counts the lookups that found an earlier run's continuation."""

    found = 0

    def lookup(self, context, k):
        out = super().lookup(context, k)
        self.found += bool(out[0])
        return out


class _CountingNgram(NgramDrafter):
    """Counts the rounds whose long match drafted past the policy's plan."""

    long_rounds = 0

    def draft(self, *args, **kwargs):
        out = super().draft(*args, **kwargs)
        self.long_rounds += self.long_match
        return out


class _StopsOnTheDrawnToken(ModelDrafter):
    """Broken on purpose: ends its draft where the token it drew was unlikely under q. A stop
    decision that looks at the drawn token makes the proposals a biased sample of q."""

    def draft(self, context, *args, **kwargs):
        d = super().draft(context, *args, **kwargs)
        for i, (x, q) in enumerate(zip(d.x, d.q)):
            if q.prob(x) < 0.2:
                del d.x[i:], d.q[i:], d.confidences[i:], d.free[i:]
                break
        return d


class _CountingModelDrafter(ModelDrafter):
    extended_rounds = 0

    def draft(self, *args, **kwargs):
        out = super().draft(*args, **kwargs)
        self.extended_rounds += bool(out.extended)
        return out


def run_loop(K, seed: int, kind: str = "model", keyed: bool = False, verifier: str = "block",
             chain: Chain = MAIN, runs: int = N_RUNS, params: SamplingParams | None = None):
    """``runs`` generations of N_NEW tokens after ``chain``'s context; ``keyed``: run r is
    seeded with seed + r (noise keyed by position) instead of drawing from one generator.
    ``kind="plain"``: no drafter. ``verifier``: the acceptance rule of unseeded sampling.
    ``params``: the sampler (default: plain softmax at T = 1)."""
    target, draft = MarkovLM(chain.target), MarkovLM(chain.draft)
    drafter = make_drafter(kind, draft, K) if kind != "plain" else None
    run_loop.drafter = drafter
    params = SamplingParams.neutral(1.0) if params is None else params
    rng = np.random.default_rng(seed)
    seqs = np.zeros((runs, N_NEW), dtype=np.int64)
    stats = LoopStats()
    for r in range(runs):
        context = list(chain.context)
        target.truncate(0)
        target.eval(context[:-1], 0)
        if drafter is not None:
            drafter.rollback(0)
        run_params = params.replace(seed=seed + r) if keyed else params
        out = [s.token for s in decode(target, context, params=run_params, rng=rng,
                                       max_tokens=N_NEW, drafter=drafter, stats=stats,
                                       verifier=verifier)]
        seqs[r] = out
        if hasattr(drafter, "suffix"):
            drafter.suffix.add(list(chain.context) + out)
    return seqs, stats


@functools.cache
def _plain_keyed_runs(seed: int) -> np.ndarray:
    """Plain keyed sampling's runs (the same for every drafter the seeded test compares)."""
    return run_loop(0, seed=seed, kind="plain", keyed=True)[0]


@functools.cache
def _plain_keyed_penalised(seed: int) -> np.ndarray:
    return run_loop(0, seed=seed, kind="plain", keyed=True, params=APP_SAMPLER)[0]


N_STATS = N_NEW + 2                 # the marginals, the joint of 1–3, the transitions
LIMIT = ALPHA / N_STATS


def comparisons(seqs: np.ndarray, chain: Chain = MAIN) -> list[tuple[str, float, int, float]]:
    """``(what, G, df, p-value)`` of each comparison with plain target sampling: every
    position's marginal, the joint of positions 1–3, every step given the previous token."""
    n = chain.n
    out = [(f"position {j + 1}", *g_test(np.bincount(seqs[:, j], minlength=n), m))
           for j, m in enumerate(chain.marginals())]
    triples = (seqs[:, 0] * n + seqs[:, 1]) * n + seqs[:, 2]
    out.append(("joint of 1-3", *g_test(np.bincount(triples, minlength=n ** 3),
                                        chain.joint3().ravel())))
    out.append(("every step", *transition_test(seqs, chain.P, chain.context[-1])))
    assert len(out) == N_STATS
    return out


def worst(seqs: np.ndarray, chain: Chain = MAIN):
    """The comparison furthest from passing, and its G over its critical value (at least 1:
    the test fails)."""
    found = max(comparisons(seqs, chain), key=lambda c: excess(c[1], c[2], LIMIT))
    return found, excess(found[1], found[2], LIMIT)


def check_matches_plain(seqs, chain: Chain = MAIN):
    """Every comparison's p-value is at least 1e-6 / 12. Power: a marginal with λ = 70 fails
    with probability 99% (over 4,000 runs, 0.048 of probability moved between the two
    likeliest tokens of the main pair's position 2; over 20,000, 0.021), and so does a wrong
    step (λ ≈ 180 over all of them) or joint that the marginals average out."""
    found, ratio = worst(seqs, chain)
    assert ratio < 1, f"{found[0]}: G {found[1]:.1f} ({found[2]} df), p = {found[3]:.2e}"


def check_caught(seqs, at_least: float, chain: Chain = MAIN):
    """A negative control: the same test fails, its worst G at least ``at_least`` times the
    critical value."""
    found, ratio = worst(seqs, chain)
    assert ratio >= at_least, f"only {ratio:.2f} × critical: {found}"


VERIFIERS = ["block", "token"]


@pytest.mark.slow
@pytest.mark.parametrize("K,verifier,chain", [(K, "block", "main")
                                              for K in (1, 2, 4, 8, "adaptive")] +
                         [(4, "token", "main"), ("adaptive", "token", "main"),
                          (2, "block", "sharp"), (2, "token", "sharp")])
def test_multi_position_loop_matches_plain_sampling(K, verifier, chain):
    seed = 100 + (K if isinstance(K, int) else 50)
    runs = FULL_RUNS if K == 4 and chain == "main" else N_RUNS
    seqs, stats = run_loop(K, seed=seed, verifier=verifier, chain=CHAINS[chain], runs=runs)
    assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted  # rejections did happen
    if K == "adaptive":
        assert len(set(stats.tested_at)) > 1      # the draft length really varied
    check_matches_plain(seqs, CHAINS[chain])


@pytest.mark.slow
@pytest.mark.parametrize("kind,K,verifier", [
    ("ngram", 4, "block"), ("hybrid", 4, "block"), ("hybrid", "hybrid-adaptive", "block"),
    ("hybrid-extend", 6, "block"), ("hybrid", "hybrid-adaptive", "token"),
    ("suffix", 4, "block"), ("hybrid-suffix", "hybrid-adaptive", "block"),
    ("suffix", "adaptive", "token")])
def test_multi_position_other_drafters_match_plain_sampling(kind, K, verifier):
    seqs, stats = run_loop(K, seed=7 + len(kind), kind=kind, verifier=verifier)
    assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted
    if kind == "hybrid-extend":     # model drafts that an n-gram match continued
        assert run_loop.drafter.model.extended_rounds > N_RUNS // 20
    if "suffix" in kind:            # earlier runs' continuations were proposed
        assert run_loop.drafter.suffix.found > N_RUNS
        if K != 4:                  # a cost model: long matches drafted past its plan
            ngram = run_loop.drafter if kind == "suffix" else run_loop.drafter.ngram
            assert ngram.long_rounds > N_RUNS // 10
    check_matches_plain(seqs)


@pytest.mark.slow
@pytest.mark.parametrize("kind,K", [("model", 4), ("model", "adaptive"), ("ngram", 4),
                                    ("hybrid", "hybrid-adaptive")])
def test_seeded_sampling_is_lossless_and_independent_of_the_drafts(kind, K):
    """With noise keyed by (seed, position, token), each seed's output is the plain target
    sample's, token for token, whatever the drafter and K; over seeds it is distributed as
    plain target sampling."""
    plain = _plain_keyed_runs(1_000)
    seqs, stats = run_loop(K, seed=1_000, kind=kind, keyed=True)
    assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted
    assert np.array_equal(seqs, plain)
    check_matches_plain(seqs)


@pytest.mark.slow
@pytest.mark.parametrize("verifier", VERIFIERS)
def test_a_draft_cut_by_its_confidence_stays_lossless(verifier):
    """The stop rule may look at q (the draft's confidence) before the token is drawn."""
    seqs, stats = run_loop(4, seed=21, kind="model-p-min", verifier=verifier)
    assert 0 < stats.drafted < 0.9 * 4 * stats.rounds           # the gate did cut drafts
    check_matches_plain(seqs)


@pytest.mark.slow
def test_a_draft_cut_on_the_drawn_token_is_caught():
    """Negative control for the stop rule: cutting where the drawn token was unlikely under
    q (edgespec.drafting.policy's docstring) biases the output, and the test sees it."""
    seqs, _ = run_loop(4, seed=21, kind="cut-on-drawn-token")
    check_caught(seqs, at_least=10)                 # measured: 32× (position 9)


@pytest.mark.slow
@pytest.mark.parametrize("verifier,rule", [("block", "verify_block"),
                                           ("token", "speculative_sampling")])
def test_multi_position_negative_control_fails(monkeypatch, verifier, rule):
    """Accepting every draft token emits the skewed draft's distribution: the test sees it."""
    import edgespec.speculative as spec
    monkeypatch.setattr(spec, rule,
                        lambda x, q, p, rng, n_vocab: (len(x), p(len(x)).sample(rng)))
    seqs, _ = run_loop(4, seed=7, verifier=verifier)
    check_caught(seqs, at_least=10)                 # measured: 78× (position 3)


@pytest.mark.slow
def test_accepting_every_suffix_draft_is_caught(monkeypatch):
    """Negative control with drafts from earlier runs: accepting them all repeats what earlier
    runs drew (the most frequent continuation), not the target's law; the test sees it."""
    import edgespec.speculative as spec
    monkeypatch.setattr(spec, "verify_block",
                        lambda x, q, p, rng, n_vocab: (len(x), p(len(x)).sample(rng)))
    seqs, _ = run_loop(4, seed=11, kind="suffix", runs=N_RUNS // 4)
    check_caught(seqs, at_least=3)


def _first_failure_block_rule(x, q, p, rng, n_vocab):
    """Broken on purpose: block verification's thresholds and weighted residuals, but the draft
    ends at the first position that fails (token-wise style) instead of at the last one that
    passes."""
    h, correction = verify.block_thresholds(x, q, p)
    n = 0
    while n < len(h) and rng.random() < h[n]:
        n += 1
    return n, correction(n).sample(rng)


@pytest.mark.slow
def test_a_broken_block_rule_fails_the_same_test(monkeypatch):
    """Negative control for block verification: the same multi-position test catches a block
    rule that stops at the first failure."""
    import edgespec.speculative as spec
    monkeypatch.setattr(spec, "verify_block", _first_failure_block_rule)
    seqs, _ = run_loop(4, seed=100 + 4, verifier="block")
    check_caught(seqs, at_least=10)                 # measured: 62× (position 8)


@pytest.mark.slow
def test_an_unweighted_block_residual_fails_the_same_test(monkeypatch):
    """Negative control for block verification's correction: the residual max(0, p − q)
    instead of max(0, w_τ·p − q) (not weighted by the accepted prefix). On the main pair it
    moves the output law by far less than any affordable test's noise; the sharp pair's test
    sees it (exactly: 4000 · Σ (f − p)² / p ≈ 190 on the joint of positions 1–3, ≈ 160 on
    position 3's marginal; the exact check in tests/test_block_verify.py also catches it)."""
    monkeypatch.setattr(verify, "residual", lambda p, q, w=1.0: residual(p, q))
    seqs, _ = run_loop(2, seed=100 + 2, verifier="block", chain=SHARP)
    check_caught(seqs, at_least=2, chain=SHARP)     # measured: 6.4× (position 3)


# 3. Penalties. A penalty at a position depends on every token before it, the drafted ones of
# the same verify pass included (row i of a pass is warped after the context and x_1..x_i).
# The target's law is then no longer a Markov chain's: it is computed exactly by enumerating
# the first PENALISED tokens (6^6 answers), warped by the sampler itself after each history.
# The sampler is an app's (Ollama's default shape: temperature below 1, top_p, a repeat
# penalty over a short window, presence and frequency penalties), strong enough on six tokens
# to move the law far from the plain chain's.
APP_SAMPLER = SamplingParams(temperature=0.8, top_k=0, top_p=0.9, min_p=0.0,
                             repeat_penalty=1.5, repeat_last_n=4, presence_penalty=0.4,
                             frequency_penalty=0.3)
PENALISED = 6


@functools.cache
def penalised_law(chain: Chain = MAIN, params: SamplingParams = APP_SAMPLER) -> np.ndarray:
    """P(first PENALISED tokens) under ``params`` after ``chain``'s context, as an array of
    shape (n,) * PENALISED."""
    from edgespec.sampling import warp
    table = chain.target.astype(np.float32)
    law = np.zeros((chain.n,) * PENALISED)

    def grow(seq: tuple, p_seq: float) -> None:
        if len(seq) == PENALISED:
            law[seq] = p_seq
            return
        history = list(chain.context) + list(seq)
        probs = warp(table[history[-1]].copy(), params, history).dense(chain.n)
        for t in np.flatnonzero(probs):
            grow(seq + (int(t),), p_seq * float(probs[t]))

    grow((), 1.0)
    return law


N_PENALISED_STATS = PENALISED + 2


def penalised_comparisons(seqs: np.ndarray) -> list[tuple[str, float, int, float]]:
    """Every position's marginal, the joints of positions 1-3 and 4-6, against the exact law."""
    law, n = penalised_law(), MAIN.n
    out = []
    for j in range(PENALISED):
        marginal = law.sum(axis=tuple(a for a in range(PENALISED) if a != j))
        out.append((f"position {j + 1}", *g_test(np.bincount(seqs[:, j], minlength=n),
                                                 marginal)))
    for a in (0, 3):
        joint = law.sum(axis=tuple(b for b in range(PENALISED) if not a <= b < a + 3))
        cells = (seqs[:, a] * n + seqs[:, a + 1]) * n + seqs[:, a + 2]
        out.append((f"joint of {a + 1}-{a + 3}", *g_test(np.bincount(cells, minlength=n ** 3),
                                                         joint.ravel())))
    assert len(out) == N_PENALISED_STATS
    return out


def penalised_worst(seqs: np.ndarray):
    found = max(penalised_comparisons(seqs),
                key=lambda c: excess(c[1], c[2], ALPHA / N_PENALISED_STATS))
    return found, excess(found[1], found[2], ALPHA / N_PENALISED_STATS)


def test_the_penalised_law_is_not_the_plain_chains():
    """The penalties matter here: the exact law of position 3 is far from the plain chain's
    at the same temperature (a test that passed both would not be testing penalties)."""
    law = penalised_law()
    plain = penalised_law(MAIN, APP_SAMPLER.replace(repeat_penalty=1.0, presence_penalty=0.0,
                                                    frequency_penalty=0.0))
    assert np.isclose(law.sum(), 1.0) and np.isclose(plain.sum(), 1.0)
    third = law.sum(axis=(0, 1, 3, 4, 5))
    third_plain = plain.sum(axis=(0, 1, 3, 4, 5))
    assert 0.5 * np.abs(third - third_plain).sum() > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("kind,K,verifier", [("model", 4, "block"), ("model", 4, "token"),
                                             ("hybrid", 4, "block")])
def test_penalties_stay_lossless_inside_a_verify_pass(kind, K, verifier):
    seqs, stats = run_loop(K, seed=300 + len(kind), kind=kind, verifier=verifier,
                           params=APP_SAMPLER)
    assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted
    # drafts of several tokens were judged: rows past the first carried drafted history
    assert len(stats.tested_at) >= 2 and stats.tested_at[1] > 0
    found, ratio = penalised_worst(seqs)
    assert ratio < 1, f"{found[0]}: G {found[1]:.1f} ({found[2]} df), p = {found[3]:.2e}"


@pytest.mark.slow
def test_seeded_penalised_sampling_is_the_plain_text():
    """Seeded with an app's sampler, every run is the plain seeded run, token for token."""
    plain = _plain_keyed_penalised(2_000)
    seqs, stats = run_loop(4, seed=2_000, kind="model", keyed=True, params=APP_SAMPLER)
    assert stats.drafted > 0 and 0 < stats.accepted < stats.drafted
    assert np.array_equal(seqs, plain)
    found, ratio = penalised_worst(seqs)
    assert ratio < 1, found


@pytest.mark.slow
@pytest.mark.parametrize("keyed", [False, True])
def test_penalties_blind_to_the_drafts_are_caught(monkeypatch, keyed):
    """Negative control: a verify pass that warps every row after the context alone (the
    drafted tokens before a row left out of its penalties) emits another law; the same test
    sees it, seeded or not. Over a quarter of the runs: measured, it emits answers the exact
    law gives no chance (top_p cuts the token it keeps), so G is infinite at 1,000 runs as at
    4,000."""
    import edgespec.speculative as spec
    from edgespec.verify import TargetRows
    monkeypatch.setattr(spec, "TargetRows", lambda rows, params, tail, x, masks:
                        TargetRows(rows, params, tail, [], masks))
    seqs, _ = run_loop(4, seed=400, kind="model", keyed=keyed, params=APP_SAMPLER,
                       runs=N_RUNS // 4)
    _, ratio = penalised_worst(seqs)
    assert ratio >= 3, ratio
