"""The drafter a :class:`~edgespec.config.SpecConfig` names: :func:`make_drafter`.

Owns nothing that lasts: it puts together a source of drafts (the draft model, the n-gram
lookup, or the two as a hybrid), each with its own length policy (the cost model's, or the
spec's pinned length), from what the caller hands it. The runtime
(:mod:`edgespec.engine.drafting`) calls it once per lane and kind of sampling.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..config import DrafterKind, SpecConfig
from ..lm import LanguageModel
from .base import Drafter, LengthPolicy
from .costs import Costs
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .policy import AdaptiveLength, FixedLength
from .reduced_head import ReducedHead


def make_drafter(spec: SpecConfig, *, costs: Optional[Costs], k_max: int,
                 draft_model: Optional[LanguageModel] = None, eog: frozenset[int] = frozenset(),
                 head: Optional[ReducedHead] = None, cross=None,
                 joint: Optional[Callable] = None,
                 index: Optional[Callable] = None,
                 donor: Optional[LanguageModel] = None) -> Optional[Drafter]:
    """The drafter ``spec`` names, each source with its own length policy: the cost model over
    ``costs`` (drafts of at most ``k_max``), or the spec's fixed K when it pins one. ``costs``
    may be None only for a fixed K. None for ``drafter="none"``. ``cross``: a draft model of
    another vocabulary (see :class:`~.model.ModelDrafter`). ``joint``: the draft model's
    lengths are planned with other streams' (:attr:`~.policy.AdaptiveLength.joint`).
    ``index``: the suffix index of earlier requests the n-gram drafts also read, as of the
    current generation (a callable: None when it has none). ``donor``: the target's cache,
    whose cells the draft model's may take (:class:`~.reading.Reading`)."""
    fixed = not spec.is_adaptive

    def policy(c: Optional[Costs], planned: Optional[Callable] = None) -> LengthPolicy:
        if fixed:
            return FixedLength(spec.fixed_k, spec.p_min)
        # Beside other streams a round's seconds are the batch's: costs are learned whole
        return AdaptiveLength(c, k_max=k_max, learns_costs=joint is None, joint=planned)

    def model_drafter() -> ModelDrafter:
        assert draft_model is not None, f"the {spec.drafter} drafter needs a draft model"
        return ModelDrafter(draft_model, eog, policy(costs, joint), head, cross, donor=donor)

    if spec.drafter is DrafterKind.MODEL:
        return model_drafter()
    if spec.drafter is DrafterKind.NGRAM:         # (costs were measured with free drafts)
        return NgramDrafter(policy(costs), index=index)
    if spec.drafter is DrafterKind.HYBRID:
        return HybridDrafter(model_drafter(),
                             NgramDrafter(policy(costs.free() if costs is not None else None),
                                          index=index))
    return None
