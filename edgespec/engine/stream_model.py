"""A stream's view of a model: :class:`StreamModel`, the model every generation of an Engine
decodes on, alone or beside others (the model protocol's passes and cache; the thread count and
step hooks stay the backend model's).

Its cache is one sequence of the model's context (``tokens``, ``truncate``, the prompt cache's
``save_state``/``restore_state`` act on that sequence alone); its passes (``eval``,
``eval_hidden``) wait in the Engine's :class:`~edgespec.engine.rounds.Rounds` and go in one
``llama_decode`` with the other streams'. Everything else (the vocabulary, the text of a
token, the settings, the threads) is the model's. The decoding loop, the drafters and the
prompt cache cannot tell a view from a model: nothing above :mod:`edgespec.backend` sees a
sequence id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from .rounds import Member, Rounds

# Prompt tokens a stream evaluates per pass while others decode: a long prompt arriving never
# holds the others' next tokens up for more than a pass of this many rows (docs/decisions.md).
PREFILL_CHUNK = 128


class StreamModel:
    """Sequence ``seq`` of backend ``model``, its passes batched by ``rounds`` as ``member``'s
    (see the module docstring)."""

    def __init__(self, model, seq, rounds: "Rounds", member: "Member"):
        self.model, self.seq, self.rounds, self.member = model, seq, rounds, member
        self._last: Optional[np.ndarray] = None     # the row of a pass the tap could not stop

    # -- the cache: this sequence's --------------------------------------------------------

    @property
    def tokens(self) -> list[int]:
        return self.seq.tokens

    def truncate(self, n: int) -> None:
        self.seq.truncate(n)

    def checkpoint(self) -> None:
        self.seq.checkpoint()

    @property
    def rollback_seconds(self) -> float:
        return self.seq.rollback_seconds

    def save_state(self, buffer=None):
        return self.seq.save_state(buffer)

    def restore_state(self, state) -> None:
        self.seq.restore_state(state)

    @property
    def state_owner(self):
        """Whose saved states this view can restore: the model's (any of its sequences)."""
        return self.model

    # -- passes: batched with the other streams' --------------------------------------------

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """This stream's part of the round's pass: ``tokens`` join the other running
        streams' parts in one ``llama_decode`` (a batch of their rows together), so this call
        blocks until that pass has run, and returns this part's last ``n_logits`` rows of
        the batch's logits, ``(n_logits, n_vocab)`` (:meth:`Rounds.eval_part
        <edgespec.engine.rounds.Rounds.eval_part>`)."""
        return self.rounds.eval_part(self.member, self.model, self.seq, tokens, n_logits)

    def eval_hidden(self, tokens: Sequence[int]) -> Optional[np.ndarray]:
        hidden, self._last = self.rounds.eval_hidden_part(self.member, self.model, self.seq,
                                                          tokens)
        return hidden

    def last_logits(self) -> np.ndarray:
        return self._last

    @property
    def n_batch(self) -> int:
        """Most tokens of one pass: a chunk while other streams decode beside this one."""
        return self.model.n_batch if self.rounds.size <= 1 else \
            min(self.model.n_batch, PREFILL_CHUNK)

    # -- the model's -----------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    @property
    def n_outputs_max(self) -> int:
        return self.model.n_outputs_max

    @property
    def vocab(self):
        return self.model.vocab

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def path(self):
        return self.model.path

    @property
    def config(self):
        return self.model.config

    @property
    def n_threads(self) -> int:
        return self.model.n_threads

    @property
    def decode_seconds(self) -> float:
        return self.model.decode_seconds

    @property
    def can_tap(self) -> bool:
        return self.model.can_tap

    def token_bytes(self, token: int) -> bytes:
        return self.model.token_bytes(token)

    def token_text(self, token: int) -> bytes:
        return self.model.token_text(token)

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        return self.model.tokenize(text, add_special, parse_special)

    def output_rows(self, ids: Sequence[int]) -> np.ndarray:
        return self.model.output_rows(ids)
