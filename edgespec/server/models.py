"""Models on demand for ``edgespec serve``: every model on this disk, and the ones loaded now.

:func:`scan_catalog` lists what a request may name: each registry pair whose two files are
here (by the pair's name), each ``*.gguf`` file in the models folder (by its file name without
``.gguf``), each registry model pulled alone into the hub cache (by its registry name), and the
models the server was started with (:func:`entry_for`). Reading a file's header is cached by
path, size and modification time, so a re-scan costs a directory listing and a few ``stat``
calls.

:class:`ModelManager` loads the model a request names, on demand, and unloads models the way
Ollama does: a model stays loaded ``keep_alive`` seconds after its last request ends (negative:
for ever; 0: unloaded at once), and loading one more model first unloads idle ones, least
recently used first, while ``max_loaded`` models are loaded or their memory would pass
``max_ram``. A model that a request is using is never unloaded under it: the load waits for
the request to end. Loading and closing Engines run in worker threads, so the event loop (and
requests for models already loaded) never waits for llama.cpp; requests naming a model that
is being loaded wait for that one load. A name that is not on this machine is an error
(:class:`ModelNotFound`), never another model's answer.

The manager belongs to one event loop (it is not thread-safe; the Engines it hands out are:
their generations take turns). Its background task, which unloads expired models, runs on
asyncio (uvicorn's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Callable, Mapping, Optional, Sequence, Union

import anyio

from .. import paths
from ..errors import (EdgespecError, EngineClosedError, MemoryBudgetError, ModelLoadError,
                      ModelNotFoundError)
from ..gguf_file import check_causal_lm, read_gguf
from ..registry import model_path, registry
from ..registry.pairs import is_present

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger(__name__)

CATALOG_TTL = 2.0            # seconds a scan of the disk is reused
DEFAULT_KEEP_ALIVE = 300.0   # Ollama's default: five minutes
KV_BYTES_PER_VALUE = 2       # llama.cpp's KV cache holds f16 values by default
MAX_NAMES_SHOWN = 20         # in a ModelNotFound message
MAX_HEADERS_KEPT = 256       # GGUF headers cached between scans

# llama.cpp's llama_ftype (general.file_type) -> the name Ollama shows as quantization_level
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}


# ---------------------------------------------------------------------------------------------
# The catalog


@dataclass(frozen=True)
class CatalogEntry:
    """One model a request may name.

    ``kind``: ``"pair"`` (a registry pair: ``draft`` is its draft) or ``"gguf"`` (one file;
    ``draft`` None unless the server was started with one). ``size``: bytes on disk, target
    and draft. ``modified``: the target file's mtime (epoch seconds). ``details``: Ollama's
    ``details`` object (``format``, ``family``, ``families``, ``parameter_size``,
    ``quantization_level``), read from the target's GGUF header. ``digest``: a sha256 of the
    name, paths, size and mtime, stable while the files are unchanged; it is NOT a hash of the
    files' bytes (hashing gigabytes on every listing would take minutes).
    ``kv_bytes_per_token``: what one token of context costs in the KV caches of the target and
    the draft (0 when the headers do not say).
    """

    name: str
    target: Path
    draft: Optional[Path]
    kind: str
    size: int
    modified: float
    details: dict
    digest: str
    kv_bytes_per_token: int = 0

    def memory(self, n_ctx: int) -> int:
        """The memory this model takes loaded with a context of ``n_ctx`` tokens: its files
        (mapped whole) plus the KV caches at f16. An upper bound: it counts every layer's
        cache at full length, including sliding-window layers."""
        return self.size + self.kv_bytes_per_token * n_ctx


@dataclass(frozen=True)
class _Header:
    """What a catalog needs from one GGUF header."""

    family: str
    parameter_size: str
    quantization_level: str
    kv_bytes_per_token: int


def _count(n: float) -> str:
    """``134_515_008`` -> ``'135M'``, ``1.71e9`` -> ``'1.7B'`` (as Ollama shows sizes)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}" if unit == "B" else f"{n / scale:.0f}{unit}"
    return str(int(n))


