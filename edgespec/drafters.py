"""Drafters, and the policy that decides how long each draft is.

A drafter proposes up to ``k`` tokens after the committed context and returns, for each, the
distribution q it was drawn from (one-hot when it has no probabilities). It asks the policy
before each token whether to go on. That decision may depend only on the draft's distribution
at that position (its confidence), never on the token drawn from it: stopping on the drawn
token's own probability would make the proposals a biased sample of q and break the
losslessness of rejection sampling (worked example in tests/test_drafters.py).

Policies:

* :class:`FixedLength` — K tokens per round, optionally cut when the draft's top probability
  falls below ``p_min`` (llama.cpp's ``--draft-p-min``).
* :class:`AdaptiveLength` — a cost model. It knows the target's time for a batch of n tokens
  and the draft's time per token (calibrated at load, refined online) and tracks acceptance
  per draft position and per draft-confidence level (both decaying). Each round it plans the
  K that maximises expected tokens per second — K = 0, plain decoding, when nothing pays;
  old evidence fades even then, so it re-probes and notices when acceptance recovers — and
  stops a draft early when no continuation is worth its time at the planned rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

from .backend import LlamaModel
from .config import SamplingParams
from .sampling import Dist, warp

# No draft position is assumed accepted more often than this, however thin the evidence.
MAX_ACCEPTANCE = 0.99

# Logits this far below the maximum change a probability by less than e^-16 each; ignoring
# them makes the confidence check ~5× cheaper on a 262k-entry row.
_CONFIDENCE_WINDOW = 16.0


def top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the most likely token (temperature 1)."""
    m = logits.max()
    near = logits[logits > m - _CONFIDENCE_WINDOW]
    return float(1.0 / np.exp(near - m, dtype=np.float32).sum(dtype=np.float64))


# ---------------------------------------------------------------------------------------------
# Draft-length policies


class LengthPolicy(Protocol):
    """Decides how many tokens to draft; learns from each verified round."""

    def plan(self) -> int:
        """Most tokens to draft this round (0: decode this round with the target alone)."""

    def keep_drafting(self, i: int, confidence: Optional[float]) -> bool:
        """Before drawing draft token ``i`` (0-based) whose distribution has this confidence
        (the draft's top probability; ``None`` when the policy did not ask for it)."""

    def observe(self, k: int, n: int, confidences: Sequence[float], draft_step_seconds:
                Sequence[float], verify_seconds: float) -> None:
        """A round drafted ``k`` tokens, ``n`` were accepted; what each part cost."""


class FixedLength:
    """K tokens per round, cut when the draft's top probability is below ``p_min``."""

    needs_confidence = False

    def __init__(self, k: int, p_min: float = 0.0):
        self.k, self.p_min = k, p_min
        self.needs_confidence = p_min > 0

    def plan(self) -> int:
        return self.k

    def keep_drafting(self, i: int, confidence: Optional[float]) -> bool:
        return confidence is None or confidence >= self.p_min

    def observe(self, k, n, confidences, draft_step_seconds, verify_seconds) -> None:
        pass


@dataclass
class Costs:
    """Seconds per call: the target's per batch size (sparse, interpolated), the draft's per
    token. Refined online with exponential moving averages."""

    target: dict[int, float]
    draft: float
    ema: float = 0.05

    def __post_init__(self) -> None:
        self._table()

    def _table(self) -> None:
        keys = sorted(self.target)
        self._keys = np.array(keys, dtype=float)
        self._vals = np.array([self.target[k] for k in keys])
        self._slope = ((self._vals[-1] - self._vals[-2]) / (self._keys[-1] - self._keys[-2])
                       if len(keys) > 1 else self._vals[0] / self._keys[0])

    def t(self, n):
        """Seconds for a target pass of ``n`` tokens (scalar or array): linear between measured
        sizes, extended along the last segment beyond them."""
        n = np.asarray(n, dtype=float)
        out = np.interp(n, self._keys, self._vals)
        out = np.where(n > self._keys[-1], self._vals[-1] + self._slope * (n - self._keys[-1]),
                       out)
        return float(out) if out.ndim == 0 else out

    @staticmethod
    def _blend(old: float, seconds: float, ema: float) -> float:
        # One slow call (a cold cache after a prompt, another process) must not flip the
        # decision: each observation moves the estimate by at most ema × 50%.
        return old + ema * (min(max(seconds, 0.5 * old), 1.5 * old) - old)

    def observe_target(self, n: int, seconds: float) -> None:
        old = self.t(n)
        new = self._blend(old, seconds, self.ema)
        if n == 1:
            # A plain pass measures how fast the machine is now, and while decoding plainly
            # nothing else is measured: every cost follows, so that the calibrated ratios of
            # draft and batch costs to a plain pass (which decide whether drafting pays) do not
            # drift apart while the machine speeds up or slows down.
            scale = new / old
            self.target = {k: v * scale for k, v in self.target.items()}
            self.draft *= scale
        self.target[n] = new
        self._table()

    def observe_draft(self, seconds: float) -> None:
        self.draft = self._blend(self.draft, seconds, self.ema)


