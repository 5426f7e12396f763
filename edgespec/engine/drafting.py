"""An Engine's drafting, where its rooms meet: :class:`EngineDrafting` keeps a drafter per lane
and kind of sampling, built on first use (:func:`~edgespec.drafting.factory.make_drafter`),
from what the other rooms own: the cost model (:mod:`.costing`), the batch gate over the
lanes' rounds (:mod:`.gating`), each lane's translation for a draft of another vocabulary
(:mod:`.translations`), and the draft length's limit (:mod:`.draft_limit`). It owns the
draft's reduced output layer and the suffix indexes of earlier requests. Each generation gets
its :class:`Speculation` from it: the drafter of the lane it holds, asked for by name when it
holds one (no callbacks).

The runtime's, not :mod:`edgespec.drafting`'s (which the loop imports and which never
imports the runtime): it knows lanes and requests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Union

from ..backend import check_pair, same_network
from ..config import SamplingParams, SpecConfig
from ..drafting.base import Drafter
from ..drafting.batch import Ask
from ..drafting.costs import Costs
from ..drafting.factory import make_drafter
from ..drafting.reduced_head import HEAD_MIN_VOCAB, ReducedHead
from ..drafting.suffix import SuffixIndexes
from ..lm import LoadedModel
from .costing import EngineCosts
from .draft_limit import with_draft_max
from .gating import LaneGate
from .translations import LaneTranslations

if TYPE_CHECKING:
    from ..backend import VocabMap
    from ..drafting.gate import BatchGate
    from ..drafting.suffix import SuffixIndex
    from .lanes import Lane


class EngineDrafting:
    """An Engine's drafters, one per lane and kind of sampling, built on first use.
    Acceptance differs between greedy, sampled and seeded decoding (seeded drafts are
    accepted when they match the target's keyed sample), so each learns its own draft
    lengths; the measured costs are shared."""

    def __init__(self, spec: SpecConfig, target: LoadedModel, draft: Optional[LoadedModel],
                 head: Optional[ReducedHead] = None, *,
                 vocab_map: Union["VocabMap", None, str] = None,
                 recalibrate: bool = False, progress: Callable[[str], None] = lambda s: None,
                 streams: int = 1):
        # A draft of another vocabulary drafts through a map between the two ("check": the
        # pair was not checked yet; None: the draft shares the target's tokenizer).
        if isinstance(vocab_map, str):
            vocab_map = check_pair(target, draft) if draft is not None else None
        self.vocab_map: Optional["VocabMap"] = vocab_map
        # A draft with a large vocabulary, run on the CPU, skips llama.cpp's output layer and
        # applies a reduced one (reduced_head.py); ``head``: one shared with another Engine.
        if head is None and draft is not None and draft.can_tap \
                and draft.n_vocab >= HEAD_MIN_VOCAB and spec.uses_draft_model:
            head = ReducedHead(draft, shared=vocab_map.keep if vocab_map else None)
        self.spec, self.target, self.draft, self.head = spec, target, draft, head
        self.streams = streams
        # The draft is the target's network at another precision: its cache takes the
        # target's cells for what the target read (reading.py) instead of reading it again.
        self.shares_kv = draft is not None and vocab_map is None and same_network(target, draft)
        # A draft of another vocabulary (``vocab_map``: the map between the two): the context
        # in its tokens and its ids to the target's, one translation per lane (it follows
        # that lane's conversation), serving its drafters and its prompt pass.
        self.translations = LaneTranslations(target, draft, vocab_map)
        # An n-gram drafter costs microseconds, whatever the draft model would cost.
        self.costing = EngineCosts(target, draft if spec.uses_draft_model else None, head,
                                   streams=streams, recalibrate=recalibrate,
                                   progress=progress)
        # Whether several streams draft at all, by their measured throughput (gate.py).
        self._gate: Optional[LaneGate] = None
        # Earlier requests' prompts and answers, one index per key (suffix.py).
        self.indexes = SuffixIndexes() if spec.suffix and spec.drafts else None
        self._by_kind: dict = {}
        if spec.is_adaptive and spec.drafts:
            self.costing.calibrate()

    @property
    def costs(self) -> Optional[Costs]:
        """The costs the drafters share (None until measured; none for a pinned length)."""
        return self.costing.costs

    @property
    def gate(self) -> Optional["BatchGate"]:
        """Whether several streams draft at all (None with one lane)."""
        return self._gate.gate if self._gate is not None else None

    def follow(self, lanes) -> None:
        """Decode on ``lanes``: with several, the costs follow the streams' mean context and
        a gate over their rounds decides whether they draft."""
        self.costing.follow(lanes)
        if self.streams > 1:
            self._gate = LaneGate(lanes.rounds, self.spec.is_adaptive)

    def observe_pass(self, target: bool, rows: int, seconds: float, context: int) -> None:
        """A pass over several streams (:mod:`edgespec.engine.rounds`): the target's, of ``rows``
        rows after contexts of ``context`` tokens on average, took ``seconds``; what the
        target's costs learn while streams share the passes (a draft pass's products are the
        lanes' own: its calibrated costs stay)."""
        if target:
            self.costing.observe_pass(rows, seconds, context)
        if target and self._gate is not None:
            self._gate.passed()

    def plan_round(self, asks: list) -> list:
        """The round's draft lengths for the lanes that asked (drafting/batch.py)."""
        return self.costing.plan_round(asks)

    def remeasure(self, force: bool = False) -> bool:
        """Measure a busy calibration again when it is due (``force``: now:
        :meth:`EngineCosts.remeasure`); True when a quiet measurement replaced it, and the
        drafters start again on it."""
        if not self.costing.remeasure(force):
            return False
        self._by_kind.clear()       # policies start again on these costs (and free() copies)
        return True

    def save_refined(self, settled: bool) -> None:
        """Keep the costs as decoding refined them for the next session (:meth:`EngineCosts.
        save_refined`) when they describe every thread: ``settled``, each governor has run
        its last steps at its full count (the costs' moving averages have forgotten a spell
        on fewer threads by then)."""
        if settled:
            self.costing.save_refined()

    def share_target_cells(self, share: bool) -> None:
        """Whether the draft's cache takes the target's cells for what the target read (a
        draft of the target's network only); the drafters are built again with it."""
        self.shares_kv = share
        self._by_kind.clear()

    def describe(self) -> dict:
        """The draft's vocabulary and the drafting settings, for ``Engine.info``."""
        spec = self.spec
        return {"draft_vocabulary": self.translations.describe(), "drafter": spec.drafter,
                "draft_max": spec.draft_max, "adaptive": spec.is_adaptive, "p_min": spec.p_min}

    def plain_pass_seconds(self) -> Optional[float]:
        """See :meth:`EngineCosts.plain_pass_seconds`."""
        return self.costing.plain_pass_seconds()

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
                self.costing.calibrate()
            joint = ((lambda rates, cap, alone: lane.plan(
                Ask(rates, cap, alone, position=len(lane.target.tokens))))
                if self.streams > 1 else None)
            drafter = make_drafter(
                spec, costs=self.costs, k_max=min(spec.k_max, self.target.n_outputs_max - 1),
                draft_model=lane.draft, eog=self.target.vocab.eog, head=lane.head,
                cross=self.translations.of(lane), joint=joint, index=lane.suffix_index,
                donor=lane.target if self.shares_kv else None)
            # A pinned length is the user's; an adaptive one drafts while drafting measures
            # faster than plain batching.
            self._by_kind[key] = (self._gate.gated(drafter)
                                  if self._gate is not None and kind != "fixed" else drafter)
        return self._by_kind[key]

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
        return self.translations.draft_tokens(lane, context)

    def set_draft_max(self, draft_max: Optional[int]) -> None:
        """See :meth:`edgespec.engine.engine.Engine.set_draft_max`."""
        self.spec = with_draft_max(self.spec, draft_max, self.target.n_outputs_max - 1)
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
        lane.draft_from(self.index)
        return self._drafting.for_sampling(self.sampling, lane)

    def plain_cost(self) -> Optional[float]:
        """The cost model's seconds for a plain target pass (None: no cost model)."""
        return self._drafting.plain_pass_seconds()

    def draft_tokens(self, lane: "Lane", tokens: list[int]) -> list[int]:
        """``tokens`` (the target's) as ``lane``'s draft cache holds them."""
        return self._drafting.draft_tokens(lane, tokens)
