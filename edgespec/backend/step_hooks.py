"""What a backend model tells of each pass: :class:`StepHooks`, the two hooks
:mod:`edgespec.engine.threads` sets (a thread governor per model) and the model calls.

Owns the hooks; offers :meth:`StepHooks.set_step_hooks`, the one way to set them. A model
without hooks set tells no one.
"""

from __future__ import annotations

from typing import Callable, Optional


class StepHooks:
    """The step hooks of a backend model (a base of :class:`~.model.LlamaModel` and
    :class:`~.remote.RemoteModel`)."""

    # Told each llama_decode's token count, logits rows and seconds; returns the thread
    # count for the next pass. None: no one is told.
    on_step: Optional[Callable[[int, int, float], int]] = None
    # Asked before each pass: the threads for it.
    before_step: Optional[Callable[[], int]] = None

    def set_step_hooks(self, on_step: Optional[Callable[[int, int, float], int]],
                       before_step: Optional[Callable[[], int]]) -> None:
        """From the next pass on, tell ``on_step`` of each pass and ask ``before_step`` for
        the threads of the next (None: neither)."""
        self.on_step, self.before_step = on_step, before_step