class _Decayed:
    """Acceptance counts per bucket that fade with age, shrunk towards a prior.

    ``rates(prior)`` returns (accepted + s·prior) / (tested + s) per bucket, so a bucket with
    little recent evidence falls back to the prior (a scalar or one value per bucket).
    ``rates(prior, z)`` adds z standard errors: an optimistic estimate while evidence is thin.
    """

    def __init__(self, n: int, strength: float):
        self.tested = np.zeros(n)
        self.accepted = np.zeros(n)
        self.strength = strength

    def rates(self, prior, z: float = 0.0) -> np.ndarray:
        """Shrunk rates, raised by ``z`` standard errors (an upper confidence bound)."""
        s = self.strength
        n = self.tested + s
        r = (self.accepted + s * np.asarray(prior)) / n
        return np.minimum(1.0, r + z * np.sqrt(r * (1 - r) / n)) if z else r

    def pooled(self, prior: float) -> float:
        s = self.strength
        return float((self.accepted.sum() + s * prior) / (self.tested.sum() + s))

    def add(self, bucket: int, accepted: bool) -> None:
        self.tested[bucket] += 1
        self.accepted[bucket] += accepted

    def age(self, decay: float) -> None:
        self.tested *= decay
        self.accepted *= decay


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
    _n_bins: int = 10
    _pos: _Decayed = field(init=False)
    _conf: _Decayed = field(init=False)
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

    def __post_init__(self) -> None:
        self._pos = _Decayed(self.k_max, strength=8.0)
        self._conf = _Decayed(self._n_bins, strength=2.0)

    # -- the model ------------------------------------------------------------------------

    def position_rates(self, z: Optional[float] = None) -> np.ndarray:
        """Acceptance per position, shrunk towards the pooled rate of all positions and raised
        by the pooled rate's standard error: while evidence is thin the policy gives drafting
        the benefit of the doubt, so a few unlucky rejections cannot stop it for good."""
        pooled = self._pos.pooled(self.prior)
        n = self._pos.tested.sum() + self._pos.strength
        bonus = (self.z if z is None else z) * np.sqrt(pooled * (1 - pooled) / n)
        return np.minimum(MAX_ACCEPTANCE, self._pos.rates(pooled) + bonus)

    def expected(self, k: int, rates: Optional[np.ndarray] = None) -> tuple[float, float]:
        """(expected tokens, expected seconds) of a round that drafts k tokens, with these
        acceptance rates per position (default: :meth:`position_rates`)."""
        reach = np.cumprod((self.position_rates() if rates is None else rates)[:k])
        return 1.0 + float(reach.sum()), k * self.costs.draft + self.costs.t(k + 1)

    def best(self) -> tuple[int, float]:
        """The K in [0, k_max] with the highest expected tokens per second, and that rate.

        Drafting must beat plain decoding by ``margin`` (a break-even gamble on a draft as
        slow as the target only adds variance)."""
        ks = np.arange(0, self.k_max + 1)
        seconds = ks * self.costs.draft + self.costs.t(ks + 1)

        def rates(z):
            reach = np.cumprod(self.position_rates(z))
            return (1.0 + np.concatenate(([0.0], np.cumsum(reach)))) / seconds

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

    def _acceptance_at(self, confidence: float) -> float:
        b = min(int(confidence * self._n_bins), self._n_bins - 1)
        return float(self._conf.rates(1.0, z=self.z)[b])

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
        self._idle = self._idle + 1 if k == 0 else 0
        # Slow start: after plain decoding (and at first) drafts grow 4, 8, 16… tokens per
        # round while evidence comes in, instead of gambling 32 draft steps on estimates.
        k = min(k, 4 << min(self._streak, 8))
        self._planned = k
        self._reach = 1.0
        self._pos_rates = self.position_rates(self._probe_z if self._probing else None)
        if k:
            # The value of time while drafting is the rate of the round actually planned: the
            # rate of the uncapped best K would make every continuation of a capped draft
            # look too dear, and the draft would stop at once, round after round.
            tokens, seconds = self.expected(k, self._pos_rates)
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
        cost = (ks - i - 1) * self.costs.draft + self.costs.t(ks + 1) - self.costs.t(i + 1)
        if float(np.max(gain - self._rate * cost)) <= 0.0:
            return False
        self._reach = reach
        return True

    def rest(self) -> None:
        """A round this policy took no part in (another source drafted): its evidence fades
        as in a plain round, so that it re-probes some time later."""
        self._pos.age(self.idle_decay)
        self._conf.age(self.idle_decay)

    def observe(self, k, n, confidences, draft_step_seconds, verify_seconds) -> None:
        self.costs.observe_target(k + 1, verify_seconds)
        decay = self.decay if k else self.idle_decay
        self._pos.age(decay)
        self._conf.age(decay)
        for i in range(min(k, n + 1)):
            self._pos.add(min(i, self.k_max - 1), i < n)
        for i, c in enumerate(confidences[:min(k, n + 1)]):
            if c is not None:
                self._conf.add(min(int(c * self._n_bins), self._n_bins - 1), i < n)
        self._rounds += 1
        # A round planned to draft counts towards the slow start even when the confidence
        # gate cut it to nothing: that is evidence about the gate, not a plain-decoding
        # decision, and restarting at 4 tokens after it cost 1-2% on the Gemma pair.
        self._streak = self._streak + 1 if k or self._planned else 0
        for s in draft_step_seconds:
            self.costs.observe_draft(s)


