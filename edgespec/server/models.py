"""Models on demand for ``edgespec serve``: the models loaded now, from the catalogue of
every model on this disk (:mod:`edgespec.catalogue`).

:class:`ModelManager` loads the model a request names, on demand, and unloads models the way
Ollama does: a model stays loaded ``keep_alive`` seconds after its last request ends (negative:
for ever; 0: unloaded at once), and loading one more model first unloads idle ones, least
recently used first, while ``max_loaded`` models are loaded or their memory would pass
``max_ram``. A model that a request is using is never unloaded under it: the load waits for
the request to end. Loading and closing Engines run in worker threads, so the event loop (and
requests for models already loaded) never waits for llama.cpp; requests naming a model that
is being loaded wait for that one load. A name that is not on this machine is an error
(:class:`~edgespec.catalogue.ModelNotFound`), never another model's answer. A request may ask
for a context (``num_ctx``): :mod:`.contexts` decides which context a model is loaded with,
and a model loaded with less is reloaded once its requests end (never for less).

The manager belongs to one event loop (it is not thread-safe; the Engines it hands out are:
their generations take turns). Its background task, which unloads expired models, runs on
asyncio (uvicorn's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, AsyncIterator, Callable, Mapping, Optional, Sequence

import anyio

from ..catalogue import CatalogEntry, ModelKind, ModelNotFound, find_entry
from ..errors import EngineClosedError
from .contexts import ContextPolicy
from .names import ModelNames
from .slots import Budget, Lease, LoadedInfo, Slot, resident_bytes

if TYPE_CHECKING:
    from ..engine.engine import Engine

log = logging.getLogger(__name__)

DEFAULT_KEEP_ALIVE = 300.0   # Ollama's default: five minutes



class ModelManager(ModelNames):
    """Loads the models requests name and unloads them when idle (see the module docstring).

    ``catalog``: returns every model on disk (:func:`scan_catalog`, usually with the server's
    own model as ``extra``); it is called at most every ``CATALOG_TTL`` seconds, and again
    when a name is not found. ``load(entry, n_ctx)``: builds an Engine for an entry with a
    context of ``n_ctx`` tokens (None: the loader's own; run in a worker thread).
    ``default``: the model a request without ``model`` gets (default: the
    ``preloaded`` one). ``max_loaded``: how many models may be loaded at once; ``max_ram``:
    bytes their memory estimates may add up to (None: no limit). ``keep_alive``: seconds an
    idle model stays loaded when a request does not say (negative: for ever; 0: unloaded at
    once). ``aliases``: extra names for catalog names. ``n_ctx``: the context the loads use
    unless a request asks for more (default: the ``preloaded`` Engine's); ``max_ctx``: the
    most a request may have (None: each model's trained context; :mod:`.contexts`);
    ``auto_ctx``: each model's default context is its own (:func:`.contexts.auto_context`),
    not ``n_ctx``.
    ``preloaded``: ``(name, engine)`` already loaded (the server's startup model); it is
    kept ``keep_alive`` seconds from now unless a request uses it.
    """

    def __init__(self, catalog: Callable[[], dict[str, CatalogEntry]],
                 load: Callable[[CatalogEntry, Optional[int]], Engine], *,
                 default: Optional[str] = None, max_loaded: int = 1,
                 max_ram: Optional[int] = None, keep_alive: float = DEFAULT_KEEP_ALIVE,
                 aliases: Mapping[str, str] = {}, n_ctx: Optional[int] = None,
                 max_ctx: Optional[int] = None, parallel: int = 1,
                 preloaded: Optional[tuple[str, Engine]] = None, auto_ctx: bool = False):
        super().__init__(catalog, aliases)
        self.budget = Budget(max_loaded, max_ram, parallel)
        self._load = load
        self.keep_alive = keep_alive
        self.contexts = ContextPolicy(n_ctx or 0, self.budget, max_ctx, auto=auto_ctx)
        self._slots: dict[str, Slot] = {}
        self._closing: list[Slot] = []          # unloaded, memory not freed yet
        self._changed: Optional[anyio.Event] = None
        # the task that unloads expired models, and the scope that stops it
        self._reaper: Optional[tuple[asyncio.Task, anyio.CancelScope]] = None
        self._closed = False
        self.default = default
        if preloaded is not None:
            name, engine = preloaded
            entry = self.resolve(name)
            slot = Slot(entry, self.budget.memory(entry, engine.n_ctx), keep_alive)
            slot.engine = engine
            slot.deadline = slot.last_used + keep_alive if keep_alive >= 0 else None
            self._slots[entry.name] = slot
            self.contexts.default = self.contexts.default or engine.n_ctx
            if default is None:
                self.default = entry.name

    # -- what is loaded -------------------------------------------------------------------

    def loaded(self) -> list[LoadedInfo]:
        """The models loaded now (not those still loading), most recently used first."""
        now, wall = time.monotonic(), time.time()
        slots = sorted(self._slots.values(), key=lambda s: -s.last_used)
        return [LoadedInfo(s.entry.name, s.entry, s.size, s.loaded_at,
                           None if s.leases or s.deadline is None
                           else wall + max(0.0, s.deadline - now), s.leases, s.engine.n_ctx,
                           _described(getattr(s.engine, "draft_choice", None)))
                for s in slots if s.engine is not None]

    def _loaded_slot(self, name: Optional[str]) -> Optional[Slot]:
        """The slot (loaded or loading) of the model ``name`` means, or None."""
        entry = find_entry({n: s.entry for n, s in self._slots.items()}, self._asked(name))
        return self._slots[entry.name] if entry is not None else None

    def engine_for(self, name: Optional[str]) -> Optional[Engine]:
        """The Engine of model ``name`` (None: the default) if it is loaded now, else None;
        never loads anything (for ``/health`` and metrics)."""
        slot = self._loaded_slot(name)
        return slot.engine if slot is not None else None

    def context_for(self, name: Optional[str], n_ctx: Optional[int] = None) -> int:
        """The context a request for model ``name`` asking for ``n_ctx`` tokens (None: any)
        is served with: the loaded model's when it serves it, else the one it would be loaded
        with (a name not on disk: the default). Never loads anything."""
        try:
            entry = self.resolve(name)
        except ModelNotFound:
            return max(self.contexts.default, n_ctx or 0)
        n_ctx = self.contexts.clamp(entry, n_ctx)
        slot = self._slots.get(entry.name)
        if slot is not None and slot.engine is not None and not slot.retiring \
                and self.contexts.serves(slot.engine.n_ctx, n_ctx):
            return slot.engine.n_ctx
        return max(self.contexts.load_context(entry), n_ctx or 0)

    # -- waiting for changes --------------------------------------------------------------

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait(self) -> None:
        """Until the next change of state (a load, a lease ending, an unload)."""
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    # -- acquiring ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def acquire(self, name: Optional[str], keep_alive: Optional[float] = None,
                      n_ctx: Optional[int] = None) -> AsyncIterator[Lease]:
        """``async with manager.acquire(name) as lease:`` the model ``name`` names
        (:meth:`resolve`), loaded first if it is not, held until the block ends.

        ``keep_alive``: seconds the model stays loaded after this request (Ollama's
        ``keep_alive``; None: the manager's). ``n_ctx``: the context the request needs (None:
        any); a model loaded with less is reloaded first (:mod:`.contexts`). Raises
        :class:`ModelNotFound`, :class:`~edgespec.errors.InvalidParameterError` for a context
        over the model's limits, the load's error (every request waiting for that load gets
        it), a :class:`~edgespec.errors.MemoryBudgetError` when the model alone needs more
        than ``max_ram``, and
        :class:`~edgespec.errors.EngineClosedError` after :meth:`close`. Holding a lease
        while acquiring another model can wait for ever when only one fits.
        """
        self._check_open()
        entry = self.resolve(name)
        n_ctx = self.contexts.ask(entry, n_ctx)
        self._start_reaper()
        slot, seconds = await self._lease(entry, n_ctx)
        slot.keep_alive = self.keep_alive if keep_alive is None else keep_alive
        try:
            assert slot.engine is not None
            yield Lease(entry.name, slot.entry, slot.engine, seconds)
        finally:
            slot.release()
            self._notify()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the server is shutting down: its models are closed")

    async def _lease(self, entry: CatalogEntry, n_ctx: Optional[int]) -> tuple[Slot, float]:
        """A lease on ``entry``'s slot (its count raised) that serves a context of ``n_ctx``,
        loading (or reloading) it first if need be."""
        need = self.budget.memory(entry, self.contexts.load_context(entry))
        self.budget.check(entry.name, need)
        t0 = time.monotonic()
        awaited: Optional[Slot] = None   # a load this request waits for
        while True:
            self._check_open()
            if awaited is not None and awaited.error is not None:
                raise awaited.error
            slot = self._slots.get(entry.name)
            if slot is not None:
                if slot.engine is not None and not slot.retiring:
                    if self.contexts.serves(slot.engine.n_ctx, n_ctx):
                        slot.leases += 1
                        slot.deadline = None
                        return slot, time.monotonic() - t0 if awaited is slot else 0.0
                    log.info("reloading %s with a context of %d tokens once its requests end",
                             entry.name, self.contexts.load_context(entry))
                    slot.retiring = True          # no new leases: they wait for the reload
                if slot.retiring and slot.idle:
                    await self._retire([slot])
                    continue
                awaited = slot if slot.engine is None else None
                await self._wait()
                continue
            need = self.budget.memory(entry, self.contexts.load_context(entry))
            victims = self.budget.victims(self._slots.values(), self._closing, need,
                                          embedding=entry.kind is ModelKind.EMBEDDING)
            if victims is None:
                await self._wait()        # until a lease ends or a load finishes
                continue
            if victims:
                for v in victims:
                    log.info("unloading %s to make room for %s", v.entry.name, entry.name)
                await self._retire(victims)
                continue                  # the state may have changed while closing
            return await self._load_into(entry, need)

    def _load_measured(self, entry: CatalogEntry) -> tuple[Engine, int]:
        """The Engine for ``entry`` with its context (:mod:`.contexts`), and how much this
        process's resident memory grew while it loaded (0 where that cannot be read)."""
        before = resident_bytes()
        engine = self._load(entry, self.contexts.load_context(entry) or None)
        return engine, max(0, resident_bytes() - before)

    async def _load_into(self, entry: CatalogEntry, need: int) -> tuple[Slot, float]:
        """Load ``entry`` into a new slot (registered first, so that concurrent requests wait
        for this load and budgets count it) and take the first lease on it."""
        slot = Slot(entry, need, self.keep_alive)
        self._slots[entry.name] = slot
        t0 = time.monotonic()
        log.info("loading %s", entry.name)
        try:
            # Shielded: a request that goes away does not abandon a half-loaded Engine;
            # whoever else waits for it gets it.
            with anyio.CancelScope(shield=True):
                engine, grown = await anyio.to_thread.run_sync(self._load_measured, entry)
        except BaseException as e:
            slot.error = e
            self.contexts.failed(entry)
            if self._slots.get(entry.name) is slot:
                del self._slots[entry.name]
            self._notify()
            log.error("loading %s failed: %s", entry.name, e)
            raise
        seconds = time.monotonic() - t0
        slot.engine = engine
        # what the load took, when it took more than the files and KV caches (llama.cpp's
        # extra CPU buffer types hold a repacked copy of the weights beside the mapped file)
        slot.size = max(self.budget.memory(entry, engine.n_ctx), grown)
        slot.loaded_at = time.time()
        slot.leases = 1
        log.info("loaded %s in %.1f s", entry.name, seconds)
        self._notify()
        return slot, seconds

    # -- unloading ------------------------------------------------------------------------

    async def _retire(self, slots: Sequence[Slot]) -> None:
        """Unload ``slots`` (loaded ones): out of the table now, their Engines closed in a
        worker thread (shielded: an unload once begun finishes); their memory counts against
        the budget until then."""
        for s in slots:
            if self._slots.get(s.entry.name) is s:
                del self._slots[s.entry.name]
            s.retiring = True
            self._closing.append(s)
        try:
            with anyio.CancelScope(shield=True):
                for s in slots:
                    assert s.engine is not None
                    try:
                        await anyio.to_thread.run_sync(s.engine.close)
                    except Exception:
                        log.exception("closing %s failed", s.entry.name)
        finally:
            for s in slots:
                self._closing.remove(s)
            self._notify()

    async def unload(self, name: Optional[str]) -> bool:
        """Unload model ``name`` (Ollama's ``keep_alive: 0`` without a prompt) once the
        requests using it end; new requests for it wait and load it again. False when it was
        not loaded."""
        slot = self._loaded_slot(name)
        if slot is None:
            return False
        slot.retiring = True
        self._notify()
        while self._slots.get(slot.entry.name) is slot:
            if slot.idle:
                log.info("unloading %s (asked)", slot.entry.name)
                await self._retire([slot])
                break
            await self._wait()
        return slot.error is None

    def _start_reaper(self) -> None:
        if self._reaper is None:
            scope = anyio.CancelScope()
            self._reaper = asyncio.get_running_loop().create_task(self._reap(scope)), scope

    async def _reap(self, scope: anyio.CancelScope) -> None:
        """Unload idle models whose keep-alive has run out, until :meth:`close` cancels it
        (through its cancel scope, which lets an unload in progress finish)."""
        with scope:
            while True:
                now = time.monotonic()
                expired = [s for s in self._slots.values() if s.idle and s.deadline is not None
                           and s.deadline <= now]
                if expired:
                    for s in expired:
                        log.info("unloading %s (idle for %g s)", s.entry.name, s.keep_alive)
                    await self._retire(expired)
                    continue
                deadlines = [s.deadline for s in self._slots.values()
                             if s.idle and s.deadline is not None]
                with anyio.move_on_after(min(deadlines) - now if deadlines else None):
                    await self._wait()

    async def close(self) -> None:
        """Stop unloading on a timer, wait for loads in progress, and close every Engine
        (their generations are cancelled). Afterwards :meth:`acquire` raises
        :class:`~edgespec.errors.EngineClosedError`."""
        self._closed = True
        self._notify()
        if self._reaper is not None:
            task, scope = self._reaper
            scope.cancel()
            await task
        while any(s.engine is None for s in self._slots.values()):
            await self._wait()
        await self._retire(list(self._slots.values()))


def _described(choice) -> Optional[dict]:
    """A draft chosen for a model here (an Engine's ``draft_choice``), as the listings say it."""
    return choice.describe() if choice is not None else None
