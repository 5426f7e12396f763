"""An Engine's drafting: :func:`make_drafter` builds the drafter a :class:`SpecConfig`
names, and :class:`EngineDrafting` keeps one per kind of sampling over the costs they share,
measured once per model file (calibration, its cache, re-measuring a busy one), with what the
draft model needs beside them (its reduced output layer, the translation of a draft of another
vocabulary); each generation gets its :class:`Speculation` from it: the drafter of the lane
it holds, asked for by name when it holds one (no callbacks).

The runtime's, not :mod:`edgespec.drafting`'s (which the loop imports and which never
imports the runtime): it knows lanes and requests."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from ..config import DrafterKind, SamplingParams, SpecConfig
from ..errors import InvalidParameterError
from ..lm import LanguageModel, LoadedModel
from .threads import governors_suspended
from ..drafting.base import Drafter
from ..drafting.cross_vocab import Translation
from ..drafting.batch import Ask, BatchCosts, plan_round
from ..drafting.gate import BatchGate, GatedDrafter
from ..drafting.suffix import SuffixIndexes
from ..drafting.calibration import calibrate, measure_draft_batch
from ..drafting.cost_cache import CostCache, calibrate_cached
from ..drafting.costs import Costs
from ..drafting.hybrid import HybridDrafter
from ..drafting.model import ModelDrafter
from ..drafting.ngram import NgramDrafter
from ..drafting.policy import AdaptiveLength, FixedLength, LengthPolicy
from ..drafting.reduced_head import HEAD_MIN_VOCAB, ReducedHead

if TYPE_CHECKING:
    from ..backend import VocabMap
    from ..drafting.suffix import SuffixIndex
    from .lanes import Lane


def make_drafter(spec: SpecConfig, *, costs: Optional[Costs], k_max: int,
                 draft_model: Optional[LanguageModel] = None, eog: frozenset[int] = frozenset(),
                 head: Optional[ReducedHead] = None, cross=None,
                 joint: Optional[Callable] = None,
                 index: Optional[Callable] = None,
                 donor: Optional[LanguageModel] = None) -> Optional[Drafter]:
    """The drafter ``spec`` names, each source with its own length policy: the cost model over
    ``costs`` (drafts of at most ``k_max``), or the spec's fixed K when it pins one. ``costs``
    may be None only for a fixed K. None for ``drafter="none"``. ``cross``: a draft model of
    another vocabulary (see :class:`~.model.ModelDrafter`). ``joint``: the draft model's
    lengths are planned with other streams' (:attr:`~.policy.AdaptiveLength.joint`).
    ``index``: the suffix index of earlier requests the n-gram drafts also read, as of the
    current generation (a callable: None when it has none). ``donor``: the target's cache,
    whose cells the draft model's may take (:class:`~.reading.Reading`)."""
    fixed = not spec.is_adaptive

    def policy(c: Optional[Costs]) -> LengthPolicy:
        if fixed:
            return FixedLength(spec.fixed_k, spec.p_min)
        # Beside other streams a round's seconds are the batch's: costs are learned whole
        return AdaptiveLength(c, k_max=k_max, learns_costs=joint is None)

    def model_drafter() -> ModelDrafter:
        assert draft_model is not None, f"the {spec.drafter} drafter needs a draft model"
        own = policy(costs)
        if joint is not None and isinstance(own, AdaptiveLength):
            own.joint = joint
        return ModelDrafter(draft_model, eog, own, head, cross, donor=donor)

    if spec.drafter is DrafterKind.MODEL:
        return model_drafter()
    if spec.drafter is DrafterKind.NGRAM:         # (costs were measured with free drafts)
        return NgramDrafter(policy(costs), index=index)
    if spec.drafter is DrafterKind.HYBRID:
        return HybridDrafter(model_drafter(),
                             NgramDrafter(policy(costs.free() if costs is not None else None),
                                          index=index))
    return None