def calibrate(target: LlamaModel, draft: Optional[LlamaModel],
              sizes: Sequence[int] = (1, 2, 4, 8, 16, 33), reps: int = 2,
              head: Optional[ReducedHead] = None) -> Costs:
    """Measure the target's seconds per batch of n tokens and the draft's per token (through
    ``head`` when the draft uses a reduced output layer).

    Uses the models' caches after their current contents and restores them afterwards.
    """
    def timed(model: LlamaModel, n: int) -> float:
        base = len(model.tokens)
        tok = model.vocab.bos if model.vocab.bos >= 0 else 0
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            if model is draft and head is not None:
                hidden = model.eval_hidden([tok] * n)
                if hidden is not None:
                    head.subset_logits(hidden)     # what a greedy draft step computes
            else:
                model.eval([tok] * n, min(n, model.n_outputs_max))
            best = min(best, time.perf_counter() - t0)
            model.truncate(base)
        return best

    sizes = [n for n in sizes if n <= min(target.n_outputs_max, target.n_batch)]
    # Untimed warm-up: the first passes after a load fault in the mapped weights and set up
    # llama.cpp's buffers (measured on the Gemma F32 target: 39 ms for a one-token pass
    # straight after loading, 29 ms from then on).
    for model in (target, draft):
        if model is not None:
            timed(model, max(sizes) if model is target else 1)
    target_costs = {n: timed(target, n) for n in sizes}
    draft_cost = timed(draft, 1) if draft is not None else 1e-4
    return Costs(target_costs, draft_cost)


def _cache_file():
    import os
    from pathlib import Path
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgespec" / "calibration.json"


def _fingerprint(model: LlamaModel) -> str:
    st = model.path.stat()
    c = model.config
    return f"{model.path.resolve()}|{st.st_size}|{int(st.st_mtime)}|t{c.n_threads}|" \
           f"ngl{c.n_gpu_layers}"


