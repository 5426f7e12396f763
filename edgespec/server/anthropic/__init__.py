"""Anthropic's Messages API: its request bodies (``request``), its replies (``replies``) and its
routes (``routes``), over the server's shared modules. It imports no other API's package."""
