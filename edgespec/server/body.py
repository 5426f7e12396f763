"""A request's body read as JSON: bounded in size, typed, never a 422 or a 500."""

from __future__ import annotations

import json

from starlette.requests import Request

from .wire import APIError


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
