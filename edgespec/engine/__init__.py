"""The runtime: an :class:`~.engine.Engine` holds a loaded pair and carries out requests.

- :mod:`.engine` — :class:`Engine`: load, generate, stream, embed, close
- :mod:`.request` — :class:`GenerationRequest`, what every edge asks for, and what the
  loop carries out
- :mod:`.prompting` — a request's prompt as tokens (chat template, tools, thinking, grammar)
- :mod:`.generation` — one generation from its tokens to its result, through the loop
- :mod:`.drafting` — an Engine's drafters per lane and kind of sampling, each generation's
  speculation; from its rooms: :mod:`.costing` — the costs they share (calibration,
  re-measuring, saving), :mod:`.gating` — the batch gate over the rounds,
  :mod:`.translations` — each lane's translation for a draft of another vocabulary,
  :mod:`.draft_limit` — the longest drafts the target verifies
- :mod:`.lanes`, :mod:`.rounds`, :mod:`.stream_model` — generations at once: each holds a
  lane (a sequence of both models' caches); their passes are batched into rounds
- :mod:`.streams` — :class:`Stream` and :class:`AsyncStream`, a generation as it happens
- :mod:`.threads` — the thread governors: how many cores a pass uses while others run

``import edgespec.engine`` is cheap: :class:`Engine` (and llama.cpp with it) loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Engine"]


def __getattr__(name: str):
    if name == "Engine":
        from .engine import Engine
        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
