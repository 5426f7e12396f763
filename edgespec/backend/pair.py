"""A target and its draft opened as one step: each model with its own settings, the pair
check, and both closed again when either fails."""

from __future__ import annotations

from typing import Callable, Optional

from ..config import ModelConfig
from .remote import open_model
from .vocab import check_compatible


def open_pair(target: ModelConfig, draft: Optional[ModelConfig], *,
              draft_tap_min_vocab: Optional[int] = None,
              progress: Callable[[str], None] = lambda s: None) -> tuple:
    """(target model, draft model or None), the draft checked to share the target's
    tokenizer (:class:`~edgespec.errors.IncompatiblePairError` names the first difference).
    ``draft_tap_min_vocab``: see :class:`~edgespec.backend.LlamaModel`."""
    progress(f"loading the target {target.path.name}…")
    t_model = open_model(target)
    try:
        if draft is None:
            return t_model, None
        progress(f"loading the draft {draft.path.name}…")
        d_model = open_model(draft, tap_min_vocab=draft_tap_min_vocab)
        try:
            check_compatible(t_model, d_model)
        except BaseException:
            d_model.close()
            raise
        return t_model, d_model
    except BaseException:
        t_model.close()
        raise
