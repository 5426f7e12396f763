"""The draft lengths of one round for several streams at once: goodput, as SmartSpec chooses
it (Liu et al. 2024, "Optimizing Speculative Decoding for Serving LLMs Using Goodput").

When an Engine decodes several streams together, one target pass verifies every stream's
draft and the draft model's steps for every drafting stream go in one pass each. A stream's
draft then costs the batch what its rows add to the target's pass and what its steps add to
the draft's passes, and it gains its expected accepted tokens. :func:`plan_round` chooses
every stream's K (0 allowed) to maximise the batch's expected committed tokens per second:

    goodput(K) = Σ_i E_i(K_i) / (Σ_s d(b_s) + T(Σ_i (K_i + 1)))

with E_i(k) = 1 + Σ_{j≤k} Π_{l≤j} r_il the expected tokens of stream i drafting k (its policy's
acceptance per position r_i), T(n) the target's pass of n rows after the streams' contexts,
and d(b) the draft model's pass over b streams' single tokens, b_s the streams still drafting
at step s. Coordinate ascent, each stream's K scanned over its whole range with the others
fixed, until nothing improves, from the best uniform length (a draft pass shared by several
streams may pay where one stream's alone does not); the result must beat plain batched
decoding by the policies' margin, or every stream decodes plainly. One stream alone keeps its
own policy's choice, so a single stream decides exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Ask:
    """What one stream's length policy brings to the round's plan: its acceptance per draft
    position (``rates``, as it plans with them), the most drafts it may take (``cap``: its
    slow start, the loop's room), what it would draft alone (``alone``), and its context's
    length (``position``: its rows' attention cost)."""

    rates: np.ndarray
    cap: int
    alone: int
    position: int = 0


@dataclass(frozen=True)
class BatchCosts:
    """Seconds of the batch's passes: ``target(n)`` a target pass of n rows over an empty
    context, ``attention`` per row per context token, ``draft(b)`` a draft pass over b
    streams' single tokens."""

    target: Callable[[np.ndarray], np.ndarray]
    attention: float
    draft: Callable[[np.ndarray], np.ndarray]
    # a stream's expected seconds of going back by K, from its acceptance reach (a recurrent
    # target's checkpoints, restores and tokens evaluated again: Costs.rollback); None: free
    rollback: Optional[Callable[[np.ndarray], np.ndarray]] = None


def expected_tokens(ask: Ask) -> np.ndarray:
    """E(k) for k = 0..cap: the tokens a round drafting k commits, in expectation."""
    reach = np.cumprod(np.asarray(ask.rates, dtype=float)[:ask.cap])
    return 1.0 + np.concatenate(([0.0], np.cumsum(reach)))


def plan_round(asks: Sequence[Ask], costs: BatchCosts, margin: float = 0.05,
               sweeps: int = 4) -> list[int]:
    """Each stream's draft length for this round (see the module docstring)."""
    n = len(asks)
    if n == 1:
        return [asks[0].alone]
    gains = [expected_tokens(a) for a in asks]
    caps = np.array([a.cap for a in asks])
    longest = int(caps.max()) if n else 0
    positions = np.array([a.position for a in asks], dtype=float)
    steps = np.arange(1, longest + 1)
    d = costs.draft
    backs = [costs.rollback(np.cumprod(np.asarray(a.rates, dtype=float)[:a.cap]))
             if costs.rollback is not None else np.zeros(a.cap + 1) for a in asks]

    def draft_seconds(ks: np.ndarray) -> float:
        b = (ks[:, None] >= steps[None, :]).sum(axis=0)
        b = b[b > 0]
        return float(np.sum(d(b))) if b.size else 0.0

    def seconds(ks: np.ndarray) -> float:
        rows = ks + 1
        return draft_seconds(ks) + float(costs.target(float(rows.sum()))) + \
            costs.attention * float(rows @ positions) + sum(b[k] for b, k in zip(backs, ks))

    def goodput(ks: np.ndarray) -> float:
        return sum(g[k] for g, k in zip(gains, ks)) / seconds(ks)

    plain = goodput(np.zeros(n, dtype=int))
    # Start from the best uniform length (every stream min(L, its cap)): a draft pass shared
    # by several streams can pay where one stream's alone does not, which one-stream moves
    # from plain decoding would never find.
    ks, best = np.zeros(n, dtype=int), plain
    for length in range(1, longest + 1):
        cand = np.minimum(caps, length)
        g = goodput(cand)
        if g > best:
            ks, best = cand, g
    for _ in range(sweeps):
        moved = False
        for i in range(n):
            cand = _scan(i, ks, gains, caps, positions, costs, steps, backs)
            k = int(np.argmax(cand))
            if cand[k] > best * (1 + 1e-9) and k != ks[i]:
                ks[i], best, moved = k, float(cand[k]), True
        if not moved:
            break
    if best < plain * (1 + margin):
        return [0] * n
    return [int(k) for k in ks]


def _scan(i: int, ks: np.ndarray, gains: list, caps: np.ndarray, positions: np.ndarray,
          costs: BatchCosts, steps: np.ndarray, backs: list) -> np.ndarray:
    """Goodput for every K of stream ``i`` (0..its cap), the others' fixed."""
    others = ks.copy()
    others[i] = 0
    k = np.arange(0, caps[i] + 1)
    tokens = sum(g[kk] for j, (g, kk) in enumerate(zip(gains, others)) if j != i) + gains[i]
    rows_other = float((others + 1).sum() - 1)
    target = costs.target(rows_other + k + 1) + costs.attention * (
        float((np.delete(others, i) + 1) @ np.delete(positions, i)) + (k + 1) * positions[i])
    # the draft passes: b_s for the others, then stream i's extra row at its steps 1..k
    mask = np.delete(others, i)[:, None] >= steps[None, :]
    b = mask.sum(axis=0)
    base = np.where(b > 0, costs.draft(np.maximum(b, 1)), 0.0)
    extra = costs.draft(b + 1) - base          # what stream i adds at each step
    draft = float(base.sum()) + np.concatenate(([0.0], np.cumsum(extra)))[:k.size]
    back = sum(b[kk] for j, (b, kk) in enumerate(zip(backs, others)) if j != i) + backs[i][k]
    return tokens / (draft + target + back)
