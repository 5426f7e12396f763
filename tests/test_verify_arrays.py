"""The verify step in arrays (issue 45): the target's rows warped together (warp_rows,
TargetRows) are warp's distributions to the last bit, and every rule makes the same choice with
the same draws from them as from rows warped one at a time."""

import numpy as np
import pytest

from edgespec.config import SamplingParams
from edgespec.sampling import Dist, warp, warp_rows
from edgespec.verify import TargetRows, speculative_sampling, verify_block, verify_keyed

PARAMS = [
    SamplingParams(),                                   # llama.cpp's defaults: top-k 40 …
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=0.5, top_k=5, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=1.3, top_k=40, top_p=0.5, min_p=0.0),
    SamplingParams(temperature=0.9, top_k=40, top_p=1.0, min_p=0.2),
    SamplingParams(temperature=0.7, top_k=100, top_p=0.8, min_p=0.02),
    SamplingParams(temperature=2.0, top_k=1),
    SamplingParams.neutral(1.0),                        # dense rows
    SamplingParams.neutral(0.6),
]


def logits_rows(rng, n_rows: int, n_vocab: int, ties: bool = False) -> np.ndarray:
    """Peaked rows (a few dozen likely tokens over a long tail); ``ties``: some rows with
    equal logits among and around their top entries, one of them flat."""
    rows = rng.normal(0.0, 2.0, (n_rows, n_vocab)).astype(np.float32)
    for row in rows:
        row[rng.choice(n_vocab, 30, replace=False)] += rng.normal(8.0, 2.0, 30).astype(np.float32)
    if ties:
        top = np.argsort(-rows, axis=1)
        rows[0, top[0, 1]] = rows[0, top[0, 0]]             # a tie at the top
        rows[1, top[1, 40]] = rows[1, top[1, 39]]           # at top-k's boundary
        rows[2, top[2, 7]] = rows[2, top[2, 5]]             # inside, a few apart
        rows[3] = 0.0                                       # flat: every entry ties
        rows[3, [5, 9]] = 1.0
        if n_rows > 4:
            rows[4, top[4, :3]] = -np.inf
    return rows


def assert_same(got: Dist, want: Dist) -> None:
    if want.ids is None:
        assert got.ids is None
    else:
        assert got.ids.dtype == want.ids.dtype
        np.testing.assert_array_equal(got.ids, want.ids)
    assert got.probs.dtype == want.probs.dtype
    np.testing.assert_array_equal(got.probs, want.probs)       # to the bit


@pytest.mark.parametrize("n_vocab", [64 * 50, 64 * 50 + 37, 49152])
@pytest.mark.parametrize("params", PARAMS)
def test_warp_rows_is_warp_to_the_bit(n_vocab, params):
    rng = np.random.default_rng(n_vocab)
    for ties in (False, True):
        logits = logits_rows(rng, 9, n_vocab, ties)
        if ties and params.top_k == 0:
            logits[4] = rng.normal(0.0, 2.0, n_vocab)           # dense rows: no -inf
        table = warp_rows(logits, params)
        if params.top_k >= n_vocab // 64 or (params.top_k == 0 and n_vocab > 5000):
            assert table is None    # a top-k of this many, large dense rows: warp does it
            continue
        for r in range(logits.shape[0]):
            assert_same(table.dist(r), warp(logits[r], params))


def test_warp_rows_on_gemma_sized_rows():
    rng = np.random.default_rng(3)
    logits = logits_rows(rng, 5, 262144, ties=True)
    params = SamplingParams(temperature=0.7)
    table = warp_rows(logits, params)
    for r in range(5):
        assert_same(table.dist(r), warp(logits[r], params))


@pytest.mark.parametrize("params,n_vocab", [(SamplingParams(temperature=0.0), 64 * 60),
                                             (SamplingParams(top_k=0), 64 * 60),
                                             (SamplingParams(top_k=0, min_p=0.1), 64 * 60),
                                             (SamplingParams(top_k=60), 64 * 60),
                                             (SamplingParams.neutral(1.0), 64 * 120)])
def test_warp_rows_leaves_other_paths_to_warp(params, n_vocab):
    assert warp_rows(np.zeros((9, n_vocab), np.float32), params) is None


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8),
                                    SamplingParams.neutral(1.0)])
def test_table_lookups_are_the_rows(params):
    rng = np.random.default_rng(5)
    logits = logits_rows(rng, 6, 64 * 100)
    logits[2, :100] = -200.0            # dense: probabilities that underflow to 0
    table = warp_rows(logits, params)
    dists = [warp(row, params) for row in logits]
    for _ in range(20):
        tokens = [int(d.sample(rng)) if rng.random() < 0.7 else int(rng.integers(-2, 6500))
                  for d in dists]
        assert table.probs_at(tokens[:4]) == [d.prob(t) for d, t in zip(dists, tokens[:4])]
    for seed in (0, 1, 2**64 - 1):
        assert table.sample_keyed(seed, 17) == [d.sample_keyed(seed, 17 + i)
                                                 for i, d in enumerate(dists)]


def rounds(n_vocab: int, K: int, params: SamplingParams, n: int, seed: int):
    """(target logits, q, x) of ``n`` rounds: the draft is the target plus noise."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        logits = logits_rows(rng, K + 1, n_vocab)
        draft = logits[:K] + rng.normal(0.0, 0.5, (K, n_vocab)).astype(np.float32)
        q = [warp(row, params) for row in draft]
        yield logits, q, [int(d.sample(rng)) for d in q]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7),
                                    SamplingParams.neutral(0.9)])
@pytest.mark.parametrize("K", [0, 1, 4, 8])
def test_the_rules_choose_alike_from_rows_in_arrays(params, K):
    """Every rule: the same (n, t) and the same number of uniforms drawn, whether the rows
    come warped together (TargetRows) or one at a time (a callable, as before)."""
    for logits, q, x in rounds(64 * 100, K, params, 40, seed=K):
        together = TargetRows(logits, params, [], x)
        alone = lambda i, lg=logits: warp(lg[i], params)       # noqa: E731
        for rule in (verify_block, speculative_sampling):
            a, b = np.random.default_rng(K), np.random.default_rng(K)
            assert rule(x, q, together, a, 64 * 100) == rule(x, q, alone, b, 64 * 100)
            assert a.random() == b.random()
        assert (together.table is not None) == (K > 0)     # a single short row: warp alone
        assert verify_keyed(x, together, 11, 300) == verify_keyed(x, alone, 11, 300)


def test_target_rows_warp_each_row_with_a_grammar_or_a_penalty():
    rng = np.random.default_rng(2)
    logits = logits_rows(rng, 3, 64 * 100)
    x, history = [5, 9], [1, 5, 5]
    masks = [rng.random(64 * 100) < 0.5 for _ in range(3)]
    for params, m in ((SamplingParams(), masks), (SamplingParams(repeat_penalty=1.3), None)):
        p = TargetRows(logits, params, history, x, m)
        for i in range(3):
            assert_same(p(i), warp(logits[i], params, history + x[:i],
                                   m[i] if m is not None else None))
        assert p.table is None
