"""llama-server's ``POST /infill``: code completion for editors' autocomplete plugins
(llama.vscode, llama.vim), over the shared generation path (:mod:`..generation`); bodies are
parsed by :mod:`.request` and replies built by :mod:`.replies`.

The prompt is llama.cpp's infill format (:meth:`~edgespec.engine.prompting.Prompter.infill`):
the other files first (in the repo-level format where the model has its tokens), then the
model's fill-in-the-middle tokens around the prefix and the suffix, cut to fit the context as
llama.cpp cuts it; it is drafted and verified as any other prompt (n-gram drafts find the
file's own repetitions in it). A model without fill-in-the-middle tokens is a 400 that says
so. Streams are llama-server's server-sent events (:class:`InfillFraming`): ``data: {…}``
per piece of text with ``"stop": false``, then one with ``"stop": true`` and the totals; a
failure ends the stream with an ``error: {…}`` event. An editor that gives up on a request
(it closes the connection) cancels the generation, as on every route.
"""

from __future__ import annotations

import contextlib
import json
from typing import Optional, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...results import Generation, StreamEvent
from ..body import read_json
from ..framing import Framing
from ..generation import GenerationPath, Timing
from .replies import Cutoff, InfillReply
from .request import InfillRequest, parse_infill
from ..wire import APIError, asked


def event_frame(name: str, body: dict) -> bytes:
    return name.encode() + b": " + json.dumps(body, ensure_ascii=False,
                                              separators=(",", ":")).encode() + b"\n\n"


class InfillFraming(Framing):
    """One ``/infill`` reply in llama-server's shape; ``cut`` ends it where llama-server
    would (``n_indent``, ``t_max_predict_ms``, ``n_predict`` 0)."""

    media_type = "text/event-stream"

    def __init__(self, reply: InfillReply, cut: Cutoff):
        self.reply, self.cut = reply, cut
        self.log_id = f"infill-{id(self):x}"

    def ends(self, event: StreamEvent) -> bool:
        return self.cut.push(event)

    def event(self, event: StreamEvent) -> Optional[bytes]:
        piece = self.cut.piece
        return event_frame("data", self.reply.chunk(piece, event.token)) if piece else None

    def closing(self, result: Generation, held: bool) -> Sequence[bytes]:
        return [event_frame("data", self.reply.final(result, self.cut, streamed=True))]

    def error(self, err: APIError) -> bytes:
        return event_frame("error", err.body())

    def body(self, result: Generation) -> dict:
        return self.reply.final(result, self.cut, streamed=False)


class LlamaCppRoutes:
    """llama-server's endpoints over ``path``'s models (``/infill``); bodies are checked
    against the context their model will have and ``max_body`` bytes."""

    def __init__(self, path: GenerationPath, max_body: int):
        self.path, self.max_body = path, max_body

    def routes(self) -> list[Route]:
        return [Route("/infill", self.infill, methods=["POST"])]

    async def infill(self, request: Request) -> Response:
        timing = Timing()
        body = await read_json(request, self.max_body)
        ireq = parse_infill(body, self.path.context_for(asked(body, "model"), None))
        async with contextlib.AsyncExitStack() as leases:
            lease = await self.path.lease(leases, ireq.gen.model)
            target = lease.engine.target
            if target.vocab.fim is None:
                raise no_fim(lease.name)
            framing = InfillFraming(InfillReply(lease.name, ireq, target.token_bytes),
                                    cutoff(ireq))
            return await self.path.respond(request, leases, lease, ireq.gen, framing, timing)


def cutoff(ireq: InfillRequest) -> Cutoff:
    return Cutoff(ireq.n_predict, ireq.n_indent, ireq.t_max_predict_ms)


def no_fim(model: str) -> APIError:
    return APIError(400, f"infill is not supported by the model '{model}': its vocabulary has "
                         "no fill-in-the-middle tokens; name a code model that has them, such "
                         "as Qwen2.5-Coder, in 'model' (or serve one with --target)",
                    param="model", code="model_not_supported")
