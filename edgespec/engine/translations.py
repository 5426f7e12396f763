"""A draft of another vocabulary, lane by lane: :class:`LaneTranslations`.

Owns one :class:`~edgespec.drafting.cross_vocab.Translation` per lane (each follows its lane's
conversation), made on first use from the map between the two vocabularies. Offers a lane's
translation for its drafters (:meth:`LaneTranslations.of`), a context in the tokens the lane's
draft cache holds (:meth:`LaneTranslations.draft_tokens`), and a line on the draft's vocabulary
(:meth:`LaneTranslations.describe`). For a draft that shares the target's tokenizer it holds
nothing and every context is the target's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from ..drafting.cross_vocab import Translation
from ..lm import LoadedModel

if TYPE_CHECKING:
    from ..backend import VocabMap
    from .lanes import Lane


def translation_for(target: LoadedModel, draft: Optional[LoadedModel],
                    vmap: Optional["VocabMap"]) -> Optional[tuple[Translation, np.ndarray]]:
    """What a drafter of another vocabulary needs (:mod:`edgespec.drafting.cross_vocab`): the
    context in the draft's tokens, and the draft's ids to the target's; None for a draft that
    shares the target's tokenizer (``vmap`` None)."""
    if vmap is None or draft is None:
        return None
    t_vocab, d_info = target.vocabulary, draft.vocab

    def tokenize(raw: bytes) -> list[int]:
        return draft.tokenize(raw, add_special=False, parse_special=False) if raw else []
    bos = (target.vocab.bos, [d_info.bos] if d_info.add_bos and d_info.bos >= 0 else [])
    translation = Translation(vmap.to_draft, lambda t: t_vocab.piece(t, special=True),
                              tokenize, bos)
    return translation, vmap.to_target


class LaneTranslations:
    """The translations of ``draft``'s lanes into ``target``'s vocabulary through ``vmap``
    (None: the draft shares the target's tokenizer, or there is no draft)."""

    def __init__(self, target: LoadedModel, draft: Optional[LoadedModel],
                 vmap: Optional["VocabMap"]):
        self.target, self.draft, self._vmap = target, draft, vmap
        self._share = vmap.share if vmap is not None else None
        self._by_lane: dict[int, Optional[tuple]] = {}

    def of(self, lane: "Lane") -> Optional[tuple]:
        """The translation of ``lane`` (a draft of another vocabulary), or None."""
        if lane.index not in self._by_lane:
            self._by_lane[lane.index] = translation_for(self.target, self.draft, self._vmap)
        return self._by_lane[lane.index]

    def draft_tokens(self, lane: "Lane", context: list[int]) -> list[int]:
        """``context`` (target tokens) as ``lane``'s draft cache holds it."""
        cross = self.of(lane)
        return context if cross is None else list(cross[0].tokens(context))

    def describe(self) -> Optional[str]:
        """The draft's vocabulary, for ``Engine.info`` (None: no draft)."""
        return (None if self.draft is None else "shared" if self._share is None
                else f"mapped: {self._share} of its tokens are the target's")
