"""The prompt cache: conversations' KV states kept aside and brought back.

The bookkeeping (when a state is kept, which one comes back, the budget) is checked on a
model stand-in that only holds a token list; everything about real caches runs on real
llama.cpp contexts: greedy output after a restore equals, token for token, that of a fresh
Engine without a cache that serves the same conversation's turns (and nothing else), with
speculation on (target, draft and the draft's reduced head all restored); a state restored
under the wrong conversation's tokens (the negative control) does not.

The reference serves the conversation turn by turn, as the cached Engine did, because
llama.cpp's CPU kernels round differently for different batch sizes: the cells of a prompt
evaluated in one batch of 64 differ from those of the same tokens in a batch of 60 (max
|Δlogit| 0.02 on Gemma F32, 1.4 on Q4_K_M, docs/decisions.md), so an Engine that evaluates a
whole conversation at once is not the like-for-like reference. A restore brings the cells back
bit for bit, so this comparison has no tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from edgespec import Engine, SamplingParams
from edgespec.errors import InvalidParameterError
from edgespec.prompt_cache import PromptCache, common_prefix

GREEDY = SamplingParams(temperature=0.0)


# ---------------------------------------------------------------------------------------------
# Bookkeeping


@dataclass(frozen=True)
class _State:
    tokens: tuple
    nbytes: int


class TokenModel:
    """Holds a token list as its 'cache'; a state costs 10 bytes a token."""

    path = Path("token-model.gguf")

    def __init__(self):
        self.tokens: list[int] = []
        self.restores = 0
        self.state_owner = self

    def save_state(self) -> _State:
        return _State(tuple(self.tokens), 10 * len(self.tokens))

    def restore_state(self, state: _State) -> None:
        self.tokens = list(state.tokens)
        self.restores += 1


def conv(tag: int, n: int) -> list[int]:
    return [tag] * 4 + list(range(1000, 1000 + n))


def use(cache: PromptCache, model: TokenModel, prompt: list[int]) -> int:
    """What a generation does: prepare, then the prefill keeps the common prefix and evaluates
    the rest; returns how many tokens it evaluated."""
    restored = cache.prepare(model, prompt)
    keep = common_prefix(model.tokens, prompt)
    assert restored in (0, keep)
    model.tokens = list(prompt)
    return len(prompt) - keep


def test_switching_between_conversations_restores_instead_of_evaluating():
    cache, m = PromptCache(1 << 20, min_tokens=8), TokenModel()
    a, b = conv(1, 100), conv(2, 100)
    assert use(cache, m, a) == 104
    assert use(cache, m, b) == 104          # a is kept aside
    assert len(cache) == 1
    assert use(cache, m, a + [7, 8]) == 2   # a comes back; b is kept aside
    assert use(cache, m, b + [9]) == 1
    assert cache.stats.restored == 2 and cache.stats.tokens_restored == 104 + 104


def test_continuing_the_live_conversation_touches_nothing():
    cache, m = PromptCache(1 << 20, min_tokens=8), TokenModel()
    use(cache, m, conv(1, 50))
    assert use(cache, m, conv(1, 60)) == 10
    assert len(cache) == 0 and cache.stats.saved == 0 and m.restores == 0


def test_a_small_gain_is_evaluated_rather_than_restored():
    cache, m = PromptCache(1 << 20, min_tokens=32), TokenModel()
    short = conv(1, 10)             # 14 tokens: below min_tokens, not worth keeping aside
    use(cache, m, short)
    use(cache, m, conv(2, 100))
    assert len(cache) == 0
    assert use(cache, m, short) == 14


def test_a_state_that_begins_a_longer_one_is_dropped():
    cache, m = PromptCache(1 << 20, min_tokens=8), TokenModel()
    use(cache, m, conv(1, 50))
    use(cache, m, conv(2, 50))       # keeps a(50)
    use(cache, m, conv(1, 80))       # restores a(50), keeps b
    use(cache, m, conv(3, 50))       # keeps a(80)
    kept = sorted(len(e.tokens) for e in cache._entries)
    assert kept == [54, 84]          # b and a(80); a(50) left when it was restored


def test_the_budget_drops_the_least_recently_kept():
    cache, m = PromptCache(2500, min_tokens=8), TokenModel()   # two states of ~104 tokens
    for tag in (1, 2, 3, 4):
        use(cache, m, conv(tag, 100))
    assert cache.nbytes <= 2500 and len(cache) == 2 and cache.stats.evicted == 1
    assert use(cache, m, conv(1, 100)) == 104          # the oldest went
    assert use(cache, m, conv(3, 100)) == 0            # a newer one stayed


def test_a_state_larger_than_the_budget_is_not_kept():
    cache, m = PromptCache(500, min_tokens=8), TokenModel()
    use(cache, m, conv(1, 100))
    use(cache, m, conv(2, 100))
    assert len(cache) == 0 and cache.nbytes == 0


def test_models_keep_their_own_states():
    cache, t, d = PromptCache(1 << 20, min_tokens=8), TokenModel(), TokenModel()
    for model in (t, d):
        use(cache, model, conv(1, 50))
    for model in (t, d):
        use(cache, model, conv(2, 50))
    use(cache, t, conv(1, 60))
    assert t.restores == 1 and d.restores == 0
    assert {id(e.owner) for e in cache._entries} == {id(t), id(d)}


def test_an_engine_refuses_a_bad_cache_size():
    with pytest.raises(InvalidParameterError, match="cache_ram=-1 is invalid"):
        PromptCache.of_mib(-1)


# ---------------------------------------------------------------------------------------------
# Real caches


def story(city: str) -> str:
    """~650 Gemma tokens, most shared within a conversation and few across them."""
    return (f"The history of the city of {city} begins with a small settlement by the river, "
            f"where the people of {city} traded salt, grain and wool. ") * 25 \
        + f"Tell me more about {city}."


CITIES = ("Lyon", "Porto", "Graz")


@pytest.fixture(scope="module")
def gemma_runs(gemma_f32_path, gemma_q4_path):
    """Three conversations alternated twice on one Engine (the cache on), and each
    conversation's turns on a fresh Engine with the cache off (its caches emptied between
    conversations): (cached results, fresh results)."""
    cached: dict[str, list] = {c: [] for c in CITIES}
    with Engine.load(gemma_f32_path, gemma_q4_path, n_ctx=2048, n_threads=2) as e:
        assert e.draft_head is not None           # the reduced head is in play
        for turn in range(2):
            for c in CITIES:
                prompt = story(c) + (" And then?" if turn else "")
                cached[c].append((prompt, e.generate(prompt, raw=True, max_tokens=24,
                                                     sampling=GREEDY)))
        cache_state = e.prompt_cache.describe()
    fresh = {}
    with Engine.load(gemma_f32_path, gemma_q4_path, n_ctx=2048, n_threads=2,
                     cache_ram=0) as f:
        for c in CITIES:
            f.target.truncate(0)       # as a fresh Engine would start
            f.draft.truncate(0)
            for prompt, _ in cached[c]:
                fresh[prompt] = f.generate(prompt, raw=True, max_tokens=24, sampling=GREEDY)
    return cached, fresh, cache_state


@pytest.mark.real
@pytest.mark.slow
def test_greedy_output_after_a_restore_equals_a_fresh_engines(gemma_runs):
    cached, fresh, state = gemma_runs
    for c in CITIES:
        first, second = cached[c]
        # the second turn of each conversation came back from the cache: only the new
        # words were evaluated
        assert second[1].stats.prompt_tokens_restored > 500
        assert second[1].stats.prompt_tokens_evaluated < 16
        for prompt, g in cached[c]:
            assert g.tokens == fresh[prompt].tokens, c
            assert g.stats.drafted > 0 or g.stats.decoding_plainly
    assert state["restored"] >= 3 and state["bytes"] <= state["max_bytes"]


@pytest.mark.real
def test_a_state_restored_under_another_conversations_tokens_changes_the_output(
        smollm2_q4_path):
    """The negative control: the comparison above would see a wrong restore."""
    a, b = story("Lyon"), story("Porto")
    with Engine.load(smollm2_q4_path, drafter="none", n_ctx=2048, n_threads=2,
                     cache_ram=0) as e:
        want = e.generate(a, raw=True, max_tokens=16, sampling=GREEDY).tokens
        a_tokens = list(e.target.tokens)
        e.generate(b, raw=True, max_tokens=16, sampling=GREEDY)
        wrong = e.target.save_state()     # b's cells...
        e.target.restore_state(type(wrong)(tuple(a_tokens), wrong.data, wrong.nbytes))
        got = e.generate(a, raw=True, max_tokens=16, sampling=GREEDY)   # ...under a's tokens
        assert got.stats.prompt_tokens_evaluated <= 2
        assert got.tokens != want
        e.target.truncate(0)
        assert e.generate(a, raw=True, max_tokens=16, sampling=GREEDY).tokens == want


@pytest.mark.real
def test_chat_conversations_switch_through_the_cache(smollm2_q4_path, smollm2_f32_path):
    """Two chats in turn on the SmolLM2 pair (its chat template): the switch restores both
    models' states, and the answers equal those of a fresh Engine serving each chat alone."""
    chats = {name: [{"role": "system", "content": f"You are {name}, a helpful guide. " * 30},
                    {"role": "user", "content": f"Hello {name}, what do you do?"}]
             for name in ("Ada", "Max")}
    answers = {}
    with Engine.load(smollm2_f32_path, smollm2_q4_path, n_ctx=2048, n_threads=2) as e:
        for _ in range(2):
            for name, messages in chats.items():
                g = e.generate(messages, max_tokens=12, sampling=GREEDY)
                answers.setdefault(name, []).append((list(messages), g))
                messages += [{"role": "assistant", "content": g.text},
                             {"role": "user", "content": "Tell me more."}]
        restored = [e.prompt_cache.describe()["restored"], e.prompt_cache.nbytes]
    assert restored[0] >= 2 * 2 - 1      # each switch back: both models (Ada's 2nd turn on)
    with Engine.load(smollm2_f32_path, smollm2_q4_path, n_ctx=2048, n_threads=2,
                     cache_ram=0) as f:
        for turns in answers.values():
            f.target.truncate(0)
            f.draft.truncate(0)
            for messages, g in turns:
                assert f.generate(messages, max_tokens=12, sampling=GREEDY).tokens == g.tokens
        assert turns[1][1].stats.prompt_tokens_restored > 100