def _kv_bytes_per_token(metadata: Mapping[str, object], arch: str) -> int:
    """n_layer × n_head_kv × (key + value head dims) × 2 bytes, from the header; 0 if unknown.
    A per-layer head count (an array) counts as the query head count: an upper bound."""
    def number(key: str) -> int:
        v = metadata.get(f"{arch}.{key}")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0
    n_layer, n_head, n_embd = (number("block_count"), number("attention.head_count"),
                               number("embedding_length"))
    if not (n_layer and n_head and n_embd):
        return 0
    n_head_kv = number("attention.head_count_kv") or n_head
    k = number("attention.key_length") or n_embd // n_head
    v = number("attention.value_length") or n_embd // n_head
    return n_layer * n_head_kv * (k + v) * KV_BYTES_PER_VALUE


def _parse_header(path: Path) -> _Header:
    """What the catalog shows of ``path``; raises :class:`EdgespecError` for a file that is
    not a usable GGUF model."""
    info = read_gguf(path)
    check_causal_lm(info)
    md = info.metadata
    label = md.get("general.size_label")
    if not (isinstance(label, str) and label):
        label = _count(sum(math.prod(dims) for dims, *_ in info.tensors.values()))
    ftype = md.get("general.file_type")
    quant = FILE_TYPES.get(ftype, f"type {ftype}") if isinstance(ftype, int) else "unknown"
    return _Header(info.architecture, label, quant,
                   _kv_bytes_per_token(md, info.architecture))


# Headers read, by (path, size, mtime_ns): a re-scan reads only new or changed files.
_HEADERS: dict[tuple[str, int, int], _Header] = {}


def _read_header(path: Path) -> tuple[_Header, int, float]:
    """(header, bytes, mtime) of ``path``; raises :class:`EdgespecError` when unusable."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelLoadError(path, "no such file") from None
    except OSError as e:
        raise ModelLoadError(path, f"cannot read it ({e.strerror or e})") from None
    key = (str(path), st.st_size, st.st_mtime_ns)    # a changed file is read again
    header = _HEADERS.get(key)
    if header is None:
        header = _parse_header(path)
        if len(_HEADERS) >= MAX_HEADERS_KEPT:
            _HEADERS.clear()
        _HEADERS[key] = header
    return header, st.st_size, st.st_mtime


def entry_for(name: str, target: Union[str, Path], draft: Union[str, Path, None] = None,
              kind: Optional[str] = None) -> CatalogEntry:
    """The catalog entry of ``target`` (and ``draft``) under ``name``: how the server names the
    model it was started with. ``kind`` defaults to ``"pair"`` with a draft, else ``"gguf"``.

    Raises :class:`EdgespecError` (a :class:`~edgespec.errors.ModelLoadError`) when a file is
    missing or not a usable GGUF model."""
    t = Path(target).expanduser()
    d = Path(draft).expanduser() if draft is not None else None
    header, size, mtime = _read_header(t)
    kv = header.kv_bytes_per_token
    if d is not None:
        d_header, d_size, _ = _read_header(d)
        size += d_size
        kv += d_header.kv_bytes_per_token
    details = {"format": "gguf", "family": header.family,
               "families": [header.family] if header.family else None,
               "parameter_size": header.parameter_size,
               "quantization_level": header.quantization_level}
    digest = hashlib.sha256("\0".join((name, str(t), str(d or ""), str(size), repr(mtime))
                                      ).encode()).hexdigest()
    return CatalogEntry(name, t, d, kind or ("pair" if d is not None else "gguf"), size, mtime,
                        details, digest, kv)


@functools.lru_cache(maxsize=256)
def _warn_once(message: str) -> None:
    """Log ``message`` the first time only (a bad file is reported once, not every scan)."""
    log.warning(message)


def _scanned(name: str, target: Path, draft: Optional[Path], kind: str
             ) -> Optional[CatalogEntry]:
    try:
        return entry_for(name, target, draft, kind)
    except EdgespecError as e:
        _warn_once(f"model {name!r} left out of the list: {e}")
        return None


def scan_catalog(models_dir: Optional[Path] = None, extra: Sequence[CatalogEntry] = ()
                 ) -> dict[str, CatalogEntry]:
    """Every model on this disk, by the name a request uses (see the module docstring).

    ``models_dir``: the folder whose ``*.gguf`` files are listed (default
    ``paths.models_dir()``); registry models are found where the registry keeps them. Files
    being written (``*.gguf.partial``, hub ``*.incomplete`` blobs) and hidden files are not
    listed; a file that is not a readable GGUF model is left out with one logged warning.
    ``extra`` entries (the model the server was started with) are added last and win a clash.
    """
    folder = Path(models_dir) if models_dir is not None else paths.models_dir()
    found: dict[str, CatalogEntry] = {}
    reg = registry()
    for pair in reg.pairs.values():
        if is_present(pair.target) and is_present(pair.draft):
            entry = _scanned(pair.name, model_path(pair.target), model_path(pair.draft),
                             "pair")
            if entry is not None:
                found[pair.name] = entry
    files = sorted(p for p in folder.glob("*.gguf") if not p.name.startswith("."))
    for path in files:
        name = path.name[:-len(".gguf")]
        if name not in found and path.is_file():
            entry = _scanned(name, path, None, "gguf")
            if entry is not None:
                found[name] = entry
    for model in reg.models.values():   # hub models pulled alone live outside the folder
        if model.kind == "hub" and model.name not in found and is_present(model.name):
            entry = _scanned(model.name, model_path(model.name), None, "gguf")
            if entry is not None:
                found[model.name] = entry
    for entry in extra:
        found[entry.name] = entry
    return found


def _tagless(name: str) -> str:
    """Ollama's ``name:latest`` is ``name``."""
    return name[:-len(":latest")] if name.endswith(":latest") else name


