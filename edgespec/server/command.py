"""``edgespec serve``: parse the options, check where to listen, load the pair, serve.

Imported whenever the command line is built, so it imports nothing of the HTTP stack at module
level; :func:`cmd_serve` does, when the command actually runs.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from pathlib import Path

from ..errors import EdgespecError
from ..shell import UsageError, add_model_args, load_engine, model_label, status

API_KEY_ENV = "EDGESPEC_API_KEY"
GRACEFUL_SHUTDOWN_SECONDS = 3


def build_serve_parser(sub) -> None:
    p = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server for local apps",
        description="Serve the pair over OpenAI's HTTP API (/v1/chat/completions, "
                    "/v1/completions, /v1/models, /health) on this machine.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any "
                        "other address needs --api-key)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument("--api-key", metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN (e.g. http://localhost:3000) call the "
                        "server; repeatable; none by default")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    add_model_args(p)
    p.set_defaults(func=cmd_serve)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_options(host: str, port: int, api_key: str | None, cors: list[str]) -> None:
    """The bind, key and CORS rules; raises :class:`UsageError` (one line) when broken."""
    if api_key is not None and not re.fullmatch(r"[!-~]+", api_key):
        raise UsageError("--api-key must be non-empty printable ASCII without spaces")
    if not is_loopback(host) and not api_key:
        raise UsageError(f"refusing to listen on {host or 'all addresses'} without an API key: "
                         "anyone who can reach it could use it; pass --api-key KEY (or set "
                         f"{API_KEY_ENV}), or keep the default --host 127.0.0.1")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port number (0-65535)")
    if "*" in cors and not api_key:
        raise UsageError("--cors-origin '*' would let any web page use this server: name the "
                         "origins, or pass --api-key")


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, so that a busy port is a one-line error before the models load."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def model_id(args) -> str:
    """The model name clients see: the pair, or the target file's name without .gguf."""
    return Path(args.target).name.removesuffix(".gguf") if args.target else model_label(args)


def _log_like_uvicorn(level: str) -> None:
    """The server's own lines (one per generation) in uvicorn's format, next to its lines."""
    from uvicorn.logging import DefaultFormatter
    handler = logging.StreamHandler()
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
    logger = logging.getLogger("edgespec.server")
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def cmd_serve(args) -> int:
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    check_options(args.host, args.port, api_key, args.cors_origin)
    try:
        import uvicorn

        from .app import create_app
    except ImportError as e:
        raise EdgespecError(f"the server needs the HTTP stack ({e.name} is not installed): "
                            "pip install 'edgespec[server]'") from None
    sock = listen(args.host, args.port)
    try:
        with load_engine(args) as engine:
            name = model_id(args)
            app = create_app(engine, model_id=name, api_key=api_key,
                             cors_origins=args.cors_origin, host=args.host)
            _log_like_uvicorn(args.log_level)
            config = uvicorn.Config(app, log_level=args.log_level, lifespan="off",
                                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
                                    server_header=False)
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            status(f"edgespec serve: listening on http://{shown}:{port}/v1 (model {name!r}"
                    + (", API key required" if api_key else "") + ")")
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
