"""A llama.cpp context that embeds: texts (as tokens) in, one pooled vector per text out.

:class:`EmbeddingModel` is a context made with ``embeddings=true`` on a ``llama_model``:
either the weights of an embedding-only GGUF it loads and owns (:meth:`EmbeddingModel.load`:
BERT, nomic-bert, …), or those of a generative model already loaded for generation
(:meth:`EmbeddingModel.sharing`: a second context on the same weights, so generation's
context and cache are untouched). llama.cpp pools the last hidden states as the model declares
(``<arch>.pooling_type``: mean, CLS or last token); a model that declares none (a generative
one) is mean-pooled.

Several texts go in one pass, one sequence each (:func:`plan_passes`), within ``n_batch``
tokens and ``n_seq`` sequences. llama.cpp pools within one micro-batch, so the batch is one
micro-batch and a text longer than it cannot be embedded: callers truncate or refuse first
(``n_ctx``). In embedding mode llama.cpp still applies a decoder's output layer to every
token, so a decoder's context (a generative model's, or a decoder embedding model's) is kept
to what :data:`LOGITS_BUDGET` bytes of logits allow.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

import llama_cpp.llama_cpp as C

from ..config import ModelConfig
from ..errors import BackendError, ModelLoadError
from ..gguf_file import (POOLING_MEAN, GGUFInfo, check_embedding_model, declared_pooling,
                         has_kv_cache, read_gguf)
from .model import LlamaModel
from .runtime import ensure_init
from .vocab import HasVocabulary, Vocabulary
from .weights import free_context, load_weights

SEQUENCES = 16                 # texts per pass at most
LOGITS_BUDGET = 512 << 20      # bytes of logits a decoder's embedding pass may take
MIN_CONTEXT = 256              # tokens per text a generative model embeds at least
CONTEXT_PAD = 256
POOLING_NAMES = {1: "mean", 2: "cls", 3: "last"}
_UNSPECIFIED = -1              # LLAMA_POOLING_TYPE_UNSPECIFIED: the model's own


def plan_passes(lengths: Sequence[int], n_batch: int, n_seq: int) -> list[list[int]]:
    """The indices of ``lengths`` grouped into passes, in order: each pass at most ``n_seq``
    texts of at most ``n_batch`` tokens in all (every length is at most ``n_batch``)."""
    passes: list[list[int]] = []
    used = n_batch + 1
    for i, n in enumerate(lengths):
        if used + n > n_batch or len(passes[-1]) >= n_seq:
            passes.append([])
            used = 0
        passes[-1].append(i)
        used += n
    return passes


class EmbeddingModel(HasVocabulary):
    """One embedding context (see the module docstring). ``n_ctx``: the most tokens of one
    text; ``n_embd``: the length of a vector; ``pooling``: how tokens are pooled ("mean",
    "cls", "last"). Thread-safe: passes take turns."""

    def __init__(self, handle, info: GGUFInfo, vocabulary: Vocabulary, n_ctx: int,
                 n_threads: int, owner: Optional[LlamaModel] = None):
        """Use :meth:`load` or :meth:`sharing`. ``owner``: the model whose weights
        ``handle`` are (None: this object owns them and frees them)."""
        self.info, self.path, self.vocabulary = info, info.path, vocabulary
        self._handle, self._owner = handle, owner
        self._ctx = self._batch = None
        self.lock = threading.Lock()
        self.n_embd = C.llama_model_n_embd(handle)
        self.n_ctx_train = C.llama_model_n_ctx_train(handle)
        self.n_ctx = min(n_ctx, self.n_ctx_train or n_ctx)
        declared = declared_pooling(info)
        if has_kv_cache(info):    # a decoder: its output layer runs on every token
            per_token = 4 * max(1, vocabulary.info.n_vocab)
            self.n_ctx = min(self.n_ctx, max(MIN_CONTEXT, LOGITS_BUDGET // per_token))
        try:
            self._open(n_threads, _UNSPECIFIED if declared else POOLING_MEAN)
        except BaseException:
            self.close()
            raise

    def _open(self, n_threads: int, pooling: int) -> None:
        cparams = C.llama_context_default_params()
        # llama.cpp pads a context to a multiple of 256 and needs the batch to match it
        size = -(-self.n_ctx // CONTEXT_PAD) * CONTEXT_PAD
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = size
        cparams.n_seq_max = SEQUENCES
        cparams.kv_unified = True        # the sequences of a pass share one cache of n_ctx
        cparams.embeddings = True
        cparams.pooling_type = pooling
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        self._ctx = C.llama_init_from_model(self._handle, cparams)
        if not self._ctx:
            raise ModelLoadError(self.path, f"llama.cpp could not create an embedding context "
                                            f"of {self.n_ctx} tokens (out of memory?)")
        kind = C.llama_pooling_type(self._ctx)
        if kind not in POOLING_NAMES:
            raise ModelLoadError(self.path, f"pools its tokens in a way edgespec does not "
                                            f"embed with (llama_pooling_type {kind})")
        self.pooling = POOLING_NAMES[kind]
        self._memory = C.llama_get_memory(self._ctx)   # NULL for encoders: no KV cache
        self._batch = C.llama_batch_init(size, 0, 1)

    @classmethod
    def load(cls, config: ModelConfig) -> "EmbeddingModel":
        """The embedding model in ``config.path``, loaded with its settings (``n_ctx``: the
        longest text, capped at the model's trained context). Raises
        :class:`~edgespec.errors.ModelLoadError` for a file that cannot embed."""
        ensure_init(config.verbose)
        info = read_gguf(config.path)        # before llama.cpp sees the file
        check_embedding_model(info)
        handle, _, _ = load_weights(config, info)
        try:
            vocabulary = Vocabulary(C.llama_model_get_vocab(handle), config.path)
        except BaseException:
            C.llama_model_free(handle)
            raise
        return cls(handle, info, vocabulary, config.n_ctx, config.n_threads)

    @classmethod
    def sharing(cls, model) -> "EmbeddingModel":
        """A context on the weights of ``model``, loaded for generation (close this one
        before it). Raises :class:`~edgespec.errors.BackendError` for a model whose weights
        are in another process (RPC)."""
        if not isinstance(model, LlamaModel):
            raise BackendError(f"{model.path.name}: embeddings need the model's weights in "
                               "this process (this one runs on RPC workers)")
        model.check_open()
        return cls(model.weights, model.info, model.vocabulary, model.n_ctx,
                   model.config.n_threads, owner=model)

    @property
    def name(self) -> str:
        return Path(self.path).name

    def embed(self, texts: Sequence[Sequence[int]]) -> np.ndarray:
        """The pooled vector of each token list, ``(len(texts), n_embd)`` float32, not
        normalised. Each list holds 1 to ``n_ctx`` valid token ids."""
        out = np.empty((len(texts), self.n_embd), np.float32)
        with self.lock:
            self._check_open()
            for group in plan_passes([len(t) for t in texts], self.n_ctx, SEQUENCES):
                out[group] = self._pass([texts[i] for i in group])
        return out

    def _pass(self, texts: Sequence[Sequence[int]]) -> np.ndarray:
        b = self._batch
        j = 0
        for s, tokens in enumerate(texts):
            for pos, t in enumerate(tokens):
                b.token[j], b.pos[j], b.n_seq_id[j] = t, pos, 1
                b.seq_id[j][0], b.logits[j] = s, True
                j += 1
        b.n_tokens = j
        if self._memory:
            C.llama_memory_clear(self._memory, True)    # each pass starts from no context
            rc = C.llama_decode(self._ctx, b)
        else:
            rc = C.llama_encode(self._ctx, b)
        if rc != 0:
            raise BackendError(f"llama.cpp failed to embed a batch of {j} tokens (code {rc})")
        rows = []
        for s in range(len(texts)):
            p = C.llama_get_embeddings_seq(self._ctx, s)
            if not p:
                raise BackendError("llama.cpp returned no pooled embedding for a sequence")
            rows.append(np.ctypeslib.as_array(p, shape=(self.n_embd,)).copy())
        return np.stack(rows)

    def _check_open(self) -> None:
        if self._ctx is None:
            raise BackendError(f"{self.name}: the embedding context is closed")

    def close(self) -> None:
        """Free the context (and the weights, when this object loaded them). Safe twice."""
        with self.lock:
            free_context(self._ctx, self._batch)
            self._ctx = self._batch = None
            if self._handle and self._owner is None:
                C.llama_model_free(self._handle)
            self._handle = None