def translation_for(target: LoadedModel, draft: Optional[LoadedModel],
                    vmap: Optional["VocabMap"]) -> Optional[tuple[Translation, np.ndarray]]:
    """What a drafter of another vocabulary needs (:mod:`.cross_vocab`): the context in the
    draft's tokens, and the draft's ids to the target's; None for a draft that shares the
    target's tokenizer (``vmap`` None)."""
    if vmap is None or draft is None:
        return None
    t_vocab, d_info = target.vocabulary, draft.vocab

    def tokenize(raw: bytes) -> list[int]:
        return draft.tokenize(raw, add_special=False, parse_special=False) if raw else []
    bos = (target.vocab.bos, [d_info.bos] if d_info.add_bos and d_info.bos >= 0 else [])
    translation = Translation(vmap.to_draft, lambda t: t_vocab.piece(t, special=True),
                              tokenize, bos)
    return translation, vmap.to_target


class EngineDrafting:
    """An Engine's drafters, one per kind of sampling, built on first use. Acceptance differs
    between greedy, sampled and seeded decoding (seeded drafts are accepted when they match
    the target's keyed sample), so each learns its own draft lengths; the measured costs are
    shared."""

    # Refined costs are kept for the next session once this many target passes refined them.
    SAVE_AFTER = 64
    # A calibration taken while the machine was busy is measured again between generations,
    # first after this many seconds, then at doubling intervals, within a shorter budget,
    # until one is quiet: that one replaces it (and is kept), so a busy start heals itself.
    REMEASURE_AFTER = 15.0
    REMEASURE_BUDGET = 3.0

    def __init__(self, spec: SpecConfig, target: LoadedModel, draft: Optional[LoadedModel],
                 head: Optional[ReducedHead] = None, *, vocab_map: Optional["VocabMap"] = None,
                 recalibrate: bool = False, progress: Callable[[str], None] = lambda s: None,
                 streams: int = 1, shares_kv: bool = False):
        # A draft with a large vocabulary, run on the CPU, skips llama.cpp's output layer and
        # applies a reduced one (reduced_head.py); ``head``: one shared with another Engine.
        if head is None and draft is not None and draft.can_tap \
                and draft.n_vocab >= HEAD_MIN_VOCAB and spec.uses_draft_model:
            head = ReducedHead(draft, shared=vocab_map.keep if vocab_map else None)
        self.spec, self.target, self.draft, self.head = spec, target, draft, head
        self.streams = streams
        # The draft is the target's network at another precision: its cache takes the
        # target's cells for what the target read (reading.py) instead of reading it again.
        self.shares_kv = shares_kv
        self._vocab_map = vocab_map
        self._vocab_share = vocab_map.share if vocab_map is not None else None
        # A draft of another vocabulary (``vocab_map``: the map between the two): the context
        # in its tokens and its ids to the target's, one translation per lane (it follows
        # that lane's conversation), serving its drafters and its prompt pass.
        self._cross: dict[int, Optional[tuple]] = {}
        self.costs: Optional[Costs] = None
        # Whether several streams draft at all, by their measured throughput (gate.py).
        self.gate: Optional[BatchGate] = None
        # Earlier requests' prompts and answers, one index per key (suffix.py).
        self.indexes = SuffixIndexes() if spec.suffix and spec.drafts else None
        self._by_kind: dict = {}
        self._recalibrate, self._progress = recalibrate, progress
        self._remeasure_wait = self.REMEASURE_AFTER
        self._remeasure_at = time.monotonic() + self._remeasure_wait
        if spec.is_adaptive and spec.drafts:
            self._calibrate()

    def _measured_draft(self):
        # An n-gram drafter costs microseconds, whatever the draft model would cost.
        return self.draft if self.spec.uses_draft_model else None

    def _calibrate(self) -> None:
        draft = self._measured_draft()
        cache = CostCache(self.target, draft, self.head)
        self.costs = calibrate_cached(self.target, draft, head=self.head,
                                      force=self._recalibrate, progress=self._progress)
        target = self.target
        self.costs.position = lambda: len(target.tokens)   # the context its passes follow
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
            self.costs.position = lanes.mean_context
        if self.streams > 1:
            rounds = lanes.rounds
            # (a stream joining starts a phase afresh, as a prompt's pass does: a lone
            # stream's phase must not span the wait for the next request)
            self.gate = BatchGate(lambda: rounds.size,
                                  lambda: rounds.prompt_passes + rounds.joins,
                                  lambda: rounds.committed)
            if self.spec.is_adaptive:       # (a pinned length is the user's: always shared)
                rounds.turns = self.gate.turns

    def observe_pass(self, target: bool, rows: int, seconds: float, context: int) -> None:
        """A pass over several streams (:mod:`edgespec.engine.rounds`): the target's, of ``rows``
        rows after contexts of ``context`` tokens on average, took ``seconds``; what the
        target's costs learn while streams share the passes (a draft pass's products are the
        lanes' own: its calibrated costs stay)."""
        if target and self.costs is not None:
            self.costs.observe_target(rows, seconds, context)
        if target and self.gate is not None:
            self.gate.passed()

    def plan_round(self, asks: list) -> list:
        """The round's draft lengths for the lanes that asked (drafting/batch.py)."""
        c = self.costs
        return plan_round(asks, BatchCosts(c.bare, c.attention, c.draft_pass, c.rollback))

    def remeasure(self, force: bool = False) -> bool:
        """Measure a busy calibration again when it is due (``force``: now); True when a
        quiet measurement replaced it. Between generations only: it uses the models."""
        c = self.costs
        if c is None or not c.busy or (not force and time.monotonic() < self._remeasure_at) \
                or self.streams > 1:       # (other lanes may be decoding on the models)
            return False
        draft = self._measured_draft()
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
        # A calibration measures no attention term: the learned one stays, at the new speed;
        # so does the draft's, where the context left no room to measure it again.
        scale = float(cal.costs.bare(1.0) / c.bare(1.0))
        cal.costs.attention = c.attention * scale
        if not cal.costs.draft_attention:
            cal.costs.draft_attention = c.draft_attention * scale
        c.adopt(cal.costs)
        CostCache(self.target, draft, self.head).save(c, "calibration")
        self._by_kind.clear()       # policies start again on these costs (and free() copies)
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
            CostCache(self.target, self._measured_draft(), self.head).save(self.costs,
                                                                           "refined")

    def describe(self) -> dict:
        """The draft's vocabulary and the drafting settings, for ``Engine.info``."""
        spec = self.spec
        vocabulary = (None if self.draft is None else "shared" if self._vocab_share is None
                      else f"mapped: {self._vocab_share} of its tokens are the target's")
        return {"draft_vocabulary": vocabulary, "drafter": spec.drafter,
                "draft_max": spec.draft_max, "adaptive": spec.is_adaptive, "p_min": spec.p_min}

    def plain_pass_seconds(self) -> Optional[float]:
        """The cost model's seconds for a one-token target pass, as decoding refined it
        (None without a cost model: a pinned draft length)."""
        return self.costs.pass_seconds(1) if self.costs is not None else None

    def for_sampling(self, sampling: SamplingParams, lane: "Lane") -> Optional[Drafter]:
        """The drafter of ``lane`` for this kind of sampling (built on first use)."""
        spec = self.spec
        if not spec.drafts:
            return None
        kind = ("fixed" if not spec.is_adaptive else
                "greedy" if sampling.greedy else
                "seeded" if sampling.seed is not None else "sampled")
        self.remeasure()
        key = (lane.index, kind)
        if key not in self._by_kind:
            if kind != "fixed" and self.costs is None:
                self._calibrate()
            joint = ((lambda rates, cap, alone: lane.plan(
                Ask(rates, cap, alone, position=len(lane.target.tokens))))
                if self.streams > 1 else None)
            drafter = make_drafter(
                spec, costs=self.costs, k_max=min(spec.k_max, self.target.n_outputs_max - 1),
                draft_model=lane.draft, eog=self.target.vocab.eog, head=lane.head,
                cross=self.cross_for(lane), joint=joint, index=lambda: lane.suffix,
                donor=lane.target if self.shares_kv else None)
            # A pinned length is the user's; an adaptive one drafts while drafting measures
            # faster than plain batching.
            self._by_kind[key] = (GatedDrafter(drafter, self.gate)
                                  if self.gate is not None and kind != "fixed" else drafter)
        return self._by_kind[key]

    def cross_for(self, lane: "Lane") -> Optional[tuple]:
        """The translation of ``lane`` (a draft of another vocabulary), or None."""
        if lane.index not in self._cross:
            self._cross[lane.index] = translation_for(self.target, self.draft, self._vocab_map)
        return self._cross[lane.index]

    def speculation(self, sampling: SamplingParams, index_key: Optional[str] = None
                    ) -> Optional[Speculation]:
        """How a generation with ``sampling`` drafts (from the earlier requests of
        ``index_key``'s index); None: nothing drafts."""
        if not self.spec.drafts:
            return None
        return Speculation(self, sampling,
                           self.indexes.get(index_key) if self.indexes else None)

    def draft_tokens(self, lane: "Lane", context: list[int]) -> list[int]:
        """``context`` (target tokens) as ``lane``'s draft cache holds it."""
        cross = self.cross_for(lane)
        return context if cross is None else list(cross[0].tokens(context))

    def set_draft_max(self, draft_max: Optional[int]) -> None:
        """See :meth:`edgespec.engine.engine.Engine.set_draft_max`."""
        if not self.spec.drafts:
            raise InvalidParameterError("draft_max", draft_max,
                                        "unused: this Engine has no drafter (load it with a "
                                        "draft model or drafter='ngram')")
        spec = replace(self.spec, draft_max=draft_max)
        limit = self.target.n_outputs_max - 1
        if spec.most_drafts > limit:
            raise InvalidParameterError(
                "draft_max", draft_max, f"at most {limit} for this Engine (its target was "
                f"loaded to verify {limit} drafts per pass; load it with draft_max="
                f"{draft_max} for longer drafts)", options=("draft_max",))
        self.spec = spec
        self._by_kind.clear()


