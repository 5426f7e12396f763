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

import numpy as np
import pytest

import llama_cpp.llama_cpp as C

from edgespec import Engine, SamplingParams
from edgespec.backend.rollback import PARTIAL
from edgespec.backend.sequence import KVSequence

from conftest import HYBRID_ARCHS
from test_parallel import together

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


def test_the_tokenizer_is_copied_as_gguf_py_reads_it(smollm2_q4_path):
    """The writer reads a model's tokenizer keys from the header itself (gguf-py's reader
    takes seconds over a large vocabulary): the same values and types as gguf-py's."""
    import gguf

    from edgespec.bench.synthetic import _read_tokenizer
    st = smollm2_q4_path.stat()
    ours = _read_tokenizer(str(smollm2_q4_path), st.st_size, st.st_mtime_ns)
    theirs = {name: (f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
              for name, f in gguf.GGUFReader(str(smollm2_q4_path)).fields.items()
              if name.startswith("tokenizer.")}
    assert len(ours["tokenizer.ggml.tokens"][0]) == 49152 and ours == theirs


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
    # Lengths pinned: the cost model may rightly choose K = 0 on a loaded machine, and this
    # test is about what drafts do to the output, not whether they pay here.
    with Engine.load(m["F32"], drafter="ngram", n_ctx=512, draft_max=8) as eng:
        # the second time round, the suffix index holds the first answer: long drafts
        stats = check_against_plain(eng, arch) + check_against_plain(eng, arch)
        assert sum(s.accepted for s in stats) > N_NEW
    with Engine.load(m["F32"], m["Q4_0"], drafter="hybrid", n_ctx=512, draft_max=4) as eng:
        stats = check_against_plain(eng, arch) + check_against_plain(eng, arch)
        assert sum(s.drafted for s in stats) > 0


def test_four_streams_at_once_equal_plain_decoding(hybrid_models, arch):
    m = hybrid_models[arch]
    with Engine.load(m["F32"], m["Q4_0"], n_ctx=512, draft_max=6, parallel=4,
                     suffix=False) as eng:
        want = {p: plain(eng, arch, p) for p in PROMPTS}
        passes = eng.lanes.rounds.passes
        got = together(eng, GREEDY, N_NEW, PROMPTS)
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


def test_seeded_sampling_is_the_same_with_and_without_speculation(hybrid_models, arch):
    m = hybrid_models[arch]
    drafted = 0
    with Engine.load(m["F32"], m["Q4_0"], n_ctx=512, draft_max=4, suffix=False) as eng:
        for i, p in enumerate(PROMPTS):
            s = SamplingParams(temperature=1.0, seed=100 + i)
            spec = eng.generate(p, max_tokens=N_NEW, sampling=s, raw=True)
            alone = eng.generate(p, max_tokens=N_NEW, sampling=s, raw=True, speculative=False)
            assert spec.tokens == alone.tokens, p
            drafted += spec.stats.drafted
    assert drafted > 0


PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 130}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}


def test_constrained_output_and_tool_calls_equal_plain_decoding(hybrid_models, arch):
    from edgespec import Constraint
    m = hybrid_models[arch]
    with Engine.load(m["F32"], m["Q4_0"], n_ctx=1024, draft_max=4, suffix=False) as eng:
        for kwargs in ({"constraint": Constraint.json_schema(PERSON)},
                       {"tools": [WEATHER], "tool_choice": "required"}):
            ask = [{"role": "user", "content": "Who is in the picture, and the weather?"}]
            spec = eng.generate(ask, max_tokens=64, sampling=GREEDY, **kwargs)
            alone = eng.generate(ask, max_tokens=64, sampling=GREEDY, speculative=False,
                                 **kwargs)
            assert spec.tokens == alone.tokens, kwargs
            assert spec.stats.drafted > 0
        assert alone.tool_calls and alone.tool_calls[0].name == "get_weather"


def test_drafts_across_vocabularies_to_and_from_a_hybrid(hybrid_models, gemma_q4_path,
                                                         gemma_f32_path, smollm2_q4_path,
                                                         tmp_path):
    """A hybrid target with Gemma's tokenizer drafted by SmolLM2 (another tokenizer, most of
    whose tokens are Gemma's), and Gemma drafted by a hybrid with SmolLM2's tokenizer."""
    from edgespec.bench.synthetic import TINY, write_model
    hybrid = write_model(TINY["qwen35"], tmp_path / "qwen35-gemma-vocab.gguf", gemma_q4_path,
                         seed=1, dtype="F16")
    for target, draft, arch in ((hybrid, smollm2_q4_path, "qwen35-gemma-vocab"),
                                (gemma_f32_path, hybrid_models["qwen35"]["Q8_0"], "gemma")):
        with Engine.load(target, draft, n_ctx=512, draft_max=4, suffix=False) as eng:
            assert eng.vocab_map is not None
            stats = check_against_plain(eng, arch, PROMPTS[:2])
            assert sum(s.drafted for s in stats) > 0


