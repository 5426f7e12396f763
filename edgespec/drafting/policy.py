"""How long each draft is: the length policies a drafter owns.

A policy is asked before each round how many tokens to try (``plan``) and, before each draft
token, whether to go on (``keep_drafting``); after the target's verify pass it learns what was
accepted and what each part cost (``observe``). The stop decision may depend only on the
draft's distribution at that position (its confidence), never on the token drawn from it:
stopping on the drawn token's own probability would make the proposals a biased sample of q
and break the losslessness of rejection sampling (tests/test_drafters.py shows both).

* :class:`FixedLength` — K tokens per round, optionally cut when the draft's top probability
  falls below ``p_min`` (llama.cpp's ``--draft-p-min``).
* :class:`AdaptiveLength` — a cost model. It knows the target's time for a batch of n tokens
  and the draft's time per token (:class:`~edgespec.drafting.costs.Costs`) and tracks
  acceptance per draft position and per draft-confidence level (both decaying). Each round it
  plans the K that maximises expected tokens per second — K = 0, plain decoding, when nothing
  pays; old evidence fades even then, so it re-probes and notices when acceptance recovers —
  and stops a draft early when no continuation is worth its time at the planned rate.

What drafting is expected to cost and save, for the drafter's other decisions (whether to
catch a draft cache up, to read a long prompt through a window, which source to draft with),
is not a policy's question: it is its ``economics`` (:class:`~.economics.DraftEconomics`), the
cost oracle an :class:`AdaptiveLength` plans with. :class:`FixedLength` has none (None): the
callers then act as a pinned length does (read everything, draft regardless).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from .costs import Costs
from .decayed import Decayed
from .economics import DraftEconomics

# No draft position is assumed accepted more often than this, however thin the evidence.
MAX_ACCEPTANCE = 0.99


def slow_start_length(tried: float) -> int:
    """The most tokens a draft may take after ``tried`` rounds (or tests) of its kind:
    4, 8, 16… up to 1024."""
    return 4 << min(int(tried), 8)


class FixedLength:
    """K tokens per round, cut when the draft's top probability is below ``p_min``. It has no
    cost model (no ``economics``): the length is the user's."""

    economics = None

    def __init__(self, k: int, p_min: float = 0.0):
        self.k, self.p_min = k, p_min
        self.needs_confidence = p_min > 0

    def plan(self) -> int:
        return self.k

    def keep_drafting(self, i: int, confidence: Optional[float]) -> bool:
        return confidence is None or confidence >= self.p_min

    def length_for(self, confidence: float, k_max: int, slow_start: bool = False) -> int:
        return 0        # the length is the user's: no match drafts past it

    def extension_for(self, confidence: float, room: int) -> int:
        return room

    def observe(self, k, n, confidences, draft_step_seconds, verify_seconds,
                k_verified=None) -> None:
        pass

    def rest(self) -> None:
        pass

    def new_answer(self) -> None:
        pass

    def probe_cap(self, confidence: float) -> int:
        return self.k


