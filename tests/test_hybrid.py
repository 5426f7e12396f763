"""Speculation on hybrid and recurrent models (edgespec/backend/rollback.py): Qwen3.5's Gated
DeltaNet + attention (qwen35), LFM2's short convolutions + attention (lfm2), Mamba2 (mamba2)
and Granite 4.0-H's Mamba2 + attention (granitehybrid), as small random-weight GGUFs written
from llama.cpp's own definitions (tests/conftest.py ``hybrid_models``), F32 targets drafted by
their own Q8_0 and Q4_0 copies.

Greedy speculative output must be token-identical to plain decoding (the recurrent state goes
back to the last accepted token after every rejecting pass), in every mode: model drafts up to
K = 8, n-gram and suffix drafts, the hybrid drafter, four streams at once, conversations
continued from the live cache and from the prompt cache, llama.cpp's snapshots. The negative
control leaves the rollback out (the attention part trimmed as on any model, the recurrent
part left as the rejected drafts made it) and must be caught by the same comparison.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest

import llama_cpp.llama_cpp as C

from edgespec import Engine, SamplingParams
from edgespec.backend.rollback import PARTIAL
from edgespec.backend.sequence import KVSequence

from conftest import HYBRID_ARCHS

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ",
           "Once upon a time there was a small robot who", "List three colours:"]
N_NEW = 40


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_models_are_byte_reproducible(hybrid_models, smollm2_q4_path, tmp_path):
    from edgespec.bench.synthetic import TINY, write_model
    again = write_model(TINY["qwen35"], tmp_path / "a.gguf", smollm2_q4_path, seed=1)
    other = write_model(TINY["qwen35"], tmp_path / "b.gguf", smollm2_q4_path, seed=2)
    assert sha256(again) == sha256(hybrid_models["qwen35"]["F32"])
    assert sha256(other) != sha256(again)


PLAIN: dict = {}


def plain(eng: Engine, arch: str, prompt: str) -> list[int]:
    """Plain decoding's answer (the same F32 target file for every engine of ``arch``)."""
    if (arch, prompt) not in PLAIN:
        PLAIN[arch, prompt] = eng.generate(prompt, max_tokens=N_NEW, sampling=GREEDY, raw=True,
                                           speculative=False).tokens
    return PLAIN[arch, prompt]


def check_against_plain(eng: Engine, arch: str, prompts=PROMPTS) -> list:
    """Every prompt's speculative answer equals plain decoding's; returns their stats."""
    stats = []
    for prompt in prompts:
        out = eng.generate(prompt, max_tokens=N_NEW, sampling=GREEDY, raw=True)
        assert out.tokens == plain(eng, arch, prompt), (arch, prompt)
        stats.append(out.stats)
    return stats


@pytest.fixture(scope="module", params=HYBRID_ARCHS)
def arch(request):
    return request.param


@pytest.mark.parametrize("draft, k", [("Q4_0", 8), ("Q8_0", 3)])
def test_model_drafts_equal_plain_decoding(hybrid_models, arch, draft, k):
    m = hybrid_models[arch]
    with Engine.load(m["F32"], m[draft], n_ctx=512, draft_max=k, suffix=False) as eng:
        assert eng.target.describe()["rollback"] == "checkpoints"
        stats = check_against_plain(eng, arch)
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    assert drafted > 0 and accepted > 0
    assert accepted < drafted           # rejections: the rollback was exercised
    assert sum(s.rollback_seconds for s in stats) > 0


def test_ngram_suffix_and_hybrid_drafts_equal_plain_decoding(hybrid_models, arch):
    m = hybrid_models[arch]
    with Engine.load(m["F32"], drafter="ngram", n_ctx=512) as eng:
        # the second time round, the suffix index holds the first answer: long drafts
        stats = check_against_plain(eng, arch) + check_against_plain(eng, arch)
        assert sum(s.accepted for s in stats) > N_NEW
    with Engine.load(m["F32"], m["Q4_0"], drafter="hybrid", n_ctx=512) as eng:
        stats = check_against_plain(eng, arch) + check_against_plain(eng, arch)
        assert sum(s.drafted for s in stats) > 0


