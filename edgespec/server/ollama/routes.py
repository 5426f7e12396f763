"""Ollama's endpoints: ``/api/chat``, ``/api/generate``, ``/api/tags``, ``/api/show``,
``/api/ps`` and ``/api/version``, over the shared generation path (:mod:`..generation`;
its embeddings: :mod:`.embeddings`);
bodies are parsed by :mod:`.request` and replies built by :mod:`.replies`.

Streams are Ollama's newline-delimited JSON (:class:`OllamaFraming`): an object per piece of
text, then the final one with the figures; a failure ends the stream with
``{"error": …}``, as Ollama's does. A request with no messages (or an empty prompt) loads the
model, and with ``keep_alive: 0`` unloads it, as Ollama's API does.
"""

from __future__ import annotations

import contextlib
import json
from typing import Optional, Sequence

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...gguf_file import read_gguf
from ...results import Generation, StreamEvent
from ..body import read_json
from ..framing import Framing
from ..generation import GenerationPath, Timing
from .replies import (OllamaReply, ollama_error_body, ps_body, show_body, tags_body,
                      version_body)
from .request import OllamaRequest, parse_ollama_chat, parse_ollama_generate
from ..models_info import contexts, fills_middle, thinks
from ..wire import APIError, asked


def ndjson(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class OllamaFraming(Framing):
    """One ``/api/chat`` or ``/api/generate`` reply in Ollama's shape
    (:class:`~.replies.OllamaReply`); the final object's durations run from
    ``timing``'s start, and include ``load_seconds`` spent loading the model."""

    media_type = "application/x-ndjson"

    def __init__(self, reply: OllamaReply, timing: Timing, load_seconds: float):
        self.reply, self.timing, self.load_seconds = reply, timing, load_seconds
        self.log_id = f"ollama-{reply.kind}"

    def event(self, event: StreamEvent) -> Optional[bytes]:
        lp = [event.logprob] if event.logprob else None
        if event.text or event.thinking or lp:
            return ndjson(self.reply.chunk(event.text, logprobs=lp, thinking=event.thinking))
        return None

    def closing(self, result: Generation, held: bool) -> Sequence[bytes]:
        frames = []
        if held and (result.text or result.tool_calls or result.thinking):
            frames.append(ndjson(self.reply.chunk(result.text, logprobs=result.logprobs,
                                                  tool_calls=result.tool_calls or (),
                                                  thinking=result.thinking)))
        frames.append(ndjson(self._final(result, streamed=True)))
        return frames

    def error(self, err: APIError) -> bytes:
        return ndjson(ollama_error_body(err))

    def body(self, result: Generation) -> dict:
        return self._final(result, streamed=False)

    def _final(self, result: Generation, streamed: bool) -> dict:
        return self.reply.final(result, total_seconds=self.timing.seconds,
                                load_seconds=self.load_seconds, streamed=streamed)


class OllamaRoutes:
    """Ollama's endpoints over ``path``'s models; bodies are checked against the context
    their model will have (``options.num_ctx`` asks for one) and ``max_body`` bytes."""

    def __init__(self, path: GenerationPath, max_body: int):
        self.path, self.max_body = path, max_body
        self.manager = path.manager

    def routes(self) -> list[Route]:
        return [Route("/api/version", self.version, methods=["GET"]),
                Route("/api/tags", self.tags, methods=["GET"]),
                Route("/api/ps", self.ps, methods=["GET"]),
                Route("/api/show", self.show, methods=["POST"]),
                Route("/api/chat", self.chat, methods=["POST"]),
                Route("/api/generate", self.generate, methods=["POST"])]

    async def version(self, request: Request) -> Response:
        return JSONResponse(version_body())

    async def tags(self, request: Request) -> Response:
        return JSONResponse(tags_body(self.manager.listing()))

    async def ps(self, request: Request) -> Response:
        return JSONResponse(ps_body(self.manager.loaded()))

    async def show(self, request: Request) -> Response:
        body = await read_json(request, self.max_body, any_type=True)
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise APIError(400, "model is required: the name of a model /api/tags lists",
                           param="model")
        entry = self.path.resolve(name)
        engine = self.manager.engine_for(entry.name)
        if engine is not None and entry.kind != "embedding":
            info, template = engine.info(), engine.template.source or ""
        else:      # not loaded: what its file says (no load for a look)
            gguf = await run_in_threadpool(read_gguf, entry.target)
            info, template = {}, gguf.chat_template or ""
        fills = await run_in_threadpool(fills_middle, entry, engine)
        choice = getattr(engine, "draft_choice", None)      # (a draft chosen for it here)
        return JSONResponse(show_body(entry, info, template, contexts(self.manager, entry),
                                      thinks(entry, engine), fills,
                                      choice.describe() if choice is not None else None))

    async def chat(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body, any_type=True)
        return await self._generate(request, parse_ollama_chat(body, self._context(body)),
                                    "chat", timing)

    async def generate(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body, any_type=True)
        return await self._generate(request, parse_ollama_generate(body, self._context(body)),
                                    "generate", timing)

    def _context(self, body) -> int:
        return self.path.context_for(asked(body, "model"), asked(body, "options", "num_ctx"))

    async def _generate(self, request: Request, oreq: OllamaRequest, kind: str,
                        timing: Timing) -> Response:
        if oreq.load_only and oreq.keep_alive == 0:       # Ollama's way to unload a model
            entry = self.path.resolve(oreq.model)
            await self.manager.unload(entry.name)
            return JSONResponse(OllamaReply(kind, entry.name).loaded(unloaded=True))
        async with contextlib.AsyncExitStack() as leases:
            lease = await self.path.lease(leases, oreq.model, oreq.keep_alive, oreq.num_ctx)
            if oreq.load_only:
                return JSONResponse(OllamaReply(kind, oreq.model).loaded())
            req = oreq.gen
            reply = OllamaReply(kind, oreq.model, lease.engine.target.token_bytes,
                                lease.engine.template if req.kind == "chat" else None)
            framing = OllamaFraming(reply, timing, lease.load_seconds)
            return await self.path.respond(request, leases, lease, req, framing, timing)
