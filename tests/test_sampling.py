"""warp(): llama.cpp's sampler semantics, checked against straightforward reference code."""

import math

import numpy as np
import pytest

from edgespec.config import SamplingParams
from edgespec.errors import InvalidParameterError
from edgespec.sampling import Dist, apply_penalties, top_k_ids, warp


def ref_warp(logits, params: SamplingParams, history=()):
    """Reference: full sort, llama.cpp chain order, float64 throughout."""
    x = apply_penalties(np.asarray(logits, np.float32), params, history).astype(np.float64)
    if params.temperature == 0:
        out = np.zeros_like(x)
        out[np.argmax(x)] = 1
        return out
    order = np.argsort(-x, kind="stable")
    keep = order
    if params.top_k > 0:
        keep = keep[: params.top_k]
    if params.top_p < 1:
        pr = np.exp(x[keep] - x[keep].max())
        pr /= pr.sum()
        cum = np.cumsum(pr)
        n = int(np.searchsorted(cum, params.top_p, side="left")) + 1
        keep = keep[:max(1, min(n, keep.size))]
    if params.min_p > 0:
        keep = keep[x[keep] >= x[keep].max() + math.log(params.min_p)]
    out = np.zeros_like(x)
    z = x[keep] / params.temperature
    e = np.exp(z - z.max())
    out[keep] = e / e.sum()
    return out


@pytest.mark.parametrize("n_vocab", [10, 1000, 262144])
@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(temperature=0.5, top_k=5, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=1.3, top_k=0, top_p=0.9, min_p=0.0),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1),
    SamplingParams(temperature=0.7, top_k=100, top_p=0.8, min_p=0.02),
    SamplingParams.neutral(1.0),
    SamplingParams.neutral(2.0),
])
def test_warp_matches_reference(n_vocab, params):
    rng = np.random.default_rng(n_vocab)
    logits = (rng.normal(0, 3, n_vocab)).astype(np.float32)
    got = warp(logits, params).dense(n_vocab)
    want = ref_warp(logits, params)
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert got.sum() == pytest.approx(1.0)


def test_greedy_is_one_hot_argmax():
    logits = np.array([0.1, 3.0, 2.9], np.float32)
    d = warp(logits, SamplingParams(temperature=0))
    assert d.argmax() == 1 and d.prob(1) == 1.0


@pytest.mark.parametrize("k", [1, 7, 40, 1000])
def test_top_k_ids_is_exact_on_a_large_row(k):
    rng = np.random.default_rng(k)
    logits = rng.standard_normal(262144).astype(np.float32)
    got = np.sort(top_k_ids(logits, k))
    want = np.sort(np.argsort(-logits)[:k])
    np.testing.assert_array_equal(got, want)


def test_top_k_ids_handles_a_row_with_many_ties():
    logits = np.zeros(262144, np.float32)
    logits[[5, 9]] = 1.0
    ids = top_k_ids(logits, 40)
    assert ids.size == 40 and {5, 9} <= set(ids.tolist())


def test_repeat_penalty_follows_llama_cpp():
    logits = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    p = SamplingParams(repeat_penalty=2.0, repeat_last_n=2)
    out = apply_penalties(logits, p, history=[3, 0, 1])     # only [0, 1] are recent
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, 0.5])
    assert logits[0] == 2.0                                  # input untouched


def test_presence_and_frequency_penalties():
    logits = np.zeros(3, np.float32)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, p, history=[1, 1, 2])
    np.testing.assert_allclose(out, [0.0, -1.0, -0.75])


def test_penalty_changes_greedy_choice():
    logits = np.array([1.0, 0.9], np.float32)
    assert warp(logits, SamplingParams(temperature=0, repeat_penalty=1.5),
                history=[0]).argmax() == 1


def test_sample_follows_the_distribution():
    d = Dist(np.array([4, 8]), np.array([0.25, 0.75]))
    rng = np.random.default_rng(0)
    draws = np.array([d.sample(rng) for _ in range(20000)])
    assert set(draws.tolist()) == {4, 8}
    assert abs((draws == 8).mean() - 0.75) < 0.015


@pytest.mark.parametrize("kwargs,name", [
    ({"temperature": -1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"),
    ({"min_p": 1.1}, "min_p"), ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"seed": -3}, "seed"), ({"temperature": "hot"}, "temperature"),
    ({"presence_penalty": 3}, "presence_penalty"),
])
def test_invalid_parameters_name_the_parameter_and_range(kwargs, name):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(**kwargs)
    assert e.value.name == name
    assert str(e.value).startswith(f"{name}=") and "must be" in str(e.value)


# --- seeded sampling: noise keyed by (seed, position, token) ------------------------------------

from edgespec.sampling import keyed_uniforms  # noqa: E402

CHI2_999 = {9: 27.88, 39: 72.05}     # 0.999 quantiles of chi-square


def chi2(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def test_keyed_uniforms_are_uniform_and_keyed():
    u = keyed_uniforms(3, 17, np.arange(200_000))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    assert np.array_equal(u[:10], keyed_uniforms(3, 17, np.arange(10)))
    assert not np.array_equal(u[:10], keyed_uniforms(3, 18, np.arange(10)))
    assert not np.array_equal(u[:10], keyed_uniforms(4, 17, np.arange(10)))


@pytest.mark.parametrize("case", range(4))
def test_the_keyed_sampler_draws_the_warped_distribution(case):
    """Over seeds, the keyed sample of a warped row is distributed as the warp says."""
    rng = np.random.default_rng(case)
    logits = rng.normal(0, 2, 5000).astype(np.float32)
    params = [SamplingParams(temperature=0.8, top_k=10, top_p=1.0, min_p=0.0),
              SamplingParams(temperature=1.2, top_k=40, top_p=0.9, min_p=0.0),
              SamplingParams(temperature=0.8),
              SamplingParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0)][case]
    d = warp(logits, params)
    ids = d.ids if d.ids is not None else np.arange(d.probs.size)
    index = {int(t): i for i, t in enumerate(ids)}
    n = 20_000
    counts = np.zeros(len(ids))
    for seed in range(n):
        counts[index[d.sample_keyed(seed, position=case)]] += 1
    df = len(ids) - 1
    limit = CHI2_999.get(df, df + 4.5 * np.sqrt(2 * df))
    assert chi2(counts, d.probs) < limit


def test_a_biased_keyed_sampler_fails_the_same_test():
    """Negative control: racing uniform (not exponential) noise against p is biased."""
    p = np.full(10, 0.02)
    p[0] = 0.82
    ids = np.arange(10)
    counts = np.zeros(10)
    for seed in range(20_000):
        u = keyed_uniforms(seed, 0, ids)
        counts[int(np.argmin(u / p))] += 1          # should be -log(u) / p
    assert chi2(counts, p) > 10 * CHI2_999[9]