def _current(key: str) -> bool:
    """Whether a calibration entry still describes files on this machine: entries for deleted
    or rewritten files (a removed model, a test's temporary copy) and for an older key format
    are dropped when the cache is next written, so that it does not grow without end."""
    from pathlib import Path
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


def calibrate_cached(target: LlamaModel, draft: Optional[LlamaModel],
                     head: Optional[ReducedHead] = None) -> Costs:
    """:func:`calibrate`, remembered per model file, threads and offload in the user's cache
    directory so that only the first load of a pair on a machine pays for it (~1 s)."""
    import json
    path = _cache_file()
    key = _fingerprint(target) + "||" + (_fingerprint(draft) if draft is not None else "-")
    if head is not None:
        key += f"||head{HEAD_ROWS}"
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    entry = saved.get(key)
    if isinstance(entry, dict) and "target" in entry and "draft" in entry:
        return Costs({int(n): float(v) for n, v in entry["target"].items()}, float(entry["draft"]))
    costs = calibrate(target, draft, head=head)
    saved = {k: v for k, v in saved.items() if _current(k)}
    saved[key] = {"target": costs.target, "draft": costs.draft}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(saved, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only costs a recalibration next time
    return Costs(dict(costs.target), costs.draft)


# ---------------------------------------------------------------------------------------------
# Drafters


class Drafter(Protocol):
    """What the speculative loop needs from a source of draft tokens."""

    seconds: float
    step_seconds: list[float]     # per single-token draft step of the last draft() call
    confidences: list      # confidence of each proposed token of the last call (or None)

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator, policy: LengthPolicy) -> tuple[list[int], list[Dist]]:
        """Propose up to ``k`` tokens after ``context``; return them and their q."""

    def rollback(self, n_keep: int) -> None:
        """Forget anything after the first ``n_keep`` tokens of the context."""


# The reduced draft head: the lowest token ids (BPE and SentencePiece vocabularies number
# their pieces in merge order, so low ids are the common ones), every short ASCII token and
# every token the current conversation has used. Measured on the Gemma-3-270M vocabulary
# (262,144 entries) over the greedy continuations of the bench's default prompts, tokens
# outside that set: 1.8% with the lowest 16,384 ids (18,195 rows in all; punctuation, digits
# and other single characters sit at the end of that vocabulary, hence the ASCII rule).
# 16,384 is fastest: greedy acceptance traces of the Gemma pair for each size (10,276 /
# 18,195 / 34,219 rows), replayed at the measured costs, gave the best fixed K 1.59x /
# 1.68x / 1.60x plain; fewer rows miss more tokens, more rows cost more per step.
HEAD_ROWS = 16384
HEAD_MIN_VOCAB = 4 * HEAD_ROWS    # below this the output layer is a small share of a step


