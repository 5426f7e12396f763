"""What the listings (OpenAI's ``/v1/models``, Ollama's ``/api/tags`` and ``/api/show``) say of
a model beyond its files: the context it is served with, its chat template, whether it thinks,
which other app's store holds it. A loaded model answers for itself; one not loaded answers
from its GGUF header (:class:`~edgespec.catalogue.CatalogEntry`) and the context it would be
loaded with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..catalogue import CatalogEntry
from ..chat_template import LABELS

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from .models import ModelManager


def contexts(manager: ModelManager, entry: CatalogEntry) -> tuple[int, Optional[int]]:
    """The contexts of ``entry``'s target and draft (None: it drafts without a draft model):
    as loaded now, or as a request that asks for none would load them."""
    n_ctx = manager.context_for(entry.name)
    engine = manager.engine_for(entry.name)
    if entry.kind == "embedding":       # (an Embedder: no draft)
        return n_ctx, None
    if engine is not None:
        return n_ctx, engine.draft.n_ctx if engine.draft is not None else None
    return n_ctx, n_ctx if entry.draft is not None else None


def template_label(entry: CatalogEntry, engine: Optional[Engine]) -> str:
    """What renders the model's chat messages (:attr:`~edgespec.chat_template.ChatTemplate.
    label`): ``"none (plain text)"`` for a model whose file has no chat template."""
    if engine is not None and entry.kind != "embedding":
        return engine.template.label
    return LABELS["model" if entry.has_template else "plain"]


def fills_middle(entry: CatalogEntry, engine: Optional[Engine]) -> bool:
    """Whether the model fills in the middle (its vocabulary has FIM tokens: Ollama's
    ``insert`` capability, the ``suffix`` of /api/generate and /v1/completions)."""
    if entry.kind == "embedding":
        return False
    if engine is not None:
        return engine.target.vocab.fim is not None
    from ..backend import file_fim
    return file_fim(entry.target) is not None


def thinks(entry: CatalogEntry, engine: Optional[Engine]) -> bool:
    """Whether the model's chat template has a thinking mode (:mod:`edgespec.thinking`)."""
    if engine is None or entry.kind == "embedding":      # (an Embedder: no template)
        return entry.thinks
    return engine.template.thinking is not None


def where(entry: CatalogEntry) -> dict:
    """Where a model of another app's store lives: ``store`` (``ollama``, ``lmstudio``, …) and
    ``path`` (the file itself); {} for edgespec's own models."""
    store = getattr(entry, "store", "")         # (any object with a CatalogEntry's fields)
    return {"store": store, "path": str(entry.target)} if store else {}
