"""The ASGI application: OpenAI's, Ollama's and Anthropic's endpoints, and llama-server's
``/infill`` for editors' autocomplete, over the models on this machine (Starlette, served by
uvicorn).

Every request that generates names a model (``model``); the :class:`~.models.ModelManager`
loads it on first use (its registered draft with it), unloads idle ones when its budget says
so, and refuses a name that is not on disk with a 404 that names ``edgespec pull``: no request
is answered by another model than it named (``--model-alias`` maps names explicitly). The APIs
go the same way: their routes (:mod:`.openai.routes`, :mod:`.ollama.routes`,
:mod:`.anthropic.routes`, :mod:`.llamacpp.routes`) check the body (:mod:`.openai.request`,
:mod:`.ollama.request`, :mod:`.anthropic.request`, :mod:`.llamacpp.request`), and one path
(:mod:`.generation`) leases the model, queues the generation on its Engine, frames the answer
in the API's :class:`~.framing.Framing` (OpenAI's server-sent events, Ollama's NDJSON,
Anthropic's named events, llama-server's events) and counts the figures (:mod:`.metrics`, with
``--metrics``). Embeddings (``/api/embed``, ``/api/embeddings``: :mod:`.ollama.embeddings`;
``/v1/embeddings``: :mod:`.openai.embeddings`) lease models the same way (:mod:`.embeddings`).
This module wires the routes, the guards and the error handlers.

Requests queue for an Engine (first come, first served; one generation at a time) while the
event loop stays free: each generation runs in a thread of its own
(:class:`~edgespec.engine.streams.AsyncStream`), and loading a model runs in a worker thread, so
``/health`` answers during a long generation or a load. A client that goes away cancels its
generation, whether it was streaming, waiting for a whole response or still queued: the
generation stops within one decoding step.

``GET /`` is a chat page (:mod:`.page`) that uses the OpenAI endpoints and shows how
speculation did from the stream's ``edgespec`` fields.

Guards, before any endpoint: a request without the API key (when there is one: as a bearer
token, or as ``x-api-key``, which Anthropic's clients send) gets 401,
except for ``/health`` and the page's files, which hold no secret (the page asks for the key
when the API answers 401); with no key, only loopback ``Host`` names are served (so a web
page cannot reach the server through DNS rebinding), and OpenAI bodies must be sent as
``application/json`` (a page's plain form post is refused before it can start a generation).
Ollama's clients (and its documentation's ``curl -d``) send JSON without that header, so
``/api/`` bodies are read whatever their type. A request a browser sends from a page (it
carries ``Origin``) that generates or changes something (any method but GET, HEAD and
OPTIONS, ``/v1`` and ``/api`` alike) is served only from the server's own page (the same
origin) or an origin ``cors_origins`` lets in (``--allow-origin``: exact, or patterns with
``*``, :mod:`.origins`). No CORS headers are sent unless ``cors_origins`` names origins, and
never with credentials. Errors come in
the shape of the API asked: OpenAI's ``{"error": {"message", "type", "param", "code"}}``,
Ollama's ``{"error": message}``, Anthropic's ``{"type": "error", "error": {"type",
"message"}}``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
from typing import Optional, Sequence

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import page
from .anthropic.routes import AnthropicRoutes, is_anthropic
from .anthropic.replies import anthropic_error
from .generation import INDEX_KEY, GenerationPath
from .llamacpp.routes import LlamaCppRoutes
from ..catalogue import entry_for
from .models import ModelManager
from .ollama.embeddings import OllamaEmbeddingRoutes
from .ollama.routes import OllamaRoutes
from .ollama.model_routes import OllamaModelRoutes
from .ollama.replies import ollama_error_body
from .openai.embeddings import OpenAIEmbeddingRoutes
from .openai.routes import OpenAIRoutes
from .origins import Origins, same_origin
from .wire import APIError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}


def is_ollama(path: str) -> bool:
    return path.startswith("/api/")


def error_response(err: APIError, path: str = "", method: str = "") -> JSONResponse:
    """``err`` in the shape of the API ``path`` belongs to, logged (:func:`log_error`): every
    error the server answers comes through here."""
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    status, body = err.status, err.body()
    if is_ollama(path):
        body = ollama_error_body(err)
    elif is_anthropic(path):
        status, body = anthropic_error(err)
    log_error(err, path, method, status)
    return JSONResponse(body, status_code=status, headers=headers)


MAX_LOGGED = 500             # characters of an error's message in its log line


def _printable(text: str, limit: int = MAX_LOGGED) -> str:
    """``text`` on one line, without control characters (a client's newline cannot forge log
    lines), cut at ``limit`` characters."""
    text = "".join(c if c.isprintable() else " " for c in text)
    return text if len(text) <= limit else text[:limit] + "…"


def log_error(err: APIError, path: str, method: str, status: int) -> None:
    """One line for an error answered: the route, the status, the error's code and message
    (``POST /api/chat 400 invalid_value: …``), at INFO (4xx) or WARNING (5xx); uvicorn's
    access line has only the status. Never the request's body: the message is what the
    client is told."""
    log.log(logging.WARNING if status >= 500 else logging.INFO, "%s %s %d %s: %s",
            method or "-", _printable(path, 200), status, err.code or err.type,
            _printable(err.message))


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

    def __init__(self, app, api_key, allowed_hosts: Optional[set],
                 shared_index: bool = False):
        self.app = app
        keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
        self.keys = [k.encode() for k in keys if k]
        self.allowed_hosts = allowed_hosts
        # Each key's requests draft from its own suffix index, unless the operator shares one.
        self.per_key = len(self.keys) > 1 and not shared_index

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            err = self.check(headers, scope["path"])
            if err is not None:
                await error_response(err, scope["path"], scope["method"])(scope, receive, send)
                return
            if self.per_key and needs_key(scope["path"]):
                scope[INDEX_KEY] = hashlib.sha256(_given_key(headers).encode()).hexdigest()
        await self.app(scope, receive, send)

    def check(self, headers: Headers, path: str) -> Optional[APIError]:
        if self.allowed_hosts is not None:
            host = _host_name(headers.get("host", "")).lower()
            if host not in self.allowed_hosts:
                return APIError(400, f"this server only answers requests addressed to "
                                     f"127.0.0.1 or localhost, not {host!r} (start it with "
                                     "--api-key to serve other names)", code="invalid_host")
        if self.keys and needs_key(path):
            given = _given_key(headers)
            if not given:
                return APIError(401, "missing API key: send the header 'Authorization: "
                                     "Bearer KEY' (or 'x-api-key: KEY')",
                                code="invalid_api_key")
            # every key compared, so that the time taken does not tell which one came close
            if sum(hmac.compare_digest(given.encode(), k) for k in self.keys) == 0:
                return APIError(401, "incorrect API key", code="invalid_api_key")
        return None


def _given_key(headers: Headers) -> str:
    """The API key a request sends: ``x-api-key`` (Anthropic's clients), else ``Authorization:
    Bearer``; "" when none."""
    given = headers.get("x-api-key", "")
    if not given.strip():
        scheme, _, given = headers.get("authorization", "").partition(" ")
        given = given if scheme.lower() == "bearer" else ""
    return given.strip()


class OriginGuard:
    """A request a browser sends from a web page carries ``Origin``: one that generates or
    changes something (any method but GET, HEAD and OPTIONS, on every route) is served only
    from the server's own page (the same origin) or an origin ``--allow-origin`` lets in
    (:class:`~.origins.Origins`), so a page elsewhere cannot start a generation, a pull or a
    deletion, with a form or a script, whatever the body's type (403)."""

    def __init__(self, app, origins: Origins):
        self.app, self.origins = app, origins

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            headers = Headers(scope=scope)
            origin = headers.get("origin")
            if origin is not None and not self.origins.allows(origin) and not same_origin(
                    origin, scope.get("scheme", "http"), headers.get("host", "")):
                err = APIError(403, f"requests from the web page at {origin} are not served: "
                                    f"start the server with --allow-origin {origin} to allow "
                                    "it", code="origin_not_allowed")
                await error_response(err, scope["path"], scope["method"])(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
# Endpoints of the server itself, and errors


def health_endpoint(manager: ModelManager):
    """``GET /health``: whether the server answers, and what its models are doing (no key
    needed, and never queued behind a generation)."""
    async def health(request: Request) -> Response:
        engine = manager.engine_for(None)
        lanes = engine.lanes if engine is not None else None
        return JSONResponse({"status": "ok", "model": manager.default,
                             "busy": bool(lanes and lanes.running),
                             "running": len(lanes.running) if lanes else 0,
                             "parallel": lanes.contexts if lanes else 0,
                             "streams": lanes.n if lanes else 0,
                             "waiting": lanes.waiting if lanes else 0,
                             "loaded": [{"name": m.name, "in_use": m.in_use}
                                        for m in manager.loaded()]})
    return health


def metrics_endpoint(metrics):
    """``GET /metrics``: ``metrics`` in Prometheus' text format."""
    async def metrics_text(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)
    return metrics_text


async def _api_error(request: Request, exc: APIError) -> Response:
    return error_response(exc, request.url.path, request.method)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    path, method = request.url.path, request.method
    if exc.status_code == 404:
        hint = (" (edgespec serves /api/chat, /api/generate, /api/embed, /api/embeddings, "
                "/api/tags, /api/show, /api/ps, /api/version, /api/pull, /api/delete and "
                "/api/copy)") if is_ollama(path) else ""
        return error_response(APIError(404, f"no such endpoint: {method} {path}{hint}",
                                       code="unknown_url"), path, method)
    if exc.status_code == 405:
        return error_response(APIError(405, f"{method} is not allowed on {path}",
                                       code="method_not_allowed"), path, method)
    return error_response(APIError(exc.status_code, str(exc.detail)), path, method)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, f"internal error: {exc}", type="server_error",
                                   code="internal_error"), request.url.path, request.method)


