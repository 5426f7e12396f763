"""A target and its draft opened as one step: each model with its own settings, the pair
check (a shared tokenizer, or a map between two vocabularies), and both closed again when
either fails."""

from __future__ import annotations

from typing import Callable, Optional

from ..config import ModelConfig
from ..lm import LoadedModel
from .remote import open_model
from .vocab_map import check_pair


def open_pair(target: ModelConfig, draft: Optional[ModelConfig], *,
              draft_tap_min_vocab: Optional[int] = None,
              progress: Callable[[str], None] = lambda s: None) -> tuple:
    """(target model, draft model or None, vocabulary map or None): the draft shares the
    target's tokenizer (no map), or enough of its tokens to draft across the two vocabularies
    (:func:`~edgespec.backend.vocab_map.check_pair`; progress is told so); else
    :class:`~edgespec.errors.IncompatiblePairError` names the difference.
    ``draft_tap_min_vocab``: see :class:`~edgespec.backend.LlamaModel`."""
    progress(f"loading the target {target.path.name}…")
    t_model = open_model(target)
    try:
        if draft is None:
            return t_model, None, None
        progress(f"loading the draft {draft.path.name}…")
        d_model = open_model(draft, tap_min_vocab=draft_tap_min_vocab)
        try:
            vmap = check_pair(t_model, d_model)
        except BaseException:
            d_model.close()
            raise
        if vmap is not None:
            progress(f"{vmap.describe()} ({vmap.difference})")
        return t_model, d_model, vmap
    except BaseException:
        t_model.close()
        raise


def same_network(target: LoadedModel, draft: LoadedModel) -> bool:
    """Whether ``draft`` is ``target``'s network at another precision (a quantisation of the
    same file, as ``edgespec pair derive`` and both registry pairs make): the same
    architecture, hyperparameters, tokenizer size and tensors (names and shapes; their types
    may differ). Then the draft's KV cache can take the target's cells for a context
    (``llama_state_seq_set_data`` checks the layers' row sizes again): what the target read
    need not be read a second time (edgespec.drafting.reading). Whether the weights are the
    same network's is not checked, only their shapes: KV cells of another fine-tune of the
    same shapes would make the draft's proposals worse, never an answer different."""
    a, b = target.info, draft.info
    if not a.architecture or a.architecture != b.architecture:
        return False
    prefix = a.architecture + "."
    hyper = {k for k in (*a.metadata, *b.metadata) if k.startswith(prefix)}
    if any(a.metadata.get(k) != b.metadata.get(k) for k in hyper) or a.n_vocab != b.n_vocab:
        return False
    return {n: t[0] for n, t in a.tensors.items()} == {n: t[0] for n, t in b.tensors.items()}