class ReducedHead:
    """The draft model's output layer over a subset of the vocabulary, applied in numpy to the
    hidden state that :meth:`LlamaModel.eval_hidden` reads (the idea of FR-Spec, Zhao et al.
    2025: a draft spends most of its step on the output rows of tokens it almost never
    proposes).

    Tokens outside the subset get q = 0: they are never proposed, and rejection sampling
    stays exact because q is still the distribution each draft token was drawn from. The
    tokens of the conversation being drafted for join the subset (a name, an identifier)
    before the next draft, and leave it when another conversation starts (:meth:`follow`):
    the subset stays bounded on a server that runs for days, and a generation's speed does
    not depend on what was generated before it. One head serves every engine sharing the
    draft model (:meth:`shared`).
    """

    def __init__(self, model: LlamaModel, rows: int = HEAD_ROWS, max_extra: int = 16384):
        n = model.n_vocab
        ids = set(range(min(rows, n))) | set(model.vocab.eog)
        for i in range(min(rows, n), n):
            text = model.token_text(i).replace(b"\xe2\x96\x81", b" ")
            if len(text) <= 2 and all(c < 128 for c in text):
                ids.add(i)
        self.model, self.n_vocab = model, n
        self.ids = np.array(sorted(ids), dtype=np.int64)
        self.w = model.output_rows(self.ids)
        self._member = np.zeros(n, dtype=bool)
        self._member[self.ids] = True
        nb = len(self.ids)
        # Subset ids and their logits: the base rows, then the extra rows in order added.
        self._all_ids = np.empty(nb + max_extra, dtype=np.int64)
        self._all_ids[:nb] = self.ids
        self._vals = np.empty(nb + max_extra, dtype=np.float32)
        self._extra_ids = self._all_ids[nb:]
        self._extra_w = np.empty((max_extra, self.w.shape[1]), dtype=np.float32)
        self._n_extra = 0
        self._context: list[int] = []     # the conversation the extra rows were added for
        self.seconds = 0.0      # spent in the products, cumulative

    @classmethod
    def shared(cls, model: LlamaModel) -> "ReducedHead":
        head = getattr(model, "_reduced_head", None)
        if head is None:
            head = model._reduced_head = cls(model)
        return head

    @property
    def size(self) -> int:
        return len(self.ids) + self._n_extra

    def follow(self, context: Sequence[int]) -> None:
        """Serve this context: add the rows of its tokens; when it does not continue the
        context served before (another conversation, an edited or regenerated turn), first
        drop the rows added for that one."""
        n = len(self._context)
        if n > len(context) or context[:n] != self._context:
            self._member[self._extra_ids[:self._n_extra]] = False
            self._n_extra = 0
            self._context = []
            n = 0
        self.include(context[n:])
        self._context.extend(context[n:])

    def include(self, tokens: Sequence[int]) -> None:
        """Add the output rows of these tokens (those not in the subset yet)."""
        t = np.unique(np.asarray(tokens, dtype=np.int64))
        t = t[(t >= 0) & (t < self.n_vocab)]
        new = t[~self._member[t]][:len(self._extra_ids) - self._n_extra]
        if new.size:
            k = self._n_extra
            self._extra_w[k:k + new.size] = self.model.output_rows(new)
            self._extra_ids[k:k + new.size] = new
            self._member[new] = True
            self._n_extra += new.size

    def subset_logits(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, logits) of the subset for this hidden state; views valid until the next
        call. Greedy drafting needs no more: its argmax and confidence read these 18k
        entries instead of building and scanning a 262k row (~90 µs a step).

        The products use einsum, not ``@``: BLAS would start its own threads, which then spin
        against llama.cpp's on the same cores (measured on 2 cores: the draft's steps took
        twice as long and speculation fell below plain decoding). Splitting the rows over a
        second Python thread halves the product in isolation but measured no faster between
        llama.cpp's passes (its threads still hold the other core), so it runs on this one.
        """
        t0 = time.perf_counter()
        nb, k = len(self.ids), self._n_extra
        np.einsum("ij,j->i", self.w, hidden, out=self._vals[:nb])
        if k:
            np.einsum("ij,j->i", self._extra_w[:k], hidden, out=self._vals[nb:nb + k])
        self.seconds += time.perf_counter() - t0
        return self._all_ids[:nb + k], self._vals[:nb + k]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """A full-vocabulary logits row: the subset's logits, -inf elsewhere."""
        self.subset_logits(hidden)
        return self.last_row()

    def last_row(self) -> np.ndarray:
        """The last product as a full-vocabulary row (-inf outside the subset)."""
        row = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        row[self._all_ids[:self.size]] = self._vals[:self.size]
        return row


