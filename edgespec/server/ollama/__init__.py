"""Ollama's API: its request bodies (``request``) and their ``options`` (``options``), its replies
and listings (``replies``), its generating and listing routes (``routes``), its embeddings
(``embeddings``) and its model management (``model_routes``: pull, delete, copy), over the
server's shared modules. It imports no other API's package."""
