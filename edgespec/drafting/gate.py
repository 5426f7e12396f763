"""Whether several streams draft at all: decided by the batch's measured throughput, not by
the cost model alone.

The goodput plan (:mod:`.batch`) chooses each stream's draft length from the cost of a
``llama_decode`` by rows and of a draft step by streams. What it cannot see is everything
around the passes: each stream's sampling and verification, the threads' hand-offs at every
draft step (a round with drafts is K + 1 meetings of all streams, a plain one is one), and
those threads' Python work competing with llama.cpp's threads for the same cores. For a fast
target on few cores that is most of a round (SmolLM2 F32 on 2 cores, 4 streams: a plain
round every 41 ms where its pass takes 23 ms), and a plan that the cost model prefers by 10%
lost to plain batching by 30%.

:class:`BatchGate` measures instead. Time is cut into *phases* of at least a few target
passes; in each, every stream decodes the same way (all drafting as their plans say, or all
plainly), and the phase's committed tokens per wall-clock second are that regime's figure for
that many streams (a decayed mean). The gate keeps the regime that measured better and
re-measures the other now and then, less and less often while it keeps losing (1 phase in 2,
4, … 32), so that the cost of looking is a small share of the difference. A phase during
which a stream joined, left or had its prompt evaluated is not counted. One stream alone is
never gated: its own policy decides exactly as before (and its rate is measured the same way).

A third regime is the reference a batch must beat: the streams *take turns*
(:attr:`~edgespec.engine.rounds.Rounds.turns`), each round one stream's alone (planned, drafted
and verified as if it were the only one), the turn passing when its holder asks for its
next round. Its
throughput is that of the same requests one after another (with every first token early),
so when neither way of sharing passes beats it, as on a CPU whose cores the target's pass
already fills, the batch still never loses to running the streams in turn. It is judged by
the rate measured while a stream ran alone (the server's own one-after-another throughput),
and explored only before one did.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from .base import Draft

SPEC, PLAIN, TURNS = "spec", "plain", "turns"
REGIMES = (SPEC, PLAIN, TURNS)
MIN_PASSES = 6          # target passes a phase lasts at least
MIN_SECONDS = 0.2       # and seconds
MAX_INTERVAL = 32       # the losing regime is measured again at least once in this many phases
DECAY = 0.3             # weight of a new phase in a regime's figure


@dataclass
class _Figure:
    """One regime's committed tokens per second at one stream count."""

    rate: float = 0.0
    phases: int = 0

    def add(self, rate: float) -> None:
        self.rate = rate if self.phases == 0 else self.rate + DECAY * (rate - self.rate)
        self.phases += 1


