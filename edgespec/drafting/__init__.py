"""Where draft tokens come from, and how many to try: the drafting contract and its drafters.

- :mod:`.base` — :class:`Draft` and the :class:`Drafter` protocol the loop relies on
- :mod:`.policy` — draft-length policies: :class:`FixedLength`, :class:`AdaptiveLength`
- :mod:`.costs` — what drafting and verifying cost: :class:`Costs`, calibration, its cache
- :mod:`.model`, :mod:`.ngram`, :mod:`.hybrid` — the three drafters
- :mod:`.reading` — what the draft model's cache reads, and whether catching it up pays
- :mod:`.reduced_head` — the draft model's output layer over a subset of the vocabulary
- :mod:`.engine_drafting` — :func:`~.engine_drafting.make_drafter`, and
  :class:`~.engine_drafting.EngineDrafting`: an Engine's drafters (one per kind of sampling)
  and the costs they share (calibration, re-measuring), and each generation's Speculation
  (imported by the Engine directly, not from here: it builds on :mod:`edgespec.request`,
  which the loop's results lead back to this package)
"""

from __future__ import annotations

from .base import Draft, Drafter
from .costs import CostCache, Costs, calibrate, calibrate_cached
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .policy import AdaptiveLength, FixedLength, LengthPolicy
from .reduced_head import HEAD_MIN_VOCAB, ReducedHead
from .cross_vocab import Translation

__all__ = ["Draft", "Drafter", "CostCache", "Costs", "calibrate", "calibrate_cached",
           "HybridDrafter", "ModelDrafter", "NgramDrafter", "AdaptiveLength", "FixedLength",
           "LengthPolicy", "HEAD_MIN_VOCAB", "ReducedHead", "Translation"]
