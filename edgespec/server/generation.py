"""The one path every generating endpoint takes, whichever API it speaks.

An API's routes parse the body (an :class:`~.wire.APIRequest`) and pick its
:class:`~.framing.Framing`; :class:`GenerationPath` does the rest: it leases the model the
request names from the :class:`~.models.ModelManager` (loaded on first use), starts the
generation on its Engine (the prompt is tokenized and queued in a worker thread: chat
templates and long prompts take time), then streams it or collects it whole, counts it for
``/metrics`` and logs it. Failures to lease or to start become HTTP errors in one place
(:func:`api_error`).

Every stream keeps the same rules (:func:`guarded`): a failure is reported as its last frame
and logged; a client that goes away, or a stream that ends early any other way, cancels the
generation (within one decoding step); the model's lease is held until the last byte is sent
(:class:`LeasedResponse`), so the model is neither evicted nor unloaded under a stream. A
whole response is cancelled when its client goes away while it waits. An API's framing may
end a generation early, streamed or not (:meth:`~.framing.Framing.ends`): it is stopped there
and answered as one that reached its limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any, AsyncIterator, Callable, Optional, TypeVar

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import (ConstraintError, ContextOverflowError, EdgespecError, EngineClosedError,
                      InvalidParameterError, MemoryBudgetError, PromptTooLargeError,
                      TemplateError, TemplateRefused)
from ..engine.request import GenerationRequest
from ..engine.streams import AsyncStream
from ..results import Generation
from .framing import Framing
from ..catalogue import CatalogEntry, ModelKind, ModelNotFound
from .models import ModelManager
from .slots import Lease
from .wire import APIError, APIRequest, is_int

log = logging.getLogger(__name__)

T = TypeVar("T")
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def api_error(e: EdgespecError, req: Optional[APIRequest] = None) -> Optional[APIError]:
    """The HTTP error for ``e``, raised while leasing a model (``req`` None: any failure but
    a missing model, a context it cannot have, the memory budget or shutdown is the model's
    load failing) or while starting ``req``'s generation (None: not the request's doing; the
    app answers it as an internal error)."""
    if isinstance(e, InvalidParameterError):
        return APIError(400, str(e), param=e.name, code="invalid_value")
    if isinstance(e, ModelNotFound):
        return APIError(404, str(e), param="model", code="model_not_found")
    if isinstance(e, EngineClosedError):
        return APIError(503, str(e), type="server_error", code="shutting_down")
    if isinstance(e, MemoryBudgetError):
        return APIError(507, str(e), type="server_error", code="model_too_large")
    if req is None:
        return APIError(500, f"the model could not be loaded: {e}", type="server_error",
                        code="model_load_failed")
    if isinstance(e, ContextOverflowError):
        return APIError(400, str(e), param="messages" if req.kind == "chat" else "prompt",
                        code="context_length_exceeded")
    if isinstance(e, TemplateError):
        return APIError(400, f"the chat template cannot render these messages ({e})",
                        param="messages", code="invalid_value")
    if isinstance(e, (TemplateRefused, PromptTooLargeError, ConstraintError)):
        return APIError(400, str(e), param="messages", code="invalid_value")
    return None


def cancelled() -> APIError:
    """What a generation stopped by the server's shutdown is answered with."""
    return APIError(503, "the generation was cancelled: the server is shutting down",
                    type="server_error", code="cancelled")


