"""Drafting across vocabularies: the map between two real vocabularies (SmolLM2-135M's 49k
BPE tokens, Gemma-3-270M's 262k SentencePiece ones), the draft's view of the context in its
own tokens, and the statistical losslessness of token-level intersection (TLI) with a
negative control that skips the renormalisation.

The translation's logic is checked on a toy pair of vocabularies (pure logic), then on the
real tokenizers: whatever the target emits, the draft reads exactly the same bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec import verify
from edgespec.backend import VocabOnly, check_pair, check_pair_files
from edgespec.config import SamplingParams
from edgespec.drafting import FixedLength, ModelDrafter, Translation
from edgespec.drafting import model as drafting_model
from edgespec.drafting.cross_vocab import LOOK_BEHIND, restrict
from edgespec.errors import IncompatiblePairError
from edgespec.sampling import Dist, warp

# -- restrict ------------------------------------------------------------------------------


def test_restrict_keeps_the_shared_ids_renormalised_and_in_the_targets_ids():
    to_target = np.array([7, -1, 3, -1, 9])
    q = Dist(None, np.array([0.1, 0.4, 0.2, 0.2, 0.1]))
    r = restrict(q, to_target)
    assert dict(zip(r.ids.tolist(), r.probs.tolist())) == pytest.approx(
        {3: 0.5, 7: 0.25, 9: 0.25})
    sparse = Dist(np.array([1, 2]), np.array([0.5, 0.5]))
    assert restrict(sparse, to_target).ids.tolist() == [3]
    assert restrict(Dist(np.array([1, 3]), np.array([0.5, 0.5])), to_target) is None


# -- the translation on a toy pair ---------------------------------------------------------

# The target's pieces (id -> bytes); the draft's vocabulary (bytes -> id) is tokenised by
# greedy longest match, as a stand-in for a real tokenizer (pure logic).
T_PIECES = {0: b"<bos>", 1: b"a", 2: b"b", 3: b"ab", 4: b"cd", 5: b"abcd", 6: b" x",
            7: b"\xe2", 8: b"\x80", 9: b"\x94", 10: b"q"}
D_VOCAB = {b"a": 0, b"b": 1, b"c": 2, b"d": 3, b"abcd": 4, b" x": 5, b"\xe2\x80\x94": 6,
           b"q": 7, b"<": 8, b">": 9, b"s": 10, b"o": 11}
D_PIECES = {v: k for k, v in D_VOCAB.items()}


def toy_tokenize(raw: bytes) -> list[int]:
    out, i = [], 0
    while i < len(raw):
        for j in range(len(raw), i, -1):
            if raw[i:j] in D_VOCAB:
                out.append(D_VOCAB[raw[i:j]])
                i = j
                break
        else:
            raise AssertionError(f"toy draft cannot tokenise {raw[i:]!r}")
    return out


def toy_translation(bos_out=()) -> Translation:
    to_draft = np.full(len(T_PIECES), -1)
    for t, piece in T_PIECES.items():
        if piece in D_VOCAB and t != 0:
            to_draft[t] = D_VOCAB[piece]
    return Translation(to_draft, T_PIECES.__getitem__, toy_tokenize, (0, list(bos_out)))


def text_of(draft_tokens) -> bytes:
    return b"".join(D_PIECES[d] for d in draft_tokens)


def test_shared_tokens_are_the_drafts_own_and_a_run_of_others_is_tokenised_as_one_text():
    tr = toy_translation()
    # "ab" and "cd" are not the draft's tokens: together they are its one token "abcd"
    assert tr.tokens([0, 1, 3, 4, 6]) == [0, 4, 5]
    assert tr.tokens([0, 1, 3]) == [0, 0, 1]          # the run cut in two: "ab" alone
    assert tr.truncate(1) == 0                       # <bos> becomes nothing in this draft
    assert toy_translation(bos_out=[11]).tokens([0, 1]) == [11, 0]


def test_a_character_split_across_byte_tokens_waits_for_its_last_byte():
    tr = toy_translation()
    assert tr.tokens([10, 7]) == [7]
    assert tr.tokens([10, 7, 8]) == [7]
    assert tr.tokens([10, 7, 8, 9]) == [7, 6]        # "—" complete: the draft's own token


def test_a_long_run_starts_again_after_the_look_behind():
    tr = toy_translation()
    run = [3, 4] * LOOK_BEHIND                        # "abcd" over and over, none shared
    out = tr.tokens(run)
    assert text_of(out) == b"abcd" * LOOK_BEHIND
    assert tr.truncate(LOOK_BEHIND + 1) == len(tr.tokens(run[:LOOK_BEHIND + 1]))


@pytest.mark.parametrize("seed", range(20))
def test_the_kept_translation_is_the_one_made_afresh(seed):
    """Grown, cut back and grown again in any order, the translation equals the one made
    from the context alone, and it carries the context's bytes."""
    rng = np.random.default_rng(seed)
    tr = toy_translation()
    context: list[int] = [0]
    for _ in range(60):
        if rng.random() < 0.3 and len(context) > 1:
            context = context[:int(rng.integers(1, len(context)))]
            tr.truncate(len(context))
        else:
            # (whole characters: a character's bytes split across tokens are the test above)
            context += rng.choice([1, 2, 3, 4, 5, 6, 10], int(rng.integers(1, 4))).tolist()
        got = list(tr.tokens(context))
        # compare with a fresh translation grown token by token (the same look-behind cuts)
        fresh = toy_translation()
        for n in range(1, len(context) + 1):
            fresh.tokens(context[:n])
        assert got == fresh.tokens(context)
        raw = b"".join(T_PIECES[t] for t in context[1:])
        assert text_of(got) == raw


