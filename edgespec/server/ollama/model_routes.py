"""Ollama's model management: ``/api/pull``, ``/api/delete`` and ``/api/copy`` over the
server's :class:`~..models.ModelManager` (what they do on disk: :mod:`..model_store`).

``/api/pull`` streams NDJSON status objects, as Ollama's does: ``pulling manifest``; per
file ``pulling <digest>`` with ``digest``, ``total`` and ``completed``; ``verifying sha256
digest``; ``success``, or ``{"error": …}`` as the last line when the pull fails
(``"stream": false``: the last object alone, or the error with its HTTP status). The
manager sees a pulled model at once (a hub file pulled by ``REPO_ID/FILENAME`` is served
under that name until the server stops). A name already on this machine that no registry
knows (a file of the models folder) is answered ``success`` at once. A client that goes away
stops its pull (see :mod:`..model_store`).

``/api/delete`` removes what ``edgespec rm`` removes (404 when nothing of the name is here,
400 for a name no file could have), after unloading the models that use those files; every
name ``/api/tags`` lists is taken, ``:latest`` and all. The model the server was started with
is refused (400: stop the server first), as is a file outside the models folder.
``/api/copy`` makes ``destination`` another name for the model ``source`` names: an alias
listed by ``/api/tags``, sharing the source's files (and its loaded Engine), kept until the
server stops (not written to disk) or until ``/api/delete`` removes the name (the source's
files stay). Pulls and deletions take turns. Errors are
Ollama's ``{"error": message}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path
from typing import AsyncIterator, Optional

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ... import paths
from ...catalogue import CatalogEntry, ModelNotFound
from ...errors import EdgespecError, ModelNotFoundError
from ...registry.downloads import DownloadError, NotEnoughDiskSpaceError
from ..body import read_json
from ..generation import GenerationPath, STREAM_HEADERS
from ..model_store import Pull, Removal, Target, pull_target, removal
from ..wire import APIError, checked, get_field, refuse_unknown

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_.:/@-]{1,256}")


def _line(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _name(body: object, fields: set, key: str = "model") -> str:
    """The model a body names (``key``; Ollama's older clients send ``name``)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown(body, fields)
    name = body.get(key) if body.get(key) is not None else body.get("name")
    if name is None or name == "":
        raise APIError(400, f"{key} is required: the name of a model", param=key,
                       code="missing_required_parameter")
    return checked(key, name, "str")


def _uses(entry: CatalogEntry, files: set[Path]) -> bool:
    """Whether the model ``entry`` is made of any of ``files`` (resolved paths)."""
    return any(p is not None and p.resolve() in files for p in (entry.target, entry.draft))


def failure(e: EdgespecError) -> APIError:
    """The HTTP error a failed pull or deletion is answered with."""
    if isinstance(e, ModelNotFoundError):
        return APIError(404, str(e), param="model", code="model_not_found")
    if isinstance(e, NotEnoughDiskSpaceError):
        return APIError(507, str(e), type="server_error", code="insufficient_storage")
    if isinstance(e, DownloadError):
        return APIError(502, f"the pull failed: {e}", type="server_error", code="pull_failed")
    return APIError(500, f"the pull failed: {e}", type="server_error", code="pull_failed")


class OllamaModelRoutes:
    """``/api/pull``, ``/api/delete`` and ``/api/copy`` over ``path``'s manager; bodies are
    read up to ``max_body`` bytes."""

    def __init__(self, path: GenerationPath, max_body: int):
        self.path, self.manager, self.max_body = path, path.manager, max_body
        self._turn = anyio.Lock()      # pulls and deletions write the same files

    def routes(self) -> list[Route]:
        return [Route("/api/pull", self.pull, methods=["POST"]),
                Route("/api/delete", self.delete, methods=["DELETE"]),
                Route("/api/copy", self.copy, methods=["POST"])]

    # -- pull -------------------------------------------------------------------------------

    async def pull(self, request: Request) -> Response:
        body = await read_json(request, self.max_body, any_type=True)
        name = _name(body, {"model", "name", "stream", "insecure"})
        stream = get_field(body, "stream", "bool", True)
        get_field(body, "insecure", "bool")  # accepted: TLS and sha256 are always checked
        target = self._target(name)
        if stream:
            return StreamingResponse(self._lines(target), media_type="application/x-ndjson",
                                     headers=STREAM_HEADERS)
        return JSONResponse(await self._whole(request, target))

    def _target(self, name: str) -> Optional[Target]:
        """What pulling ``name`` fetches; None: it is here and no registry knows it."""
        try:
            return pull_target(name)
        except ModelNotFoundError as e:
            try:
                self.manager.resolve(name)
            except ModelNotFound:
                raise failure(e) from None
            return None
        except DownloadError as e:                  # a hub file name refused
            raise APIError(400, str(e), param="model") from None

    async def _statuses(self, target: Optional[Target]) -> AsyncIterator[dict]:
        """The pull's status objects, from ``pulling manifest`` to ``success``; it is stopped
        if the caller stops reading (its client went away)."""
        async with self._turn:
            yield {"status": "pulling manifest"}
            if target is not None:
                pull = Pull(target)
                try:
                    async for status in pull.statuses():
                        yield status
                finally:
                    if pull.running:       # its reader went away: stop it at its next chunk
                        pull.cancel()
                        log.info("%s: pull stopped: its client went away", target.name)
                        with anyio.CancelScope(shield=True):
                            await pull.finished()   # its files settle before the next turn
                        log.info("%s: the pull ended", target.name)
                if pull.entry is not None:
                    self.manager.add_entry(pull.entry)
                self.manager.rescan()
                log.info("pulled %s", target.name)
            yield {"status": "success"}

    async def _lines(self, target: Optional[Target]) -> AsyncIterator[bytes]:
        """A streamed pull's NDJSON lines; a failure is the last line, as Ollama's."""
        try:
            async with contextlib.aclosing(self._statuses(target)) as statuses:
                async for status in statuses:
                    yield _line(status)
        except Exception as e:   # reported to the client, then logged
            log.error("pulling %s failed: %s", target.name if target else "", e,
                      exc_info=not isinstance(e, EdgespecError))
            message = failure(e).message if isinstance(e, EdgespecError) else \
                f"the pull failed: {e}"
            yield _line({"error": message})

    async def _whole(self, request: Request, target: Optional[Target]) -> dict:
        """The last status of a pull not streamed; stopped if the client goes away."""
        last: dict = {}
        error: Optional[APIError] = None

        async def watch_disconnect(scope: anyio.CancelScope) -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            scope.cancel()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch_disconnect, tasks.cancel_scope)
            try:
                async with contextlib.aclosing(self._statuses(target)) as statuses:
                    async for status in statuses:
                        last = status
            except EdgespecError as e:
                error = failure(e)
            tasks.cancel_scope.cancel()
        if error is not None:
            raise error
        return last

    # -- delete and copy --------------------------------------------------------------------

    async def delete(self, request: Request) -> Response:
        name = _name(await read_json(request, self.max_body, any_type=True), {"model", "name"})
        if self.manager.is_copy(name):                # the name goes; the files stay
            self.manager.forget(name)
            return Response(status_code=200)
        async with self._turn:
            plan = await self._removal(name)
            files = {p.resolve() for p in plan.files}
            started = self._started()
            if started is not None and _uses(started, files):
                raise APIError(400, f"'{name}' holds the files of the model this server was "
                                    "started with: stop the server to remove it with "
                                    "`edgespec rm`", param="model")
            for info in self.manager.loaded():
                if _uses(info.entry, files):
                    await self.manager.unload(info.name)
            freed = await run_in_threadpool(plan.remove)
            self.manager.forget(name)
            self.manager.rescan()
        log.info("deleted %s (%d bytes freed)", name, freed)
        return Response(status_code=200)

    async def _removal(self, name: str) -> Removal:
        """What deleting ``name`` removes; a 400 for a name that cannot be a hub file's, or one
        the server lists whose files it does not manage (the model it was started with, from
        outside the models folder), a 404 when nothing of it is here."""
        try:
            return await run_in_threadpool(removal, name)
        except DownloadError as e:                  # a hub file name refused: the name's fault
            raise APIError(400, str(e), param="model", code="invalid_model_name") from None
        except ModelNotFoundError as e:
            with contextlib.suppress(ModelNotFound):
                entry = self.manager.resolve(name)
                if entry.store:
                    raise APIError(400, f"'{name}' is a model of another app's store "
                                        f"({entry.store}: {entry.target}): edgespec never "
                                        "changes it; remove it with that app", param="model",
                                   code="not_removable") from None
                started = self._started()
                if started is not None and entry.target == started.target:
                    raise APIError(400, f"'{name}' is the model this server was started with: "
                                        "stop the server to remove it", param="model",
                                   code="model_in_use") from None
                raise APIError(400, f"'{name}' is served from {entry.target}, outside the "
                                    f"models folder {paths.models_dir()}: edgespec removes "
                                    "only the files it keeps; delete that file yourself",
                               param="model", code="not_removable") from None
            raise failure(e) from None
        except EdgespecError as e:
            raise failure(e) from None

    def _started(self) -> Optional[CatalogEntry]:
        """The model the server was started with (its default), if it has one."""
        try:
            return self.manager.resolve(None)
        except ModelNotFound:
            return None

    async def copy(self, request: Request) -> Response:
        body = await read_json(request, self.max_body, any_type=True)
        source = _name(body, {"source", "destination"}, key="source")
        destination = _name(body, {"source", "destination"}, key="destination")
        if not _NAME.fullmatch(destination):
            raise APIError(400, f"destination {destination!r} is not a model name: use "
                                "letters, digits and _ . : / @ -", param="destination")
        entry = self.path.resolve(source)
        if not self.manager.is_copy(destination):
            with contextlib.suppress(ModelNotFound):
                taken = self.manager.resolve(destination)
                raise APIError(400, f"'{destination}' already names the model "
                                    f"'{taken.name}': delete it first, or choose another "
                                    "name", param="destination")
        self.manager.add_alias(destination, entry.name)
        log.info("%s is now another name for %s", destination, entry.name)
        return Response(status_code=200)
