"""What drafting and verifying cost: the target's seconds per batch of n tokens and the draft's
per token (:class:`Costs`), refined while decoding.

The figures are measured at load by :mod:`.calibration` and remembered on disk by
:mod:`.cost_cache`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..config import REDO_FOLD

# A draft that costs nothing to make (an n-gram lookup), in seconds per token.
FREE_DRAFT = 1e-4
# Passes over a context at least this long teach the attention term; shorter ones the table.
ATTENTION_CONTEXT = 256
# A pass of several rows teaches the table's entry for its row count and, after a long context,
# the attention term, by least squares (a Kalman filter over both, :meth:`Costs._learn_rows`):
# each moves by how uncertain it is against how noisy a pass's seconds are. Each spread is
# relative to its figure: a pass's seconds (noise), the calibration's table against real rows
# (prior; the attention term starts unknown, at most a one-row pass per PRIOR_CONTEXT tokens),
# and what the machine may drift per pass.
PASS_NOISE = 0.15
PRIOR_SPREAD = 0.25
PRIOR_CONTEXT = 2000
DRIFT = 0.02


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

    Every verify pass refines the table's entry for its own row count (added where the table
    had none), at any context: llama.cpp's CPU kernels work in tiles of rows, so a pass of 12
    rows may cost what one of 16 does, which no line between measured sizes shows (the
    1.5B Qwen on the EPYC: 400 ms for 12 rows where the line says 340).
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
    # Seconds per context token the draft reads in a batch (catching up on a prompt):
    # measured by the calibration on its attention probe, so that no request pays for the
    # first measurement (docs/decisions.md#draft-read-cost); 0: not measured.
    draft_read: float = 0.0
    position: Callable[[], int] = field(default=lambda: 0, repr=False, compare=False)
    # The draft's pass over b streams' single tokens, b >= 2 (their reduced heads' products
    # included), when several streams draft together; measured for an Engine that decodes
    # several at once (measure_draft_batch).
    draft_batch: dict[int, float] = field(default_factory=dict)
    # Going back after rejected drafts where a model's cache has a recurrent part
    # (backend/rollback.py): seconds of the target's checkpoint before each verify pass and
    # of restoring a state (the target's and the draft's), and whether the accepted tokens
    # are then evaluated again (a pass of that many rows). Zero and False where going back
    # is free (attention only, or llama.cpp's snapshots).
    checkpoint: float = 0.0
    restore: float = 0.0
    redo: bool = False

    def adopt(self, other: "Costs") -> None:
        """Take ``other``'s figures in place (the policies and thread governors that share
        this object see them at once)."""
        self.target, self.draft, self.busy = dict(other.target), other.draft, other.busy
        self.attention, self.draft_attention = other.attention, other.draft_attention
        self.draft_read = other.draft_read
        self.draft_batch = dict(other.draft_batch) or self.draft_batch
        self.checkpoint, self.restore, self.redo = other.checkpoint, other.restore, other.redo
        self._cov = None
        self._table()

    def measured_rollback(self, target: tuple[float, float],
                          draft: Optional[tuple[float, float]] = None) -> None:
        """Going back as measured (:func:`~.calibration.rollback_costs`): the target's
        (checkpoint, restore) seconds and the draft's, if any: its checkpoint comes before
        each of its steps (added to :attr:`draft`), its restore to the target's."""
        self.checkpoint, self.restore = target
        self.redo = self.restore > 0    # a restored checkpoint is behind the tokens kept
        if draft is not None:
            self.draft += draft[0]
            self.restore += draft[1]

    def adopt_remeasured(self, other: "Costs") -> None:
        """Take a quiet re-measurement's figures in place (:meth:`adopt`). A calibration
        measures no attention term: the learned one stays, at the new speed; so does the
        draft's, where the context left no room to measure it again."""
        scale = float(other.bare(1.0) / self.bare(1.0))
        attention = self.attention * scale
        draft_attention = other.draft_attention or self.draft_attention * scale
        draft_read = other.draft_read or self.draft_read * scale
        self.adopt(other)
        self.attention, self.draft_attention = attention, draft_attention
        self.draft_read = draft_read

    def follow(self, position: Callable[[], int]) -> None:
        """The context the passes follow from now on: ``position()`` tokens
        (:attr:`position`)."""
        self.position = position

    def __post_init__(self) -> None:
        self._cov: Optional[np.ndarray] = None      # the least squares' (table, attention)
        self._cov_keys: list[int] = []
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
            self.draft_read *= scale
            self.checkpoint *= scale
            self.restore *= scale
            self._cov = None if self._cov is None else self._cov * scale ** 2
        else:
            self._learn_rows(n, min(max(seconds, 0.5 * old), 2.0 * old), context)
        self._table()

    def _learn_rows(self, n: int, seen: float, context: int) -> None:
        """Least squares, one pass at a time: the seconds ``seen`` of a pass of ``n`` rows
        after ``context`` tokens are the table's entry for ``n`` plus the attention term's
        share; the residual moves each by its uncertainty (a long context's pass can be
        told apart from a costlier row count only over passes of several lengths and
        contexts; the prior decides until then). After a short context only the entry
        learns."""
        if n not in self.target:
            self.target[n] = float(self.bare(float(n)))
        keys = sorted(self.target)
        m = len(keys)
        theta = np.array([self.target[k] for k in keys] + [self.attention])
        spread = np.append(theta[:m], max(self.attention, self.target[keys[0]] / PRIOR_CONTEXT))
        if self._cov is None or self._cov_keys != keys:
            self._cov_keys = keys
            self._cov = np.diag((PRIOR_SPREAD * spread) ** 2)
        cov = self._cov + np.diag((DRIFT * spread) ** 2)
        phi = np.zeros(m + 1)
        phi[keys.index(n)] = 1.0
        long = context >= ATTENTION_CONTEXT
        phi[m] = n * context if long else 0.0
        predicted = theta @ phi + (0.0 if long else self.attention * n * context)
        c_phi = cov @ phi
        gain = c_phi / (phi @ c_phi + (PASS_NOISE * predicted) ** 2)
        theta = theta + gain * (seen - predicted)
        self._cov = cov - np.outer(gain, c_phi)
        self.target = {k: max(float(v), 1e-9) for k, v in zip(keys, theta[:m])}
        self.attention = max(float(theta[m]), 0.0)

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

    def rollback(self, reach: np.ndarray) -> np.ndarray:
        """Expected seconds of going back in rounds that draft k = 0 … len(reach) tokens,
        ``reach[j - 1]`` the probability that the first j drafts are accepted: the target's
        checkpoint in every drafting round, and when j < k are accepted, a restore and (with
        ``redo``) the j + 1 tokens kept evaluated again: as rows added to the next pass when
        they are at most ``REDO_FOLD``, else as a pass of their own. All zeros where going
        back is free."""
        k = np.arange(len(reach) + 1)
        if not (self.checkpoint or self.restore or self.redo):
            return np.zeros(k.size)
        r = np.concatenate(([1.0], np.asarray(reach, dtype=float), [0.0]))
        stop = r[:-2] - r[1:-1]             # exactly j accepted, j = 0 … len(reach) - 1
        kept = np.arange(1, stop.size + 1, dtype=float)
        # kept tokens go again at the front of the next pass (their rows, not its fixed
        # part), or when more than REDO_FOLD in a pass of their own
        redo = np.where(kept <= REDO_FOLD, self.bare(kept + 1) - self.bare(1), self.bare(kept))
        back = self.restore + (redo if self.redo else 0.0)
        return np.where(k > 0, self.checkpoint, 0.0) + np.concatenate(
            ([0.0], np.cumsum(stop * back)))

    def perfect_drafts(self, max_rows: int) -> tuple[float, int]:
        """What drafts that are always accepted and cost nothing would make of a token's
        decoding: the least seconds per token of a pass of n = 2 … ``max_rows`` rows (n - 1
        drafts and the token after them) as a share of a one-row pass, and that n. The
        bound on decoding's speed-up is its inverse (what `edgespec bench` reports)."""
        n = np.arange(2, max(2, max_rows) + 1, dtype=float)
        per_token = self.bare(n) / n / float(self.bare(1.0))
        i = int(np.argmin(per_token))
        return min(1.0, float(per_token[i])), int(n[i])

    def snapshot(self) -> "Costs":
        """A copy of these figures, refined apart from here on."""
        return Costs(dict(self.target), self.draft, busy=self.busy, attention=self.attention,
                     draft_attention=self.draft_attention, draft_read=self.draft_read,
                     position=self.position, draft_batch=dict(self.draft_batch),
                     checkpoint=self.checkpoint, restore=self.restore, redo=self.redo)

    def free(self) -> "Costs":
        """These target costs with drafts that cost nothing (n-gram lookups; the target
        still goes back after rejections)."""
        return Costs(dict(self.target), FREE_DRAFT, attention=self.attention,
                     position=self.position, checkpoint=self.checkpoint,
                     restore=self.restore, redo=self.redo)