def find_entry(catalog: Mapping[str, CatalogEntry], name: str) -> Optional[CatalogEntry]:
    """The entry ``name`` means, or None: the name itself, or with Ollama's ``:latest`` tag;
    a registry model's name, for its file in the models folder; else a case-insensitive match
    when exactly one entry matches."""
    for n in (name, _tagless(name)):
        if n in catalog:
            return catalog[n]
    bare = _tagless(name)
    model = registry().models.get(bare)
    if model is not None:
        entry = catalog.get(Path(model.file).stem)
        if entry is not None and entry.target.name == model.file:
            return entry
    folded = [e for n, e in catalog.items() if n.lower() == bare.lower()]
    return folded[0] if len(folded) == 1 else None


class ModelNotFound(ModelNotFoundError):
    """A request named a model that is not on this machine (or named none, with no default).
    ``name``: the name asked for ("" when none was)."""

    def __init__(self, name: str, available: Sequence[str], models_folder: Path):
        self.name = name
        shown = ", ".join(available[:MAX_NAMES_SHOWN])
        if len(available) > MAX_NAMES_SHOWN:
            shown += f" (and {len(available) - MAX_NAMES_SHOWN} more)"
        here = (f"the models here are: {shown}" if available
                else "there are no models here yet")
        if not name:
            super().__init__(f"the request names no model and this server has no default: "
                             f"send \"model\"; {here}")
            return
        bare = _tagless(name)
        reg = registry()
        if bare in reg.pairs or bare in reg.models:
            fix = f"`edgespec pull {bare}` downloads it"
        else:
            fix = (f"put its GGUF file in {models_folder}, or `edgespec pairs` lists the pairs "
                   "that `edgespec pull NAME` downloads")
        super().__init__(f"the model '{name}' is not on this machine: {fix}; {here}")


# ---------------------------------------------------------------------------------------------
# The manager


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


class _Slot:
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


