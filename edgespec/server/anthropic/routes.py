"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``,
over the shared generation path (:mod:`..generation`); bodies are parsed by
:mod:`.request` and replies built by :mod:`.replies`.

Streams are server-sent events framed as Anthropic's (:class:`AnthropicFraming`):
``message_start`` (its usage counts the prompt), ``content_block_start`` of the text block,
``ping``, a ``content_block_delta`` (``text_delta``) per piece of text,
``content_block_stop``, ``message_delta`` (``stop_reason``, ``stop_sequence``, usage) and
``message_stop``. A request that may call tools streams its answer once it is complete: each
block whole (a ``tool_use`` block's input as one ``input_json_delta``). A failure ends the
stream with an ``error`` event. The key may come as ``x-api-key`` (the guard in :mod:`..app`
reads it beside ``Authorization: Bearer``); ``anthropic-version`` and ``anthropic-beta``
are accepted and not read: the wire format is the Messages API's of version 2023-06-01, and a
beta feature's fields are refused by name like any other edgespec does not have.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...results import Generation, StreamEvent
from .replies import (MessageReply, anthropic_error, block_delta, block_events,
                      block_stop, blocks, sse_event)
from .request import parse_count, parse_messages
from ..body import read_json
from ..framing import Framing
from ..generation import GenerationPath, Timing
from ..wire import APIError, asked

PING = sse_event("ping", {"type": "ping"})


def is_anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


class AnthropicFraming(Framing):
    """One reply in Anthropic's shape (:class:`~.replies.MessageReply`); ``held``:
    the answer is sent once complete (a request that may call tools); ``input_tokens``: the
    prompt's, for ``message_start``."""

    media_type = "text/event-stream"

    def __init__(self, reply: MessageReply, held: bool, input_tokens: int):
        self.reply, self.held, self.input_tokens = reply, held, input_tokens
        self.log_id = reply.id

    def opening(self) -> Sequence[bytes]:
        frames = [sse_event("message_start", {
            "type": "message_start", "message": self.reply.message(None, self.input_tokens)})]
        if not self.held:
            frames.append(sse_event("content_block_start", {
                "type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}))
        return frames + [PING]

    def event(self, event: StreamEvent) -> Optional[bytes]:
        return block_delta(0, {"type": "text_delta", "text": event.text}) if event.text \
            else None

    def closing(self, result: Generation, held: bool) -> Sequence[bytes]:
        frames = ([f for i, b in enumerate(blocks(result)) for f in block_events(i, b)]
                  if held else [block_stop(0)])
        return frames + [sse_event("message_delta", self.reply.delta(result)),
                         sse_event("message_stop", {"type": "message_stop"})]

    def error(self, err: APIError) -> bytes:
        return sse_event("error", anthropic_error(err)[1])

    def body(self, result: Generation) -> dict:
        return self.reply.message(result)


class AnthropicRoutes:
    """Anthropic's endpoints over ``path``'s models; bodies are checked against the context
    the model they name is served with, and ``max_body`` bytes."""

    def __init__(self, path: GenerationPath, max_body: int):
        self.path, self.max_body = path, max_body

    def routes(self) -> list[Route]:
        return [Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"])]

    async def messages(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body)
        req = parse_messages(body, self.path.context_for(asked(body, "model"), None))
        async with contextlib.AsyncExitStack() as leases:
            lease = await self.path.lease(leases, req.model)
            # message_start counts the prompt before the first token: tokenized once more
            # for a stream (milliseconds beside the generation)
            n = len(await self.path.prompt_tokens(lease, req)) if req.stream else 0
            framing = AnthropicFraming(MessageReply(req.model, req.generation.stop,
                                                    lease.engine.target.token_bytes),
                                       req.holds_answer, n)
            return await self.path.respond(request, leases, lease, req, framing, timing)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's tokens as ``/v1/messages`` would send them to the model (which is
        loaded for it, if it is not: only its tokenizer can count)."""
        body = await read_json(request, self.max_body)
        req = parse_count(body, self.path.context_for(asked(body, "model"), None))
        async with contextlib.AsyncExitStack() as leases:
            lease = await self.path.lease(leases, req.model)
            return JSONResponse({"input_tokens": len(await self.path.prompt_tokens(lease,
                                                                                   req))})
