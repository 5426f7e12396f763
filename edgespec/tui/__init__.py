"""``edgespec chat``: the terminal chat UI, a thin shell over the Engine.

The only part of edgespec that imports prompt_toolkit, and only in :mod:`.app` (loaded when the
command runs), so building the command-line parser stays cheap.

- :mod:`.command` — the parser and the command: load the engine, pick a terminal or a pipe.
- :mod:`.session` — one chat with an Engine: settings, turns, cancellation, statistics.
- :mod:`.slash` — the slash commands (``/help``, ``/set`` …) and what a line of input does.
- :mod:`.render` — writing answers (accepted draft tokens coloured) and status lines.
- :mod:`.app` — the prompt_toolkit loop: key bindings, completion, history, toolbar.
"""
