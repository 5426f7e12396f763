"""``edgespec serve``: a local HTTP server for OpenAI's, Ollama's and Anthropic's clients, over
the models on this disk (one loaded at start, the others when a request names one).

``command`` parses the command line and starts the server; ``app`` is the ASGI application
(Starlette, served by uvicorn): the routes of each API over one generation path
(``generation``). Each API has its package: ``openai``, ``ollama``, ``anthropic`` and
``llamacpp`` (llama-server's ``/infill``), each with its request parser (``request``, over
``wire``), its replies (``replies``), both plain Python, and its routes (``routes``); OpenAI's
and Ollama's embedding routes (``embeddings``) share the path in ``embeddings``. An API's
package imports the shared modules beside it and never another API's; only ``app`` imports
them, to mount their routes and answer errors in their shapes. This package is the only part of
edgespec that imports the HTTP stack: the modules that answer HTTP (``app``, the routes,
``generation``, ``body``, ``page``) import it, and ``command`` only when it serves, so building
the command line never loads it.
"""
