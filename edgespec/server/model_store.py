"""What Ollama's model endpoints change on disk: pulls (``/api/pull``) run in a worker thread
with their progress as Ollama's status objects, and deletions (``/api/delete``). No HTTP
stack: the routes are :mod:`.ollama.model_routes`.

A name to pull is what ``edgespec pull`` takes: a registry pair or model (Ollama's
``name:latest`` is ``name``), or a hub file ``REPO_ID/FILENAME[@REVISION]``. It is fetched the
way ``edgespec pull`` fetches it (:mod:`edgespec.registry`): into the hub cache or the models
folder, each file written under a temporary name and given its own only once whole and its
sha256 checked, a pair's tokenizers checked. Files already fetched stay, so a pull stopped
half-way (its client went away: the transfer stops at its next chunk, and the partial
transfer is deleted) continues from them the next time.

A name to delete is what ``edgespec rm`` takes: a registry pair, model or embedding model (its
files), a hub file ``REPO_ID/FILENAME``, or a GGUF file of the models folder by its name (with
or without ``.gguf``); files elsewhere are never removed. Every name may end with Ollama's
``:latest``, as ``/api/tags`` lists it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Optional

from .. import paths
from ..catalogue import CatalogEntry, entry_for, own_file, tagless
from ..errors import EdgespecError, ModelNotFoundError
from ..registry import ensure_model, model_path, pull_pair, registry, remove_model
from ..registry.downloads import DownloadCancelled, Progress, ProgressSink
from ..registry.hub_file import HubFile

log = logging.getLogger(__name__)


def is_hub_spec(name: str) -> bool:
    """Whether ``name`` names a hub file (``OWNER/REPO/FILE…``), as ``edgespec pull`` reads
    names."""
    return name.count("/") >= 2


@dataclass(frozen=True)
class Target:
    """What a pull fetches: ``kind`` ``"pair"``, ``"model"`` (registry names) or ``"hub"``
    (``name``: the hub file, as :class:`~edgespec.registry.hub_file.HubFile` writes it)."""

    kind: str
    name: str


def pull_target(name: str) -> Target:
    """What pulling ``name`` fetches. Raises :class:`~edgespec.errors.ModelNotFoundError`
    (not a registry name: the message offers close ones) or a
    :class:`~edgespec.registry.downloads.DownloadError` (a hub file name that could escape
    the cache)."""
    bare = tagless(name)
    if is_hub_spec(bare):
        return Target("hub", str(HubFile.parse(bare)))
    reg = registry()
    if bare in reg.pairs:
        return Target("pair", bare)
    reg.models_of(bare)                 # raises for an unknown name
    return Target("model", bare)


def fetch(target: Target, progress: ProgressSink) -> Optional[CatalogEntry]:
    """Fetch ``target``'s files (in a worker thread), telling ``progress``. For a hub file,
    the catalog entry it is served as (None when it is not a GGUF model: it stays in the
    cache, unserved); None for registry names, which the catalogue lists itself."""
    if target.kind == "pair":
        # Not the draft's measured choice (registry/draft_choice.py): timings taken beside the
        # server's own generations would measure its load; `edgespec pull` makes it.
        pull_pair(target.name, progress=progress)
        return None
    if target.kind == "model":
        ensure_model(target.name, progress=progress)
        return None
    from ..registry.hub import download      # the hub client, only when a hub file is pulled
    path = download(HubFile.parse(target.name), progress=progress)
    try:
        return entry_for(target.name, path)
    except EdgespecError as e:
        log.warning("%s was pulled but is not served: %s", target.name, e)
        return None


def status_of(p: Progress) -> dict:
    """Ollama's status object for a file's progress: ``pulling <digest>`` with ``digest``,
    ``total`` and ``completed`` bytes (the file's name stands in for a digest not known),
    or ``verifying sha256 digest``."""
    if p.verifying:
        return {"status": "verifying sha256 digest"}
    out: dict = {"status": f"pulling {p.sha256[:12] if p.sha256 else p.file}"}
    if p.sha256:
        out["digest"] = f"sha256:{p.sha256}"
    if p.total is not None:
        out.update(total=p.total, completed=p.done)
    return out


class Pull:
    """One pull, started in a worker thread on creation (on the running event loop).

    :meth:`statuses` yields its status objects as they come (each change once) and ends when
    the files are fetched (``entry``: :func:`fetch`'s), or raises the pull's error;
    :meth:`cancel` stops it at its next report, and :meth:`finished` waits for its thread;
    ``running``: its thread has not ended yet."""

    def __init__(self, target: Target, fetcher: Callable[[Target, ProgressSink],
                                                         Optional[CatalogEntry]] = fetch):
        self.target = target
        self.entry: Optional[CatalogEntry] = None
        self.running = True
        self._cancelled = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._ended = asyncio.Event()
        self._last: Optional[dict] = None
        self._fetch = fetcher
        threading.Thread(target=self._run, name=f"pull {target.name}", daemon=True).start()

    def cancel(self) -> None:
        self._cancelled.set()

    async def finished(self) -> None:
        await self._ended.wait()

    async def statuses(self) -> AsyncIterator[dict]:
        while (item := await self._queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    # -- the worker thread ------------------------------------------------------------------

    def _run(self) -> None:
        outcome: object = None
        try:
            self.entry = self._fetch(self.target, self._report)
        except Exception as e:  # noqa: BLE001 - handed to the event loop, which raises it
            outcome = e
        self.running = False
        self._put(outcome)
        self._put_call(self._ended.set)

    def _report(self, p: Progress) -> None:
        if self._cancelled.is_set():
            raise DownloadCancelled(f"the pull of {self.target.name} was stopped")
        status = status_of(p)
        if status != self._last:
            self._last = status
            self._put(status)

    def _put(self, item: object) -> None:
        self._put_call(lambda: self._queue.put_nowait(item))

    def _put_call(self, call: Callable[[], None]) -> None:
        try:
            self._loop.call_soon_threadsafe(call)
        except RuntimeError:             # the loop is closed: no one listens any more
            self._cancelled.set()


# ---------------------------------------------------------------------------------------------
# Deleting


@dataclass(frozen=True)
class Removal:
    """What deleting a name removes: its ``files`` (to unload the models using them first),
    and ``remove``, which deletes them and returns the bytes freed (run it in a worker
    thread)."""

    files: list[Path]
    remove: Callable[[], int]


def removal(name: str) -> Removal:
    """What deleting ``name`` removes (see the module docstring; Ollama's ``:latest`` tag, which
    ``/api/tags`` adds to every name, may end it). Raises
    :class:`~edgespec.errors.ModelNotFoundError` when nothing of it is on this machine, and a
    :class:`~edgespec.registry.downloads.DownloadError` for a hub file name that could escape
    the cache (the name's fault: a 400)."""
    bare = tagless(name)
    if is_hub_spec(bare) and own_file(name) is None and own_file(bare) is None:
        from ..registry import hub
        f = HubFile.parse(bare)
        cached = hub.cached_path(f)
        return _found(name, [cached] if cached else [], lambda: hub.remove(f))
    reg = registry()
    if bare in reg.pairs or bare in reg.models or bare in reg.embeddings:
        models = reg.models_of(bare)
        files = [p for m in models if (p := model_path(m.name)).is_file()]
        return _found(name, files, lambda: sum(remove_model(m.name) for m in models))
    mine = own_file(name) or own_file(bare)
    if mine is None:
        raise ModelNotFoundError(f"model '{name}' not found: no registry pair or model, hub "
                                 f"file or GGUF file in {paths.models_dir()} has this name "
                                 "(`ollama list` shows the names here)")
    return _found(name, [mine], lambda: _unlink(mine))


def _found(name: str, files: list[Path], remove: Callable[[], int]) -> Removal:
    if not files:
        raise ModelNotFoundError(f"model '{name}' not found: it is not downloaded "
                                 "(`ollama list` shows the names here)")
    return Removal(files, remove)


def _unlink(path: Path) -> int:
    size = path.stat().st_size
    path.unlink()
    return size
