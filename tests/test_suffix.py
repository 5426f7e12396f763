"""Drafts from earlier requests (edgespec/drafting/suffix.py): the index's logic on hand-made
token lists, then a real Engine and a real server whose repeated prompts are drafted from
their earlier answers, each API key from its own."""

from __future__ import annotations

import openai
import pytest

from edgespec import Engine, SamplingParams
from edgespec.drafting.ngram import match_confidence
from edgespec.drafting.suffix import SuffixIndex, SuffixIndexes

from server_helpers import ServerProcess, stop_checked
from test_real_models import check_greedy_equivalent

GREEDY = SamplingParams(temperature=0.0)


def test_an_earlier_sequence_is_proposed_after_the_context_matches_it():
    idx = SuffixIndex()
    idx.add([1, 2, 3, 4, 5, 6, 7, 8, 9])
    x, m = idx.lookup([50, 1, 2, 3, 4], 3)
    assert (x, m) == ([5, 6, 7], 4)          # matched 1 2 3 4, continued
    assert idx.lookup([50, 60, 70], 3) == ([], 0)      # no earlier occurrence
    assert idx.lookup([2, 3, 4], 0) == ([], 0)


def test_the_draft_is_as_long_as_the_match_at_most():
    idx = SuffixIndex()
    idx.add(list(range(100, 140)))
    assert len(idx.lookup([9, 9, 103, 104, 105], 32)[0]) == 3     # a 3-token match: 3
    x, m = idx.lookup(list(range(100, 120)), 32)
    assert m == 20 and x == list(range(120, 140))                   # 20 matched, 20 left


def test_the_continuation_most_earlier_requests_share_wins_and_rare_ones_are_cut():
    idx = SuffixIndex(min_share=0.3)
    for tail in ([7, 8, 9, 10], [7, 8, 9, 11], [7, 8, 12, 13], [20, 21, 22, 23]):
        idx.add([1, 2, 3, 4] + tail)
    x, m = idx.lookup([1, 2, 3, 4], 8)
    # 7 (3 of 4), 8 (3 of 4), 9 (2 of 4), then 10 or 11 (1 of 4 each: under 0.3)
    assert x == [7, 8, 9] and m == 4


def test_the_oldest_requests_are_evicted_within_the_bound():
    idx = SuffixIndex(max_tokens=100)
    for i in range(10):
        idx.add([1000 + i] + list(range(i * 30, i * 30 + 29)))
    assert idx.tokens <= 100 and len(idx) == 3
    assert idx.lookup([0, 1, 2], 4) == ([], 0)                  # the first one is gone
    assert idx.lookup([270, 271, 272], 2) == ([273, 274], 3)     # the last one is kept
    live = {i for occ in idx._where.values() for i, _ in occ}
    assert live == set(idx._docs)                                # nothing points at the evicted


def test_each_key_has_an_index_of_its_own():
    ixs = SuffixIndexes()
    ixs.get("a").add([1, 2, 3, 4, 5])
    assert ixs.get("a").lookup([1, 2, 3], 2) == ([4, 5], 3)
    assert ixs.get("b").lookup([1, 2, 3], 2) == ([], 0)
    assert ixs.get(None) is ixs.get(None) and ixs.tokens == 5


PROMPT = "Write three sentences about the sea."


@pytest.mark.parametrize("suffix", [True, False])
def test_a_prompt_asked_again_is_drafted_from_its_earlier_answer(smollm2_f32_path, suffix):
    """An app that regenerates: the second answer is drafted from the first (n-gram drafts
    only, so the model drafter's acceptance cannot hide it), and it is still the target's
    greedy answer; with the index off it is not."""
    with Engine.load(smollm2_f32_path, drafter="ngram", n_ctx=512, suffix=suffix) as eng:
        plain = eng.generate(PROMPT, max_tokens=48, sampling=GREEDY, speculative=False)
        first = eng.generate(PROMPT, max_tokens=48, sampling=GREEDY)
        again = eng.generate(PROMPT, max_tokens=48, sampling=GREEDY)
        prompt = eng.prompt_tokens(PROMPT)
    for g in (first, again):
        check_greedy_equivalent(smollm2_f32_path, prompt, plain.tokens, g.tokens)
    n = len(again.tokens)
    if suffix:
        assert again.stats.accepted >= 0.8 * n > first.stats.accepted + 0.3 * n
    else:
        assert again.stats.accepted < 0.5 * n