class ModelDrafter:
    """A small model that shares the target's tokenizer samples tokens from its own q.

    Its KV cache follows the same invariant as the target's: it holds a prefix of the
    committed context; the missing tail (at least the last committed token) is fed at the
    start of the next draft.
    """

    def __init__(self, model: LlamaModel, eog: frozenset[int],
                 head: Optional[ReducedHead] = None):
        self.model = model
        self.eog = eog
        self.head = head        # None: llama.cpp's own output layer over the whole vocabulary
        self.seconds = 0.0
        self.step_seconds: list[float] = []
        self.confidences: list[float] = []
        # Seconds per token to bring the cache up to the context after others committed
        # tokens it has not seen (n-gram rounds); None until measured on a batch of 4+.
        self.catch_up_cost: Optional[float] = None
        self.extended = 0     # n-gram tokens that ended the last draft (see draft())

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of the context the draft's cache has not evaluated yet."""
        return len(context) - len(self.model.tokens)

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator, policy: LengthPolicy,
              extend: Optional[Callable[[list[int]], list[int]]] = None
              ) -> tuple[list[int], list[Dist]]:
        """Draft up to ``k`` tokens. ``extend(x)``, asked after each drawn token, may return
        tokens that continue ``x`` (an n-gram match): they end the draft with one-hot q, and
        ``self.extended`` says how many there were. The extender bounds their number."""
        t0 = time.perf_counter()
        m = self.model
        self.extended = 0
        n_cached = len(m.tokens)
        assert m.tokens == context[:n_cached], "draft cache diverged from the context"
        if self.head is not None:
            self.head.follow(context)
        ids, vals = self._step(context[n_cached:])
        lag = len(context) - n_cached
        if lag >= 4:
            per_token = (time.perf_counter() - t0) / lag
            self.catch_up_cost = (per_token if self.catch_up_cost is None else
                                  self.catch_up_cost + 0.2 * (per_token - self.catch_up_cost))
        x: list[int] = []
        q: list[Dist] = []
        self.step_seconds = steps = []
        self.confidences = confs = []
        need_conf = getattr(policy, "needs_confidence", True)
        plain_greedy = params.greedy and not params.uses_penalty
        tail = list(context[-params.repeat_last_n:]) if params.uses_penalty else []
        for i in range(k):
            # The stop decision uses only this position's distribution (see module docstring).
            if plain_greedy:
                j = int(np.argmax(vals))
                q_i = Dist.one_hot(j if ids is None else int(ids[j]))
                confidence = top_probability(vals) if need_conf else None
            else:
                q_i = self._warp(ids, vals, params, tail)
                confidence = ((top_probability(vals) if params.greedy else
                               float(q_i.probs.max())) if need_conf else None)
            if not policy.keep_drafting(i, confidence):
                break
            x_i = q_i.sample(rng)
            x.append(x_i)
            q.append(q_i)
            confs.append(confidence)
            if x_i in self.eog or i == k - 1:
                break
            more = extend(x) if extend is not None else []
            if more:
                # The continuation is a function of the tokens drawn so far: a one-hot q
                # for each keeps rejection sampling exact.
                x.extend(more)
                q.extend(Dist.one_hot(t) for t in more)
                confs.extend([None] * len(more))
                self.extended = len(more)
                break
            if tail:
                tail.append(x_i)
            ts = time.perf_counter()
            ids, vals = self._step([x_i])
            steps.append(time.perf_counter() - ts)
        self.seconds += time.perf_counter() - t0
        return x, q

    def _step(self, tokens: Sequence[int]) -> tuple[Optional[np.ndarray], np.ndarray]:
        """Evaluate ``tokens``; the draft's logits after the last of them as (ids, logits):
        the reduced head's subset, or (None, the whole row)."""
        if self.head is None:
            return None, self.model.eval(tokens, 1)[0]
        hidden = self.model.eval_hidden(tokens)
        if hidden is None:
            return None, self.model.last_logits()
        return self.head.subset_logits(hidden)

    def _warp(self, ids: Optional[np.ndarray], vals: np.ndarray, params: SamplingParams,
              tail: list[int]) -> Dist:
        """q for sampling. On the reduced head's subset the samplers see only its logits
        (the -inf rest can never be drawn, so q is the same); penalties index the whole
        vocabulary and get the full row."""
        if ids is None:
            return warp(vals, params, tail)
        if tail:
            return warp(self.head.last_row(), params, tail)
        d = warp(vals, params)
        return Dist(ids[d.ids] if d.ids is not None else ids.copy(), d.probs)

    def rollback(self, n_keep: int) -> None:
        self.model.truncate(n_keep)


