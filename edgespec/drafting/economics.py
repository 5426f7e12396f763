"""What drafting is expected to cost and save: the cost oracle of an adaptive length policy.

:class:`DraftEconomics` puts the policy's acceptance estimates (per draft position, decaying;
:class:`~.policy.AdaptiveLength`) against what each part of a round costs
(:class:`~.costs.Costs`): a target pass of n rows, a draft step, a round of K drafts, the time
drafting saves over the next N tokens. The policy asks it what each draft length is worth
when it plans; the drafter's other decisions ask it whether to catch a draft cache up, to
read a long prompt through a window, to draft again after plain rounds (:mod:`.reading`), and
which source to draft with (:mod:`.hybrid`).

A pinned length (:class:`~.policy.FixedLength`) has no oracle (its ``economics`` is None): the
callers then act as the user's length says (read everything, catch up whenever behind, draft
regardless).
"""

from __future__ import annotations

from typing import Optional, Protocol

import numpy as np

from .costs import Costs


class Estimates(Protocol):
    """What the oracle reads of its policy (:class:`~.policy.AdaptiveLength`): the costs, the
    acceptance per draft position, the margin drafting must win by, and the plan."""

    costs: Costs
    margin: float

    @property
    def planned(self) -> int: ...

    @property
    def round_rate(self) -> float: ...

    @property
    def probing(self) -> bool: ...

    def position_rates(self, z: Optional[float] = None) -> np.ndarray: ...

    def best(self) -> tuple[int, float]: ...


class DraftEconomics:
    """The expected costs and savings of drafting, on one adaptive policy's estimates."""

    def __init__(self, policy: Estimates):
        self.policy = policy

    @property
    def costs(self) -> Costs:
        return self.policy.costs

    @property
    def planned_rate(self) -> float:
        """Expected tokens per second of the round just planned (a plain one: a plain
        pass's)."""
        p = self.policy
        return p.round_rate if p.planned else 1.0 / self.costs.pass_seconds(1)

    def pass_seconds(self, n_rows: int) -> float:
        """Seconds of a target pass over ``n_rows`` tokens after the current context (a
        plain round: 1; verifying K drafts: K + 1)."""
        return self.costs.pass_seconds(n_rows)

    def step_seconds(self) -> float:
        """Seconds of one single-token draft step."""
        return self.costs.draft_step()

    def read_seconds(self) -> Optional[float]:
        """Seconds per context token the draft reads in a batch, as the calibration measured
        it (None: not measured)."""
        return self.costs.draft_read or None

    def expected_round(self, k: int, rates: Optional[np.ndarray] = None) -> tuple[float, float]:
        """(expected tokens, expected seconds) of a round that drafts ``k`` tokens, with these
        acceptance rates per position (default: the policy's
        :meth:`~.policy.AdaptiveLength.position_rates`): the accepted drafts and the target's
        own token, ``k`` draft steps, a pass of ``k + 1`` rows and, on a recurrent model,
        going back after a rejection (:meth:`~.costs.Costs.rollback`). Against decoding those
        tokens plainly it saves tokens × :meth:`pass_seconds` (1) − seconds."""
        reach = np.cumprod((self.policy.position_rates() if rates is None else rates)[:k])
        c = self.costs
        return 1.0 + float(reach.sum()), \
            k * c.draft_step() + c.pass_seconds(k + 1) + float(c.rollback(reach)[k])

    def rates_by_length(self, acceptance: np.ndarray, draft: float) -> np.ndarray:
        """Expected tokens per second of a round that drafts K = 0 … len(acceptance)
        tokens, position i accepted at ``acceptance[i]``, a draft step costing ``draft``."""
        ks = np.arange(0, acceptance.size + 1)
        reach = np.cumprod(acceptance)
        seconds = ks * draft + self.costs.pass_seconds(ks + 1) + self.costs.rollback(reach)
        return (1.0 + np.concatenate(([0.0], np.cumsum(reach)))) / seconds

    def catch_up_pays(self, seconds: float, tokens_ahead: float) -> bool:
        """Whether spending ``seconds`` to bring the draft up to date is repaid by drafting
        for the next ``tokens_ahead`` tokens instead of decoding plainly: at the rate of the
        K the policy's :meth:`~.policy.AdaptiveLength.best` chooses (a probe's, while
        probing, where catching up is cheap). A probe's optimism does not pay for reading a
        prompt: that costs a second or more (Qwen2.5-Coder-0.5B reads 4.4 ms a token on 2
        cores, a 350-token chat history 1.5 s, where the 1.5B target decodes a token in 81 ms)
        and a probe is a bet on thin evidence, so a catch-up above a plain pass's cost must
        pay at today's estimates (:meth:`saving`)."""
        k, rate = self.policy.best()
        if k == 0:
            return False
        if self.policy.probing and seconds > self.costs.pass_seconds(1):
            return self.saving(tokens_ahead) > seconds
        return tokens_ahead * (self.costs.pass_seconds(1) - 1.0 / rate) > seconds

    def saving(self, tokens_ahead: float, keep: float = 1.0) -> float:
        """Seconds that drafting is expected to save over decoding the next ``tokens_ahead``
        tokens plainly, were every position's acceptance ``keep`` times today's estimate (a
        draft that reads only a window of the prompt): at the best K's rate on today's
        estimates (no probing), 0 unless it beats plain decoding by the policy's margin."""
        if tokens_ahead <= 0:
            return 0.0
        rate = self.rates_by_length(keep * self.policy.position_rates(),
                                    self.costs.draft_step())
        best = float(rate.max())
        if best < rate[0] * (1 + self.policy.margin):
            return 0.0
        return tokens_ahead * (self.costs.pass_seconds(1) - 1.0 / best)