# -- the real vocabularies -------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocabs(gemma_f32_path, smollm2_q4_path):
    with VocabOnly(gemma_f32_path) as g, VocabOnly(smollm2_q4_path) as s:
        yield g, s


@pytest.fixture(scope="module")
def gemma_smol(vocabs):
    return check_pair(*vocabs)


def test_the_map_between_gemma_and_smollm2(vocabs, gemma_smol):
    g, s = vocabs
    m = gemma_smol
    assert m.n_draft == 49152 and m.n_target == 262144
    assert 0.9 < m.overlap < 0.96 and m.share == "93.8%"
    assert "tokenizer types differ" in m.difference
    # one to one, both ways
    d = np.flatnonzero(m.keep)
    assert np.array_equal(m.to_draft[m.to_target[d]], d)
    assert len(np.unique(m.to_target[d])) == len(d)
    # the same text under each tokenizer's own markers: Ġthe (BPE) is ▁the (SentencePiece)
    for text in [" the", "The", "\n", " photosynthesis", "def", "—"]:
        gt, st = (v.vocabulary.tokenize(text, False, False) for v in (g, s))
        if len(gt) == 1 and len(st) == 1:
            assert m.to_target[st[0]] == gt[0], text
    assert s.token_text(st[0]) != g.token_text(gt[0])       # the raw entries differ
    # a byte token maps to the draft's token for that byte; ends of sequence correspond
    byte_e2 = g.vocabulary.tokenize(b"\xe2", False, False)[0]
    assert s.vocabulary.token_bytes(int(m.to_draft[byte_e2])) == b"\xe2"
    assert m.to_target[s.vocab.eos] == g.vocab.eos
    # control tokens never map to plain text
    assert m.to_draft[g.vocabulary.tokenize("<start_of_turn>", False, True)[0]] == -1


def test_the_map_is_kept_on_disk_under_both_vocabularies_digests(vocabs, gemma_smol,
                                                                 monkeypatch, tmp_path):
    from edgespec.backend import vocab_map as vm
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = vm.vocab_map(*vocabs)
    files = list((tmp_path / "edgespec" / "vocab_maps").glob("*.npz"))
    assert len(files) == 1
    monkeypatch.setattr(vm, "build_map", lambda *a: pytest.fail("built again"))
    again = vm.vocab_map(*vocabs)
    assert np.array_equal(again.to_target, built.to_target)
    assert np.array_equal(again.to_target, gemma_smol.to_target)
    files[0].write_bytes(b"not a map")             # a damaged file is rebuilt, not trusted
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert np.array_equal(vm.vocab_map(*vocabs).to_target, built.to_target)


def test_a_draft_with_too_few_of_the_targets_tokens_is_refused_with_the_share(
        smollm2_f32_path, gemma_q4_path):
    with pytest.raises(IncompatiblePairError, match=r"only 17\.6% of the draft's tokens map"):
        check_pair_files(smollm2_f32_path, gemma_q4_path)


def test_a_draft_that_shares_the_tokenizer_needs_no_map(smollm2_f32_path, smollm2_q4_path):
    assert check_pair_files(smollm2_f32_path, smollm2_q4_path) is None


TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "def f(x):\n    return {'a': [1, 2, 3]}\n\n\n",
         "Photosynthesis — the process by which plants make sugar — needs light.",
         "東京は日本の首都です。 Ünïcödé façade, naïve café.",
         "emoji 🙂🚀 and  multiple   spaces\t\ttabs",
         "<start_of_turn>user\nhello<end_of_turn>\n"]


