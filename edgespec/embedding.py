"""Embeddings: texts in, one unit vector per text out, for the retrieval apps that embed their
documents and a question and hand the nearest documents to a chat model.

:class:`Embedder` embeds with one model: an embedding model's own GGUF
(:meth:`Embedder.load`: all-MiniLM, nomic-embed-text, bge, …, pooled as the file declares),
or a generative model an Engine holds (:meth:`Engine.embed <edgespec.engine.engine.Engine.embed>`:
its last hidden states mean-pooled, on a llama.cpp context of their own, so the Engine's
generations and caches are untouched). An embedding model is not loaded as an Engine: it
cannot generate, so it has no use for what an Engine is (a chat template, a draft, the cost
model's calibration), and an Embedder loads it without any of them.

Each input is a text (tokenized with the model's special tokens: BERT's ``[CLS] … [SEP]``)
or a list of token ids (embedded as given). One longer than the model embeds (its context,
:attr:`Embedder.n_ctx`) is cut to its first tokens, its closing special token kept, with
``truncate=True`` (Ollama's default), or refused (:class:`~edgespec.errors.InputTooLongError`)
with ``truncate=False``. Vectors are L2-normalised unless ``normalize=False``; ``dimensions``
keeps the first components and normalises again, as Ollama does (meaningful for models
trained for it, Matryoshka style: nomic-embed-text-v1.5, mxbai-embed-large; a GGUF does not
declare it, so it is the caller's choice).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np

from . import config
from .backend.embedding import EmbeddingModel
from .config import ModelConfig, default_threads
from .errors import BackendError, EngineClosedError, InputTooLongError, InvalidParameterError
from .lm import VocabInfo

Inputs = Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]]]
_INPUTS = "a text, a list of texts, a list of token ids, or a list of such lists"


@dataclass(frozen=True)
class Embeddings:
    """What :meth:`Embedder.embed` returns: ``vectors``, ``(inputs, dimensions)`` float32, in
    the order of the inputs; ``token_counts``, the tokens embedded of each input (after
    truncation); ``seconds``, the wall time of the call."""

    vectors: np.ndarray
    token_counts: tuple[int, ...]
    seconds: float

    @property
    def prompt_tokens(self) -> int:
        """Every token embedded (OpenAI's ``usage.prompt_tokens``)."""
        return sum(self.token_counts)

    def tolist(self) -> list[list[float]]:
        return self.vectors.tolist()

    def __len__(self) -> int:
        return len(self.vectors)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_ids(v) -> bool:
    return isinstance(v, (list, tuple)) and all(_is_int(t) for t in v)


def as_inputs(inputs: Inputs) -> list[Union[str, list[int]]]:
    """``inputs`` as a list of texts and token-id lists (a bare string or id list is one
    input). Raises :class:`~edgespec.errors.InvalidParameterError` for any other shape."""
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, (list, tuple)):
        if inputs and all(_is_int(t) for t in inputs):
            return [[int(t) for t in inputs]]
        if all(isinstance(v, str) or _is_ids(v) and v for v in inputs):
            return [v if isinstance(v, str) else [int(t) for t in v] for v in inputs]
    raise InvalidParameterError("inputs", _short(inputs), _INPUTS)


def _short(value) -> object:
    text = repr(value)
    return value if len(text) <= 60 else text[:57] + "..."


def fit(tokens: list[int], limit: int, truncate: bool, index: int, vocab: VocabInfo
        ) -> list[int]:
    """``tokens`` within ``limit``: as they are, their first ones (the closing special token
    the tokenizer added kept last), or :class:`~edgespec.errors.InputTooLongError`."""
    if len(tokens) <= limit:
        return tokens
    if not truncate:
        raise InputTooLongError(index, len(tokens), limit)
    if vocab.add_eos and tokens[-1] == vocab.eos:
        return tokens[:limit - 1] + tokens[-1:]
    return tokens[:limit]


def check_dimensions(dimensions: Optional[int], n_embd: int) -> None:
    """Refuse a ``dimensions`` that is neither None nor in [1, ``n_embd``]."""
    if dimensions is not None and (not _is_int(dimensions) or not 1 <= dimensions <= n_embd):
        raise InvalidParameterError("dimensions", dimensions,
                                    f"None or an integer in [1, {n_embd}] for this model")


def shape(vectors: np.ndarray, dimensions: Optional[int], normalize: bool) -> np.ndarray:
    """``vectors`` cut to their first ``dimensions`` components (None: all) and L2-normalised
    (``normalize``)."""
    if dimensions is not None:
        check_dimensions(dimensions, vectors.shape[1])
        vectors = vectors[:, :dimensions]
    if not np.isfinite(vectors).all():
        raise BackendError("the model produced a vector with NaN or infinite values")
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype=np.float32)


