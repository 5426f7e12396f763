"""Whether an Engine's streams draft at all, wired to its rounds: :class:`LaneGate`.

Owns the :class:`~edgespec.drafting.gate.BatchGate` of an Engine that decodes several streams
at once, fed by its lanes' :class:`~.rounds.Rounds` (their size, the phases a prompt or a
join starts afresh, the tokens committed) and told of each target pass. Offers a lane's
drafter gated by it (:meth:`LaneGate.gated`); with an adaptive draft length the rounds also
take turns while the gate says so. One stream alone has no gate: its drafters draft as
their own policies say.
"""

from __future__ import annotations

from typing import Optional

from ..drafting.base import Drafter
from ..drafting.gate import BatchGate, GatedDrafter
from .rounds import Rounds


class LaneGate:
    """The batch gate over ``rounds``; ``adaptive``: the draft length is the cost model's
    (a pinned one is the user's: always shared, never taken in turns)."""

    def __init__(self, rounds: Rounds, adaptive: bool):
        # (a stream joining starts a phase afresh, as a prompt's pass does: a lone
        # stream's phase must not span the wait for the next request)
        self.gate = BatchGate(lambda: rounds.size,
                              lambda: rounds.prompt_passes + rounds.joins,
                              lambda: rounds.committed)
        if adaptive:
            rounds.take_turns_when(self.gate.turns)

    def passed(self) -> None:
        """A target pass over the streams ended (:meth:`BatchGate.passed`)."""
        self.gate.passed()

    def gated(self, drafter: Optional[Drafter]) -> GatedDrafter:
        """``drafter``, drafting only while drafting measures faster than plain batching."""
        return GatedDrafter(drafter, self.gate)
