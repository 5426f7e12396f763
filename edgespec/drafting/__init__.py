"""Where draft tokens come from, and how many to try: the drafting contract and its drafters.

- :mod:`.base` — :class:`Draft` and the :class:`Drafter` protocol the loop relies on
- :mod:`.policy` — draft-length policies: :class:`FixedLength`, :class:`AdaptiveLength`
- :mod:`.economics` — what drafting is expected to cost and save, on an adaptive policy's
  estimates: the cost oracle its plans and the reading and hybrid decisions consult
- :mod:`.costs` — what drafting and verifying cost: :class:`Costs`, refined while decoding;
  :mod:`.calibration` — measuring them; :mod:`.cost_cache` — remembering them on disk
- :mod:`.model`, :mod:`.ngram`, :mod:`.hybrid` — the three drafters; :mod:`.factory` — the one a
  :class:`~edgespec.config.SpecConfig` names, with its length policy
- :mod:`.reading` — what the draft model's cache reads, and whether catching it up pays
- :mod:`.reduced_head` — the draft model's output layer over a subset of the vocabulary
- :mod:`.batch`, :mod:`.gate` — draft lengths planned across streams, and whether
  speculating beats plain batching now
- :mod:`.suffix` — earlier requests' tokens, as n-gram drafts
- :mod:`.cross_vocab` — drafting with a draft of another vocabulary

An Engine's drafters, the costs they share and each generation's speculation are the runtime's
(:mod:`edgespec.engine.drafting`): this package never imports the runtime.
"""

from __future__ import annotations

from .base import Draft, Drafter, LengthPolicy
from .calibration import calibrate
from .cost_cache import CostCache, calibrate_cached
from .costs import Costs
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .policy import AdaptiveLength, FixedLength
from .reduced_head import HEAD_MIN_VOCAB, ReducedHead
from .cross_vocab import Translation

__all__ = ["Draft", "Drafter", "CostCache", "Costs", "calibrate", "calibrate_cached",
           "HybridDrafter", "ModelDrafter", "NgramDrafter", "AdaptiveLength", "FixedLength",
           "LengthPolicy", "HEAD_MIN_VOCAB", "ReducedHead", "Translation"]
