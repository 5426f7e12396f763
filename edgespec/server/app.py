"""The ASGI application: OpenAI's and Ollama's endpoints over the models on this machine
(Starlette, served by uvicorn).

Every request that generates names a model (``model``); the :class:`~.models.ModelManager`
loads it on first use (its registered draft with it), unloads idle ones when its budget says
so, and refuses a name that is not on disk with a 404 that names ``edgespec pull``: no request
is answered by another model than it named (``--model-alias`` maps names explicitly). Both
APIs go the same way: the body is checked (:mod:`.protocol`, :mod:`.ollama`), the model
leased, the generation queued on its Engine, the answer framed (OpenAI's server-sent events,
Ollama's NDJSON), and the figures counted (:mod:`.metrics`, with ``--metrics``).

Requests queue for an Engine (first come, first served; one generation at a time) while the
event loop stays free: each generation runs in a thread of its own
(:class:`~edgespec.streams.AsyncStream`), and loading a model runs in a worker thread, so
``/health`` answers during a long generation or a load. A client that goes away cancels its
generation, whether it was streaming, waiting for a whole response or still queued: the
generation stops within one decoding step.

``GET /`` is a chat page (:mod:`.page`) that uses the OpenAI endpoints and shows how
speculation did from the stream's ``edgespec`` fields.

Guards, before any endpoint: a request without the API key (when there is one) gets 401,
except for ``/health`` and the page's files, which hold no secret (the page asks for the key
when the API answers 401); with no key, only loopback ``Host`` names are served (so a web
page cannot reach the server through DNS rebinding), and OpenAI bodies must be sent as
``application/json`` (a page's plain form post is refused before it can start a generation).
Ollama's clients (and its documentation's ``curl -d``) send JSON without that header, so
``/api/`` bodies are read whatever their type, but a request a browser sends from a page (it
carries ``Origin``) is served only from an origin ``cors_origins`` names. No CORS headers
are sent unless ``cors_origins`` names origins, and never with credentials. Errors come in
the shape of the API asked: OpenAI's ``{"error": {"message", "type", "param", "code"}}``,
Ollama's ``{"error": message}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
import logging
import time
from typing import AsyncIterator, Callable, Optional, Sequence

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import (ConstraintError, ContextOverflowError, EdgespecError, EngineClosedError,
                      InvalidParameterError, ModelLoadError, PromptTooLargeError,
                      TemplateError, TemplateRefused)
from ..gguf_file import read_gguf
from . import page
from ..catalogue import ModelNotFound, entry_for
from .models import ModelManager
from .ollama import (OllamaReply, OllamaRequest, ollama_error_body, parse_ollama_chat,
                     parse_ollama_generate, ps_body, show_body, tags_body, version_body)
from .protocol import APIError, GenerationRequest, parse_chat, parse_completion
from .replies import Reply, token_event

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
NDJSON = "application/x-ndjson"


def is_ollama(path: str) -> bool:
    return path.startswith("/api/")


def error_response(err: APIError, path: str = "") -> JSONResponse:
    """``err`` in the shape of the API ``path`` belongs to."""
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    body = ollama_error_body(err) if is_ollama(path) else err.body()
    return JSONResponse(body, status_code=err.status, headers=headers)


def sse(body: dict) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() \
        + b"\n\n"


def ndjson(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


# ---------------------------------------------------------------------------------------------
# Guards


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):                   # [::1]:8000
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def needs_key(path: str) -> bool:
    """Whether ``path`` is served only with the API key: all but ``/health`` and the chat
    page (``/`` and its files under ``/web/``), which hold no secret. The Host check applies
    to every path."""
    return not (path in ("/", "/health") or path.startswith("/web/"))


class Guard:
    """API key and Host checks for every HTTP request (a pure ASGI middleware, so that
    streamed responses pass through untouched). ``/health`` and the page need no key
    (:func:`needs_key`)."""

    def __init__(self, app, api_key: Optional[str], allowed_hosts: Optional[set]):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            err = self.check(Headers(scope=scope), scope["path"])
            if err is not None:
                await error_response(err, scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def check(self, headers: Headers, path: str) -> Optional[APIError]:
        if self.allowed_hosts is not None:
            host = _host_name(headers.get("host", "")).lower()
            if host not in self.allowed_hosts:
                return APIError(400, f"this server only answers requests addressed to "
                                     f"127.0.0.1 or localhost, not {host!r} (start it with "
                                     "--api-key to serve other names)", code="invalid_host")
        if self.api_key is not None and needs_key(path):
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not given:
                return APIError(401, "missing API key: send the header 'Authorization: "
                                     "Bearer KEY'", code="invalid_api_key")
            if not hmac.compare_digest(given.strip().encode(), self.api_key):
                return APIError(401, "incorrect API key", code="invalid_api_key")
        return None


class CountRequests:
    """Each request counted by :class:`~.metrics.Metrics` under its route (``other`` for
    paths that are no route) and the status it was answered with, while in flight until its
    last byte (a pure ASGI middleware: streams pass through)."""

    def __init__(self, app, metrics, routes: Sequence[str]):
        self.app, self.metrics, self.routes = app, metrics, set(routes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in self.routes else \
            "/v1/models/{model}" if path.startswith("/v1/models/") else "other"
        counted = self.metrics.request(endpoint)

        async def send_counted(message) -> None:
            if message["type"] == "http.response.start":
                counted.status = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, send_counted)
        except BaseException as e:
            counted.end(exc=e)
            raise
        counted.end()


# ---------------------------------------------------------------------------------------------
# Reading requests


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, limit: int, any_type: bool = False) -> object:
    """The body as JSON. ``any_type``: whatever its Content-Type (Ollama's clients), unless a
    browser sent it from a page (the guard has already checked its ``Origin``)."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not any_type:
        raise APIError(400, "send the request body as JSON with the header 'Content-Type: "
                            "application/json'", code="invalid_content_type")
    length = request.headers.get("content-length", "")
    too_large = APIError(413, f"the request body is larger than {limit} bytes",
                         code="request_too_large")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks), parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the request body is not valid JSON ({e})",
                       code="invalid_json") from None


