"""OpenAI's endpoints: ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``, over
the shared generation path (:mod:`..generation`; its embeddings: :mod:`.embeddings`); bodies
are parsed by :mod:`.request` and replies built by :mod:`.replies`.

Streams are server-sent events framed as OpenAI's (:class:`OpenAIFraming`): one id; the role
in the first delta only; finish_reason in the last chunk; the usage chunk if asked;
``data: [DONE]``. A failure ends the stream with an error event instead.
"""

from __future__ import annotations

import contextlib
import json
from typing import Callable, Optional, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...results import Generation, StreamEvent
from ..body import read_json
from ..framing import Framing
from ..generation import GenerationPath, Timing
from .request import parse_chat, parse_completion
from .replies import Reply, token_event
from ..models_info import contexts, template_label, thinks, where
from ..reply_fields import rfc3339
from ..wire import APIError, APIRequest, asked


def sse(body: dict) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() \
        + b"\n\n"


class OpenAIFraming(Framing):
    """One reply in OpenAI's shape (:class:`~.replies.Reply`); ``token_bytes(id)`` spells
    tokens for logprobs and the ``edgespec`` field of each chunk."""

    media_type = "text/event-stream"

    def __init__(self, reply: Reply, token_bytes: Callable[[int], bytes], include_usage: bool):
        self.reply, self.spell, self.include_usage = reply, token_bytes, include_usage
        self.log_id = reply.id

    def _chunk(self, text: Optional[str], **fields) -> bytes:
        return sse(self.reply.chunk(text, include_usage=self.include_usage, **fields))

    def opening(self) -> Sequence[bytes]:
        return [self._chunk("", first=True)]

    def event(self, event: StreamEvent) -> Optional[bytes]:
        lp = self.reply.logprobs([event.logprob], self.spell) if event.logprob else None
        if event.text or event.thinking or lp or event.round is not None:
            return self._chunk(event.text, logprobs=lp, thinking=event.thinking,
                               edgespec=token_event(event, self.spell))
        return None

    def closing(self, result: Generation, held: bool) -> Sequence[bytes]:
        frames = []
        if held and (result.text or result.thinking):
            frames.append(self._chunk(result.text, thinking=result.thinking,
                                      logprobs=self.reply.logprobs(result.logprobs, self.spell)))
        if held and result.tool_calls:
            frames.append(self._chunk(None, tool_calls=result.tool_calls))
        frames.append(sse(self.reply.final_chunk(result, self.include_usage)))
        if self.include_usage:
            frames.append(sse(self.reply.usage_chunk(result)))
        frames.append(b"data: [DONE]\n\n")
        return frames

    def error(self, err: APIError) -> bytes:
        return sse(err.body())

    def body(self, result: Generation) -> dict:
        return self.reply.response(result, self.spell)


class OpenAIRoutes:
    """OpenAI's endpoints over ``path``'s models; bodies are checked against the context
    their model will have and ``max_body`` bytes."""

    def __init__(self, path: GenerationPath, max_body: int):
        self.path, self.max_body = path, max_body

    def routes(self) -> list[Route]:
        return [Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model:path}", self.model, methods=["GET"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"])]

    def model_card(self, entry, anthropic: bool = False) -> dict:
        """A model as ``/v1/models`` lists it, with ``context_length`` (LM Studio's and
        Ollama's name; ``max_model_len``, vLLM's): the context it is loaded with, or would
        be loaded with (:func:`~..models_info.contexts`). ``anthropic``: Anthropic's fields
        too (``type``, ``display_name``, ``created_at``), for its clients."""
        n_ctx, draft_ctx = contexts(self.path.manager, entry)
        engine = self.path.manager.engine_for(entry.name)
        extra = {"type": "model", "display_name": entry.name,
                 "created_at": rfc3339(int(entry.modified * 1e9))} if anthropic else {}
        return {**extra, "id": entry.name, "object": "model", "created": int(entry.modified),
                "owned_by": "edgespec", "context_length": n_ctx, "max_model_len": n_ctx,
                "edgespec": {"kind": entry.kind, "draft": entry.draft.name if entry.draft
                             else None, "loaded": engine is not None,
                             "draft_context_length": draft_ctx,
                             "context_length_trained": entry.n_ctx_train or None,
                             "chat_template": template_label(entry, engine),
                             "thinking": thinks(entry, engine), **where(entry)}}

    async def models(self, request: Request) -> Response:
        cards = [self.model_card(e, _anthropic(request))
                 for e in self.path.manager.listing()]
        if not _anthropic(request):
            return JSONResponse({"object": "list", "data": cards})
        return JSONResponse({"data": cards, "has_more": False,       # Anthropic's list shape
                             "first_id": cards[0]["id"] if cards else None,
                             "last_id": cards[-1]["id"] if cards else None})

    async def model(self, request: Request) -> Response:
        return JSONResponse(self.model_card(self.path.resolve(request.path_params["model"]),
                                            _anthropic(request)))

    async def chat_completions(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body)
        return await self._generate(request, parse_chat(body, self._context(body)), timing)

    async def completions(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body)
        return await self._generate(request, parse_completion(body, self._context(body)),
                                    timing)

    def _context(self, body) -> int:
        return self.path.context_for(asked(body, "model"), asked(body, "num_ctx"))

    async def _generate(self, request: Request, req: APIRequest, timing: Timing) -> Response:
        async with contextlib.AsyncExitStack() as leases:
            lease = await self.path.lease(leases, req.model, n_ctx=req.num_ctx)
            template = lease.engine.template if req.kind == "chat" else None
            framing = OpenAIFraming(Reply(req.kind, lease.name, template),
                                    lease.engine.target.token_bytes, req.include_usage)
            return await self.path.respond(request, leases, lease, req, framing, timing)


def _anthropic(request: Request) -> bool:
    """Whether an Anthropic client asks (its SDK sends ``anthropic-version`` on every call):
    ``/v1/models`` then answers in Anthropic's shape, a superset of OpenAI's cards."""
    return "anthropic-version" in request.headers
