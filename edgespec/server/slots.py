"""What the model manager keeps per model, and the budget its models must fit.

A :class:`Slot` is one model loaded or being loaded (its leases, keep-alive and memory
estimate); a :class:`Lease` is a request's hold on one; :class:`LoadedInfo` is what
``/api/ps`` shows of it. :class:`Budget` decides what fits: at most ``max_loaded`` models,
their memory estimates within ``max_ram``, and which idle models to unload for one more.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

from ..catalogue import CatalogEntry, ModelKind
from ..errors import EdgespecError, MemoryBudgetError

if TYPE_CHECKING:
    from ..engine.engine import Engine


@dataclass(frozen=True)
class Lease:
    """A loaded model held for one request (see :meth:`ModelManager.acquire`)."""

    name: str
    entry: CatalogEntry
    engine: Engine
    load_seconds: float          # waited for its load; 0 when it was loaded already


@dataclass(frozen=True)
class LoadedInfo:
    """A loaded model, for Ollama's ``/api/ps``. ``size``: its memory estimate
    (:meth:`CatalogEntry.memory`); ``loaded_at``/``expires_at``: epoch seconds; ``expires_at``
    is None while a request uses it or when its keep-alive is for ever; ``in_use``: leases
    held; ``n_ctx``: the context it was loaded with."""

    name: str
    entry: CatalogEntry
    size: int
    loaded_at: float
    expires_at: Optional[float]
    in_use: int
    n_ctx: int
    draft_choice: Optional[dict] = None     # the draft chosen for it here, and why


class Slot:
    """One model loaded or being loaded."""

    def __init__(self, entry: CatalogEntry, size: int, keep_alive: float):
        self.entry = entry
        self.size = size                        # memory estimate (files + KV caches)
        self.engine: Optional[Engine] = None  # None while loading
        self.error: Optional[BaseException] = None   # why the load failed
        self.leases = 0
        self.keep_alive = keep_alive
        self.loaded_at = time.time()
        self.last_used = time.monotonic()
        self.deadline: Optional[float] = None   # monotonic; None: in use, or kept for ever
        self.retiring = False                   # unload() asked: no new leases

    @property
    def idle(self) -> bool:
        return self.engine is not None and self.leases == 0

    def release(self) -> None:
        """A request's lease ends: the keep-alive starts when it was the last."""
        self.leases -= 1
        self.last_used = time.monotonic()
        if self.leases == 0 and self.keep_alive >= 0:
            self.deadline = self.last_used + self.keep_alive


class Budget:
    """At most ``max_loaded`` models at once, their memory estimates adding up to at most
    ``max_ram`` bytes (None: no limit), each model's with the KV caches of ``parallel``
    whole contexts (``--parallel``; the streams beyond them share those)."""

    def __init__(self, max_loaded: int = 1, max_ram: Optional[int] = None, parallel: int = 1):
        if max_loaded < 1:
            raise EdgespecError(f"max_loaded={max_loaded} is invalid: at least one model must "
                                "fit")
        if max_ram is not None and max_ram <= 0:
            raise EdgespecError(f"max_ram={max_ram} is invalid: give a positive number of "
                                "bytes, or None for no limit")
        self.max_loaded, self.max_ram, self.parallel = max_loaded, max_ram, parallel

    def memory(self, entry: CatalogEntry, n_ctx: int) -> int:
        """What ``entry`` takes loaded with ``n_ctx`` tokens for each of its ``parallel``
        whole contexts (an Engine's KV caches hold ``parallel``; an embedding model's, one)."""
        return entry.memory(n_ctx * (1 if entry.kind is ModelKind.EMBEDDING else self.parallel))

    def check(self, name: str, need: int) -> None:
        """Refuse a model that alone needs more than ``max_ram`` (:class:`~edgespec.errors.
        MemoryBudgetError`)."""
        if self.max_ram is not None and need > self.max_ram:
            raise MemoryBudgetError(f"the model '{name}' needs about {gb(need)} (files and "
                                    f"KV cache), more than --max-ram {gb(self.max_ram)} "
                                    "allows: raise --max-ram or pick a smaller model")

    def victims(self, slots: Iterable[Slot], closing: Iterable[Slot], need: int,
                embedding: bool = False) -> Optional[list[Slot]]:
        """Idle models among ``slots`` to unload, least recently used first, so that a model
        taking ``need`` bytes fits beside them and the ``closing`` ones; None when models in
        use (or loading, or closing) must finish first. ``embedding``: the model is an
        embedding model. Embedding models and generative ones are counted apart against
        ``max_loaded`` (a retrieval app embeds, then chats: one of each stays loaded), their
        memory together against ``max_ram``."""
        slots = list(slots)
        held = slots + list(closing)

        def alike(s: Slot) -> bool:
            return (s.entry.kind is ModelKind.EMBEDDING) == embedding
        count, ram = sum(map(alike, held)), sum(s.size for s in held)
        idle = sorted((s for s in slots if s.idle), key=lambda s: (not alike(s), s.last_used))
        victims = []
        while count >= self.max_loaded or (self.max_ram is not None
                                           and ram + need > self.max_ram):
            if not idle:
                return None
            v = idle.pop(0)
            if count < self.max_loaded or alike(v):
                victims.append(v)
                count, ram = count - alike(v), ram - v.size
            else:       # only memory can make room now, and this one is of the other kind
                return None
        return victims


def resident_bytes() -> int:
    """This process's resident memory (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n < 10e9 else f"{n / 1e9:.0f} GB"
