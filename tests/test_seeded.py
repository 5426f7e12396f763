"""A seed gives the same text with speculation on or off, on the real pairs: 20 prompts × 3
seeds, every drafter, the adaptive draft length. The noise of each position is keyed by
(seed, position, token), so a draft can only be accepted where it equals the target's own
sample; a divergence is allowed only where batched and one-by-one logits may pick different
winners of the race (a near-tie, see docs/decisions.md)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec import Engine, SamplingParams
from edgespec.backend import LlamaModel
from edgespec.bench.prompts import PROMPT_SETS
from edgespec.config import ModelConfig
from edgespec.sampling import keyed_uniforms, warp

PROMPTS = [p for name in ("default", "chat", "code", "extract", "summarise")
           for p in PROMPT_SETS[name]][:20]
SEEDS = (1, 22, 333)
N = 24
NEAR_TIE = 1e-3     # relative gap between the race's two best scores


def race_gap(path, tokens, params, position) -> float:
    """Relative gap between the two best scores of the keyed race after ``tokens`` (fresh,
    one-token passes)."""
    m = LlamaModel(ModelConfig(path, n_ctx=1024, n_threads=1))
    try:
        for t in tokens[:-1]:
            m.eval([t], 0)
        d = warp(m.eval(tokens[-1:], 1)[0].copy(), params)
    finally:
        m.close()
    ids = d.ids if d.ids is not None else np.arange(d.probs.size)
    live = d.probs > 0
    scores = np.sort(-np.log(keyed_uniforms(params.seed, position, ids[live])) / d.probs[live])
    return scores[1] / scores[0] - 1 if scores.size > 1 else np.inf


def check_pair(target, draft, drafters):
    engines = {name: Engine.load(target=target, draft=draft if name != "ngram" else None,
                                 drafter=name, n_ctx=1024) for name in drafters}
    plain_engine = engines[drafters[0]]
    try:
        for prompt in PROMPTS:
            tokens = plain_engine.prompt_tokens(prompt, raw=True)
            for seed in SEEDS:
                params = SamplingParams(temperature=0.8, seed=seed)
                plain = plain_engine.generate(prompt, raw=True, max_tokens=N, sampling=params,
                                              speculative=False).tokens
                for name, eng in engines.items():
                    spec = eng.generate(prompt, raw=True, max_tokens=N, sampling=params)
                    assert spec.stats.speculative
                    if spec.tokens == plain:
                        continue
                    j = next(i for i, (a, b) in enumerate(zip(plain, spec.tokens)) if a != b)
                    gap = race_gap(target, tokens + plain[:j], params, len(tokens) + j)
                    assert gap < NEAR_TIE, (name, prompt[:30], seed, j, gap)
    finally:
        for eng in engines.values():
            eng.close()


@pytest.mark.slow
def test_smollm2_seeded_output_is_the_same_with_speculation(smollm2_f32_path, smollm2_q4_path):
    check_pair(smollm2_f32_path, smollm2_q4_path, ("hybrid", "model", "ngram"))


@pytest.mark.slow
def test_gemma_seeded_output_is_the_same_with_speculation(gemma_f32_path, gemma_q4_path):
    check_pair(gemma_f32_path, gemma_q4_path, ("hybrid", "model", "ngram"))
