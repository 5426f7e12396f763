"""llama-cpp-python's own high-level API, as a peer for side-by-side benchmarks: what a
Python user would otherwise pick (``llama_cpp.Llama``, plain or with its prompt lookup)."""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import llama_cpp.llama_cpp as C

from ..gguf_file import read_gguf
from .preflight import cpu_kernels
from .repack import Overrides
from .runtime import ensure_init

_PARAMS_LOCK = threading.Lock()


@contextmanager
def _extra_buffers(on: bool, kept: Optional[Overrides] = None) -> Iterator[None]:
    """``llama_cpp.Llama`` takes no parameter for llama.cpp's extra CPU buffer types: while
    one is built, the default model parameters it starts from carry ``use_extra_bufts`` (and
    ``kept``: the weights that keep the repacked kernels, as edgespec's own loads do)."""
    if on:
        yield
        return
    default = C.llama_model_default_params

    def without() -> C.llama_model_params:
        params = default()
        params.use_extra_bufts = False
        if kept is not None:
            params.tensor_buft_overrides = kept.pointer
        return params
    with _PARAMS_LOCK:
        C.llama_model_default_params = without
        try:
            yield
        finally:
            C.llama_model_default_params = default


class LlamaCppPythonPeer:
    """``llama_cpp.Llama`` decoding greedily, plain or with ``LlamaPromptLookupDecoding``,
    timed the way edgespec times itself (decoding only, prompt processing excluded)."""

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 2048,
                 n_threads: Optional[int] = None, prompt_lookup: bool = False,
                 num_pred_tokens: int = 10, cpu_extra_buffers: str = "auto"):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        ensure_init()
        draft = LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens) if prompt_lookup \
            else None
        # the same preflight as edgespec's own models: a CPU kernel that faults stays off
        tensors = read_gguf(path).tensors
        with _extra_buffers(*cpu_kernels(tensors, cpu_extra_buffers)):
            self.llm = Llama(str(path), n_ctx=n_ctx, n_threads=n_threads,
                             n_threads_batch=n_threads, draft_model=draft, verbose=False)
        vocab = C.llama_model_get_vocab(self.llm.model)
        self.eog = {t for t in range(self.llm.n_vocab()) if C.llama_vocab_is_eog(vocab, t)}

    def generate(self, tokens: Sequence[int], max_tokens: int) -> tuple[int, float]:
        """(tokens generated, decoding seconds) for a greedy completion of ``tokens``."""
        n = 0
        t_first = None
        for tok in self.llm.generate(list(tokens), temp=0.0, top_k=1, reset=True):
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            if tok in self.eog:
                break
            n += 1
            if n >= max_tokens:
                break
        # The first token comes out of prompt processing; time the rest, per token.
        return n, (time.perf_counter() - t_first) * n / max(n - 1, 1) if t_first else 0.0

    def close(self) -> None:
        self.llm.close()
