"""An Engine's cost model: :class:`EngineCosts`.

Owns the :class:`~edgespec.drafting.costs.Costs` an Engine's drafters share, measured once per
model file and setting (calibration and its cache, the draft's batches when several streams
draft together), measured again while a busy calibration is due, kept on disk as decoding
refined it, and taught by the passes several streams share. Offers them (``costs``: None
until measured, and for a pinned draft length, which needs none), the round's joint plan
over them, and the seconds of a plain pass. The drafters are :mod:`.drafting`'s; this room
only measures what they weigh.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from ..drafting.batch import BatchCosts, plan_round
from ..drafting.calibration import calibrate, measure_draft_batch
from ..drafting.cost_cache import CostCache, calibrate_cached
from ..drafting.costs import Costs
from ..drafting.reduced_head import ReducedHead
from ..lm import LoadedModel
from .threads import governors_suspended


class EngineCosts:
    """The costs of ``target`` and ``draft`` (the draft model as measured: None where only an
    n-gram drafts, which costs microseconds), with ``head``, the draft's reduced output layer,
    for ``streams`` lanes. ``recalibrate``: measure again rather than read the cache;
    ``progress``: told what measuring is doing."""

    # Refined costs are kept for the next session once this many target passes refined them.
    SAVE_AFTER = 64
    # A calibration taken while the machine was busy is measured again between generations,
    # first after this many seconds, then at doubling intervals, within a shorter budget,
    # until one is quiet: that one replaces it (and is kept), so a busy start heals itself.
    REMEASURE_AFTER = 15.0
    REMEASURE_BUDGET = 3.0

    def __init__(self, target: LoadedModel, draft: Optional[LoadedModel],
                 head: Optional[ReducedHead], *, streams: int = 1, recalibrate: bool = False,
                 progress: Callable[[str], None] = lambda s: None):
        self.target, self.draft, self.head, self.streams = target, draft, head, streams
        self.costs: Optional[Costs] = None
        self._recalibrate, self._progress = recalibrate, progress
        self._remeasure_wait = self.REMEASURE_AFTER
        self._remeasure_at = time.monotonic() + self._remeasure_wait

    def calibrate(self) -> None:
        """Measure the costs (or read them from the cache); they follow the target's context
        until :meth:`follow` gives them the streams'."""
        draft = self.draft
        cache = CostCache(self.target, draft, self.head)
        self.costs = calibrate_cached(self.target, draft, head=self.head,
                                      force=self._recalibrate, progress=self._progress)
        target = self.target
        self.costs.follow(lambda: len(target.tokens))   # the context its passes follow
        # Several streams draft together: what the draft's pass over b of them costs.
        sizes = [b for b in (2, 4, 8, 16) if b <= self.streams]
        if draft is not None and sizes and not all(b in self.costs.draft_batch for b in sizes):
            self._progress("measuring the draft's batches (once per model and setting)…")
            self.costs.draft_batch.update(measure_draft_batch(draft, sizes, self.head))
            if not self.costs.busy:
                cache.save(self.costs, "calibration")

    def follow(self, lanes) -> None:
        """With several lanes the costs' context (the attention term's) is the streams'
        mean, not one sequence's."""
        if self.costs is not None and self.streams > 1:
            self.costs.follow(lanes.mean_context)

    def observe_pass(self, rows: int, seconds: float, context: int) -> None:
        """A target pass over several streams, of ``rows`` rows after contexts of
        ``context`` tokens on average, took ``seconds``: what the costs learn."""
        if self.costs is not None:
            self.costs.observe_target(rows, seconds, context)

    def plan_round(self, asks: list) -> list:
        """The round's draft lengths for the lanes that asked (drafting/batch.py)."""
        c = self.costs
        return plan_round(asks, BatchCosts(c.bare, c.attention, c.draft_pass, c.rollback))

    def remeasure(self, force: bool = False) -> bool:
        """Measure a busy calibration again when it is due (``force``: now); True when a
        quiet measurement replaced it (in place: whoever holds the costs sees it).
        Between generations only: it uses the models."""
        c = self.costs
        if c is None or not c.busy or (not force and time.monotonic() < self._remeasure_at) \
                or self.streams > 1:       # (other lanes may be decoding on the models)
            return False
        draft = self.draft
        models = [m for m in (self.target, draft) if m is not None]
        # Not without room after the conversation. On every thread the models may use (a
        # governor that backed off may have done so in the busy spell this is to replace),
        # unseen by the governors; the measurement says itself whether the machine is quiet.
        if any(len(m.tokens) + 64 > m.n_ctx for m in models):
            cal = None
        else:
            with governors_suspended(*models):
                cal = calibrate(self.target, draft, head=self.head,
                                budget=self.REMEASURE_BUDGET)
        if cal is None or not cal.quiet:
            self._remeasure_wait *= 2
            self._remeasure_at = time.monotonic() + self._remeasure_wait
            return False
        c.adopt_remeasured(cal.costs)
        CostCache(self.target, draft, self.head).save(c, "calibration")
        return True

    def save_refined(self) -> None:
        """Keep the costs as decoding refined them, so the next session starts from these;
        not those that grew from a busy calibration (a quiet re-measure replaces and keeps
        them: :meth:`remeasure`). The caller knows whether the threads ran at their count.
        Nor those that several streams refined: their passes ran beside the other streams'
        Python work on the same cores and over several sequences (a table so refined put 4
        rows at 84 ms where one stream's pass of 4 takes 30), and the file is every session's,
        one stream's included."""
        if self.costs is not None and not self.costs.busy and self.streams == 1 \
                and self.costs.observed >= self.SAVE_AFTER:
            CostCache(self.target, self.draft, self.head).save(self.costs, "refined")

    def plain_pass_seconds(self) -> Optional[float]:
        """The cost model's seconds for a one-token target pass, as decoding refined it
        (None without a cost model: a pinned draft length)."""
        return self.costs.pass_seconds(1) if self.costs is not None else None
