"""A seed gives the same text with speculation on or off, on the real pairs: 10 prompts × 3
seeds (each with a sampler apps send: llama.cpp's, Ollama's and Qwen's, penalties included),
the adaptive draft length; the hybrid drafter (the model's drafts where no n-gram matches,
n-grams where one does) on SmolLM2 and Gemma, the n-gram drafter alone on SmolLM2 (the model
drafter alone runs in tests/test_lossless_stats.py and tests/test_qwen_pair.py). The noise of
each position is keyed by (seed, position, token), so a draft can only be accepted where it
equals the target's own sample; a divergence is allowed only where batched and one-by-one
logits may pick different winners of the race (a near-tie, see docs/decisions.md).

What "the same text" is checked against: the target's own seeded output is, token by token,
the keyed sample of the target's distribution after the prompt and the tokens before it.
Instead of decoding that text once more, one token at a time, each speculative answer is
checked in one target pass over the prompt and the answer (a row per answer token, and one
after it): each token must be the keyed sample of its row, and an answer that ended on its
own must end where the row after it samples an end-of-generation token. By induction that is
exactly the plain seeded text; a token that is not is a divergence, judged as before. (The
plain path itself, ``speculative=False``, is one of these rows' users: the loop with K = 0.)
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from edgespec import Engine, SamplingParams
from edgespec.backend import LlamaModel
from edgespec.bench.prompts import PROMPT_SETS
from edgespec.config import ModelConfig
from edgespec.prompt_cache import common_prefix
from edgespec.sampling import keyed_uniforms, warp

PROMPTS = [p for name in ("default", "chat", "code", "extract", "summarise")
           for p in PROMPT_SETS[name]][:10]
# A seed per sampler: llama.cpp's defaults; Ollama's (top_p 0.9, a repeat penalty of 1.1 over
# the last 64 tokens, min_p off); Qwen's recommended (0.7, top_p 0.8, top_k 20, repetition
# 1.05). A penalty at a position depends on the drafted tokens before it in the same pass.
SAMPLERS = {1: SamplingParams(temperature=0.8),
            22: SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.0,
                               repeat_penalty=1.1, repeat_last_n=64),
            333: SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.0,
                                repeat_penalty=1.05)}
N = 24
NEAR_TIE = 1e-3     # relative gap between the race's two best scores


def race_gap(path, tokens, params, position) -> float:
    """Relative gap between the two best scores of the keyed race after ``tokens`` (fresh,
    one-token passes; the penalties over ``tokens``)."""
    m = LlamaModel(ModelConfig(path, n_ctx=1024, n_threads=1))
    try:
        for t in tokens[:-1]:
            m.eval([t], 0)
        d = warp(m.eval(tokens[-1:], 1)[0].copy(), params, tokens)
    finally:
        m.close()
    ids = d.ids if d.ids is not None else np.arange(d.probs.size)
    live = d.probs > 0
    scores = np.sort(-np.log(keyed_uniforms(params.seed, position, ids[live])) / d.probs[live])
    return scores[1] / scores[0] - 1 if scores.size > 1 else np.inf


def first_unlike_plain(eng: Engine, prompt: list[int], out, params) -> Optional[int]:
    """The first position at which ``out`` (a Generation) is not the target's seeded text
    after ``prompt``, or None. One pass of the Engine's target over the prompt and the answer
    (its cache is left holding them; the Engine keeps what a next prompt shares)."""
    target, tokens = eng.target, out.tokens
    target.truncate(common_prefix(target.tokens, prompt[:-1]))
    todo = (prompt + tokens)[len(target.tokens):]
    rows = target.eval(todo, len(tokens) + 1)
    for j in range(len(tokens) + 1):
        d = warp(rows[j].copy(), params, (prompt + tokens[:j])[-params.repeat_last_n:])
        sample = d.sample_keyed(params.seed, len(prompt) + j)
        if j < len(tokens) and sample != tokens[j]:
            return j
        if j == len(tokens) and out.finish_reason == "stop" \
                and sample not in target.vocab.eog:
            return j
    return None


def check_pair(target, draft, drafters):
    engines = {name: Engine.load(target=target, draft=draft if name != "ngram" else None,
                                 drafter=name, n_ctx=1024) for name in drafters}
    try:
        for prompt in PROMPTS:
            tokens = engines[drafters[0]].prompt_tokens(prompt, raw=True)
            for seed, sampler in SAMPLERS.items():
                params = sampler.replace(seed=seed)
                for name, eng in engines.items():
                    spec = eng.generate(prompt, raw=True, max_tokens=N, sampling=params)
                    assert spec.stats.speculative
                    j = first_unlike_plain(eng, tokens, spec, params)
                    if j is None:
                        continue
                    gap = race_gap(target, tokens + spec.tokens[:j], params, len(tokens) + j)
                    assert gap < NEAR_TIE, (name, prompt[:30], seed, j, gap)
    finally:
        for eng in engines.values():
            eng.close()


def test_the_check_sees_a_text_that_is_not_the_plain_one(smollm2_f32_path):
    """Negative control for the check: the plain seeded text passes it, the same text with
    one token changed (and a greedy text, a different sample) fails it at that token."""
    with Engine.load(target=smollm2_f32_path, n_ctx=1024, drafter="none") as eng:
        prompt = PROMPTS[3]
        tokens = eng.prompt_tokens(prompt, raw=True)
        params = SamplingParams(temperature=0.8, seed=22)
        plain = eng.generate(prompt, raw=True, max_tokens=N, sampling=params,
                             speculative=False)
        assert first_unlike_plain(eng, tokens, plain, params) is None
        changed = plain.tokens[:5] + [(plain.tokens[5] + 1) % eng.target.n_vocab] \
            + plain.tokens[6:]
        assert first_unlike_plain(eng, tokens, type(plain)("", changed, "length", plain.stats),
                                  params) == 5
        greedy = eng.generate(prompt, raw=True, max_tokens=N,
                              sampling=SamplingParams(temperature=0.0))
        assert greedy.tokens != plain.tokens
        assert first_unlike_plain(eng, tokens, greedy, params) is not None


@pytest.mark.slow
def test_smollm2_seeded_output_is_the_same_with_speculation(smollm2_f32_path, smollm2_q4_path):
    check_pair(smollm2_f32_path, smollm2_q4_path, ("hybrid", "ngram"))


@pytest.mark.slow
def test_gemma_seeded_output_is_the_same_with_speculation(gemma_f32_path, gemma_q4_path):
    # The hybrid drafter drafts with the model where no n-gram matches and with n-grams where
    # one does, so it covers both on a second vocabulary; SmolLM2 above runs each alone.
    check_pair(gemma_f32_path, gemma_q4_path, ("hybrid",))
