"""What drafting and verifying cost: the target's seconds per batch of n tokens and the draft's
per token, measured at load (calibration), remembered on disk, and refined while decoding.

The cache (``paths.calibration_file()``) keys each entry by the model files (path, size,
mtime), the thread count and the offload, so that a measurement is reused only where it still
describes the machine's work.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from .. import paths
from ..cpuload import QUIET, LoadWatch
from ..lm import HiddenStateModel, LanguageModel
from .reduced_head import HEAD_ROWS, ReducedHead

# A draft that costs nothing to make (an n-gram lookup), in seconds per token.
FREE_DRAFT = 1e-4
# Passes over a context at least this long teach the attention term; shorter ones the table.
ATTENTION_CONTEXT = 256
# How far one observation moves the attention term (it starts unknown, at 0: faster than the
# table's, which starts measured).
ATTENTION_EMA = 0.2


@dataclass
class Costs:
    """Seconds per call: the target's per batch size (sparse, interpolated), the draft's per
    token. Refined online with exponential moving averages.

    A pass of n tokens after a context of L costs ``target(n) + attention · n · L``: the table
    is measured over an empty context (calibration) and the attention term, every batch token
    attending to every context token, is learned from the verify passes over long contexts
    (:data:`ATTENTION_CONTEXT`). Without it a long prompt's batches look as cheap as a short
    one's: on the 2-core AMX machine SmolLM2's 9-token pass costs 1.8 one-token passes after
    16 tokens, 2.4 after 1,500 and 3.5 after 2,900, and drafting that pays on a short prompt
    loses on a long one. ``position`` says the target's context length now (the engine gives
    its target's; 0 without one).
    """

    target: dict[int, float]
    draft: float
    ema: float = 0.05
    observed: int = 0       # target passes measured since these costs were made
    busy: bool = False      # measured while the machine was busy: to be measured again
    attention: float = 0.0  # seconds per batch token per context token
    # The draft's step attends to about as long a context (its cells follow the target's):
    # seconds per context token of a step. Measured by the calibration with bare steps after
    # an empty and a long context; the loop's steps carry fixed costs of their own that would
    # be taken for attention (docs/decisions.md#long-context-drafts).
    draft_attention: float = 0.0
    position: Callable[[], int] = field(default=lambda: 0, repr=False, compare=False)
    # The draft's pass over b streams' single tokens, b >= 2 (their reduced heads' products
    # included), when several streams draft together; measured for an Engine that decodes
    # several at once (measure_draft_batch).
    draft_batch: dict[int, float] = field(default_factory=dict)

    def adopt(self, other: "Costs") -> None:
        """Take ``other``'s figures in place (the policies and thread governors that share
        this object see them at once)."""
        self.target, self.draft, self.busy = dict(other.target), other.draft, other.busy
        self.attention, self.draft_attention = other.attention, other.draft_attention
        self.draft_batch = dict(other.draft_batch) or self.draft_batch
        self._table()

    def __post_init__(self) -> None:
        self._table()

    def _table(self) -> None:
        keys = sorted(self.target)
        self._keys = np.array(keys, dtype=float)
        # A larger batch never costs less: a measurement disturbed by another process (a
        # 2-token pass faster than the 1-token one) must not extend into negative costs.
        self._vals = np.maximum.accumulate(np.array([self.target[k] for k in keys]))
        slope = ((self._vals[-1] - self._vals[-2]) / (self._keys[-1] - self._keys[-2])
                 if len(keys) > 1 else 0.0)
        self._slope = slope if slope > 0 else self._vals[-1] / self._keys[-1]

    def pass_seconds(self, n_rows):
        """Seconds for a target pass of ``n_rows`` tokens (scalar or array; each gives a row
        of logits) after the current context: the table linear between measured sizes,
        extended along the last segment beyond them, plus the attention term."""
        n = np.asarray(n_rows, dtype=float)
        out = self.bare(n) + self.attention * n * self.position()
        return float(out) if out.ndim == 0 else out

    def bare(self, n):
        """Seconds for a pass of ``n`` tokens over an empty context (the table alone)."""
        out = np.interp(n, self._keys, self._vals)
        return np.where(n > self._keys[-1], self._vals[-1] + self._slope * (n - self._keys[-1]),
                        out)

    @staticmethod
    def _blend(old: float, seconds: float, ema: float) -> float:
        # One slow call (a cold cache after a prompt, another process) must not flip the
        # decision: each observation moves the estimate by at most ema × 50%.
        return old + ema * (min(max(seconds, 0.5 * old), 1.5 * old) - old)

    def observe_target(self, n: int, seconds: float, context: Optional[int] = None) -> None:
        """A target pass of ``n`` rows took ``seconds``, after ``context`` tokens (default:
        :attr:`position`)."""
        if n < 1:
            return
        self.observed += 1
        context = self.position() if context is None else context
        old = float(self.bare(float(n))) + self.attention * n * context
        new = self._blend(old, seconds, self.ema)
        if n == 1:
            # A plain pass measures how fast the machine is now, and while decoding plainly
            # nothing else is measured: every cost follows, so that the calibrated ratios of
            # draft and batch costs to a plain pass (which decide whether drafting pays) do not
            # drift apart while the machine speeds up or slows down.
            scale = new / old
            self.target = {k: v * scale for k, v in self.target.items()}
            self.target[1] = new - self.attention * scale * context
            self.draft *= scale
            self.draft_batch = {b: v * scale for b, v in self.draft_batch.items()}
            self.attention *= scale
            self.draft_attention *= scale
        elif context >= ATTENTION_CONTEXT:
            # A batch over a long context: what it cost beyond the table is attention.
            base = float(self.bare(float(n)))
            seen = min(max(seconds, 0.5 * old), 2.0 * old)
            implied = max(0.0, seen - base) / (n * context)
            self.attention += ATTENTION_EMA * (implied - self.attention)
            return
        else:
            self.target[n] = new - self.attention * n * context
        self._table()

    def draft_step(self) -> float:
        """Seconds of one draft step after the current context (:attr:`position`): the
        measured step plus the attention term. SmolLM2's Q8_0 step is 8-10 ms after 100
        tokens and 15-16 ms after 1,900, against the F32 target's 20-25 and 25-30: a draft
        that pays on a short prompt may not on a long one."""
        return self.draft + self.draft_attention * self.position()

    def observe_draft(self, seconds: float, context: Optional[int] = None) -> None:
        """A draft step took ``seconds`` after ``context`` tokens (default: :attr:`position`):
        it refines the step, the measured attention term set apart."""
        context = self.position() if context is None else context
        old_step = self.draft + self.draft_attention * context
        old = self.draft
        self.draft = max(self._blend(old_step, seconds, self.ema)
                         - self.draft_attention * context, 0.1 * old)
        self.draft_batch = {b: v * self.draft / old for b, v in self.draft_batch.items()}

    def draft_pass(self, b):
        """Seconds of a draft pass over ``b`` streams' single tokens (scalar or array; b >= 1):
        the measured batches, linear between them and along the last segment beyond; without
        them, ``b`` separate steps (no gain assumed from batching drafts)."""
        b = np.asarray(b, dtype=float)
        if not self.draft_batch:
            out = b * self.draft
        else:
            keys = np.array([1.0] + sorted(self.draft_batch), dtype=float)
            vals = np.maximum.accumulate([self.draft] + [self.draft_batch[k]
                                                         for k in sorted(self.draft_batch)])
            slope = max((vals[-1] - vals[-2]) / (keys[-1] - keys[-2]), 0.0)
            out = np.where(b > keys[-1], vals[-1] + slope * (b - keys[-1]),
                           np.interp(b, keys, vals))
        return float(out) if out.ndim == 0 else out

    def snapshot(self) -> "Costs":
        """A copy of these figures, refined apart from here on."""
        return Costs(dict(self.target), self.draft, busy=self.busy, attention=self.attention,
                     draft_attention=self.draft_attention, position=self.position,
                     draft_batch=dict(self.draft_batch))

    def free(self) -> "Costs":
        """These target costs with drafts that cost nothing (n-gram lookups)."""
        return Costs(dict(self.target), FREE_DRAFT, attention=self.attention,
                     position=self.position)


# Calibration stops measuring larger batches past this many seconds (a busy machine) and
# extends the curve from what it has; such a measurement is used but not kept.
CALIBRATION_BUDGET = 6.0
# The shortest stretch over which other processes' load is read (ticks are 10 ms).
LOAD_SPAN = 0.3
# Where the system does not say how busy its cores are, two measurements of one step
# differing by more than this say the machine was busy.
STEADY = 1.3
CACHE_DAYS = 30         # a kept calibration is measured again after this long


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
        t0 = time.perf_counter()
        if model is draft and head is not None:
            hidden = model.eval_hidden([tok] * n)
            if hidden is not None:
                head.subset_logits(hidden)     # what a greedy draft step computes
        else:
            model.eval([tok] * n, min(n, model.n_outputs_max))
        seconds = time.perf_counter() - t0
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
    draft_attention = 0.0
    if draft is not None and "draft" in best and time.perf_counter() - t_start <= budget:
        draft_attention = _draft_attention(draft, best["draft"], timed, reps)
    return Calibration(Costs(target_costs, best.get("draft", FREE_DRAFT),
                             draft_attention=draft_attention), quiet, elapsed, others)


# Context tokens behind the draft steps that measure the draft's attention term.
ATTENTION_PROBE = 512


def _draft_attention(draft: LanguageModel, step: float, timed: Callable, reps: int) -> float:
    """Seconds per context token that a draft step adds: the fastest of ``reps`` + 1 steps
    after ATTENTION_PROBE tokens against ``step``, the fastest after the current contents.
    0 where the context has no room for the probe. The cache is restored."""
    base = len(draft.tokens)
    n = min(ATTENTION_PROBE, draft.n_ctx - base - 8)
    if n < ATTENTION_CONTEXT:
        return 0.0
    tok = draft.vocab.bos if draft.vocab.bos >= 0 else 0
    try:
        draft.eval([tok] * n, 1)
        after = min(timed(draft, 1) for _ in range(reps + 1))
    finally:
        draft.truncate(base)
    return max(0.0, after - step) / n


def _fingerprint(model: HiddenStateModel) -> str:
    st = model.path.stat()
    c = model.config
    return f"{model.path.resolve()}|{st.st_size}|{int(st.st_mtime)}|t{c.n_threads}|" \
           f"ngl{c.n_gpu_layers},fa-{c.flash_attn}" + (f"@rpc={','.join(c.rpc)}" if c.rpc else "")


def _current(key: str, entry) -> bool:
    """Whether a calibration entry still describes files on this machine and is recent: entries
    for deleted or rewritten files (a removed model, a test's temporary copy), for an older key
    format and older than CACHE_DAYS are dropped when the cache is next written."""
    if not isinstance(entry, dict) or time.time() - entry.get("saved", 0) > CACHE_DAYS * 86400:
        return False
    for part in key.split("||"):
        if part == "-" or part.startswith("head"):
            continue
        fields = part.split("|")
        if len(fields) != 5:
            return False
        try:
            st = Path(fields[0]).stat()
        except OSError:
            return False
        if f"{st.st_size}|{int(st.st_mtime)}" != "|".join(fields[1:3]):
            return False
    return True


class CostCache:
    """Measured costs on disk (``paths.calibration_file()``), one entry per pair of model
    files, thread count and offload. A measurement taken on a busy machine is used but not
    kept; costs refined while decoding are kept (:meth:`save`), so a poor start heals."""

    def __init__(self, target, draft, head: Optional[ReducedHead] = None):
        self.path = paths.calibration_file()
        self.key = _fingerprint(target) + "||" + (_fingerprint(draft) if draft is not None
                                                  else "-")
        if head is not None:
            self.key += f"||head{HEAD_ROWS}"

    def _read(self) -> dict:
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def load(self) -> Optional[Costs]:
        entry = self._read().get(self.key)
        if not _current(self.key, entry) or "target" not in entry or "draft" not in entry:
            return None
        try:
            return Costs({int(n): float(v) for n, v in entry["target"].items()},
                         float(entry["draft"]), attention=float(entry.get("attention", 0.0)),
                         draft_attention=float(entry.get("draft_attention", 0.0)),
                         draft_batch={int(b): float(v) for b, v in
                                      entry.get("draft_batch", {}).items()})
        except (TypeError, ValueError, AttributeError):
            return None

    def save(self, costs: Costs, source: str) -> None:
        saved = {k: v for k, v in self._read().items() if _current(k, v)}
        saved[self.key] = {"target": costs.target, "draft": costs.draft,
                           "attention": costs.attention, "draft_attention": costs.draft_attention,
                           "draft_batch": costs.draft_batch,
                           "saved": time.time(), "source": source}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(saved, indent=1))
            tmp.replace(self.path)
        except OSError:
            pass  # a read-only home only costs a recalibration next time


def calibrate_cached(target, draft, head: Optional[ReducedHead] = None, *,
                     force: bool = False,
                     progress: Callable[[str], None] = lambda s: None) -> Costs:
    """:func:`calibrate`, remembered per model file, threads and offload in the user's cache
    directory so that only the first load of a pair on a machine pays for it (~1 s), unless
    ``force``. ``target``/``draft``: loaded models with ``path`` and ``config`` (a
    :class:`~edgespec.backend.LlamaModel`)."""
    cache = CostCache(target, draft, head)
    costs = None if force else cache.load()
    if costs is not None:
        return costs
    cal = calibrate(target, draft, head=head, progress=progress)
    if cal.quiet:
        cache.save(cal.costs, "calibration")
    return Costs(dict(cal.costs.target), cal.costs.draft, busy=not cal.quiet,
                 draft_attention=cal.costs.draft_attention)


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
