"""How one API frames its replies to a generation: the interface the shared generation path
(:mod:`.generation`) calls, implemented once per API (OpenAI's server-sent events in
:mod:`.openai.routes`, Ollama's NDJSON in :mod:`.ollama.routes`, llama-server's events in
:mod:`.llamacpp.routes`).

A streamed reply is the frames of :meth:`Framing.opening`, a frame per stream event (or none:
:meth:`Framing.event`) until the generation ends or the framing has all it needs
(:meth:`Framing.ends`: the generation is stopped there), then :meth:`Framing.closing` once
the result is known, or :meth:`Framing.error` as the last frame when the generation fails or
is cancelled. A whole reply is :meth:`Framing.body` (an error is raised as
:class:`~.wire.APIError`, which the app answers in the API's shape). Another API is one more
implementation and its routes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional, Sequence

from ..results import Generation, StreamEvent
from .wire import APIError


class Framing(ABC):
    """The frames and bodies of one reply. ``media_type``: a stream's; ``log_id``: names the
    generation in the log."""

    media_type: str
    log_id: str

    def ends(self, event: StreamEvent) -> bool:
        """Whether the reply is complete with ``event`` (seen first, streamed or not, before
        :meth:`event`): the generation is then stopped, and the frames and body after it are
        the framing's to make (llama-server's ``n_indent`` and ``t_max_predict_ms``).
        Default: never; the generation ends by itself."""
        return False

    def opening(self) -> Sequence[bytes]:
        """Frames sent before the first token (none unless the API has some)."""
        return ()

    @abstractmethod
    def event(self, event: StreamEvent) -> Optional[bytes]:
        """The frame for one stream event, or None when it shows nothing (a token whose text
        is still incomplete)."""

    @abstractmethod
    def closing(self, result: Generation, held: bool) -> Sequence[bytes]:
        """The frames after the result: the whole answer first when the stream ``held`` it
        back (a request that may call tools: its meaning, text or calls, is known only at
        the end), then the API's end of a stream."""

    @abstractmethod
    def error(self, err: APIError) -> bytes:
        """The last frame of a stream that failed or was cancelled."""

    @abstractmethod
    def body(self, result: Generation) -> dict:
        """The whole reply, not streamed."""
