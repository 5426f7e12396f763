"""llama-server's ``/infill`` (editors' autocomplete): its request bodies (``request``), its
replies (``replies``) and its route (``routes``), over the server's shared modules. It imports
no other API's package."""
