"""Anthropic's Messages API replies: the whole message, the events of a stream, and errors.
Plain Python.

A message's ``content`` is a ``text`` block (when the answer has text, or calls no tool),
then a ``tool_use`` block per call; ``stop_reason`` is ``end_turn``, ``max_tokens`` (the
budget or the context's edge), ``stop_sequence`` (``stop_sequence`` names the one met) or
``tool_use``; ``usage`` counts ``input_tokens`` (the whole prompt) and ``output_tokens``.
Every message, and the ``message_delta`` event of a stream, also has the ``edgespec`` field
(how speculation did), which Anthropic's clients ignore.
"""

from __future__ import annotations

import json
import uuid
from typing import Callable, Optional, Sequence

from ...results import Generation
from ..reply_fields import speculation
from ..wire import APIError

# HTTP status -> Anthropic's error type (any other 5xx: api_error)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
OVERLOADED_STATUS = 529        # Anthropic's status for overloaded_error
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}


def anthropic_error(err: APIError) -> tuple[int, dict]:
    """(status, body) of ``err`` in Anthropic's shape: ``{"type": "error", "error": {"type",
    "message"}}``; a server that is shutting down (503) answers 529, ``overloaded_error``,
    as Anthropic does when it cannot take a request now."""
    kind = ERROR_TYPES.get(err.status, "api_error" if err.status >= 500
                           else "invalid_request_error")
    status = OVERLOADED_STATUS if kind == "overloaded_error" else err.status
    return status, {"type": "error", "error": {"type": kind, "message": err.message}}


def sse_event(name: str, body: dict) -> bytes:
    """One server-sent event as Anthropic frames them: its name, then its JSON."""
    return (f"event: {name}\ndata: ".encode()
            + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")


def matched_stop(text: str, stops: Sequence[str]) -> Optional[str]:
    """The stop sequence that ended ``text`` (the whole output, the stop sequence
    included), as :class:`~edgespec.textstream.TextAssembler` finds it: the one found
    first; None when none is in it."""
    hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    return min(hits, key=lambda hit: hit[0])[1] if hits else None


class MessageReply:
    """What every frame and body of one reply shares: its id, the model's name, the stop
    sequences asked for, and ``token_bytes`` to spell the output's tokens (to find the stop
    sequence the generation met)."""

    def __init__(self, model: str, stops: Sequence[str], token_bytes: Callable[[int], bytes]):
        self.id = "msg_" + uuid.uuid4().hex
        self.model, self.stops, self.spell = model, tuple(stops), token_bytes

    def stop(self, result: Generation) -> tuple[str, Optional[str]]:
        """(stop_reason, stop_sequence) of a finished generation."""
        if result.finish_reason != "stop" or not self.stops:
            return _STOP_REASONS.get(result.finish_reason, "end_turn"), None
        output = b"".join(self.spell(t) for t in result.tokens).decode("utf-8", "replace")
        sequence = matched_stop(output, self.stops)
        return ("stop_sequence" if sequence is not None else "end_turn"), sequence

    def message(self, result: Optional[Generation], input_tokens: int = 0) -> dict:
        """The whole message (``result`` None: the empty one a stream starts with)."""
        if result is None:
            return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": 0}}
        reason, sequence = self.stop(result)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": blocks(result), "stop_reason": reason, "stop_sequence": sequence,
                "usage": usage(result), "edgespec": speculation(result.stats)}

    def delta(self, result: Generation) -> dict:
        """A stream's ``message_delta`` event: how it stopped, and the usage."""
        reason, sequence = self.stop(result)
        return {"type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage(result), "edgespec": speculation(result.stats)}


def usage(result: Generation) -> dict:
    return {"input_tokens": result.stats.prompt_tokens,
            "output_tokens": result.stats.completion_tokens}


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic writes them (``toolu_…``); a tool_result quotes it back."""
    return "toolu_" + call_id.removeprefix("call_")


def blocks(result: Generation) -> list[dict]:
    """The content blocks of a finished generation (see the module docstring)."""
    out: list[dict] = []
    if result.text or not result.tool_calls:
        out.append({"type": "text", "text": result.text})
    out += [{"type": "tool_use", "id": tool_use_id(c.id), "name": c.name,
             "input": c.parsed_arguments} for c in result.tool_calls]
    return out


def block_events(index: int, block: dict) -> list[bytes]:
    """A whole content block streamed as one: its start (empty), one delta, its stop."""
    if block["type"] == "text":
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    else:
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta",
                 "partial_json": json.dumps(block["input"], ensure_ascii=False)}
    frames = [sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": start})]
    if delta.get("text") != "":
        frames.append(block_delta(index, delta))
    frames.append(block_stop(index))
    return frames


def block_delta(index: int, delta: dict) -> bytes:
    return sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": delta})


def block_stop(index: int) -> bytes:
    return sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