class Speculation:
    """How one generation drafts, decided when it is submitted: its ``sampling`` (which of
    the lane's drafters it uses), the acceptance rule for unseeded sampling (``verifier``,
    SpecConfig's) and the earlier requests it drafts from (``index``, None: its context
    only). The lane it gets is known only once it holds one: :meth:`drafter` and
    :meth:`draft_tokens` take it."""

    def __init__(self, drafting: EngineDrafting, sampling: SamplingParams,
                 index: Optional["SuffixIndex"]):
        self._drafting, self.sampling, self.index = drafting, sampling, index
        self.verifier = drafting.spec.verifier

    def drafter(self, lane: "Lane") -> Optional[Drafter]:
        """The drafter of ``lane`` for this generation, drafting from its ``index`` (the lane
        holds it while this generation does). Building a lane's first drafter of a kind of
        sampling may calibrate the cost model first (once per model file and setting), and
        any call may re-measure it when the machine's load changed (:meth:`EngineDrafting.
        remeasure`): asked for once, when the lane is held, before the prompt is read."""
        lane.suffix = self.index
        return self._drafting.for_sampling(self.sampling, lane)

    def plain_cost(self) -> Optional[float]:
        """The cost model's seconds for a plain target pass (None: no cost model)."""
        return self._drafting.plain_pass_seconds()

    def draft_tokens(self, lane: "Lane", tokens: list[int]) -> list[int]:
        """``tokens`` (the target's) as ``lane``'s draft cache holds them."""
        return self._drafting.draft_tokens(lane, tokens)
