"""The chat page the server answers ``GET /`` with: plain HTML, CSS and JavaScript shipped in
the package (``edgespec/server/web/``, read with :mod:`importlib.resources`), no build step
and nothing fetched from elsewhere. The page talks to the server's own OpenAI endpoints and
draws how speculation did from the ``edgespec`` fields of the stream.

Every file is served with a strict Content-Security-Policy: scripts, styles and connections
from this origin only, no inline script or style, no framing, no form posts, so that what
the page shows (model output included) can never run as code.
"""

from __future__ import annotations

from importlib import resources
from typing import Optional

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
# The media type of each kind of file the page is made of; other files are not served.
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def _read(name: str) -> Optional[bytes]:
    """The bytes of ``web/<name>``, or None if the package has no such file (or it is not
    of a kind the page serves)."""
    if "/" in name or "\\" in name or name.startswith(".") \
            or not any(name.endswith(suffix) for suffix in MEDIA_TYPES):
        return None
    path = resources.files(__package__).joinpath("web", name)
    return path.read_bytes() if path.is_file() else None


def _file_response(name: str) -> Response:
    body = _read(name)
    if body is None:
        raise HTTPException(404)
    media = next(m for suffix, m in MEDIA_TYPES.items() if name.endswith(suffix))
    return Response(body, media_type=media, headers=SECURITY_HEADERS)


async def index(request: Request) -> Response:
    """``GET /``: the chat page."""
    return _file_response("index.html")


async def asset(request: Request) -> Response:
    """``GET /web/{file}``: the page's script, style sheet and icon (404 for anything else)."""
    return _file_response(request.path_params["file"])