class Timing:
    """When a request arrived and when each of its tokens came out of the Engine."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.first: Optional[float] = None
        self.last: Optional[float] = None
        self.gaps: list[float] = []

    def token(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.gaps.append(now - self.last)
        self.last = now

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first is None else self.first - self.t0

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0


class LeasedResponse:
    """A response that holds a model's lease until its last byte is sent (or the client goes
    away): the model is neither evicted nor unloaded under a stream."""

    def __init__(self, response: Response, leases: contextlib.AsyncExitStack):
        self.response, self.leases = response, leases

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            await self.leases.aclose()


CONTEXT_HEADER = "X-Edgespec-Num-Ctx"
# Where the guard (app.py) leaves a request's key digest: whose suffix index it drafts from.
INDEX_KEY = "edgespec.index_key"


class GenerationPath:
    """Leasing, starting, streaming or collecting, counting: see the module docstring.
    ``metrics``: a :class:`~.metrics.Metrics` to count into (None: not counted)."""

    def __init__(self, manager: ModelManager, metrics=None):
        self.manager = manager
        self.metrics = metrics

    def resolve(self, name: Optional[str]) -> CatalogEntry:
        """The catalog entry ``name`` names (404 when there is none)."""
        try:
            return self.manager.resolve(name)
        except ModelNotFound as e:
            raise api_error(e) from None

    def context_for(self, model: Any, n_ctx: Any) -> int:
        """The context a body naming ``model`` and asking for ``n_ctx`` tokens will be served
        with (:meth:`~.models.ModelManager.context_for`), read before the body is checked
        (values of the wrong type count as not given): the bound of its checks."""
        return self.manager.context_for(model if isinstance(model, str) else None,
                                        n_ctx if is_int(n_ctx) and n_ctx > 0 else None)

    async def lease(self, leases: contextlib.AsyncExitStack, name: Optional[str],
                    keep_alive: Optional[float] = None, n_ctx: Optional[int] = None, *,
                    embedding: bool = False) -> Lease:
        """The model ``name`` names, loaded (with a context of at least ``n_ctx``) if need
        be, held until ``leases`` closes (or, for a stream, its last byte: :meth:`respond`
        takes the lease over). ``embedding``: the lease is for embeddings, which every model
        makes; otherwise an embedding model (which cannot generate) is refused with a 400
        before it is loaded."""
        if not embedding and self.resolve(name).kind is ModelKind.EMBEDDING:
            raise APIError(400, f"the model '{name}' is an embedding model: it does not "
                                "generate text (send it to /api/embed or /v1/embeddings)",
                           param="model", code="model_not_supported")
        try:
            return await leases.enter_async_context(self.manager.acquire(name, keep_alive,
                                                                         n_ctx))
        except EdgespecError as e:
            raise api_error(e) from None

    async def respond(self, request: Request, leases: contextlib.AsyncExitStack, lease: Lease,
                      req: APIRequest, framing: Framing, timing: Timing) -> Response:
        """Generate ``req`` on the leased model and answer it in ``framing``: a stream when
        it asked for one (which takes the lease over from ``leases``), else the whole body."""
        key = request.scope.get(INDEX_KEY)
        if key is not None:
            req = dataclasses.replace(req, generation=req.generation.keyed(key))
        gen = await run_in_threadpool(_mapped, lease.engine.asubmit, req)
        endpoint = request.url.path
        # the context it is served with (a num_ctx over the model's is clamped: contexts.py)
        served = {CONTEXT_HEADER: str(lease.engine.n_ctx)}
        if req.stream:
            frames = self._frames(gen, framing, req.holds_answer, lease.name, endpoint, timing)
            stream = StreamingResponse(guarded(frames, gen, framing),
                                       media_type=framing.media_type,
                                       headers={**STREAM_HEADERS, **served})
            return LeasedResponse(stream, leases.pop_all())
        result = await self._collect(request, gen, framing, timing)
        self._count(lease.name, endpoint, result, timing)
        if result.finish_reason == "cancelled":
            raise cancelled()
        return JSONResponse(framing.body(result), headers=served)

    @staticmethod
    async def prompt_tokens(lease: Lease, req: APIRequest) -> list[int]:
        """The prompt tokens ``req`` would be generated from on the leased model (tokenized
        in a worker thread; nothing is queued)."""
        return await run_in_threadpool(_mapped, lease.engine.request_tokens, req)

    async def _frames(self, gen: AsyncStream, framing: Framing, held: bool, model: str,
                      endpoint: str, timing: Timing) -> AsyncIterator[bytes]:
        """A stream's frames; ``held``: the answer is sent once complete
        (:meth:`~.framing.Framing.closing`), not token by token."""
        for frame in framing.opening():
            yield frame
        ended = False
        async for event in gen:
            if ended:
                continue        # the rest of the step under way when the framing ended it
            timing.token()
            ended = framing.ends(event)
            frame = None if held else framing.event(event)
            if frame is not None:
                yield frame
            if ended:
                gen.cancel()
        result = _ended(gen.result, ended)
        _log_result(framing.log_id, result)
        self._count(model, endpoint, result, timing)
        if result.finish_reason == "cancelled":
            yield framing.error(cancelled())
            return
        for frame in framing.closing(result, held):
            yield frame

    async def _collect(self, request: Request, gen: AsyncStream, framing: Framing,
                       timing: Timing):
        """Run a whole generation, cancelling it if the client goes away meanwhile (or when
        the framing has all it needs, :meth:`~.framing.Framing.ends`)."""
        async def watch_disconnect() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gen.cancel()
            log.info("%s: client disconnected", framing.log_id)

        ended = False
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watch_disconnect)
                async for event in gen:
                    if not ended:
                        timing.token()
                        ended = framing.ends(event)
                        if ended:
                            gen.cancel()
                tasks.cancel_scope.cancel()
        finally:
            gen.cancel()      # a no-op after the end; stops it if this task was cancelled
        result = _ended(gen.result, ended)
        _log_result(framing.log_id, result)
        return result

    def _count(self, model: str, endpoint: str, result, timing: Timing) -> None:
        if self.metrics is not None:
            self.metrics.generation_done(model, endpoint, result.stats, timing.ttft,
                                         timing.gaps, result.finish_reason)


def _mapped(call: Callable[[GenerationRequest], T], req: APIRequest) -> T:
    """``call(req.generation)``, its errors raised as the HTTP errors they mean
    (:func:`api_error`; the others as they are)."""
    try:
        return call(req.generation)
    except EdgespecError as e:
        err = api_error(e, req)
        if err is None:
            raise
        raise err from None


async def guarded(frames: AsyncIterator[bytes], gen: AsyncStream,
                  framing: Framing) -> AsyncIterator[bytes]:
    """A stream's ``frames`` with the rules every stream keeps: a failure is reported to the
    client as its last frame (:meth:`~.framing.Framing.error`) and logged; Starlette cancels
    this when the client disconnects; whichever way it ends early, the generation is
    cancelled."""
    finished = False
    try:
        async for frame in frames:
            yield frame
        finished = True
    except anyio.get_cancelled_exc_class():
        log.info("%s: client disconnected; generation cancelled", framing.log_id)
        raise
    except Exception as e:   # reported to the client, then logged
        log.error("%s: generation failed: %s", framing.log_id, e,
                  exc_info=not isinstance(e, EdgespecError))
        yield framing.error(APIError(500, f"the generation failed: {e}", type="server_error",
                                     code="generation_failed"))
    finally:
        if not finished:
            gen.cancel()


def _ended(result: Generation, ended: bool) -> Generation:
    """``result`` of a generation its framing stopped (``ended``): at a limit, not cancelled."""
    if ended and result.finish_reason == "cancelled":
        return dataclasses.replace(result, finish_reason="length")
    return result


def _log_result(log_id: str, gen) -> None:
    log.info("%s: %s, %d tokens · %s", log_id, gen.finish_reason,
             gen.stats.completion_tokens, gen.stats.summary())