def test_pair_derive_run_chat_and_serve_a_hybrid(hybrid_models, tmp_path):
    """The commands as a user runs them on a hybrid: `pair derive` makes its own draft,
    `run` with it answers as `run --no-spec` does, `chat` answers, `serve` answers over
    HTTP what plain decoding answers."""
    import json
    import os
    import subprocess
    import sys

    from server_helpers import ServerProcess, post, stop_checked

    def edgespec(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "edgespec", *map(str, args)], input=stdin,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "EDGESPEC_MODELS": str(tmp_path / "models")})

    target = hybrid_models["qwen35"]["F32"]
    draft = tmp_path / "draft.gguf"
    proc = edgespec("pair", "derive", target, "--quant", "Q4_0", "--out", draft)
    assert proc.returncode == 0 and "pair check passed" in proc.stderr, proc.stderr

    prompt = "The capital of France is"
    common = ["--raw", "--json", "-n", "24", "--temperature", "0", "--target", target]
    runs = [edgespec("run", *common, *extra, prompt)
            for extra in (["--draft", draft, "--draft-max", "4"], ["--no-spec"])]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    spec, alone = (json.loads(r.stdout) for r in runs)
    assert spec["tokens"] == alone["tokens"] and spec["stats"]["drafted"] > 0

    chat = edgespec("chat", "--target", target, "--draft", draft, "--temperature", "0",
                    "--max-tokens", "16", stdin="Hello there\n/stats\n")
    assert chat.returncode == 0 and "Traceback" not in chat.stderr, chat.stderr
    assert any(line.startswith("last answer: [") for line in chat.stdout.splitlines())

    server = ServerProcess("--target", target, "--draft", draft, "--draft-max", "4")
    try:
        status, body = post(server.port, "/v1/completions",
                            {"prompt": prompt, "max_tokens": 24, "temperature": 0})
        assert status == 200, body
        assert body["choices"][0]["text"] == alone["text"]
    finally:
        stop_checked(server)


# -- sampling at T = 1 against the target's exact law ---------------------------------------

STAT_PROMPT = "My favourite colour is"
STAT_PARAMS = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
STAT_TOKENS = 4
STAT_RUNS = 400


@pytest.fixture(scope="module")
def stat_case(hybrid_models, smollm2_q4_path, tmp_path_factory):
    """A qwen35 model whose answers at T = 1 spread over many tokens (a soft output head), its
    Q4_0 copy as the draft, the exact law of its first STAT_TOKENS tokens, and an Engine
    drafting two tokens a round (each answer: the prompt's token, then rounds that reject
    often and go back)."""
    from dataclasses import replace

    from edgespec.backend import LlamaModel, quantize
    from edgespec.bench.synthetic import TINY, write_model
    from edgespec.config import ModelConfig
    from test_qwen_pair import joint_law
    root = tmp_path_factory.mktemp("soft")
    f32 = write_model(replace(TINY["qwen35"], sharpness=STAT_SHARPNESS), root / "soft.gguf",
                      smollm2_q4_path, seed=3)
    draft = quantize(f32, root / "soft.Q4_0.gguf", "Q4_0")
    ref = LlamaModel(ModelConfig(f32, n_ctx=256))
    try:
        law = joint_law(ref, ref.tokenize(STAT_PROMPT), STAT_PARAMS, STAT_TOKENS)
    finally:
        ref.close()
    with Engine.load(f32, draft, n_ctx=256, draft_max=2, suffix=False, cache_ram=0) as eng:
        assert eng.prompt_tokens(STAT_PROMPT, raw=True) == eng.target.tokenize(STAT_PROMPT)
        yield law, eng


STAT_SHARPNESS = 1.6     # most answers in a few cells at T = 1 (flatter heads spread thin)


def sample_runs(eng: Engine) -> tuple[list[tuple], int, int]:
    """STAT_RUNS answers' token tuples, and the tokens drafted and accepted in all."""
    out, drafted, accepted = [], 0, 0
    for _ in range(STAT_RUNS):
        g = eng.generate(STAT_PROMPT, max_tokens=STAT_TOKENS, sampling=STAT_PARAMS, raw=True)
        out.append(tuple(g.tokens))
        drafted += g.stats.drafted
        accepted += g.stats.accepted
    return out, drafted, accepted


@pytest.mark.slow
def test_sampling_on_a_hybrid_pair_emits_the_targets_joint_law(stat_case):
    from goodness import ALPHA
    from test_qwen_pair import OTHER, g_against
    law, eng = stat_case
    assert law[OTHER] < 0.5          # the cells hold most answers: the test has power
    runs, drafted, accepted = sample_runs(eng)
    assert drafted >= STAT_RUNS and 0 < accepted < drafted      # rejections, rollbacks
    g, df, p = g_against(law, runs)
    assert p >= ALPHA, f"G = {g:.1f} on {df} degrees of freedom, p = {p:.2e}"


@pytest.mark.slow
def test_leaving_the_rollback_out_fails_the_same_test(stat_case, monkeypatch):
    """Negative control: sampling from a recurrent state the rejected drafts moved on."""
    from goodness import ALPHA, excess
    from test_qwen_pair import g_against
    monkeypatch.setattr(KVSequence, "_back_to_checkpoint", leave_rollback_out)
    law, eng = stat_case
    runs, drafted, _ = sample_runs(eng)
    assert drafted >= STAT_RUNS
    g, df, _ = g_against(law, runs)
    print(f"\ncontrol: G = {g:.1f} on {df} df, {excess(g, df, ALPHA):.1f}x the critical value")
    assert excess(g, df, ALPHA) >= 1.0, f"G = {g:.1f} on {df} degrees of freedom"