@dataclass
class AdaptiveLength:
    """Cost-model draft length (see the module docstring).

    Acceptance per position is shrunk towards the pooled acceptance of all positions, which
    is shrunk towards ``prior`` (optimistic, so that a new pair gets tried). Evidence fades
    with ``decay`` per drafting round and with the slower ``idle_decay`` per plain round: after
    a long stretch of plain decoding the estimates drift back to the prior and the policy
    re-probes by itself, rarely; a pair that could not pay even at the prior acceptance
    (a draft as slow as the target) is not probed at all. K is chosen on the estimates
    (raised by ``z`` standard errors, 0 by default); the choice of plain decoding is checked
    against estimates ``z_probe``·√log(plain rounds) standard errors higher, so that thin
    evidence (one unlucky first round) leads to a short probe rather than to giving up. The
    confidence gate starts fully trusting and learns which confidence levels get rejected.
    """

    costs: Costs
    k_max: int = 32
    prior: float = 0.9
    decay: float = 0.98
    idle_decay: float = 0.998
    z: float = 0.0
    z_probe: float = 1.0
    margin: float = 0.05
    replan_every: int = 8
    # What earlier answers taught weighs at most this many tests per bucket when a drafter
    # begins a new one (:meth:`new_answer`; the n-gram's copies, whose acceptance is the
    # answer's); 0: no cap.
    carried: float = 4.0
    _n_bins: int = 10
    _pos: Decayed = field(init=False)
    _conf: Decayed = field(init=False)
    _rate: float = field(init=False, default=0.0)
    _reach: float = field(init=False, default=1.0)
    _planned: int = field(init=False, default=0)
    _rounds: int = field(init=False, default=0)
    _streak: int = field(init=False, default=0)   # consecutive drafting rounds
    _idle: int = field(init=False, default=0)     # consecutive plain rounds
    _gate_active: bool = field(init=False, default=True)
    _pos_rates: np.ndarray = field(init=False, default=None)
    _probing: bool = field(init=False, default=False)
    _probe_z: float = field(init=False, default=0.0)
    # With other streams decoding beside this one: (its position rates, its cap, its own
    # choice) -> the draft length planned for the whole batch (drafting/batch.py).
    joint: Optional[Callable[[np.ndarray, int, int], int]] = field(default=None, repr=False,
                                                                   compare=False)
    # Whether its rounds' timings teach the costs: not where other streams share the passes
    # (a round's seconds are then the batch's and its waits; the Engine learns from each pass
    # whole: EngineDrafting.observe_pass).
    learns_costs: bool = True
    # What drafting costs and saves on these estimates: what the plan weighs, and what the
    # drafter's other decisions ask.
    economics: DraftEconomics = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._pos = Decayed(self.k_max, strength=8.0)
        self._conf = Decayed(self._n_bins, strength=2.0)
        # Whether a draft's first token was accepted, per confidence bin (free drafts'
        # lengths, :meth:`length_for`).
        self._first = Decayed(self._n_bins, strength=2.0)
        # This answer's drafting rounds per confidence bin of their first token (the slow
        # start of a kind of draft, :meth:`probe_cap`).
        self._tried = np.zeros(self._n_bins)
        self.economics = DraftEconomics(self)

    @property
    def planned(self) -> int:
        """The draft length of the round just planned (0: a plain round)."""
        return self._planned

    @property
    def round_rate(self) -> float:
        """Expected tokens per second of the round just planned, when it drafts."""
        return self._rate

    @property
    def probing(self) -> bool:
        """Whether the last :meth:`best` chose a probe (drafting on optimistic estimates)."""
        return self._probing

    # -- the model ------------------------------------------------------------------------

    def position_rates(self, z: Optional[float] = None) -> np.ndarray:
        """Acceptance per position, shrunk towards the pooled rate of all positions and raised
        by the pooled rate's standard error: while evidence is thin the policy gives drafting
        the benefit of the doubt, so a few unlucky rejections cannot stop it for good."""
        pooled = self._pos.pooled(self.prior)
        n = self._pos.tested.sum() + self._pos.strength
        bonus = (self.z if z is None else z) * np.sqrt(pooled * (1 - pooled) / n)
        return np.minimum(MAX_ACCEPTANCE, self._pos.rates(pooled) + bonus)

    def best(self) -> tuple[int, float]:
        """The K in [0, k_max] with the highest expected tokens per second, and that rate.

        Drafting must beat plain decoding by ``margin`` (a break-even gamble on a draft as
        slow as the target only adds variance)."""
        def rates(z):
            return self.economics.rates_by_length(self.position_rates(z),
                                                  self.costs.draft_step())

        rate = rates(None)
        k = int(np.argmax(rate))
        if rate[k] < rate[0] * (1 + self.margin):
            k = 0
            # Explore: a few unlucky rounds must not stop drafting for good. If drafting
            # would pay at an acceptance z standard errors above the estimate, the evidence
            # is too thin to give up: probe (slow start keeps the probe short). z grows with
            # the log of the plain rounds since the last draft (as in UCB1), so probes of a
            # pair that does not pay get rarer and rarer; one that cannot pay even at
            # MAX_ACCEPTANCE is never probed.
            z = self.z_probe * np.sqrt(max(1.0, np.log1p(self._idle)))
            optimistic = rates(z)
            k_opt = int(np.argmax(optimistic))
            if optimistic[k_opt] >= rate[0] * (1 + self.margin):
                self._probing, self._probe_z = True, z
                return k_opt, float(optimistic[k_opt])
        self._probing = False
        return k, float(rate[k])

    def _bin(self, confidence: float) -> int:
        return min(int(confidence * self._n_bins), self._n_bins - 1)

    def _acceptance_at(self, confidence: float) -> float:
        return float(self._conf.rates(1.0, z=self.z)[self._bin(confidence)])

    # -- the policy -----------------------------------------------------------------------

    @property
    def needs_confidence(self) -> bool:
        """Whether the drafter should compute the draft's confidence this round (it costs a
        pass over the logits): always while the gate is cutting, otherwise one round in four
        so that the gate keeps learning."""
        return self._gate_active or self._rounds % 4 == 0

    def plan(self) -> int:
        if self._idle % self.replan_every:
            # Plain decoding was the best choice a moment ago: keep it without re-planning
            # every token (a re-plan costs ~40 µs, 0.5% of a fast model's token).
            self._idle += 1
            self._planned = 0
            return 0
        k, self._rate = self.best()
        # Slow start: after plain decoding (and at first) drafts grow 4, 8, 16… tokens per
        # round while evidence comes in, instead of gambling 32 draft steps on estimates.
        cap = min(self.k_max, slow_start_length(self._streak))
        k = min(k, cap)
        self._pos_rates = self.position_rates(self._probe_z if self._probing else None)
        if self.joint is not None:      # other streams share the passes: planned together
            k = min(self.joint(self._pos_rates, cap, k), cap)
        self._idle = self._idle + 1 if k == 0 else 0
        self._planned = k
        self._reach = 1.0
        if k:
            # The value of time while drafting is the rate of the round actually planned: the
            # rate of the uncapped best K would make every continuation of a capped draft
            # look too dear, and the draft would stop at once, round after round.
            tokens, seconds = self.economics.expected_round(k, self._pos_rates)
            self._rate = tokens / seconds
        pooled = self._pos.pooled(self.prior)
        self._gate_active = bool(self._conf.rates(1.0, z=self.z).min() < 0.9 * pooled)
        return k

    def keep_drafting(self, i: int, confidence: float) -> bool:
        """Draw token i only if some continuation of the draft is worth its time.

        A continuation to k drafts in total gains the expected extra accepted tokens and
        costs the extra draft steps (the one that produced this position is already spent)
        plus the larger verify pass; it is worth it when gain > rate × cost, with the planned
        rate as the value of time. Draft costs are not convex (the first extra verify row
        costs more than later ones), so every continuation up to the plan is considered,
        not just the next token.
        """
        rates = self._pos_rates
        reach = self._reach * (self._acceptance_at(confidence) if confidence is not None
                               else rates[min(i, self.k_max - 1)])
        ks = np.arange(i + 1, self._planned + 1)
        if ks.size == 0:
            return False
        later = rates[i + 1:self._planned]
        reach_each = reach * np.concatenate(([1.0], np.cumprod(later)))[:ks.size]
        gain = np.cumsum(reach_each)
        c = self.costs
        cost = (ks - i - 1) * c.draft_step() + c.pass_seconds(ks + 1) - c.pass_seconds(i + 1)
        back = c.rollback(np.cumprod(rates[:self._planned]))    # (a recurrent model's)
        cost = cost + back[ks] - back[i + 1]
        if float(np.max(gain - self._rate * cost)) <= 0.0:
            return False
        self._reach = reach
        return True

    def length_for(self, confidence: float, k_max: int, slow_start: bool = False) -> int:
        """The draft length that pays best for a free draft (no draft steps: an n-gram
        match's continuation) each of whose tokens is accepted at the rate drafts of this
        ``confidence`` have been: the verify pass's rows against the tokens expected, at most
        ``k_max``; 0 where none beats plain decoding. Not with other streams (their batch
        is planned together: :attr:`joint`). ``slow_start``: at most 4 << (the tokens of
        this confidence tested so far), so that a kind of match never tried costs a short
        probe (a 33-row pass costs ~6 one-row passes on a 2-core CPU), not a long one."""
        k_max = min(k_max, self.k_max)
        if self.joint is not None or k_max <= 0:
            return 0
        # A copy is accepted all or nothing more often than token by token (a file being
        # edited: measured, half of the 2-token matches' drafts are rejected at once, the
        # other half run 17 tokens on average): the first token at the rate of drafts of
        # this confidence, each later one at the rate drafts have gone on once started.
        first = min(MAX_ACCEPTANCE, float(self._first.rates(1.0, z=self.z)[self._bin(
            confidence)]))
        # Positions past the deepest one tested go on at its rate, not at the pooled one (a
        # run that got that far is a copy that seldom breaks there).
        pos = self.position_rates()
        tested = np.flatnonzero(self._pos.tested >= 1.0)
        if tested.size:
            pos[tested[-1] + 1:] = np.maximum(pos[tested[-1] + 1:], pos[tested[-1]])
        later = np.minimum(pos[1:k_max], self._acceptance_at(confidence))
        rate = self.economics.rates_by_length(np.concatenate(([first], later)), 0.0)
        k = int(np.argmax(rate))
        if slow_start:
            k = min(k, slow_start_length(self._conf.tested[self._bin(confidence)]),
                    self.probe_cap(confidence))
        return k if rate[k] >= rate[0] * (1 + self.margin) else 0

    def extension_for(self, confidence: float, room: int) -> int:
        # An extension's rows are weighed like a free draft's: at a long context each row
        # costs what attention over it does (SmolLM2 at 1,900 tokens: a 49-row pass 418 ms,
        # fifteen plain passes), and a match of 6-8 tokens there is often the passage
        # quoted, not the answer (measured: 4 of 48 and 4 of 37 appended tokens accepted).
        return room if self.joint is not None else self.length_for(confidence, room)

    def new_answer(self) -> None:
        """A new answer begins. Where :attr:`carried` is set, what earlier answers taught
        keeps its rates but weighs at most that many tests per bucket, so that this answer's
        first rounds outweigh it: how a copy from the context fares is a property of the
        answer (a file being edited is copied for dozens of tokens, a chat's two-token matches
        are mostly rejected at once), and an Engine's evidence from the one must not make the
        other draft past what pays for its first several rounds."""
        if self.carried > 0:
            for d in (self._pos, self._conf, self._first):
                d.cap(self.carried)
            self._streak = 0        # and its plans start slow, 4, 8, 16… tokens
            self._tried[:] = 0      # as does each kind of draft (:meth:`probe_cap`)

    def probe_cap(self, confidence: float) -> int:
        """4 << (this answer's rounds that drafted at this confidence, up to 8): a kind of
        draft this answer has not tried costs a short probe, whatever earlier answers
        taught (a chat's first three-token match after edits: 32 tokens on the edits' plan,
        rejected at its first)."""
        return slow_start_length(self._tried[self._bin(confidence)])

    def rest(self) -> None:
        """A round this policy took no part in (another source drafted): its evidence fades
        as in a plain round, so that it re-probes some time later."""
        self._pos.age(self.idle_decay)
        self._conf.age(self.idle_decay)

    def observe(self, k, n, confidences, draft_step_seconds, verify_seconds,
                k_verified=None) -> None:
        if not self.learns_costs:
            pass        # (its passes were shared: the Engine learns from them whole)
        elif k_verified is not None and k_verified > k:
            # The pass also checked tokens this policy did not choose: charge it only for
            # the share its own drafts would have cost.
            share = self.costs.pass_seconds(k + 1) / self.costs.pass_seconds(k_verified + 1)
            self.costs.observe_target(k + 1, verify_seconds * share)
        else:
            self.costs.observe_target(k + 1, verify_seconds)
        decay = self.decay if k else self.idle_decay
        self._pos.age(decay)
        self._conf.age(decay)
        for i in range(min(k, n + 1)):
            self._pos.add(min(i, self.k_max - 1), i < n)
        for i, c in enumerate(confidences[:min(k, n + 1)]):
            if c is not None:
                self._conf.add(self._bin(c), i < n)
        if k and confidences and confidences[0] is not None:
            self._first.age(decay)
            self._first.add(self._bin(confidences[0]), n > 0)
            self._tried[self._bin(confidences[0])] += 1
        self._rounds += 1
        # A round planned to draft counts towards the slow start even when the confidence
        # gate cut it to nothing: that is evidence about the gate, not a plain-decoding
        # decision (docs/decisions.md).
        self._streak = self._streak + 1 if k or self._planned else 0
        for s in draft_step_seconds if self.learns_costs else ():
            self.costs.observe_draft(s)