class NgramDrafter:
    """Prompt lookup: propose the continuation of the latest earlier occurrence of the context's
    last n tokens (n from ``ngram_max`` down to ``ngram_min``). Needs no model; q is one-hot,
    so under sampling a proposal x is accepted with probability p(x).

    Its confidence is the length of the match (``n / ngram_max``): a continuation of a long
    match is accepted far more often than one of a two-token match, and the policy's gate
    learns by how much.
    """

    def __init__(self, ngram_min: int = 2, ngram_max: int = 8, window: int = 4096):
        self.ngram_min, self.ngram_max, self.window = ngram_min, ngram_max, window
        self.seconds = 0.0
        self.step_seconds: list[float] = []
        self.confidences: list[float] = []
        self.last_match = 0

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator, policy: LengthPolicy) -> tuple[list[int], list[Dist]]:
        t0 = time.perf_counter()
        x = self.lookup(context, k)
        confidence = self.last_match / self.ngram_max
        need = getattr(policy, "needs_confidence", True)
        for i in range(len(x)):
            if not policy.keep_drafting(i, confidence if need else None):
                del x[i:]
                break
        self.confidences = [confidence if need else None] * len(x)
        self.step_seconds = []
        self.seconds += time.perf_counter() - t0
        return x, [Dist.one_hot(t) for t in x]

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        """The continuation after the longest, most recent earlier match of the context's tail."""
        self.last_match = 0
        if k <= 0:
            return []
        hay = np.asarray(context[-self.window:], dtype=np.int64)
        n_hay = hay.size
        for n in range(min(self.ngram_max, n_hay - 1), self.ngram_min - 1, -1):
            pattern = hay[n_hay - n:]
            starts = np.flatnonzero(hay[: n_hay - n] == pattern[0])
            for s in starts[::-1]:
                if np.array_equal(hay[s:s + n], pattern):
                    cont = hay[s + n: s + n + k]
                    if cont.size:
                        self.last_match = n
                        return [int(t) for t in cont]
        return []

    def rollback(self, n_keep: int) -> None:
        pass


class HybridPolicy:
    """Separate length policies for the two sources of a :class:`HybridDrafter`.

    An n-gram draft costs nothing to make and its acceptance depends on the match; a model
    draft costs a forward pass per token. Mixing their evidence in one policy would make each
    wrong about the other, so each source learns on its own rounds; the drafter says which
    source a round uses (:meth:`use`) before drafting.
    """

    def __init__(self, model: LengthPolicy, ngram: LengthPolicy):
        self.model, self.ngram = model, ngram
        self.active: Optional[LengthPolicy] = None
        self._planned = {"model": 0, "ngram": 0}
        self._extended = 0

    @property
    def needs_confidence(self) -> bool:
        return getattr(self.active, "needs_confidence", True)

    def plan(self) -> int:
        self._planned = {"model": self.model.plan(), "ngram": self.ngram.plan()}
        self.active = None
        self._extended = 0
        return max(self._planned.values())

    def extended(self, n: int) -> None:
        """The model's draft this round ended with ``n`` n-gram tokens: the model's policy
        learns only from the model's own tokens."""
        self._extended = n

    def use(self, source: Optional[str]) -> int:
        """Make ``source`` ("model" or "ngram"; None: neither, a plain round) the active
        policy; return its planned K."""
        if source is None:
            self.active = None
            return 0
        self.active = self.model if source == "model" else self.ngram
        return self._planned[source]

    def catch_up_pays(self, seconds: float, tokens_ahead: float) -> bool:
        """Whether bringing the draft model up to date (``seconds``) is repaid by drafting
        with it for the next ``tokens_ahead`` tokens instead of decoding plainly."""
        best = getattr(self.model, "best", None)
        if best is None:
            return True
        k, rate = best()
        if k == 0:
            return False
        return tokens_ahead * (self.model.costs.t(1) - 1.0 / rate) > seconds

    def keep_drafting(self, i: int, confidence: Optional[float]) -> bool:
        return self.active.keep_drafting(i, confidence)

    def observe(self, k, n, confidences, draft_step_seconds, verify_seconds) -> None:
        if self.active is not None:
            if self.active is self.model and self._extended:
                m = k - self._extended
                costs = getattr(self.model, "costs", None)
                if costs is not None:   # the verify pass also checked the n-gram tokens
                    verify_seconds *= costs.t(m + 1) / costs.t(k + 1)
                k, n, confidences = m, min(n, m), confidences[:m]
            self.active.observe(k, n, confidences, draft_step_seconds, verify_seconds)
            other = self.ngram if self.active is self.model else self.model
            rest = getattr(other, "rest", None)
            if rest is not None:
                rest()
        else:   # nobody drafted: a plain round for both
            for p in (self.model, self.ngram):
                p.observe(0, 0, (), (), verify_seconds)


