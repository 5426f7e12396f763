"""``edgespec bench``: every way of decoding a pair, measured side by side in one run.

- :mod:`.runner` — the configurations and the interleaved runs
- :mod:`.report` — the table and the plot
- :mod:`.prompts` — the built-in prompt sets
- :mod:`.command` — the command line
- :mod:`.load` — speed on a busy machine (``--load N``), beside an idle one
- :mod:`.long_prompts` — time to first token and whole answers over prompt lengths
- :mod:`.tasks`, :mod:`.task_bench` — task prompts (chat, code edits, summaries) and their run
- :mod:`.serving` — a server started and asked as a client would (the scripts' HTTP benchmarks)

The peer it compares with (llama-cpp-python's own API) is in ``edgespec.backend.peer``: only
the backend imports llama.cpp's bindings.
"""
