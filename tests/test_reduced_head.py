"""The draft's reduced output layer (drafting.ReducedHead) on the real Gemma-3-270M pair.

llama.cpp's graph is stopped after the final norm (LlamaModel.eval_hidden); the tests check
that the hidden state read there reproduces llama.cpp's own logits, that the KV cache stays
complete, which tokens the reduced head covers, and that speculative output is still exactly
the target's.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec import Engine, SamplingParams
from edgespec.backend import LlamaModel
from edgespec.config import ModelConfig
from edgespec.drafting import FixedLength, ModelDrafter, ReducedHead
from edgespec.drafting.model import top_probability
from edgespec.sampling import warp

from test_real_models import check_greedy_equivalent

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def twins(gemma_q4_path):
    """The draft model with the tap, and the same file without it (the reference)."""
    tapped = LlamaModel(ModelConfig(gemma_q4_path, n_ctx=512), tap_min_vocab=1)
    plain = LlamaModel(ModelConfig(gemma_q4_path, n_ctx=512))
    yield tapped, plain
    tapped.close()
    plain.close()


def test_hidden_state_reproduces_llama_cpps_logits_and_keeps_the_cache(twins):
    tapped, plain = twins
    assert tapped.can_tap and not plain.can_tap
    prompt = tapped.tokenize("The lighthouse keeper wrote in his logbook that")
    tapped.eval(prompt, 1)
    plain.eval(prompt, 1)
    w = tapped.output_rows(range(tapped.n_vocab))      # the tied embeddings, Q8_0 -> float32
    agree = 0
    for _ in range(12):
        reference = plain.last_logits().copy()
        token = int(np.argmax(reference))
        hidden = tapped.eval_hidden([token])
        assert hidden is not None and hidden.shape == (tapped.n_embd,)
        mine = np.einsum("ij,j->i", w, hidden)
        # llama.cpp quantizes the activations for its Q8_0 product; the float32 product
        # differs by that rounding only
        assert np.max(np.abs(mine - plain.eval([token], 1)[0])) < 0.5
        agree += int(np.argmax(mine)) == int(np.argmax(plain.last_logits()))
    assert agree >= 11
    # Every layer wrote its keys and values before the graph was stopped: a full pass after
    # the tapped ones gives bit-identical logits to the untapped model's.
    assert np.array_equal(tapped.eval([236761], 1)[0], plain.eval([236761], 1)[0])
    tapped.truncate(0)
    plain.truncate(0)


def test_tap_names_each_node_once_and_recovers_when_the_graph_changes(twins):
    tapped, plain = twins
    prompt = tapped.tokenize("Once the bridge was finished, the village")
    tapped.eval(prompt, 1)
    plain.eval(prompt, 1)
    w = tapped.output_rows(range(tapped.n_vocab))
    text = iter(tapped.tokenize(" held a feast that lasted three days, and people came from "
                                "every town along the river to see it", add_special=False))
    known = tapped._tap.known
    for n in [1, 3, 1, 1, 2, 5, 1, 1]:       # batch sizes change the graph's shape
        toks = [next(text) for _ in range(n)]
        hidden = tapped.eval_hidden(toks)
        assert hidden is not None
        # The twin runs the same batches, so the kernels match (batched and one-by-one passes
        # differ by more than this on some CPUs); what differs is llama.cpp quantizing the
        # activations for its output product (~0.2 here).
        row = plain.eval(toks, 1)[0]
        d = np.einsum("ij,j->i", w, hidden) - row
        assert np.max(np.abs(d)) < 0.5
        # The same winner, unless the reference's two best are nearer than the two rows can
        # differ (a near-tie: on an AMD EPYC one step's top two were 0.018 apart).
        top2 = np.sort(row)[-2:]
        assert np.argmax(row) == np.argmax(d + row) or top2[1] - top2[0] < 2 * np.max(np.abs(d))
    nxt = int(np.argmax(row))
    assert 1 <= sum(known.values()) <= 3 and len(known) > 500
    # A stale address hiding the node: the whole graph runs, the row comes from llama.cpp,
    # the addresses are forgotten, and the next step finds the node again.
    for a in list(known):
        known[a] = False
    assert tapped.eval_hidden([nxt]) is None and not known
    d = tapped.last_logits() - plain.eval([nxt], 1)[0]
    assert np.max(np.abs(d - np.median(d))) < 0.5
    nxt = int(np.argmax(plain.last_logits()))
    assert tapped.eval_hidden([nxt]) is not None
    tapped.truncate(0)
    plain.truncate(0)


def test_reduced_head_covers_common_tokens_and_learns_the_context(twins):
    tapped, _ = twins
    head = ReducedHead(tapped, rows=4096, max_extra=64)
    period = tapped.tokenize(".", add_special=False)[-1]
    assert head._member[period] and period >= 4096     # '.' sits at the vocabulary's end
    assert all(head._member[t] for t in tapped.vocab.eog)
    rare = [t for t in tapped.tokenize(" thermodynamics cooperative", add_special=False)
            if not head._member[t]]
    assert rare, "expected words outside the 4096 lowest ids"
    tapped.eval(tapped.tokenize("Hello"), 1)
    hidden = tapped.eval_hidden(tapped.tokenize(" there", add_special=False))
    head.subset_logits(hidden)
    row = head.last_row()
    assert np.isneginf(row[rare]).all()
    assert np.isneginf(row).sum() == tapped.n_vocab - head.size
    head.include(rare)
    head.subset_logits(hidden)
    row2 = head.last_row()
    full = np.einsum("ij,j->i", tapped.output_rows(rare), hidden)
    np.testing.assert_allclose(row2[rare], full, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(row2[head.ids], row[head.ids])
    # the drafter's confidence reads only the subset's logits: the same number
    ids, vals = head.subset_logits(hidden)
    assert top_probability(vals) == pytest.approx(top_probability(row2), rel=1e-6)
    assert vals.size == ids.size == head.size
    np.testing.assert_array_equal(row2[ids], vals)
    tapped.truncate(0)


def test_reduced_head_follows_one_conversation_at_a_time(twins):
    tapped, _ = twins
    head = ReducedHead(tapped, rows=4096, max_extra=256)
    base = head.size
    first = tapped.tokenize("The thermodynamics seminar met on Tuesday.")
    rare1 = [t for t in first if not head._member[t]]
    assert rare1
    head.follow(first)
    assert all(head._member[t] for t in rare1) and head.size == base + len(set(rare1))
    # the same conversation, grown: only the new tokens are added
    grown = first + tapped.tokenize(" A cooperative bakery", add_special=False)
    rare2 = [t for t in grown[len(first):] if not head._member[t]]
    head.follow(grown)
    assert all(head._member[t] for t in rare1 + rare2)
    # another conversation (or a regenerated turn): the first one's tokens leave
    other = tapped.tokenize("Quantum chromodynamics")
    head.follow(other)
    gone = set(rare1 + rare2) - set(other)
    assert gone and not any(head._member[t] for t in gone)
    assert head.size == base + len({t for t in other if t not in set(head.ids)})
    assert all(head._member[t] for t in head.ids)          # the base rows stay
    hidden = tapped.eval_hidden(other)
    head.subset_logits(hidden)
    row = head.last_row()
    assert np.isfinite(row).sum() == head.size and np.isneginf(row[list(gone)]).all()
    head.follow(other[:2])                                  # shorter: a new conversation
    assert head.size == base + len({t for t in other[:2] if t not in set(head.ids)})
    tapped.truncate(0)


def test_sampled_drafts_come_from_the_reduced_head(twins):
    tapped, _ = twins
    head = ReducedHead(tapped, rows=4096, max_extra=256)
    drafter = ModelDrafter(tapped, tapped.vocab.eog, FixedLength(6), head)
    context = tapped.tokenize("Once upon a time, in a small village by the sea,")
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    drafter.plan()
    d = drafter.draft(context, 6, params, rng, lambda: False)
    assert len(d.x) == 6
    for t, dist in zip(d.x, d.q):
        assert head._member[t]
        dense = dist.dense(tapped.n_vocab)
        assert dense.sum() == pytest.approx(1.0, abs=1e-5)
        assert dense[~head._member].max() == 0.0          # q is 0 outside the head
    tapped.truncate(0)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8),                                  # the defaults
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),   # the whole subset
    SamplingParams(temperature=0.7, top_k=0, top_p=0.9, min_p=0.02),
    SamplingParams(temperature=0.8, repeat_penalty=1.3),               # needs the full row
])
def test_q_from_the_subset_equals_q_from_the_full_row(twins, params):
    tapped, _ = twins
    head = ReducedHead(tapped, rows=4096, max_extra=64)
    drafter = ModelDrafter(tapped, tapped.vocab.eog, FixedLength(6), head)
    context = tapped.tokenize("The old lighthouse keeper said that the storm")
    head.follow(context)
    ids, vals = head.subset_logits(tapped.eval_hidden(context))
    ids, vals = ids.copy(), vals.copy()
    full = np.full(tapped.n_vocab, -np.inf, dtype=np.float32)
    full[ids] = vals
    tail = list(context) if params.uses_penalty else []
    a = drafter._warp(ids, vals, params, tail).dense(tapped.n_vocab)
    b = warp(full, params, tail).dense(tapped.n_vocab)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    assert a.sum() == pytest.approx(1.0) and (a > 0).sum() > 1
    tapped.truncate(0)


def test_gemma_pair_greedy_speculative_equals_plain(gemma_f32_path, gemma_q4_path):
    with Engine.load(target=gemma_f32_path, draft=gemma_q4_path, n_ctx=1024,
                     drafter="model", draft_max=8) as eng:
        assert eng.draft_head is not None
        accepted = drafted = 0
        for prompt in ["The history of the Roman Empire", "def quicksort(arr):",
                       "A recipe for a simple tomato soup:"]:
            plain = eng.generate(prompt, max_tokens=48, sampling=GREEDY, raw=True,
                                 speculative=False)
            spec = eng.generate(prompt, max_tokens=48, sampling=GREEDY, raw=True)
            check_greedy_equivalent(gemma_f32_path, eng.prompt_tokens(prompt, raw=True),
                                    plain.tokens, spec.tokens)
            drafted += spec.stats.drafted
            accepted += spec.stats.accepted
        # A broken head would be near 0 (measured: 0.60, and 0.63 when the first round drafted
        # too; a plain first round moves every round's boundary).
        assert drafted > 0 and accepted / drafted > 0.5


def test_the_product_runs_blas_on_one_thread_and_puts_the_count_back(monkeypatch):
    from edgespec.drafting import reduced_head as rh
    libs = rh.OneThreadBlas.libraries()
    if not libs:
        pytest.skip("numpy's BLAS thread count cannot be set here: einsum does the product")
    before = [lib.get_num_threads() for lib in libs]
    seen = []
    real_dot = np.dot

    def watched(*a, **kw):
        seen.append([lib.get_num_threads() for lib in libs])
        return real_dot(*a, **kw)

    monkeypatch.setattr(rh.np, "dot", watched)
    rng = np.random.default_rng(0)
    mat = rng.standard_normal((64, 5000)).astype(np.float32)
    vec = rng.standard_normal(64).astype(np.float32)
    out = np.empty(5000, dtype=np.float32)
    rh.OneThreadBlas.vec_mat(vec, mat, out)
    assert seen == [[1] * len(libs)]
    assert [lib.get_num_threads() for lib in libs] == before
    np.testing.assert_allclose(out, vec @ mat, rtol=1e-4, atol=1e-4)


def test_a_draft_of_another_vocabulary_gets_rows_only_for_the_shared_tokens(twins):
    """Across vocabularies the head has no rows for tokens the target lacks: they could never
    be proposed (here: Gemma's odd ids are taken to be the target's lacking ones)."""
    tapped, _ = twins
    shared = np.zeros(tapped.n_vocab, dtype=bool)
    shared[::2] = True
    head = ReducedHead(tapped, rows=4096, max_extra=64, shared=shared)
    assert head.size and shared[head.ids].all()
    words = tapped.tokenize(" thermodynamics cooperative photosynthesis", add_special=False)
    head.include(words)
    ids, _ = head.subset_logits(np.ones(head.wt.shape[0], dtype=np.float32))
    assert shared[ids].all()
    assert set(t for t in words if shared[t]) <= set(ids.tolist())
