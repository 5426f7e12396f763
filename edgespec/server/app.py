"""The ASGI application: OpenAI's endpoints over one Engine (Starlette, served by uvicorn).

Requests queue for the Engine (first come, first served; one generation at a time) while the
event loop stays free: each generation runs in a thread of its own
(:class:`~edgespec.streams.AsyncStream`), so ``/health`` answers during a long generation.
A client that goes away cancels its generation, whether it was streaming, waiting for a whole
response or still queued: the generation stops within one decoding step.

Guards, before any endpoint: a request without the API key (when there is one) gets 401; with
no key, only loopback ``Host`` names are served (so a web page cannot reach the server through
DNS rebinding), and bodies must be sent as ``application/json`` (a page's plain form post is
refused before it can start a generation). No CORS headers are sent unless ``cors_origins``
names origins, and never with credentials.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from typing import AsyncIterator, Optional, Sequence

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
                      InvalidParameterError, PromptTooLargeError, TemplateError, TemplateRefused)
from .protocol import APIError, GenerationRequest, parse_chat, parse_completion
from .replies import Reply

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}


def error_response(err: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def sse(body: dict) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() \
        + b"\n\n"


# ---------------------------------------------------------------------------------------------
# Guards


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):                   # [::1]:8000
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Guard:
    """API key and Host checks for every HTTP request (a pure ASGI middleware, so that
    streamed responses pass through untouched). ``/health`` needs no key."""

    def __init__(self, app, api_key: Optional[str], allowed_hosts: Optional[set]):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            err = self.check(Headers(scope=scope), scope["path"])
            if err is not None:
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def check(self, headers: Headers, path: str) -> Optional[APIError]:
        if self.allowed_hosts is not None:
            host = _host_name(headers.get("host", "")).lower()
            if host not in self.allowed_hosts:
                return APIError(400, f"this server only answers requests addressed to "
                                     f"127.0.0.1 or localhost, not {host!r} (start it with "
                                     "--api-key to serve other names)", code="invalid_host")
        if self.api_key is not None and path != "/health":
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not given:
                return APIError(401, "missing API key: send the header 'Authorization: "
                                     "Bearer KEY'", code="invalid_api_key")
            if not hmac.compare_digest(given.strip().encode(), self.api_key):
                return APIError(401, "incorrect API key", code="invalid_api_key")
        return None


# ---------------------------------------------------------------------------------------------
# Reading requests


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, limit: int) -> object:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
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
# The application


class Server:
    """The endpoints, bound to one Engine."""

    def __init__(self, engine, model_id: str, max_body: int):
        self.engine = engine
        self.model_id = model_id
        self.max_body = max_body
        self.started = int(time.time())

    def model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.started,
                "owned_by": "edgespec"}

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.model_id, "busy": self.engine.busy,
                             "waiting": self.engine.waiting})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, request: Request) -> Response:
        if request.path_params["model"] != self.model_id:
            raise APIError(404, f"the model {request.path_params['model']!r} does not exist; "
                                f"this server serves {self.model_id!r}", param="model",
                           code="model_not_found")
        return JSONResponse(self.model_card())

    async def chat_completions(self, request: Request) -> Response:
        body = await read_json(request, self.max_body)
        return await self.generate(request, parse_chat(body, self.engine.n_ctx))

    async def completions(self, request: Request) -> Response:
        body = await read_json(request, self.max_body)
        return await self.generate(request, parse_completion(body, self.engine.n_ctx))

    # -- generation -----------------------------------------------------------------------

    def _start(self, req: GenerationRequest):
        """Tokenize and queue (in a worker thread: chat templates and long prompts take time)."""
        try:
            return self.engine.astream(
                req.prompt, max_tokens=req.max_tokens, sampling=req.sampling, raw=req.raw,
                stop=req.stop, constraint=req.constraint, tools=req.tools,
                tool_choice=req.tool_choice, logprobs=req.logprobs,
                parallel_tool_calls=req.parallel_tool_calls)
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

    async def generate(self, request: Request, req: GenerationRequest) -> Response:
        gen = await run_in_threadpool(self._start, req)
        reply = Reply(req.kind, self.model_id)
        if req.stream:
            return StreamingResponse(self._events(gen, reply, req),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        result = await self._collect(request, gen, reply)
        if result.finish_reason == "cancelled":
            raise APIError(503, "the generation was cancelled: the server is shutting down",
                           type="server_error", code="cancelled")
        return JSONResponse(reply.response(result, self.engine.target.token_bytes))

    async def _collect(self, request: Request, gen, reply: Reply):
        """Run a whole generation, cancelling it if the client goes away meanwhile."""
        async def watch_disconnect() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gen.cancel()
            log.info("%s: client disconnected", reply.id)

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watch_disconnect)
                async for _ in gen:
                    pass
                tasks.cancel_scope.cancel()
        finally:
            gen.cancel()      # a no-op after the end; stops it if this task was cancelled
        _log_result(reply, gen.result)
        return gen.result

    async def _events(self, gen, reply: Reply, req: GenerationRequest) -> AsyncIterator[bytes]:
        """Server-sent events framed as OpenAI's: one id; the role in the first delta only;
        finish_reason in the last chunk; the usage chunk if asked; ``data: [DONE]``. A failure
        ends the stream with an error event instead. Starlette cancels this when the client
        disconnects, and the ``finally`` cancels the generation.

        A request that may call tools streams its answer once it is complete: the raw output
        is the call's JSON, and what it means (content, or ``tool_calls`` deltas) is known
        only at its end."""
        include_usage = req.include_usage
        spell = self.engine.target.token_bytes
        hold = bool(req.tools) and req.tool_choice != "none"
        finished = False
        try:
            yield sse(reply.chunk("", first=True, include_usage=include_usage))
            async for event in gen:
                if hold:
                    continue
                lp = reply.logprobs([event.logprob], spell) if event.logprob else None
                if event.text or lp:
                    yield sse(reply.chunk(event.text, include_usage=include_usage,
                                          logprobs=lp))
            result = gen.result
            if hold and result.finish_reason != "cancelled":
                if result.text:
                    yield sse(reply.chunk(result.text, include_usage=include_usage,
                                          logprobs=reply.logprobs(result.logprobs, spell)))
                if result.tool_calls:
                    yield sse(reply.chunk(None, include_usage=include_usage,
                                          tool_calls=result.tool_calls))
            _log_result(reply, result)
            if result.finish_reason == "cancelled":
                yield sse(APIError(503, "the generation was cancelled: the server is shutting "
                                        "down", type="server_error", code="cancelled").body())
                return
            yield sse(reply.final_chunk(result, include_usage))
            if include_usage:
                yield sse(reply.usage_chunk(result))
            yield b"data: [DONE]\n\n"
            finished = True
        except anyio.get_cancelled_exc_class():
            log.info("%s: client disconnected; generation cancelled", reply.id)
            raise
        except Exception as e:   # reported to the client, then logged
            log.error("%s: generation failed: %s", reply.id, e,
                      exc_info=not isinstance(e, EdgespecError))
            yield sse(APIError(500, f"the generation failed: {e}", type="server_error",
                               code="generation_failed").body())
        finally:
            if not finished:
                gen.cancel()


def _log_result(reply: Reply, gen) -> None:
    log.info("%s: %s, %d tokens · %s", reply.id, gen.finish_reason,
             gen.stats.completion_tokens, gen.stats.summary())


async def _api_error(request: Request, exc: APIError) -> Response:
    return error_response(exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        return error_response(APIError(404, f"no such endpoint: {request.method} "
                                            f"{request.url.path}", code="unknown_url"))
    if exc.status_code == 405:
        return error_response(APIError(405, f"{request.method} is not allowed on "
                                            f"{request.url.path}", code="method_not_allowed"))
    return error_response(APIError(exc.status_code, str(exc.detail)))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, f"internal error: {exc}", type="server_error",
                                   code="internal_error"))


def create_app(engine, *, model_id: str, api_key: Optional[str] = None,
               cors_origins: Sequence[str] = (), max_body: int = MAX_BODY_BYTES,
               host: str = "127.0.0.1") -> Starlette:
    """The server's ASGI app over ``engine`` (which the caller keeps and closes).

    ``host`` is the address it listens on: without ``api_key`` only requests addressed to it
    or to a loopback name are served.
    """
    server = Server(engine, model_id, max_body)
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.model, methods=["GET"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
    ]
    allowed_hosts = None if api_key else LOOPBACK_NAMES | {host.lower()}
    middleware = []
    if cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cors_origins),
                                     allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"],
                                     allow_credentials=False))
    middleware.append(Middleware(Guard, api_key=api_key, allowed_hosts=allowed_hosts))
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={APIError: _api_error, HTTPException: _http_error,
                                         Exception: _internal_error})