class BatchGate:
    """See the module docstring. ``streams``: how many streams decode together now;
    ``prompts``: a counter of the passes that held a prompt's tokens; ``committed``: a counter
    of the tokens all streams committed (:attr:`~edgespec.engine.rounds.Rounds.committed`: every
    stream's, whether it drafts or not)."""

    def __init__(self, streams: Callable[[], int], prompts: Callable[[], int],
                 committed: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 min_passes: int = MIN_PASSES, min_seconds: float = MIN_SECONDS):
        self._streams, self._prompts, self._committed = streams, prompts, committed
        self._clock = clock
        self.min_passes, self.min_seconds = min_passes, min_seconds
        self._lock = threading.Lock()
        self.figures: dict[tuple[int, str], _Figure] = {}
        self._interval: dict[tuple[int, str], int] = {}   # phases between looks at a loser
        self._since: dict[tuple[int, str], int] = {}      # phases since the last look
        self.regime = SPEC
        self._phase: Optional[tuple[int, float, int]] = None   # (streams, start, prompts)
        self._passes = 0
        self._tokens0 = 0       # the committed counter when the phase began
        self._exploring = False     # the phase under way measures the losing regime
        self._asked = False

    # -- what the streams and the rounds tell it ------------------------------------------

    def drafts(self) -> bool:
        """Whether a stream's next round may draft."""
        n = self._streams()
        if n < 1:
            return True
        with self._lock:
            self._roll(n)
            self._asked = True
            return n == 1 or self.regime != PLAIN

    def turns(self) -> bool:
        """Whether the streams take turns now (one stream's round per pass)."""
        return self._streams() > 1 and self.regime == TURNS

    def passed(self) -> None:
        """A decoding pass of the target went by."""
        with self._lock:
            self._passes += 1
            self._roll(self._streams())

    # -- inside ---------------------------------------------------------------------------

    def figure(self, n: int, regime: str) -> _Figure:
        return self.figures.setdefault((n, regime), _Figure())

    def _start(self, n: int, regime: str) -> None:
        self.regime = regime
        self._phase = (n, self._clock(), self._prompts())
        self._passes, self._tokens0 = 0, self._committed()
        self._asked = False     # whether a stream that may draft asked during the phase

    def lone(self) -> Optional[float]:
        """A stream alone's committed tokens per second (measured whenever one runs alone),
        or None before any: what the streams get taking turns."""
        f = self.figures.get((1, SPEC))
        return f.rate if f is not None and f.phases else None

    def _rate(self, n: int, regime: str) -> Optional[float]:
        """The figure ``regime`` is judged by at ``n`` streams (None: never measured). Taking
        turns is judged by the streams' rate alone, when known: each of its rounds is a lone
        stream's (its own phases start and end mid-turn, and measure it low)."""
        if regime == TURNS and self.lone() is not None:
            return self.lone()
        f = self.figure(n, regime)
        return f.rate if f.phases else None

    def _roll(self, n: int) -> None:
        if n < 1:
            self._phase = None
            return
        if self._phase is None or self._phase[0] != n or self._phase[2] != self._prompts():
            # A new count of streams, or a prompt's pass inside the phase: measure afresh.
            same = self._phase is not None and self._phase[0] == n
            if not same:
                self._exploring = False
            self._start(n, self.regime if same else self._best(n))
            return
        elapsed = self._clock() - self._phase[1]
        if self._passes < self.min_passes or elapsed < self.min_seconds:
            return
        if not self._asked:         # nobody could draft: the phase tells nothing
            self._start(n, self.regime)
            return
        self.figure(n, self.regime).add((self._committed() - self._tokens0) / elapsed)
        self._start(n, self._next(n))

    def _best(self, n: int) -> str:
        """The regime that measured fastest at ``n`` streams (one never measured first; a
        stream alone is never gated)."""
        if n == 1:
            return SPEC
        rates = {r: self._rate(n, r) for r in REGIMES}
        fresh = [r for r in REGIMES if rates[r] is None]
        if fresh:
            return fresh[0]
        return max(REGIMES, key=lambda r: rates[r])

    def _next(self, n: int) -> str:
        """The regime of the next phase: the best one, or now and then a loser, each loser
        less often while it keeps losing."""
        best = self._best(n)
        if n == 1:
            return best
        if self._exploring:
            # The phase just ended looked at a loser: look less often while it keeps losing.
            self._exploring = False
            key = (n, self.regime)
            lost = self.regime != best
            self._interval[key] = min(MAX_INTERVAL, 2 * self._interval.get(key, 1)) \
                if lost else 2
            self._since[key] = 0
            return best
        if self.regime != best:
            return best     # (a loser measured in its turn, now behind: back to the best)
        due = None
        for r in REGIMES:
            if r == best or (r == TURNS and self.lone() is not None):
                continue
            key = (n, r)
            self._since[key] = self._since.get(key, 0) + 1
            if not self.figure(n, r).phases or \
                    self._since[key] >= self._interval.setdefault(key, 2):
                due = due or r
        if due is not None:
            self._exploring = True
            return due
        return best


class GatedDrafter:
    """A stream's drafter whose rounds draft only while the :class:`BatchGate` says so (the
    drafting protocol of :mod:`.base`)."""

    def __init__(self, inner, gate: BatchGate):
        self.inner, self.gate = inner, gate
        self._gated = False

    def begin(self, context: Sequence[int], limit: int) -> None:
        self.inner.begin(context, limit)

    def plan(self) -> int:
        self._gated = not self.gate.drafts()
        return 0 if self._gated else self.inner.plan()

    def draft(self, context, k_max: int, params, rng: np.random.Generator, should_stop,
              constraint=None) -> Draft:
        return self.inner.draft(context, k_max, params, rng, should_stop, constraint)

    def observe(self, draft: Draft, n_accepted: int, verify_seconds: float) -> None:
        if not self._gated:         # a gated round taught its policy nothing
            self.inner.observe(draft, n_accepted, verify_seconds)

    def rollback(self, n_keep: int) -> None:
        self.inner.rollback(n_keep)
