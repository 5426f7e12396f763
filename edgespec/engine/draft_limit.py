"""The longest drafts an Engine may verify: :func:`with_draft_max`.

Owns the check of a new ``draft_max`` against what the Engine was loaded with: it must
draft at all, and its target verifies at most ``n_outputs_max - 1`` drafts per pass (its
logits buffer was sized at load). Offers the settings with the new length, or an
:class:`~edgespec.errors.InvalidParameterError` saying why not and how to load for it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..config import SpecConfig
from ..errors import InvalidParameterError


def with_draft_max(spec: SpecConfig, draft_max: Optional[int], limit: int) -> SpecConfig:
    """``spec`` with ``draft_max`` (see :meth:`edgespec.engine.engine.Engine.set_draft_max`),
    for a target that verifies at most ``limit`` drafts per pass."""
    if not spec.drafts:
        raise InvalidParameterError("draft_max", draft_max,
                                    "unused: this Engine has no drafter (load it with a "
                                    "draft model or drafter='ngram')")
    new = replace(spec, draft_max=draft_max)
    if new.most_drafts > limit:
        raise InvalidParameterError(
            "draft_max", draft_max, f"at most {limit} for this Engine (its target was "
            f"loaded to verify {limit} drafts per pass; load it with draft_max="
            f"{draft_max} for longer drafts)", options=("draft_max",))
    return new
