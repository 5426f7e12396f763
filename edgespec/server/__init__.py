"""``edgespec serve``: a local, OpenAI-compatible HTTP server over one Engine.

``command`` parses the command line and starts the server; ``protocol`` is the OpenAI wire
format (request validation, response and chunk bodies) in plain Python; ``app`` is the ASGI
application (Starlette, served by uvicorn). This package is the only part of edgespec that
imports the HTTP stack, and only ``app`` and the body of ``command.cmd_serve`` do, so building
the command line never loads it.
"""