def test_each_api_key_drafts_from_its_own_earlier_requests(smollm2_f32_path):
    """Two keys on one server: a prompt repeated under key A is drafted from A's earlier
    answer; the same prompt's first time under key B is not (its timing would tell B that A
    asked it). With --shared-suffix-index it would be (the operator's choice)."""
    s = ServerProcess("--target", smollm2_f32_path, "--drafter", "ngram", "--ctx-size", 512,
                      "--api-key", "key-a", "--api-key", "key-b")
    try:
        def ask(key: str) -> dict:
            client = openai.OpenAI(base_url=s.base_url, api_key=key, max_retries=0)
            r = client.chat.completions.create(
                model="SmolLM2-135M-Instruct.F32", max_tokens=48, temperature=0,
                messages=[{"role": "user", "content": PROMPT}])
            stats = r.model_extra["edgespec"]
            return {"text": r.choices[0].message.content,
                    "share": stats["accepted"] / r.usage.completion_tokens}
        a1, a2, b1 = ask("key-a"), ask("key-a"), ask("key-b")
        b2 = ask("key-b")
    finally:
        stop_checked(s)
    assert a1["text"] == a2["text"] == b1["text"] == b2["text"]
    assert a2["share"] >= 0.8 and b2["share"] >= 0.8
    assert b1["share"] < a2["share"] - 0.3 and a1["share"] < a2["share"] - 0.3


# -- a long match drafts past the n-gram policy's plan ----------------------------------------

def _ngram_over(index, plan_k: int):
    """An n-gram drafter (cost model: SmolLM2's passes, free drafts) whose policy plans
    ``plan_k`` tokens, with ``index`` as its earlier requests."""
    import numpy as np

    from edgespec.drafting import AdaptiveLength, Costs, NgramDrafter
    pol = AdaptiveLength(Costs({1: 0.023, 4: 0.031, 8: 0.039, 16: 0.045, 33: 0.066}, 0.0))
    drafter = NgramDrafter(pol, index=lambda: index)
    drafter._planned = plan_k
    pol._pos_rates, pol._planned, pol._rate = np.full(pol.k_max, 0.3), plan_k, 1 / 0.02
    return drafter, pol


def test_a_long_match_of_an_earlier_request_drafts_past_the_plan():
    """Learned on the context's short matches, the n-gram policy plans 2 tokens a round; an
    earlier answer the context matches for 20 tokens drafts as far as matches that long have
    paid (none seen yet: as far as an optimistic prior says), and so does a 5-token one until
    matches of its length have been rejected, then it keeps to the plan; once long matches
    have been rejected their draft is short again."""
    import numpy as np
    earlier = list(range(1000, 1100))
    idx = SuffixIndex()
    idx.add(earlier)
    drafter, pol = _ngram_over(idx, plan_k=2)
    rng = np.random.default_rng(0)
    d = drafter.draft([7] + earlier[:20], 60, GREEDY, rng, lambda: False)
    assert drafter.long_match and len(d.x) > 10 and d.x == earlier[20:20 + len(d.x)]
    d = drafter.draft([7, 8, 9] + earlier[15:20], 60, GREEDY, rng, lambda: False)
    assert drafter.long_match and d.x == earlier[20:24]    # a 5-token match: a first probe
    for _ in range(30):          # 5-token matches' drafts rejected at their first token
        pol.observe(8, 0, [match_confidence(5)] * 8, [], 0.03)
    drafter._planned = 2
    d = drafter.draft([7, 8, 9] + earlier[15:20], 60, GREEDY, rng, lambda: False)
    assert not drafter.long_match and len(d.x) <= 2      # the plan at most
    for _ in range(30):          # long matches' drafts rejected at their first token
        pol.observe(8, 0, [0.75] * 8, [], 0.03)
    drafter._planned = 2
    d = drafter.draft([7] + earlier[:20], 60, GREEDY, rng, lambda: False)
    assert not drafter.long_match and len(d.x) <= 2


def test_a_pinned_or_batched_length_is_not_drafted_past():
    import numpy as np

    from edgespec.drafting import FixedLength, NgramDrafter
    earlier = list(range(1000, 1100))
    idx = SuffixIndex()
    idx.add(earlier)
    pinned = NgramDrafter(FixedLength(3), index=lambda: idx)
    pinned.plan()
    d = pinned.draft([7] + earlier[:20], 60, GREEDY, np.random.default_rng(0), lambda: False)
    assert d.x == earlier[20:23] and not pinned.long_match
    drafter, pol = _ngram_over(idx, plan_k=2)
    pol.joint = lambda rates, cap, k: k        # other streams share the passes
    d = drafter.draft([7] + earlier[:20], 60, GREEDY, np.random.default_rng(0), lambda: False)
    assert len(d.x) <= 2 and not drafter.long_match
