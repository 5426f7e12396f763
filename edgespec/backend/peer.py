"""llama-cpp-python's own high-level API, as a peer for side-by-side benchmarks: what a
Python user would otherwise pick (``llama_cpp.Llama``, plain or with its prompt lookup)."""

from __future__ import annotations

import os
import time
from typing import Optional, Sequence

import llama_cpp.llama_cpp as C

from .runtime import ensure_init


class LlamaCppPythonPeer:
    """``llama_cpp.Llama`` decoding greedily, plain or with ``LlamaPromptLookupDecoding``,
    timed the way edgespec times itself (decoding only, prompt processing excluded)."""

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 2048,
                 n_threads: Optional[int] = None, prompt_lookup: bool = False,
                 num_pred_tokens: int = 10):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        ensure_init()
        draft = LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens) if prompt_lookup \
            else None
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