class ModelManager:
    """Loads the models requests name and unloads them when idle (see the module docstring).

    ``catalog``: returns every model on disk (:func:`scan_catalog`, usually with the server's
    own model as ``extra``); it is called at most every ``CATALOG_TTL`` seconds, and again
    when a name is not found. ``load``: builds an Engine for an entry (run in a worker
    thread). ``default``: the model a request without ``model`` gets (default: the
    ``preloaded`` one). ``max_loaded``: how many models may be loaded at once; ``max_ram``:
    bytes their memory estimates may add up to (None: no limit). ``keep_alive``: seconds an
    idle model stays loaded when a request does not say (negative: for ever; 0: unloaded at
    once). ``aliases``: extra names for catalog names. ``n_ctx``: the context the loads use,
    for the memory estimate of a model not loaded yet (default: the last loaded Engine's).
    ``preloaded``: ``(name, engine)`` already loaded (the server's startup model); it is
    kept ``keep_alive`` seconds from now unless a request uses it.
    """

    def __init__(self, catalog: Callable[[], dict[str, CatalogEntry]],
                 load: Callable[[CatalogEntry], Engine], *, default: Optional[str] = None,
                 max_loaded: int = 1, max_ram: Optional[int] = None,
                 keep_alive: float = DEFAULT_KEEP_ALIVE, aliases: Mapping[str, str] = {},
                 n_ctx: Optional[int] = None,
                 preloaded: Optional[tuple[str, Engine]] = None):
        if max_loaded < 1:
            raise EdgespecError(f"max_loaded={max_loaded} is invalid: at least one model must "
                                "fit")
        if max_ram is not None and max_ram <= 0:
            raise EdgespecError(f"max_ram={max_ram} is invalid: give a positive number of "
                                "bytes, or None for no limit")
        self._scan = catalog
        self._load = load
        self.max_loaded = max_loaded
        self.max_ram = max_ram
        self.keep_alive = keep_alive
        self._aliases = dict(aliases)
        self._n_ctx = n_ctx or 0
        self._catalog: dict[str, CatalogEntry] = {}
        self._scanned_at = -math.inf
        self._slots: dict[str, _Slot] = {}
        self._closing: list[_Slot] = []          # unloaded, memory not freed yet
        self._changed: Optional[anyio.Event] = None
        # the task that unloads expired models, and the scope that stops it
        self._reaper: Optional[tuple[asyncio.Task, anyio.CancelScope]] = None
        self._closed = False
        self.default = default
        if preloaded is not None:
            name, engine = preloaded
            entry = self.resolve(name)
            slot = _Slot(entry, entry.memory(engine.n_ctx), keep_alive)
            slot.engine = engine
            slot.deadline = slot.last_used + keep_alive if keep_alive >= 0 else None
            self._slots[entry.name] = slot
            self._n_ctx = self._n_ctx or engine.n_ctx
            if default is None:
                self.default = entry.name

    # -- names ----------------------------------------------------------------------------

    def _entries(self, fresh: bool = False) -> dict[str, CatalogEntry]:
        now = time.monotonic()
        if fresh or now - self._scanned_at > CATALOG_TTL:
            self._catalog = self._scan()
            self._scanned_at = now
        return self._catalog

    def listing(self) -> list[CatalogEntry]:
        """Every model on disk, by name (the disk re-scanned at most every ``CATALOG_TTL``
        seconds)."""
        return sorted(self._entries().values(), key=lambda e: e.name)

    def _asked(self, name: Optional[str]) -> str:
        """The name a request means: the default for none, an alias's model ("" if none)."""
        asked = name or self.default or ""
        return self._aliases.get(asked, self._aliases.get(_tagless(asked), asked))

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

    # -- what is loaded -------------------------------------------------------------------

    def loaded(self) -> list[LoadedInfo]:
        """The models loaded now (not those still loading), most recently used first."""
        now, wall = time.monotonic(), time.time()
        slots = sorted(self._slots.values(), key=lambda s: -s.last_used)
        return [LoadedInfo(s.entry.name, s.entry, s.size, s.loaded_at,
                           None if s.leases or s.deadline is None
                           else wall + max(0.0, s.deadline - now), s.leases, s.engine.n_ctx)
                for s in slots if s.engine is not None]

    def _loaded_slot(self, name: Optional[str]) -> Optional[_Slot]:
        """The slot (loaded or loading) of the model ``name`` means, or None."""
        entry = find_entry({n: s.entry for n, s in self._slots.items()}, self._asked(name))
        return self._slots[entry.name] if entry is not None else None

    def engine_for(self, name: Optional[str]) -> Optional[Engine]:
        """The Engine of model ``name`` (None: the default) if it is loaded now, else None;
        never loads anything (for ``/health`` and metrics)."""
        slot = self._loaded_slot(name)
        return slot.engine if slot is not None else None

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
    async def acquire(self, name: Optional[str], keep_alive: Optional[float] = None
                      ) -> AsyncIterator[Lease]:
        """``async with manager.acquire(name) as lease:`` the model ``name`` names
        (:meth:`resolve`), loaded first if it is not, held until the block ends.

        ``keep_alive``: seconds the model stays loaded after this request (Ollama's
        ``keep_alive``; None: the manager's). Raises :class:`ModelNotFound`, the load's
        error (every request waiting for that load gets it), a
        :class:`~edgespec.errors.MemoryBudgetError` when the model alone needs more than
        ``max_ram``, and
        :class:`~edgespec.errors.EngineClosedError` after :meth:`close`. Holding a lease
        while acquiring another model can wait for ever when only one fits.
        """
        self._check_open()
        entry = self.resolve(name)
        self._start_reaper()
        slot, seconds = await self._lease(entry)
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

    async def _lease(self, entry: CatalogEntry) -> tuple[_Slot, float]:
        """A lease on ``entry``'s slot (its count raised), loading it first if need be."""
        need = entry.memory(self._n_ctx)
        if self.max_ram is not None and need > self.max_ram:
            raise MemoryBudgetError(f"the model '{entry.name}' needs about {_gb(need)} (files "
                                    f"and KV cache), more than --max-ram {_gb(self.max_ram)} "
                                    "allows: raise --max-ram or pick a smaller model")
        t0 = time.monotonic()
        awaited: Optional[_Slot] = None   # a load this request waits for
        while True:
            self._check_open()
            if awaited is not None and awaited.error is not None:
                raise awaited.error
            slot = self._slots.get(entry.name)
            if slot is not None:
                if slot.engine is not None and not slot.retiring:
                    slot.leases += 1
                    slot.deadline = None
                    return slot, time.monotonic() - t0 if awaited is slot else 0.0
                awaited = slot if slot.engine is None else None
                await self._wait()
                continue
            victims = self._victims(need)
            if victims is None:
                await self._wait()        # until a lease ends or a load finishes
                continue
            if victims:
                for v in victims:
                    log.info("unloading %s to make room for %s", v.entry.name, entry.name)
                await self._retire(victims)
                continue                  # the state may have changed while closing
            return await self._load_into(entry, need)

    def _victims(self, need: int) -> Optional[list[_Slot]]:
        """Idle models to unload, least recently used first, so that a model taking ``need``
        bytes fits; None when models in use (or loading, or closing) must finish first."""
        held = list(self._slots.values()) + self._closing
        count, ram = len(held), sum(s.size for s in held)
        idle = sorted((s for s in self._slots.values() if s.idle), key=lambda s: s.last_used)
        victims = []
        while count >= self.max_loaded or (self.max_ram is not None
                                           and ram + need > self.max_ram):
            if not idle:
                return None
            v = idle.pop(0)
            victims.append(v)
            count, ram = count - 1, ram - v.size
        return victims

    def _load_measured(self, entry: CatalogEntry) -> tuple[Engine, int]:
        """The Engine for ``entry``, and how much this process's resident memory grew while
        it loaded (0 where that cannot be read)."""
        before = _resident_bytes()
        engine = self._load(entry)
        return engine, max(0, _resident_bytes() - before)

    async def _load_into(self, entry: CatalogEntry, need: int) -> tuple[_Slot, float]:
        """Load ``entry`` into a new slot (registered first, so that concurrent requests wait
        for this load and budgets count it) and take the first lease on it."""
        slot = _Slot(entry, need, self.keep_alive)
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
            if self._slots.get(entry.name) is slot:
                del self._slots[entry.name]
            self._notify()
            log.error("loading %s failed: %s", entry.name, e)
            raise
        seconds = time.monotonic() - t0
        slot.engine = engine
        # what the load took, when it took more than the files and KV caches (llama.cpp's
        # extra CPU buffer types hold a repacked copy of the weights beside the mapped file)
        slot.size = max(entry.memory(engine.n_ctx), grown)
        self._n_ctx = engine.n_ctx
        slot.loaded_at = time.time()
        slot.leases = 1
        log.info("loaded %s in %.1f s", entry.name, seconds)
        self._notify()
        return slot, seconds

    # -- unloading ------------------------------------------------------------------------

    async def _retire(self, slots: Sequence[_Slot]) -> None:
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


def _resident_bytes() -> int:
    """This process's resident memory (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n < 10e9 else f"{n / 1e9:.0f} GB"