def real_translation(vocabs, gemma_smol) -> Translation:
    g, s = vocabs

    def tokenize(raw: bytes) -> list[int]:
        return s.vocabulary.tokenize(raw, False, False) if raw else []
    return Translation(gemma_smol.to_draft, lambda t: g.vocabulary.piece(t, special=True),
                       tokenize, (g.vocab.bos, []))


@pytest.mark.parametrize("text", TEXTS)
def test_the_draft_reads_exactly_the_targets_text(vocabs, gemma_smol, text):
    g, s = vocabs
    tr = real_translation(vocabs, gemma_smol)
    context = g.vocabulary.tokenize(text, True, True)       # <bos> and control tokens parsed
    out = []
    for n in range(1, len(context) + 1):         # committed a token at a time, as decoding does
        out = list(tr.tokens(context[:n]))
    assert b"".join(s.vocabulary.piece(t) for t in out) == text.encode()
    assert tr.seconds < 0.05


# -- statistical losslessness across the two real vocabularies ---------------------------

N_DRAWS = 60_000
TV_LIMIT = 0.012


class _NoModel:
    """_cross_q reads no model: the rows are hand-made (pure logic)."""
    tokens: list[int] = []


def cross_q(gemma_smol, draft_row, allowed_target, params):
    class Constraint:
        def mask(self):
            return allowed_target
    drafter = ModelDrafter(_NoModel(), frozenset(), FixedLength(1), None,
                           (None, gemma_smol.to_target))
    q, _ = drafter._cross_q(None, draft_row, params, [], Constraint(), False)
    return q


def constrained_case(vocabs, gemma_smol):
    """A grammar allows six of Gemma's tokens: four SmolLM2 also holds, two it lacks. The
    draft puts 40% of its mass on tokens Gemma lacks and some on tokens the grammar refuses."""
    g, s = vocabs
    m = gemma_smol
    words = [" Paris", " London", " Rome", " Berlin"]
    shared = [g.vocabulary.tokenize(w, False, False)[0] for w in words]
    assert all(m.to_draft[t] >= 0 for t in shared)
    gemma_only = [t for t in range(1000, 200000) if m.to_draft[t] < 0
                  and g.vocabulary.piece(t)][:2]
    smol_only = np.flatnonzero(~m.keep)[100:105]
    refused = [int(m.to_draft[g.vocabulary.tokenize(" the", False, False)[0]])]
    allowed = np.zeros(m.n_target, dtype=bool)
    allowed[shared + gemma_only] = True
    p_logits = np.full(m.n_target, -5.0, dtype=np.float32)
    p_logits[shared + gemma_only] = [2.0, 1.0, 0.5, 0.0, 1.5, -0.5]
    draft_row = np.full(m.n_draft, -30.0, dtype=np.float32)
    draft_row[m.to_draft[shared]] = [0.0, 2.0, 1.0, 0.5]
    draft_row[smol_only] = 1.6
    draft_row[refused] = 2.5
    return allowed, p_logits, draft_row


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("mutant", [False, True])
def test_tli_is_lossless_on_a_constrained_distribution_and_the_mutant_is_caught(
        vocabs, gemma_smol, monkeypatch, rule, mutant):
    if mutant:      # q restricted to the shared tokens without renormalising
        def no_renorm(q, to_target):
            ids = q.ids if q.ids is not None else np.arange(q.probs.size)
            t = to_target[ids]
            return Dist(t[t >= 0], q.probs[t >= 0])
        monkeypatch.setattr(drafting_model, "restrict", no_renorm)
    params = SamplingParams(temperature=0.9)
    allowed, p_logits, draft_row = constrained_case(vocabs, gemma_smol)
    q = cross_q(gemma_smol, draft_row, allowed, params)
    p = warp(p_logits, params, allowed=allowed)
    assert set(q.ids.tolist()) <= set(np.flatnonzero(allowed).tolist())
    rng = np.random.default_rng(7)
    counts: dict[int, int] = {}
    for _ in range(N_DRAWS):
        x = q.sample(rng)
        if rule == "token":
            n, t = verify.speculative_sampling([x], [q], lambda i: p, rng, 262144)
        else:
            n, t = verify.verify_block([x], [q], lambda i: p, rng, 262144)
        out = x if n else t
        counts[out] = counts.get(out, 0) + 1
    dense_p = p.dense(262144)
    got = np.zeros(262144)
    for k, c in counts.items():
        got[k] = c / N_DRAWS
    distance = 0.5 * float(np.abs(got - dense_p).sum())
    if mutant:
        assert distance > 3 * TV_LIMIT, f"the mutant went unnoticed (TV {distance:.4f})"
    else:
        assert distance < TV_LIMIT, f"TV distance {distance:.4f} to the target's p"
