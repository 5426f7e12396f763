"""Every way found for llama.cpp to abort the calling process on bad input is checked before
calling in (docs/decisions.md, "Native aborts"). Each test shows both sides on a tiny GGUF
the test writes: the guarded call raises a Python exception in this process, and the same call
made straight into llama.cpp, in a child process, dies by a signal (the guard's negative
control: without it, the caller would vanish)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from edgespec.backend import LlamaModel, VocabOnly
from edgespec.backend.probe import write_probe_model
from edgespec.config import ModelConfig
from edgespec.errors import BackendError, ContextOverflowError, ModelLoadError

pytestmark = pytest.mark.real        # loads GGUF files (tiny ones it writes itself)

CHILD = textwrap.dedent("""
    import ctypes, sys
    import llama_cpp.llama_cpp as C
    quiet = C.llama_log_callback(lambda *a: None)      # kept: llama.cpp calls it later
    C.llama_log_set(quiet, ctypes.c_void_p(0))
    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.use_extra_bufts = False
    model = C.llama_model_load_from_file(sys.argv[1].encode(), mp)
    vocab = C.llama_model_get_vocab(model)
    cp = C.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_outputs_max = 256, 8, 8, 2
    ctx = C.llama_init_from_model(model, cp)
    batch = C.llama_batch_init(64, 0, 1)
    def decode(n, all_logits=False):
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 3 + i, i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, all_logits or i == n - 1
        batch.n_tokens = n
        return C.llama_decode(ctx, batch)
    buf = ctypes.create_string_buffer(64)
    print("calling", flush=True)
""")


def died_by_signal(model_path, call: str) -> int:
    """Run ``call`` straight into llama.cpp in a child; the signal that ended it (0: none)."""
    proc = subprocess.run([sys.executable, "-c", CHILD + call, str(model_path)],
                          capture_output=True, text=True, timeout=120)
    assert "calling" in proc.stdout, proc.stderr[-2000:]
    return -proc.returncode if proc.returncode < 0 else 0


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("guards") / "probe.gguf"
    write_probe_model(path)
    return path


@pytest.fixture(scope="module")
def model(probe):
    m = LlamaModel(ModelConfig(probe, n_ctx=256, n_batch=8, n_outputs_max=2, n_threads=2,
                               cpu_extra_buffers="off"))
    yield m
    m.close()


def test_a_model_without_a_vocabulary_is_refused_before_any_text_lookup(tmp_path):
    path = tmp_path / "no-vocab.gguf"
    write_probe_model(path, tokenizer="none")
    for load in (lambda: LlamaModel(ModelConfig(path, n_ctx=64, cpu_extra_buffers="off")),
                 lambda: VocabOnly(path)):
        with pytest.raises(ModelLoadError, match="has no tokenizer"):
            load()
    assert died_by_signal(path, "out = (C.llama_token * 8)()\n"
                                "C.llama_tokenize(vocab, b'hi', 2, out, 8, True, True)") \
        == signal.SIGABRT


def test_token_ids_outside_the_vocabulary_are_refused(model, probe):
    n = model.n_vocab
    for call in (model.token_bytes, model.token_text, model.vocabulary.attr):
        for bad in (n, n + 1000, -1):
            with pytest.raises(BackendError, match=f"token id {bad} is not in this model's "
                                                   f"vocabulary \\(0-{n - 1}\\)"):
                call(bad)
    assert model.token_bytes(n - 1) == f"t{n - 4}".encode()       # the last id still reads
    assert died_by_signal(probe, f"C.llama_token_to_piece(vocab, {n}, buf, 64, 0, False)") \
        == signal.SIGABRT
    assert died_by_signal(probe, f"C.llama_vocab_get_text(vocab, {n})") == signal.SIGABRT


def test_a_batch_longer_than_n_batch_is_sent_in_pieces(model, probe):
    model.truncate(0)
    rows = model.eval(list(range(3, 23)), 1)          # 20 tokens, n_batch 8
    assert rows.shape == (1, model.n_vocab) and len(model.tokens) == 20
    assert model.cache_span() == (0, 19)
    model.truncate(0)
    assert died_by_signal(probe, "decode(20)") == signal.SIGABRT


def test_more_logits_rows_than_the_context_returns_are_refused(model, probe):
    model.truncate(0)
    with pytest.raises(ValueError, match=r"n_logits=8 must be in \[0, min\(8, 2\)\]"):
        model.eval(list(range(3, 11)), 8)
    assert model.tokens == []
    assert died_by_signal(probe, "decode(8, all_logits=True)") == signal.SIGABRT


def test_a_context_that_would_overflow_is_refused_and_the_model_stays_usable(model):
    model.truncate(0)
    model.eval(list(range(3, 3 + 250)), 1)
    with pytest.raises(ContextOverflowError):
        model.eval(list(range(3, 13)), 1)
    assert len(model.tokens) == 250
    model.truncate(10)
    assert model.eval([5, 6], 1).shape == (1, model.n_vocab)