# ---------------------------------------------------------------------------------------------
# Timing: what /metrics is told of a generation


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


# ---------------------------------------------------------------------------------------------
# The application


class Server:
    """The endpoints, over the models of ``manager``. ``n_ctx``: the context the models are
    loaded with (bodies are checked against it before a model loads)."""

    def __init__(self, manager: ModelManager, n_ctx: int, max_body: int, metrics=None):
        self.manager = manager
        self.n_ctx = n_ctx
        self.max_body = max_body
        self.metrics = metrics
        self._noted: set[str] = set()

    def _note_once(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning("%s", message)

    # -- models ---------------------------------------------------------------------------

    def model_card(self, entry) -> dict:
        return {"id": entry.name, "object": "model", "created": int(entry.modified),
                "owned_by": "edgespec",
                "edgespec": {"kind": entry.kind, "draft": entry.draft.name if entry.draft
                             else None, "loaded": self.manager.engine_for(entry.name)
                             is not None}}

    def _resolve(self, name: Optional[str]):
        try:
            return self.manager.resolve(name)
        except ModelNotFound as e:
            raise APIError(404, str(e), param="model", code="model_not_found") from None

    async def health(self, request: Request) -> Response:
        engine = self.manager.engine_for(None)
        loaded = self.manager.loaded()
        return JSONResponse({"status": "ok", "model": self.manager.default,
                             "busy": bool(engine and engine.busy),
                             "waiting": engine.waiting if engine else 0,
                             "loaded": [{"name": m.name, "in_use": m.in_use}
                                        for m in loaded]})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list",
                             "data": [self.model_card(e) for e in self.manager.listing()]})

    async def model(self, request: Request) -> Response:
        return JSONResponse(self.model_card(self._resolve(request.path_params["model"])))

    async def metrics_text(self, request: Request) -> Response:
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    # -- leasing a model ------------------------------------------------------------------

    async def _lease(self, leases: contextlib.AsyncExitStack, name: Optional[str],
                     keep_alive: Optional[float] = None):
        """The model ``name`` names, loaded if need be, held until ``leases`` closes."""
        try:
            return await leases.enter_async_context(self.manager.acquire(name, keep_alive))
        except ModelNotFound as e:
            raise APIError(404, str(e), param="model", code="model_not_found") from None
        except EngineClosedError as e:
            raise APIError(503, str(e), type="server_error", code="shutting_down") from None
        except ModelLoadError as e:
            raise APIError(500, f"the model could not be loaded: {e}", type="server_error",
                           code="model_load_failed") from None
        except EdgespecError as e:      # the memory budget
            raise APIError(507 if "--max-ram" in str(e) else 500, str(e),
                           type="server_error", code="model_too_large") from None

    # -- OpenAI ---------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body)
        return await self.generate(request, parse_chat(body, self.n_ctx), timing)

    async def completions(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body)
        return await self.generate(request, parse_completion(body, self.n_ctx), timing)

    def _start(self, engine, req: GenerationRequest):
        """Tokenize and queue (in a worker thread: chat templates and long prompts take time)."""
        try:
            return engine.astream(
                req.prompt, max_tokens=req.max_tokens, sampling=req.sampling, raw=req.raw,
                stop=req.stop, constraint=req.constraint, tools=req.tools,
                tool_choice=req.tool_choice, logprobs=req.logprobs,
                parallel_tool_calls=req.parallel_tool_calls, speculative=req.speculative)
        except ContextOverflowError as e:
            raise APIError(400, str(e), param="messages" if req.kind == "chat" else "prompt",
                           code="context_length_exceeded") from None
        except InvalidParameterError as e:
            raise APIError(400, str(e), param=e.name, code="invalid_value") from None
        except (TemplateRefused, PromptTooLargeError) as e:
            raise APIError(400, str(e), param="messages", code="invalid_value") from None
        except TemplateError as e:
            raise APIError(400, f"the chat template cannot render these messages ({e})",
                           param="messages", code="invalid_value") from None
        except ConstraintError as e:
            raise APIError(400, str(e), param="messages", code="invalid_value") from None
        except EngineClosedError as e:
            raise APIError(503, str(e), type="server_error", code="shutting_down") from None

    async def generate(self, request: Request, req: GenerationRequest,
                       timing: Timing) -> Response:
        leases = contextlib.AsyncExitStack()
        try:
            lease = await self._lease(leases, req.model)
            gen = await run_in_threadpool(self._start, lease.engine, req)
            reply = Reply(req.kind, lease.name)
            endpoint = request.url.path
            if req.stream:
                stream = StreamingResponse(
                    _guarded(self._events(gen, reply, req, lease, timing, endpoint), gen,
                             reply.id, _openai_error_event),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
                response, leases = LeasedResponse(stream, leases), None
                return response
            result = await self._collect(request, gen, reply.id, timing)
            self._count(lease.name, endpoint, result, timing)
            if result.finish_reason == "cancelled":
                raise APIError(503, "the generation was cancelled: the server is shutting down",
                               type="server_error", code="cancelled")
            return JSONResponse(reply.response(result, lease.engine.target.token_bytes))
        finally:
            if leases is not None:
                await leases.aclose()

    def _count(self, model: str, endpoint: str, result, timing: Timing) -> None:
        if self.metrics is not None:
            self.metrics.generation_done(model, endpoint, result.stats, timing.ttft,
                                         timing.gaps, result.finish_reason)

    async def _collect(self, request: Request, gen, rid: str, timing: Timing):
        """Run a whole generation, cancelling it if the client goes away meanwhile."""
        async def watch_disconnect() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gen.cancel()
            log.info("%s: client disconnected", rid)

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watch_disconnect)
                async for _ in gen:
                    timing.token()
                tasks.cancel_scope.cancel()
        finally:
            gen.cancel()      # a no-op after the end; stops it if this task was cancelled
        _log_result(rid, gen.result)
        return gen.result

    async def _events(self, gen, reply: Reply, req: GenerationRequest, lease, timing: Timing,
                      endpoint: str) -> AsyncIterator[bytes]:
        """Server-sent events framed as OpenAI's: one id; the role in the first delta only;
        finish_reason in the last chunk; the usage chunk if asked; ``data: [DONE]``. A failure
        ends the stream with an error event instead (:func:`_guarded`).

        A request that may call tools streams its answer once it is complete: the raw output
        is the call's JSON, and what it means (content, or ``tool_calls`` deltas) is known
        only at its end."""
        include_usage = req.include_usage
        spell = lease.engine.target.token_bytes
        hold = bool(req.tools) and req.tool_choice != "none"
        yield sse(reply.chunk("", first=True, include_usage=include_usage))
        async for event in gen:
            timing.token()
            if hold:
                continue
            lp = reply.logprobs([event.logprob], spell) if event.logprob else None
            if event.text or lp or event.round is not None:
                yield sse(reply.chunk(event.text, include_usage=include_usage,
                                      logprobs=lp, edgespec=token_event(event, spell)))
        result = gen.result
        if hold and result.finish_reason != "cancelled":
            if result.text:
                yield sse(reply.chunk(result.text, include_usage=include_usage,
                                      logprobs=reply.logprobs(result.logprobs, spell)))
            if result.tool_calls:
                yield sse(reply.chunk(None, include_usage=include_usage,
                                      tool_calls=result.tool_calls))
        _log_result(reply.id, result)
        self._count(lease.name, endpoint, result, timing)
        if result.finish_reason == "cancelled":
            yield sse(APIError(503, "the generation was cancelled: the server is shutting "
                                    "down", type="server_error", code="cancelled").body())
            return
        yield sse(reply.final_chunk(result, include_usage))
        if include_usage:
            yield sse(reply.usage_chunk(result))
        yield b"data: [DONE]\n\n"

    # -- Ollama ---------------------------------------------------------------------------

    async def ollama_version(self, request: Request) -> Response:
        return JSONResponse(version_body())

    async def ollama_tags(self, request: Request) -> Response:
        return JSONResponse(tags_body(self.manager.listing()))

    async def ollama_ps(self, request: Request) -> Response:
        return JSONResponse(ps_body(self.manager.loaded()))

    async def ollama_show(self, request: Request) -> Response:
        body = await read_json(request, self.max_body, any_type=True)
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise APIError(400, "model is required: the name of a model /api/tags lists",
                           param="model")
        entry = self._resolve(name)
        engine = self.manager.engine_for(entry.name)
        if engine is not None:
            info, template, n_ctx = engine.info(), engine.template.source or "", engine.n_ctx
        else:      # not loaded: what its file says (no load for a look)
            gguf = await run_in_threadpool(read_gguf, entry.target)
            info, template, n_ctx = {}, gguf.chat_template or "", self.n_ctx
        return JSONResponse(show_body(entry, info, template, n_ctx))

    async def ollama_chat(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body, any_type=True)
        return await self.ollama_generate_(request, parse_ollama_chat(body, self.n_ctx),
                                           "chat", timing)

    async def ollama_generate(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body, any_type=True)
        return await self.ollama_generate_(request, parse_ollama_generate(body, self.n_ctx),
                                           "generate", timing)

    async def ollama_generate_(self, request: Request, oreq: OllamaRequest, kind: str,
                               timing: Timing) -> Response:
        if oreq.think_ignored:
            self._note_once("think", "note: a request set 'think', which edgespec ignores: "
                                     "its models' thinking is part of the answer's text")
        if oreq.num_ctx is not None and oreq.num_ctx > self.n_ctx:
            self._note_once("num_ctx", f"note: a request asked for num_ctx={oreq.num_ctx}; "
                                       f"this server's models have a context of {self.n_ctx} "
                                       "tokens (start it with --ctx-size N for more)")
        if oreq.load_only and oreq.keep_alive == 0:       # Ollama's way to unload a model
            entry = self._resolve(oreq.model)
            await self.manager.unload(entry.name)
            return JSONResponse(OllamaReply(kind, entry.name).loaded(unloaded=True))
        leases = contextlib.AsyncExitStack()
        try:
            lease = await self._lease(leases, oreq.model, oreq.keep_alive)
            reply = OllamaReply(kind, oreq.model, lease.engine.target.token_bytes)
            if oreq.load_only:
                return JSONResponse(reply.loaded())
            req = oreq.gen
            if req.parallel_tool_calls and not lease.engine.template.writes_tool_call_tags:
                # Several calls only where the template writes call tags: in the generic JSON
                # format small models repeat one call until num_predict (docs/decisions.md)
                req = dataclasses.replace(req, parallel_tool_calls=False)
            gen = await run_in_threadpool(self._start, lease.engine, req)
            endpoint = request.url.path
            if req.stream:
                stream = StreamingResponse(
                    _guarded(self._ndjson(gen, reply, req, lease, timing, endpoint), gen,
                             f"ollama-{kind}", _ollama_error_line),
                    media_type=NDJSON, headers={"Cache-Control": "no-cache",
                                                "X-Accel-Buffering": "no"})
                response, leases = LeasedResponse(stream, leases), None
                return response
            result = await self._collect(request, gen, f"ollama-{kind}", timing)
            self._count(lease.name, endpoint, result, timing)
            if result.finish_reason == "cancelled":
                raise APIError(503, "the generation was cancelled: the server is shutting down")
            return JSONResponse(reply.final(result, total_seconds=timing.seconds,
                                            load_seconds=lease.load_seconds, streamed=False))
        finally:
            if leases is not None:
                await leases.aclose()

    async def _ndjson(self, gen, reply: OllamaReply, req: GenerationRequest, lease,
                      timing: Timing, endpoint: str) -> AsyncIterator[bytes]:
        """Ollama's stream: an object per piece of text, then the final one with the figures.
        A request that may call tools sends its answer once complete (as for OpenAI); a
        failure ends the stream with ``{"error": …}``, as Ollama's does (:func:`_guarded`)."""
        hold = bool(req.tools) and req.tool_choice != "none"
        async for event in gen:
            timing.token()
            if hold:
                continue
            lp = [event.logprob] if event.logprob else None
            if event.text or lp:
                yield ndjson(reply.chunk(event.text, logprobs=lp))
        result = gen.result
        _log_result(f"ollama-{reply.kind}", result)
        self._count(lease.name, endpoint, result, timing)
        if result.finish_reason == "cancelled":
            yield ndjson({"error": "the generation was cancelled: the server is shutting "
                                   "down"})
            return
        if hold and (result.text or result.tool_calls):
            yield ndjson(reply.chunk(result.text, logprobs=result.logprobs,
                                     tool_calls=result.tool_calls or ()))
        yield ndjson(reply.final(result, total_seconds=timing.seconds,
                                 load_seconds=lease.load_seconds, streamed=True))