def single_model(engine, name: str) -> ModelManager:
    """A manager that serves ``engine`` alone, under ``name`` (an app embedding one Engine)."""
    entry = entry_for(name, engine.target.path,
                      engine.draft.path if engine.draft is not None else None)
    return ModelManager(lambda: {name: entry}, lambda e, n_ctx: engine,
                        preloaded=(name, engine), keep_alive=-1, max_ctx=engine.n_ctx)


def create_app(engine=None, *, model_id: Optional[str] = None,
               manager: Optional[ModelManager] = None, api_key: Optional[str] = None,
               cors_origins: Sequence[str] = (), max_body: int = MAX_BODY_BYTES,
               host: str = "127.0.0.1", metrics=None, n_ctx: Optional[int] = None,
               close_on_shutdown: bool = False, shared_index: bool = False) -> Starlette:
    """The server's ASGI app over ``manager``'s models, or over one ``engine`` served as
    ``model_id`` (the caller keeps and closes either).

    ``host`` is the address it listens on: without ``api_key`` only requests addressed to it
    or to a loopback name are served. ``metrics``: a :class:`~.metrics.Metrics` to count
    into and serve at ``/metrics`` (None: no ``/metrics``). ``n_ctx``: the context the
    manager's models are loaded with when a request asks for no more (default: the
    engine's; a manager that has its own keeps it). ``close_on_shutdown``: the
    app's lifespan closes the manager's models when the server stops (run it with
    ``lifespan="on"``). ``api_key``: one key, or several (each key's requests then draft from
    their own suffix index of earlier requests, unless ``shared_index``). ``cors_origins``:
    the origins whose web pages may call it (``--allow-origin``: exact, or patterns with ``*``;
    ``*`` alone: any), beside its own page.
    """
    if manager is None:
        if engine is None or model_id is None:
            raise TypeError("create_app needs an engine and its model_id, or a manager")
        manager = single_model(engine, model_id)
    n_ctx = n_ctx or (engine.n_ctx if engine is not None else None)
    if n_ctx is None:
        raise TypeError("create_app needs n_ctx with a manager")
    manager.contexts.default = manager.contexts.default or n_ctx
    path = GenerationPath(manager, metrics)
    routes = [
        Route("/", page.index, methods=["GET", "HEAD"]),
        Route("/web/{file}", page.asset, methods=["GET", "HEAD"]),
        Route("/health", health_endpoint(manager), methods=["GET"]),
        *OpenAIRoutes(path, max_body).routes(),
        *OllamaRoutes(path, max_body).routes(),
        *AnthropicRoutes(path, max_body).routes(),
        *LlamaCppRoutes(path, max_body).routes(),
        *OllamaModelRoutes(path, max_body).routes(),
        *OllamaEmbeddingRoutes(path, max_body).routes(),
        *OpenAIEmbeddingRoutes(path, max_body).routes(),
    ]
    if metrics is not None:
        routes.append(Route("/metrics", metrics_endpoint(metrics), methods=["GET"]))
    allowed_hosts = None if api_key else LOOPBACK_NAMES | {host.lower()}
    middleware = []
    if metrics is not None:
        middleware.append(Middleware(CountRequests, metrics=metrics,
                                     routes=[r.path for r in routes]))
    origins = Origins(cors_origins)
    if origins:
        middleware.append(Middleware(CORSMiddleware,
                                     allow_origins=["*"] if origins.every else origins.exact,
                                     allow_origin_regex=origins.regex,
                                     allow_methods=["GET", "POST", "DELETE"],
                                     allow_headers=["Authorization", "Content-Type",
                                                    "x-api-key", "anthropic-version",
                                                    "anthropic-beta"],
                                     allow_credentials=False))
    middleware.append(Middleware(Guard, api_key=api_key, allowed_hosts=allowed_hosts,
                                 shared_index=shared_index))
    middleware.append(Middleware(OriginGuard, origins=origins))
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