class Embedder:
    """Embeds texts with one model (see the module docstring). Build one with :meth:`load`
    (an embedding model's file) or :meth:`sharing` (the weights of a model loaded for
    generation). Any thread may call it; calls take turns. ``close()`` frees it."""

    def __init__(self, open_model: Callable[[], EmbeddingModel], path: Path):
        """``open_model``: makes the llama.cpp context, on first use."""
        self._open_model = open_model
        self._model: Optional[EmbeddingModel] = None
        self.path = Path(path)
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def load(cls, path: Union[str, Path], *, n_ctx: int = config.N_CTX,
             n_threads: Optional[int] = None, n_gpu_layers: int = -1, verbose: bool = False,
             cpu_extra_buffers: str = "auto") -> "Embedder":
        """Load the embedding model in ``path`` (a GGUF: BERT, nomic-bert, …, or a generative
        model, mean-pooled). ``n_ctx``: the most tokens of one input (at most the model's
        trained context). Raises :class:`~edgespec.errors.ModelLoadError` for a file that
        cannot embed (an adapter, a reranker, …)."""
        model = EmbeddingModel.load(ModelConfig(
            path, n_ctx=n_ctx, n_threads=n_threads or default_threads(),
            n_gpu_layers=n_gpu_layers, verbose=verbose, cpu_extra_buffers=cpu_extra_buffers))
        embedder = cls(lambda: model, model.path)
        embedder._model = model
        return embedder

    @classmethod
    def sharing(cls, model) -> "Embedder":
        """An Embedder on the weights of ``model`` (a loaded ``LlamaModel``), whose context is
        made on first use; close it before ``model``."""
        return cls(lambda: EmbeddingModel.sharing(model), model.path)

    def _backend(self) -> EmbeddingModel:
        with self._lock:
            if self._closed:
                raise EngineClosedError(f"the embedder of {self.path.name} is closed")
            if self._model is None:
                self._model = self._open_model()
            return self._model

    @property
    def n_ctx(self) -> int:
        """The most tokens of one input."""
        return self._backend().n_ctx

    @property
    def n_embd(self) -> int:
        """The length of a vector (before ``dimensions``)."""
        return self._backend().n_embd

    @property
    def pooling(self) -> str:
        """How tokens are pooled: "mean", "cls" or "last"."""
        return self._backend().pooling

    def embed(self, inputs: Inputs, *, truncate: bool = True,
              dimensions: Optional[int] = None, normalize: bool = True) -> Embeddings:
        """One vector per input (see the module docstring): several inputs share a pass.
        Raises :class:`~edgespec.errors.InvalidParameterError` for an input that is empty or
        holds token ids outside the vocabulary, and
        :class:`~edgespec.errors.InputTooLongError` for one too long with
        ``truncate=False``."""
        t0 = time.perf_counter()
        for name, value in (("truncate", truncate), ("normalize", normalize)):
            if not isinstance(value, bool):
                raise InvalidParameterError(name, value, "True or False")
        items = as_inputs(inputs)
        model = self._backend()
        check_dimensions(dimensions, model.n_embd)
        vocab = model.vocabulary.info
        tokens = [fit(self._tokens(model, item, i), model.n_ctx, truncate, i, vocab)
                  for i, item in enumerate(items)]
        vectors = model.embed(tokens) if tokens else np.empty((0, model.n_embd), np.float32)
        return Embeddings(shape(vectors, dimensions, normalize), tuple(map(len, tokens)),
                          time.perf_counter() - t0)

    @staticmethod
    def _tokens(model: EmbeddingModel, item: Union[str, list[int]], index: int) -> list[int]:
        n_vocab = model.vocabulary.info.n_vocab
        if isinstance(item, str):
            tokens = model.tokenize(item, add_special=True, parse_special=False)
            if not tokens:
                raise InvalidParameterError(f"inputs[{index}]", item, "a text with at least "
                                            "one token")
            return tokens
        bad = next((t for t in item if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise InvalidParameterError(f"inputs[{index}]", bad, f"token ids in [0, "
                                        f"{n_vocab - 1}] for this model")
        return item

    def close(self) -> None:
        """Free the context (and the model, when :meth:`load` loaded it). Safe twice; later
        calls raise :class:`~edgespec.errors.EngineClosedError`."""
        with self._lock:
            self._closed = True
            model, self._model = self._model, None
        if model is not None:
            model.close()

    def __enter__(self) -> "Embedder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
