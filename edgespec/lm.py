"""The small language-model protocol that the decoding loop and the drafters are written
against.

:class:`edgespec.backend.LlamaModel` implements it over llama.cpp; the tests' pure-numpy
Markov model implements it too, so the loop, the verifier and the drafters can be exercised
(and imported) without llama.cpp.

A model owns one KV cache and keeps ``tokens``, the exact token sequence it holds (position
``i`` holds ``tokens[i]``): :meth:`LanguageModel.eval` appends, :meth:`LanguageModel.truncate`
removes a suffix, :meth:`LanguageModel.checkpoint` marks a length that a later truncation may
come back to (what a recurrent model needs to go back at all cheaply). Logits rows are
float32 arrays of ``n_vocab`` entries, valid until the next ``eval`` on the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from .config import ModelConfig
    from .gguf_file import GGUFInfo

_VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2"}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n and a[:n] == b[:n]:
        return n
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


@dataclass(frozen=True)
class VocabInfo:
    """Tokenizer facts the pair check and the decoding loop need."""

    n_vocab: int
    vocab_type: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool
    eog: frozenset[int]       # every end-of-generation token
    # fill-in-the-middle: (prefix, suffix, middle) token ids; None: the model has none
    fim: Optional[tuple[int, int, int]] = None

    @property
    def type_name(self) -> str:
        return _VOCAB_TYPES.get(self.vocab_type, str(self.vocab_type))


class LanguageModel(Protocol):
    """What the loop and the drafters need of a model."""

    tokens: list[int]         # what the KV cache holds
    vocab: VocabInfo
    n_vocab: int
    n_ctx: int                # most positions the cache holds
    n_batch: int              # most tokens one eval() call sends at once
    n_outputs_max: int        # most logits rows one eval() call returns
    # Seconds spent going back in the cache so far (a recurrent model's copies, restores and
    # tokens evaluated again, inside eval and truncate; 0 where dropping positions is free).
    rollback_seconds: float

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` to the cache; logits of the last ``n_logits`` of them,
        shape ``(n_logits, n_vocab)``."""

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` cache positions."""

    def checkpoint(self) -> None:
        """Keep a cheap way back to the cache as it is now: a later ``truncate`` to this
        length or more then costs little. A model whose cache drops positions at no cost
        (attention only) does nothing; a recurrent or hybrid one copies its running state
        before its next pass (:mod:`edgespec.backend.rollback`)."""


class SavedState(Protocol):
    """A model's cache contents copied aside (:meth:`StatefulModel.save_state`)."""

    tokens: tuple             # the tokens the cache held
    nbytes: int               # host memory the copy takes


class StatefulModel(LanguageModel, Protocol):
    """A model whose cache contents can be copied aside and back, bit for bit (the prompt
    cache, :mod:`edgespec.prompt_cache`)."""

    path: Path
    # Whose states this cache can take: the model itself, or for a stream's view of one
    # sequence of a context, that context's model (any of its sequences' states).
    state_owner: object

    def save_state(self, buffer: Optional[Callable[[int], np.ndarray]] = None) -> SavedState:
        """A copy of what the cache holds now; in ``buffer(size)``, a scratch array of at
        least ``size`` bytes that its caller reuses, when given and the model can (a copy
        restored at once), else in new memory."""

    def restore_state(self, state: SavedState) -> None:
        """Make the cache hold ``state`` (from :meth:`save_state` on a model of the same
        ``state_owner``) instead of what it holds."""


class LoadedModel(StatefulModel, Protocol):
    """A model as the Engine's rooms use it (:mod:`edgespec.engine.generation`,
    :mod:`edgespec.engine.threads`, calibration, the prompt cache): a loaded GGUF with its settings,
    text and timing. :class:`~edgespec.backend.LlamaModel` and
    :class:`~edgespec.backend.RemoteModel` are."""

    config: "ModelConfig"
    info: "GGUFInfo"          # what the file says of itself (read before llama.cpp loads it)
    can_tap: bool             # whether its last hidden state can be read (eval_hidden)
    n_threads: int            # CPU threads of the next pass
    decode_seconds: float     # wall time inside llama_decode, cumulative
    # Told each pass's token count, logits rows and seconds; returns the next thread count
    # (edgespec.engine.threads owns both hooks; None: no one is told).
    on_step: Optional[Callable[[int, int, float], int]]
    before_step: Optional[Callable[[], int]]

    def set_threads(self, n: int) -> None:
        """Run the next passes on ``n`` CPU threads."""

    def set_step_hooks(self, on_step: Optional[Callable[[int, int, float], int]],
                       before_step: Optional[Callable[[], int]]) -> None:
        """Set both hooks (:class:`~edgespec.backend.step_hooks.StepHooks`)."""

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        """Tokens of ``text``."""

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` contributes to the output (control tokens: none)."""

    def token_text(self, token: int) -> bytes:
        """The raw vocabulary entry of ``token``."""


class HiddenStateModel(LanguageModel, Protocol):
    """A model whose last hidden state can be read instead of its logits (for a draft's
    reduced output layer, :mod:`edgespec.drafting.reduced_head`)."""

    path: Path

    def eval_hidden(self, tokens: Sequence[int]) -> Optional[np.ndarray]:
        """Like ``eval(tokens, 1)`` but return the last token's final hidden state, skipping
        the output layer; None when it could not be read (:meth:`last_logits` then holds
        the row)."""

    def last_logits(self) -> np.ndarray:
        """The logits row of the last evaluated token."""

    def output_rows(self, ids: Sequence[int]) -> np.ndarray:
        """Rows ``ids`` of the output layer's weights, float32, ``(len(ids), n_embd)``."""

    def token_text(self, token: int) -> bytes:
        """The raw vocabulary entry of ``token``."""
