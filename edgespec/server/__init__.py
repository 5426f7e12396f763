"""``edgespec serve``: a local HTTP server for OpenAI's, Ollama's and Anthropic's clients, over
the models on this disk (one loaded at start, the others when a request names one).

``command`` parses the command line and starts the server; ``app`` is the ASGI application
(Starlette, served by uvicorn): the routes of each API (``openai``, ``ollama``,
``ollama_models``, ``anthropic``, ``embeddings``) over one generation path (``generation``).
The request parsers (``protocol``, ``ollama_request``, ``anthropic_request``,
``embed_request``, over ``wire``) and the replies (``replies``, ``ollama_replies``,
``anthropic_replies``) are plain Python. This package is the only part of edgespec that
imports the HTTP stack: the modules that answer HTTP (``app``, the routes, ``generation``,
``body``, ``page``) import it, and ``command`` only when it serves, so building the command
line never loads it.
"""
