"""A draft that is the target's network at another precision takes the target's KV cells for
the context instead of reading it again (edgespec/drafting/reading.py): real GGUF files,
real llama.cpp, the answer the target's own."""

from __future__ import annotations

import numpy as np
import pytest
from test_real_models import check_greedy_equivalent

from edgespec import Engine, SamplingParams
from edgespec.backend import same_network
from edgespec.backend.model import LlamaModel
from edgespec.config import ModelConfig
from edgespec.gguf_file import read_gguf

GREEDY = SamplingParams(temperature=0.0)


class _Header:
    def __init__(self, path):
        self.info = read_gguf(path)


def test_a_quantisation_of_the_same_network_is_recognised(smollm2_f32_path, smollm2_q4_path,
                                                         gemma_f32_path, gemma_q4_path):
    assert same_network(_Header(smollm2_f32_path), _Header(smollm2_q4_path))
    assert same_network(_Header(gemma_f32_path), _Header(gemma_q4_path))
    assert not same_network(_Header(gemma_f32_path), _Header(smollm2_q4_path))
    assert not same_network(_Header(smollm2_f32_path), _Header(gemma_q4_path))


def _passage_prompt() -> str:
    topics = pytest.importorskip("pydoc_data.topics").topics
    return topics["assignment"][:2400] + "\n\nIn one sentence, the text above says that"


def _reading(eng):
    (drafter,) = eng._drafting._by_kind.values()
    return drafter.reading


def test_the_draft_takes_the_targets_cells_instead_of_reading_the_prompt(smollm2_f32_path,
                                                                        smollm2_q4_path):
    prompt = _passage_prompt()
    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path, drafter="model",
                     draft_max=4, n_ctx=2048, cache_ram=0) as eng:
        assert eng._drafting.shares_kv
        tokens = eng.prompt_tokens(prompt, raw=True)
        assert len(tokens) > 400
        plain = eng.generate(prompt, max_tokens=32, sampling=GREEDY, raw=True,
                             speculative=False)
        spec = eng.generate(prompt, max_tokens=32, sampling=GREEDY, raw=True)
        reading = _reading(eng)
        # The prompt not read by the draft: its cells were copied in, and it drafted on them
        # (what it read is the few committed tokens a round's first step adds).
        assert spec.stats.loop.caught_up < 16 and reading.taken >= len(tokens)
        assert spec.stats.loop.drafted > 0 and spec.stats.accepted > spec.stats.loop.drafted / 2
        assert reading.take_cost is not None and reading.take_cost > 0
        check_greedy_equivalent(smollm2_f32_path, tokens, plain.tokens, spec.tokens)
        held = eng.draft.tokens
        assert held == (tokens + spec.tokens)[:len(held)] and len(held) > len(tokens)

        # The control: without the cells the draft reads the prompt, chunk by chunk.
        eng._drafting.share_target_cells(False)
        eng.draft.truncate(0)
        again = eng.generate(prompt, max_tokens=32, sampling=GREEDY, raw=True)
        assert again.stats.loop.caught_up > 64 and _reading(eng).taken == 0
        check_greedy_equivalent(smollm2_f32_path, tokens, plain.tokens, again.tokens)


def test_a_short_prompt_is_copied_too_and_the_copy_passes_through_one_reused_buffer(
        smollm2_f32_path, smollm2_q4_path):
    # A prompt within one catch-up chunk (64 tokens) was read by the draft's first step: a
    # batch costs a quantised draft as much as the F32 target. The cells are taken instead,
    # through a buffer the reading keeps from copy to copy.
    prompt = "The three primary colours of light are red, green and"
    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path, drafter="model",
                     draft_max=4, n_ctx=2048, cache_ram=0) as eng:
        tokens = eng.prompt_tokens(prompt, raw=True)
        assert 4 < len(tokens) < 64
        plain = eng.generate(prompt, max_tokens=24, sampling=GREEDY, raw=True,
                             speculative=False)
        spec = eng.generate(prompt, max_tokens=24, sampling=GREEDY, raw=True)
        reading = _reading(eng)
        assert reading.taken >= len(tokens) and spec.stats.loop.caught_up < len(tokens) - 1
        assert spec.stats.loop.drafted > 0
        check_greedy_equivalent(smollm2_f32_path, tokens, plain.tokens, spec.tokens)
        buffer = reading._buffer
        assert buffer.size > 0
        again = eng.generate(prompt, max_tokens=24, sampling=GREEDY, raw=True)
        assert reading._buffer is buffer and again.tokens == spec.tokens

        # The control: without the cells the draft's first step reads the prompt itself.
        eng._drafting.share_target_cells(False)
        eng.draft.truncate(0)
        read = eng.generate(prompt, max_tokens=24, sampling=GREEDY, raw=True)
        assert read.stats.loop.caught_up >= len(tokens) - 1 and _reading(eng).taken == 0
        assert read.tokens == spec.tokens


def test_a_saved_state_written_into_a_callers_buffer_restores_the_same_cache(
        smollm2_f32_path):
    m = LlamaModel(ModelConfig(smollm2_f32_path, n_ctx=512))
    try:
        tokens = m.tokenize("Speculative decoding keeps the target's distribution")
        m.eval(tokens, 1)
        scratch = np.zeros(1 << 22, dtype=np.uint8)
        state = m.save_state(lambda size: scratch)
        assert np.shares_memory(np.asarray(state.data), scratch) and state.nbytes > 0
        assert scratch[:state.nbytes].any()
        row = np.array(m.eval(tokens[:1], 1)[0])       # the next pass on those cells
        m.truncate(0)
        m.restore_state(state)
        assert m.tokens == tokens
        again = m.eval(tokens[:1], 1)[0]
        assert np.array_equal(np.asarray(again), row)
    finally:
        m.close()
