"""The names ``edgespec serve`` answers to: the catalogue of models on this disk (re-read at
most every ``CATALOG_TTL`` seconds, and again when a name is not found), the aliases given at
start, and the names added while serving (Ollama's ``/api/pull`` of a hub file, ``/api/copy``).
:class:`ModelNames` is what :class:`~edgespec.server.models.ModelManager` resolves a request's
``model`` with; it loads nothing.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Mapping, Optional

from .. import paths
from ..catalogue import CatalogEntry, ModelNotFound, find_entry, tagless

CATALOG_TTL = 2.0            # seconds a scan of the disk is reused


class ModelNames:
    """``catalog``: returns every model on disk; ``aliases``: extra names for its names.
    ``default``: the name a request without ``model`` means."""

    def __init__(self, catalog: Callable[[], dict[str, CatalogEntry]],
                 aliases: Mapping[str, str] = {}):
        self._scan = catalog
        self._aliases = dict(aliases)
        self._copies: set[str] = set()                  # aliases listed as models
        self._added: dict[str, CatalogEntry] = {}       # entries not on the catalogue
        self._catalog: dict[str, CatalogEntry] = {}
        self._scanned_at = -math.inf
        self.default: Optional[str] = None

    # -- names ----------------------------------------------------------------------------

    def _entries(self, fresh: bool = False) -> dict[str, CatalogEntry]:
        now = time.monotonic()
        if fresh or now - self._scanned_at > CATALOG_TTL:
            self._catalog = {**self._scan(), **{n: e for n, e in self._added.items()
                                                 if e.target.is_file()}}
            self._scanned_at = now
        return self._catalog

    def listing(self) -> list[CatalogEntry]:
        """Every model on disk, by name (the disk re-scanned at most every ``CATALOG_TTL``
        seconds), and the copies :meth:`add_alias` made, under their own names."""
        entries = self._entries()
        copies = [dataclasses.replace(e, name=alias) for alias in self._copies
                  if (e := find_entry(entries, self._aliases[alias])) is not None]
        return sorted([*entries.values(), *copies], key=lambda e: e.name)

    def _asked(self, name: Optional[str]) -> str:
        """The name a request means: the default for none, an alias's model ("" if none)."""
        asked = name or self.default or ""
        return self._aliases.get(asked, self._aliases.get(tagless(asked), asked))

    def resolve(self, name: Optional[str]) -> CatalogEntry:
        """The catalog entry a request's ``model`` names: ``None`` or ``""`` is the default,
        an alias its model, else :func:`find_entry`. Raises :class:`ModelNotFound`; never
        answers with another model."""
        asked = self._asked(name)
        if not asked:
            raise self._not_found("")
        for fresh in (False, True):       # a miss re-scans: the file may have just arrived
            entry = find_entry(self._entries(fresh), asked)
            if entry is not None:
                return entry
        raise self._not_found(asked)

    def _not_found(self, name: str) -> ModelNotFound:
        return ModelNotFound(name, [e.name for e in self.listing()], paths.models_dir())

    # -- names added while serving (Ollama's /api/pull and /api/copy) ---------------------

    def rescan(self) -> None:
        """Read the disk again at the next look (a pull or a delete just changed it)."""
        self._scanned_at = -math.inf

    def add_entry(self, entry: CatalogEntry) -> None:
        """Serve ``entry``, a file the catalogue does not list (a hub file pulled by its
        repository and name), under its name until the server stops or :meth:`forget`."""
        self._added[entry.name] = entry
        self.rescan()

    def add_alias(self, alias: str, name: str) -> None:
        """Answer requests naming ``alias`` with the model ``name`` names, and list it under
        ``alias`` (Ollama's copy), until the server stops or :meth:`forget`."""
        self._aliases[tagless(alias)] = name
        self._copies.add(tagless(alias))

    def forget(self, name: str) -> bool:
        """Stop serving a name :meth:`add_entry` or :meth:`add_alias` added (the files stay);
        False when ``name`` is neither."""
        bare = tagless(name)
        if bare in self._copies:
            self._copies.discard(bare)
            del self._aliases[bare]
            return True
        if self._added.pop(name, None) is None and self._added.pop(bare, None) is None:
            return False
        self.rescan()
        return True

    def is_copy(self, name: str) -> bool:
        return tagless(name) in self._copies
