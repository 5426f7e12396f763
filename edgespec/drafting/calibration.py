"""Measuring what drafting and verifying cost on this machine (:func:`calibrate`), and what a
draft pass over several streams costs (:func:`measure_draft_batch`): the figures a
:class:`~.costs.Costs` starts from, and whether the machine looked quiet while they were taken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..cpuload import QUIET, LoadWatch
from ..lm import LanguageModel
from .costs import ATTENTION_CONTEXT, FREE_DRAFT, Costs
from .reduced_head import ReducedHead

# Calibration stops measuring larger batches past this many seconds (a busy machine) and
# extends the curve from what it has; such a measurement is used but not kept.
CALIBRATION_BUDGET = 6.0
# The shortest stretch over which other processes' load is read (ticks are 10 ms).
LOAD_SPAN = 0.3
# Where the system does not say how busy its cores are, two measurements of one step
# differing by more than this say the machine was busy.
STEADY = 1.3


@dataclass
class Calibration:
    """What :func:`calibrate` measured, and whether the machine looked quiet meanwhile."""

    costs: Costs
    quiet: bool
    seconds: float
    others: Optional[float] = None     # cores other processes used meanwhile (None: unknown)


def calibrate(target: LanguageModel, draft: Optional[LanguageModel],
              sizes: Sequence[int] = (1, 2, 4, 8, 16, 33), reps: int = 2,
              head: Optional[ReducedHead] = None,
              progress: Callable[[str], None] = lambda s: None,
              budget: Optional[float] = None) -> Calibration:
    """Measure the target's seconds per batch of n tokens and the draft's per token (through
    ``head`` when the draft uses a reduced output layer).

    Every step is measured in ``reps`` rounds over all sizes (the fastest counts), so a slow
    stretch of a fraction of a second spoils one round, not a size. The machine counts as busy
    (``quiet=False``) when other processes used a quarter of a core or more meanwhile (where
    the system says: :mod:`edgespec.cpuload`), else when a step's rounds disagree by more than
    ``STEADY``; and when the budget ran out. Uses the models' caches after their current
    contents and restores them afterwards.
    """
    budget = CALIBRATION_BUDGET if budget is None else budget
    t_start = time.perf_counter()
    sizes = [n for n in sizes if n <= min(target.n_outputs_max, target.n_batch)]
    # warm-ups, rounds, the draft's steps after a long context
    steps = [0, 2 + reps * (len(sizes) + (draft is not None)) + (reps + 1) * (draft is not None)]

    def timed(model: LanguageModel, n: int) -> float:
        steps[0] += 1
        progress(f"measuring the models' speed (once per model and setting) "
                 f"{min(steps[0], steps[1])}/{steps[1]}…")
        base = len(model.tokens)
        tok = model.vocab.bos if model.vocab.bos >= 0 else 0
        model.checkpoint()          # (a recurrent model's way back to its contents)
        back0 = model.rollback_seconds
        t0 = time.perf_counter()
        if model is draft and head is not None:
            hidden = model.eval_hidden([tok] * n)
            if hidden is not None:
                head.subset_logits(hidden)     # what a greedy draft step computes
        else:
            model.eval([tok] * n, min(n, model.n_outputs_max))
        # (going back is measured apart: rollback_costs)
        seconds = time.perf_counter() - t0 - (model.rollback_seconds - back0)
        model.truncate(base)
        return seconds

    # Untimed warm-up: the first passes after a load fault in the mapped weights and set up
    # llama.cpp's buffers, and run a third slower (docs/decisions.md).
    for model in (target, draft):
        if model is not None:
            timed(model, max(sizes) if model is target else 1)
    watch = LoadWatch()
    rounds: list[dict] = []
    for r in range(reps):
        got = {}
        for n in sizes if r == 0 else [k for k in rounds[0] if k != "draft"]:
            got[n] = timed(target, n)
            if time.perf_counter() - t_start > budget and len(got) >= 2:
                progress("the machine is busy: measuring less, and not keeping it")
                break
        if draft is not None:
            got["draft"] = timed(draft, 1)
        rounds.append(got)
        if time.perf_counter() - t_start > budget:
            break
    # A load reading over a few hundredths of a second is a handful of clock ticks: one-token
    # passes fill the calibration out to LOAD_SPAN (within the budget), improving t(1) too.
    first = sizes[0]
    while watch.available and watch.elapsed() < LOAD_SPAN \
            and time.perf_counter() - t_start <= budget:
        rounds[0][first] = min(rounds[0][first], timed(target, first))
    keys = [k for k in rounds[0] if all(k in r for r in rounds)]
    best = {k: min(r[k] for r in rounds) for k in keys}
    spread = max(max(r[k] for r in rounds) / best[k] for k in keys)
    elapsed = time.perf_counter() - t_start
    others = watch.others()
    quiet = elapsed <= budget and (spread <= STEADY if others is None else others < QUIET)
    target_costs = {k: v for k, v in best.items() if k != "draft"}
    draft_attention = draft_read = 0.0
    if draft is not None and "draft" in best and time.perf_counter() - t_start <= budget:
        draft_attention, draft_read = _draft_attention(draft, best["draft"], timed, reps)
    costs = Costs(target_costs, best.get("draft", FREE_DRAFT), draft_attention=draft_attention,
                  draft_read=draft_read)
    rollback_costs(costs, target, draft)
    return Calibration(costs, quiet, elapsed, others)


def rollback_costs(costs: Costs, target: LanguageModel,
                   draft: Optional[LanguageModel], reps: int = 3) -> None:
    """Set ``costs``' figures for going back after rejected drafts (:meth:`Costs.rollback`),
    measured on the models as the loop uses them: the target's checkpoint before a verify
    pass of two rows and its restore when the second is rejected (nothing on an attention-only
    model, or with llama.cpp's snapshots); the draft's checkpoint before each step (added to
    its step) and its restore. The fastest of ``reps``; the caches end as they began."""
    def cycle(model: LanguageModel, rows: int) -> tuple[float, float]:
        base = len(model.tokens)
        tok = model.vocab.bos if model.vocab.bos >= 0 else 0
        b0 = model.rollback_seconds
        model.checkpoint()
        model.eval([tok] * rows, rows)
        b1 = model.rollback_seconds
        model.truncate(base + rows - 1)
        b2 = model.rollback_seconds
        model.truncate(base)
        return b1 - b0, b2 - b1

    target_cycles = [cycle(target, 2) for _ in range(reps)]
    fastest = (min(c[0] for c in target_cycles), min(c[1] for c in target_cycles))
    draft_fastest = None
    if draft is not None:
        draft_cycles = [cycle(draft, 1) for _ in range(reps)]
        draft_fastest = (min(c[0] for c in draft_cycles), min(c[1] for c in draft_cycles))
    costs.measured_rollback(fastest, draft_fastest)


# Context tokens behind the draft steps that measure the draft's attention term.
ATTENTION_PROBE = 512


def _draft_attention(draft: LanguageModel, step: float, timed: Callable,
                     reps: int) -> tuple[float, float]:
    """(Seconds per context token that a draft step adds, seconds per token of reading a
    context): the fastest of ``reps`` + 1 steps after ATTENTION_PROBE tokens against
    ``step``, the fastest after the current contents; and the probe's own batch per token
    (what catching up on a prompt costs, :class:`~.reading.Reading`). (0, 0) where the context
    has no room for the probe. The cache is restored."""
    base = len(draft.tokens)
    n = min(ATTENTION_PROBE, draft.n_ctx - base - 8)
    if n < ATTENTION_CONTEXT:
        return 0.0, 0.0
    tok = draft.vocab.bos if draft.vocab.bos >= 0 else 0
    try:
        t0 = time.perf_counter()
        draft.eval([tok] * n, 1)
        read = (time.perf_counter() - t0) / n
        after = min(timed(draft, 1) for _ in range(reps + 1))
    finally:
        draft.truncate(base)
    return max(0.0, after - step) / n, read


def measure_draft_batch(draft, sizes: Sequence[int], head: Optional[ReducedHead] = None,
                        reps: int = 3) -> dict[int, float]:
    """Seconds of the draft's pass over one token of each of b streams, for each b in
    ``sizes`` (at most the model's sequences), the reduced head's b products included; the
    fastest of ``reps``. ``draft``: the backend model (its ``sequences``, ``decode`` and
    ``decode_hidden``); each sequence is left as it was."""
    out = {}
    tok = draft.vocab.bos if draft.vocab.bos >= 0 else 0
    for b in sizes:
        seqs = draft.sequences[:b]
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            if head is not None:
                hidden = draft.decode_hidden([(seq, [tok]) for seq in seqs])
                for row in (hidden if hidden is not None else ()):
                    head.subset_logits(row)
            else:
                draft.decode([(seq, [tok], 1) for seq in seqs])
            best = min(best, time.perf_counter() - t0)
            for seq in seqs:
                seq.truncate(len(seq.tokens) - 1)
        out[b] = best
    return out