async def _guarded(frames: AsyncIterator[bytes], gen, rid: str,
                   error: Callable[[str], bytes]) -> AsyncIterator[bytes]:
    """A stream's ``frames`` with the rules every stream keeps: a failure is reported to the
    client as its last frame (``error(message)``) and logged; Starlette cancels this when the
    client disconnects; whichever way it ends early, the generation is cancelled."""
    finished = False
    try:
        async for frame in frames:
            yield frame
        finished = True
    except anyio.get_cancelled_exc_class():
        log.info("%s: client disconnected; generation cancelled", rid)
        raise
    except Exception as e:   # reported to the client, then logged
        log.error("%s: generation failed: %s", rid, e, exc_info=not isinstance(e, EdgespecError))
        yield error(f"the generation failed: {e}")
    finally:
        if not finished:
            gen.cancel()


def _openai_error_event(message: str) -> bytes:
    return sse(APIError(500, message, type="server_error", code="generation_failed").body())


def _ollama_error_line(message: str) -> bytes:
    return ndjson({"error": message})


def _log_result(rid: str, gen) -> None:
    log.info("%s: %s, %d tokens · %s", rid, gen.finish_reason,
             gen.stats.completion_tokens, gen.stats.summary())


async def _api_error(request: Request, exc: APIError) -> Response:
    return error_response(exc, request.url.path)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    path = request.url.path
    if exc.status_code == 404:
        hint = (" (edgespec serves /api/chat, /api/generate, /api/tags, /api/show, /api/ps "
                "and /api/version; models come from `edgespec pull`)") if is_ollama(path) else ""
        return error_response(APIError(404, f"no such endpoint: {request.method} "
                                            f"{path}{hint}", code="unknown_url"), path)
    if exc.status_code == 405:
        return error_response(APIError(405, f"{request.method} is not allowed on "
                                            f"{path}", code="method_not_allowed"), path)
    return error_response(APIError(exc.status_code, str(exc.detail)), path)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, f"internal error: {exc}", type="server_error",
                                   code="internal_error"), request.url.path)