class HybridDrafter:
    """An n-gram match of at least ``min_match`` tokens when the n-gram policy finds it worth
    drafting, else the draft model.

    Copying from the context (quotes, code, summaries) costs nothing to draft and is accepted
    in long runs; everything else goes to the model. With a :class:`HybridPolicy` each source
    drafts as many tokens as its own policy planned, and the n-gram source's confidence gate
    (which learns acceptance by match length) decides when a match is too weak to use.
    """

    def __init__(self, model_drafter: ModelDrafter, ngram: Optional[NgramDrafter] = None,
                 min_match: int = 2, extend_match: int = 6):
        self.model = model_drafter
        self.ngram = ngram or NgramDrafter(ngram_min=min_match)
        self.min_match = min_match
        self.extend_match = extend_match
        self.step_seconds: list[float] = []
        self.confidences: list = []
        # Stretches without a usable n-gram match, in tokens: an estimate of how long the
        # draft model would draft after catching up (decaying mean) and where the current
        # stretch began.
        self.miss_tokens = 16.0
        self._miss_start: Optional[int] = None

    @property
    def seconds(self) -> float:
        return self.model.seconds + self.ngram.seconds

    def draft(self, context, k, params, rng, policy):
        """Up to ``k`` tokens (the loop's bound: budget, context, batch), each source capped
        further by its own plan."""
        use = getattr(policy, "use", None)
        k_ngram = min(k, use("ngram")) if use else k
        x, q = self.ngram.draft(context, k_ngram, params, rng, policy) if k_ngram > 0 \
            else ([], [])
        source = self.ngram
        if x and self.ngram.last_match >= self.min_match:
            if self._miss_start is not None:
                stretch = len(context) - self._miss_start
                if stretch >= 0:    # (negative: a new, shorter conversation)
                    self.miss_tokens += 0.2 * (stretch - self.miss_tokens)
                self._miss_start = None
        else:
            if self._miss_start is None:
                self._miss_start = len(context)
            if not self._catch_up_pays(context, policy):
                # The draft lags far behind (n-gram rounds it did not see) and the stretch
                # until the next match is too short to repay evaluating them: plain round.
                use(None)
                self.step_seconds, self.confidences = [], []
                return [], []
            k_model = min(k, use("model")) if use else k
            source = self.model
            if k_model > 0:
                x, q = self.model.draft(context, k_model, params, rng, policy,
                                        extend=self._extender(context, k))
                if self.model.extended and hasattr(policy, "extended"):
                    policy.extended(self.model.extended)
            else:
                x, q = [], []
                self.model.step_seconds, self.model.confidences = [], []
        self.step_seconds, self.confidences = source.step_seconds, source.confidences
        return x, q

    def _extender(self, context, k):
        """While the model drafts: a long n-gram match of the context and the draft so far
        (the answer has started to quote) continues the draft for free, up to the loop's
        bound ``k`` rather than the model's plan, since those tokens cost no draft steps."""
        tail = list(context[-self.ngram.window:])

        def extend(x: list[int]) -> list[int]:
            more = self.ngram.lookup(tail + x, k - len(x))
            return more if self.ngram.last_match >= self.extend_match else []
        return extend

    def _catch_up_pays(self, context, policy) -> bool:
        lag = self.model.lag(context)
        pays = getattr(policy, "catch_up_pays", None)
        cost = self.model.catch_up_cost
        if pays is None or cost is None or lag < 4:
            return True
        ahead = max(self.miss_tokens, len(context) - self._miss_start)
        return pays(lag * cost, ahead)

    def rollback(self, n_keep: int) -> None:
        self.model.rollback(n_keep)
