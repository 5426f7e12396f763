"""OpenAI's API: its request bodies (``request``), its replies (``replies``), its routes
(``routes``) and its embeddings (``embeddings``), over the server's shared modules. It imports
no other API's package."""
