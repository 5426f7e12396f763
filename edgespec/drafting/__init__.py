"""Where draft tokens come from, and how many to try: the drafting contract and its drafters.

- :mod:`.base` — :class:`Draft` and the :class:`Drafter` protocol the loop relies on
- :mod:`.policy` — draft-length policies: :class:`FixedLength`, :class:`AdaptiveLength`
- :mod:`.costs` — what drafting and verifying cost: :class:`Costs`, calibration, its cache
- :mod:`.model`, :mod:`.ngram`, :mod:`.hybrid` — the three drafters
- :mod:`.reduced_head` — the draft model's output layer over a subset of the vocabulary
"""

from __future__ import annotations

from typing import Optional

from ..config import SpecConfig
from ..lm import LanguageModel
from .base import Draft, Drafter
from .costs import Costs, calibrate, calibrate_cached
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .policy import AdaptiveLength, FixedLength, LengthPolicy
from .reduced_head import HEAD_MIN_VOCAB, ReducedHead

__all__ = ["Draft", "Drafter", "Costs", "calibrate", "calibrate_cached", "HybridDrafter",
           "ModelDrafter", "NgramDrafter", "AdaptiveLength", "FixedLength", "LengthPolicy",
           "HEAD_MIN_VOCAB", "ReducedHead", "make_drafter"]


def make_drafter(spec: SpecConfig, *, costs: Optional[Costs], k_max: int, pinned: bool = False,
                 draft_model: Optional[LanguageModel] = None, eog: frozenset[int] = frozenset(),
                 head: Optional[ReducedHead] = None) -> Optional[Drafter]:
    """The drafter ``spec`` names, each source with its own length policy: the cost model over
    ``costs`` (drafts of at most ``k_max``), or the spec's fixed K when the spec or ``pinned``
    asks for one. ``costs`` may be None only for a fixed K. None for ``drafter="none"``."""
    fixed = pinned or not spec.is_adaptive

    def policy(c: Optional[Costs]) -> LengthPolicy:
        return FixedLength(spec.fixed_k, spec.p_min) if fixed else AdaptiveLength(c, k_max=k_max)

    def model_drafter() -> ModelDrafter:
        assert draft_model is not None, f"the {spec.drafter} drafter needs a draft model"
        return ModelDrafter(draft_model, eog, policy(costs), head)

    if spec.drafter == "model":
        return model_drafter()
    if spec.drafter == "ngram":         # (costs were measured with free drafts)
        return NgramDrafter(policy(costs))
    if spec.drafter == "hybrid":
        return HybridDrafter(model_drafter(),
                             NgramDrafter(policy(costs.free() if costs is not None else None)))
    return None