class OriginGuard:
    """A request a browser sends from a web page carries ``Origin``: on ``/api/`` (whose
    bodies are read whatever their Content-Type) it is served only from the origins the
    server lets in (``--cors-origin``), so a page cannot start a generation with a form."""

    def __init__(self, app, origins: Sequence[str]):
        self.app, self.origins = app, set(origins)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and is_ollama(scope["path"]) \
                and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            origin = Headers(scope=scope).get("origin")
            if origin is not None and origin not in self.origins and "*" not in self.origins:
                err = APIError(403, f"requests from the web page at {origin} are not served: "
                                    f"start the server with --cors-origin {origin} to allow it")
                await error_response(err, scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)


def single_model(engine, name: str) -> ModelManager:
    """A manager that serves ``engine`` alone, under ``name`` (an app embedding one Engine)."""
    entry = entry_for(name, engine.target.path,
                      engine.draft.path if engine.draft is not None else None)
    return ModelManager(lambda: {name: entry}, lambda e: engine, preloaded=(name, engine),
                        keep_alive=-1)


def create_app(engine=None, *, model_id: Optional[str] = None,
               manager: Optional[ModelManager] = None, api_key: Optional[str] = None,
               cors_origins: Sequence[str] = (), max_body: int = MAX_BODY_BYTES,
               host: str = "127.0.0.1", metrics=None, n_ctx: Optional[int] = None,
               close_on_shutdown: bool = False) -> Starlette:
    """The server's ASGI app over ``manager``'s models, or over one ``engine`` served as
    ``model_id`` (the caller keeps and closes either).

    ``host`` is the address it listens on: without ``api_key`` only requests addressed to it
    or to a loopback name are served. ``metrics``: a :class:`~.metrics.Metrics` to count
    into and serve at ``/metrics`` (None: no ``/metrics``). ``n_ctx``: the context the
    manager's models are loaded with (default: the engine's). ``close_on_shutdown``: the
    app's lifespan closes the manager's models when the server stops (run it with
    ``lifespan="on"``).
    """
    if manager is None:
        if engine is None or model_id is None:
            raise TypeError("create_app needs an engine and its model_id, or a manager")
        manager = single_model(engine, model_id)
    n_ctx = n_ctx or (engine.n_ctx if engine is not None else None)
    if n_ctx is None:
        raise TypeError("create_app needs n_ctx with a manager")
    server = Server(manager, n_ctx, max_body, metrics)
    routes = [
        Route("/", page.index, methods=["GET", "HEAD"]),
        Route("/web/{file}", page.asset, methods=["GET", "HEAD"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.model, methods=["GET"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/api/version", server.ollama_version, methods=["GET"]),
        Route("/api/tags", server.ollama_tags, methods=["GET"]),
        Route("/api/ps", server.ollama_ps, methods=["GET"]),
        Route("/api/show", server.ollama_show, methods=["POST"]),
        Route("/api/chat", server.ollama_chat, methods=["POST"]),
        Route("/api/generate", server.ollama_generate, methods=["POST"]),
    ]
    if metrics is not None:
        routes.append(Route("/metrics", server.metrics_text, methods=["GET"]))
    allowed_hosts = None if api_key else LOOPBACK_NAMES | {host.lower()}
    middleware = []
    if metrics is not None:
        middleware.append(Middleware(CountRequests, metrics=metrics,
                                     routes=[r.path for r in routes]))
    if cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cors_origins),
                                     allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"],
                                     allow_credentials=False))
    middleware.append(Middleware(Guard, api_key=api_key, allowed_hosts=allowed_hosts))
    middleware.append(Middleware(OriginGuard, origins=cors_origins))
    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            if close_on_shutdown:
                await manager.close()

    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                     exception_handlers={APIError: _api_error, HTTPException: _http_error,
                                         Exception: _internal_error})