def test_four_streams_at_once_equal_plain_decoding(hybrid_models, arch):
    m = hybrid_models[arch]
    with Engine.load(m["F32"], m["Q4_0"], n_ctx=512, draft_max=6, parallel=4,
                     suffix=False) as eng:
        want = {p: plain(eng, arch, p) for p in PROMPTS}
        got, errors = {}, []
        start = threading.Barrier(len(PROMPTS))
        passes = eng.lanes.rounds.passes

        def one(p):
            try:
                start.wait()
                got[p] = eng.generate(p, max_tokens=N_NEW, sampling=GREEDY, raw=True)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert {p: g.tokens for p, g in got.items()} == want
        assert sum(g.stats.drafted for g in got.values()) > 0
        assert eng.lanes.rounds.passes > passes     # some passes held several streams


def conversations(eng: Engine, **kwargs) -> list:
    """Two conversations of two turns, interleaved: each second turn continues a state the
    other conversation pushed out of the live cache (the prompt cache brings it back)."""
    a = [{"role": "user", "content": "Tell me about the sea."}]
    b = [{"role": "user", "content": "Write a short poem."}]
    out = []
    for turn in range(2):
        for conv in (a, b):
            g = eng.generate(conv, max_tokens=24, sampling=GREEDY, **kwargs)
            out.append(g)
            conv += [{"role": "assistant", "content": g.text},
                     {"role": "user", "content": ["And more?", "Go on."][turn]}]
    return out


def test_conversations_continued_from_the_caches_equal_fresh_plain_decoding(hybrid_models,
                                                                             arch):
    m = hybrid_models[arch]
    with Engine.load(m["F32"], drafter="none", n_ctx=1024, cache_ram=0) as ref:
        fresh = [[g.tokens] for g in conversations(ref, speculative=False)]
    with Engine.load(m["F32"], m["Q4_0"], n_ctx=1024, draft_max=4, suffix=False) as eng:
        spec = conversations(eng)
        assert eng.prompt_cache.describe()["restored"] >= 1
    assert [[g.tokens] for g in spec] == fresh
    # the later turns took their prefix from a cache
    assert all(g.stats.prompt_tokens_evaluated < g.stats.prompt_tokens for g in spec[2:])


@pytest.mark.parametrize("arch_", ["qwen35", "lfm2"])
def test_llama_cpp_snapshots_equal_plain_decoding(hybrid_models, arch_):
    """With llama.cpp's per-token snapshots a rejection goes back without a copy restored
    or a token evaluated again; the answers are the same."""
    m = hybrid_models[arch_]
    redone = {}
    for rollback in ("checkpoints", "snapshots"):
        with Engine.load(m["F32"], m["Q4_0"], n_ctx=512, draft_max=6, suffix=False,
                         rollback=rollback) as eng:
            assert eng.target.describe()["rollback"] == rollback
            seq = eng.target.sequences[0]
            check_against_plain(eng, arch_)
            assert seq.rollbacks > 0
            redone[rollback] = seq.reevaluated
    assert redone["snapshots"] < redone["checkpoints"] / 2, redone


def leave_rollback_out(self: KVSequence, n: int) -> None:
    """What a runtime that trims positions only would leave: the attention part cut at ``n``
    and the recurrent part as the rejected drafts made it (its position set to ``n - 1`` in
    the copy's header, so that llama.cpp takes the next token)."""
    m, seq = self.model, self.seq_id
    size = C.llama_state_seq_get_size_ext(m.context, seq, PARTIAL)
    now = np.empty(size, dtype=np.uint8)
    ptr = now.ctypes.data_as(C.ctypes.POINTER(C.ctypes.c_uint8))
    assert C.llama_state_seq_get_data_ext(m.context, ptr, size, seq, PARTIAL) == size
    # llama.cpp's layout: u32 magic, i32 sequence, u32 cells (one), i32 its position, ...
    assert now[4:12].view(np.int32).tolist() == [seq, 1]
    now[12:16] = np.array([n - 1], dtype=np.int32).view(np.uint8)
    assert C.llama_state_seq_set_data_ext(m.context, ptr, size, seq, PARTIAL)
    assert C.llama_memory_seq_rm(m.memory, seq, n, -1)
    self.held = n


def test_leaving_the_rollback_out_is_caught(hybrid_models, arch, monkeypatch):
    """Negative control: the same comparison catches a recurrent state left ahead."""
    m = hybrid_models[arch]
    monkeypatch.setattr(KVSequence, "_back_to_checkpoint", leave_rollback_out)
    with Engine.load(m["F32"], m["Q4_0"], n_ctx=512, draft_max=8, suffix=False) as eng:
        differ = [p for p in PROMPTS
                  if eng.generate(p, max_tokens=N_NEW, sampling=GREEDY, raw=True).tokens
                  != plain(eng, arch, p)]
    assert len(differ) >= len(PROMPTS) // 2, differ
