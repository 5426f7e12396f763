"""Draft models measured against a target on this machine, so that the figures hold on a busy
one too (:mod:`.auto_draft` chooses with them).

The target first writes its own greedy answers to two short requests (:data:`PROBE_PROMPTS`,
one in prose, one in code, :data:`GENERATED` tokens each); each candidate reads them in one
pass: its *agreement* is the share of their tokens it predicts (its greedy token is the
target's), what greedy drafting accepts per token while the target writes. (An arbitrary text
read by both understates it: a model agrees with another far more on what they write than
on what someone else wrote; Qwen2.5-Coder's 0.5B and 1.5B agreed on 68% of a stretch of
Python's documentation.) Then the timings, in rounds: every round times each model's one-token step
(the fastest of three), the target's passes of 4, 8 and 16 rows (its verification of a draft)
and each model's reading of a 32-token chunk (a prompt), the models in an order rotated from
round to round. A model's cost is taken as a share of the target's step *in the same round*,
and a share's rounds are summed up by a median after the rounds more than a few median
absolute deviations off are dropped: a burst of another process slows one round, whichever
model it falls on, and moves no median (a Q8_0 draft measured alone at 26.7x the target's step
on a busy machine once lost to a Q4_0 one of far lower agreement). Other processes' load over
the measurement is read too (:mod:`edgespec.cpuload`): a measurement taken while they used a
quarter of a core or more is *busy*, and the choice made from it provisional. The models run
on the threads decoding would have now (fewer than the cores others keep busy). Past
:data:`BUDGET` seconds of rounds (a machine that busy stalls a step for seconds) the timing
stops after :data:`MIN_ROUNDS`.

The figures go through :mod:`.draft_choice`'s model: the best draft length's expected
speed-up while decoding, and a whole request's (its prompt as long as its answer).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..cpuload import QUIET, LoadWatch
from .draft_choice import _text, expected_speedup, whole_request

PROBE_TOKENS = 96           # the text every model reads (its timings)
PROBE_PROMPTS = ("Question: What are three habits that keep a codebase easy to change? "
                 "Answer in a few sentences.\nAnswer:",
                 "# A Python function that parses 'key=value' lines into a dict, skipping "
                 "blank lines and comments\ndef ")
GENERATED = 40              # tokens the target writes after each (agreement)
ROUNDS = 7                  # timing rounds, at most ...
MIN_ROUNDS = 3              # ... and at least, once BUDGET seconds of them have passed
BUDGET = 20.0
STEPS_PER_ROUND = 3         # one-token steps per model per round (the fastest counts)
ROW_SIZES = (4, 8, 16)      # the target's passes of n rows (verifying a draft of n - 1)
READ_CHUNK = 32             # a prompt's chunk, read by every model each round
OUTLIER = 3.0               # rounds further than this many scaled MADs from the median go
SPREAD = 1.5                # no load meter: the target's steps this far apart say "busy"
LOAD_SPAN = 0.3             # seconds of other processes' load read before choosing threads
TARGET = "target"           # the target's key among a round's timings (a draft's: "draft i")


@dataclass
class Measured:
    """One draft's figures against the target (shares are of the target's one-token step)."""

    name: str
    path: Path
    agreement: float = 0.0
    step_share: float = 1.0
    read_share: float = 0.0     # reading a prompt token, in target steps
    speedup: float = 0.0        # expected while decoding, at its best K
    k: int = 0
    whole: float = 0.0          # a whole request's expected speed-up (prompt = answer)

    def figures(self) -> dict:
        return {"agreement": round(self.agreement, 4), "step_share": round(self.step_share, 4),
                "read_share": round(self.read_share, 4), "speedup": round(self.speedup, 4),
                "k": self.k, "whole": round(self.whole, 4)}


@dataclass
class Probe:
    """What one measurement found: the drafts best first, the target's figures, whether the
    machine was busy meanwhile (``others``: cores other processes used; None: unknown)."""

    drafts: list[Measured]
    read_target: float = 0.0
    rows: dict[int, float] = field(default_factory=dict)
    busy: bool = False
    others: Optional[float] = None
    failed: dict[str, str] = field(default_factory=dict)     # name -> why it was not measured


def robust_median(values: Sequence[float]) -> float:
    """The median of ``values`` once those further than :data:`OUTLIER` scaled median absolute
    deviations from their median are dropped."""
    med = statistics.median(values)
    mad = 1.4826 * statistics.median(abs(v - med) for v in values)
    kept = [v for v in values if abs(v - med) <= OUTLIER * mad] if mad > 0 else list(values)
    return statistics.median(kept or values)


def shares(rounds: Sequence[dict[str, float]], base: str = TARGET) -> dict[str, float]:
    """Each key's time as a share of ``base``'s in the same round, over the rounds
    (:func:`robust_median`)."""
    keys = [k for k in rounds[0] if k != base]
    return {k: robust_median([r[k] / r[base] for r in rounds if r.get(base, 0) > 0 and k in r])
            for k in keys}


def rows_curve(rows: dict[int, float]) -> Callable[[int], float]:
    """A target pass of n rows as a share of one row's: linear between the measured sizes,
    beyond the last along its last slope, never falling as n grows."""
    pts = sorted({1: 1.0, **rows}.items())
    level = 0.0
    for i, (n, v) in enumerate(pts):
        level = max(level, v)
        pts[i] = (n, level)

    def at(n: int) -> float:
        for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
            if n <= n1:
                return v0 + (v1 - v0) * (n - n0) / (n1 - n0)
        (n0, v0), (n1, v1) = pts[-2], pts[-1]
        return v1 + (v1 - v0) * (n - n1) / (n1 - n0)
    return at


def rank(drafts: list[Measured], rows: dict[int, float], read_target: float
         ) -> list[Measured]:
    """Each draft's expected speed-ups from its figures, the best for a whole request first."""
    curve = rows_curve(rows)
    for d in drafts:
        d.speedup, d.k = expected_speedup(d.agreement, d.step_share, curve)
        d.whole = whole_request(d.speedup, read_target, d.read_share)
    return sorted(drafts, key=lambda d: d.whole, reverse=True)


def is_busy(others: Optional[float], target_steps: Sequence[float]) -> bool:
    """Whether a measurement was taken on a busy machine: other processes used a quarter of a
    core or more (where the system says), else the target's steps differed by more than
    :data:`SPREAD`."""
    if others is not None:
        return others >= QUIET
    return max(target_steps) > SPREAD * min(target_steps)


def _timed(model, tokens: list[int], n_logits: int, base: int) -> float:
    """Seconds of one pass of ``tokens`` after the first ``base`` positions, then back."""
    model.checkpoint()              # (a recurrent model's way back)
    back = model.rollback_seconds
    t0 = time.perf_counter()
    model.eval(tokens, n_logits)
    seconds = time.perf_counter() - t0 - (model.rollback_seconds - back)
    model.truncate(base)
    return seconds


def _round(models: list[tuple[str, object]], r: int, text: list[int], base: int
           ) -> dict[str, float]:
    """One round of timings, the models' order rotated by ``r``."""
    out: dict[str, float] = {}
    order = models[r % len(models):] + models[:r % len(models)]
    chunk = text[:READ_CHUNK]
    for key, model in order:
        out[key] = min(_timed(model, text[:1], 1, base) for _ in range(STEPS_PER_ROUND))
        out[f"read {key}"] = _timed(model, chunk, 1, base) / len(chunk)
        if key == TARGET:
            for n in ROW_SIZES:
                out[f"rows {n}"] = _timed(model, text[:n], n, base)
    return out


def _threads(watch: Callable[[], LoadWatch]) -> int:
    """The default thread count, less the cores other processes keep busy now (as the thread
    governors decode on a busy machine: a step on more threads than free cores stalls for
    whole scheduler slices, which no round survives)."""
    from ..config import default_threads
    meter = watch()
    time.sleep(LOAD_SPAN)
    others = meter.others()
    free = (os.cpu_count() or 1) - (others or 0.0)
    return max(1, min(default_threads(), int(free + 0.5)))


def _load(path: Path, tokens: int, threads: int):
    from ..backend import LlamaModel
    from ..config import ModelConfig
    room = max(tokens, 64 + GENERATED)     # the text, or a request and its answer
    return LlamaModel(ModelConfig(path, n_ctx=room + READ_CHUNK + max(ROW_SIZES) + 16,
                                  n_outputs_max=max(tokens, GENERATED), n_threads=threads))


def measure(target_path: Path, drafts: list[tuple[str, Path]], *,
            n_threads: Optional[int] = None, tokens: int = PROBE_TOKENS, rounds: int = ROUNDS,
            watch: Callable[[], LoadWatch] = LoadWatch,
            log: Callable[[str], None] = lambda s: None) -> Probe:
    """``drafts`` (name, path) measured against the target (see the module docstring), all
    loaded at once; one that fails to load is left out (``Probe.failed``)."""
    from ..errors import EdgespecError
    threads = n_threads or _threads(watch)
    tokens, rounds = max(tokens, READ_CHUNK), max(rounds, 1)
    loaded: list[tuple[str, object]] = []
    probe = Probe([])
    try:
        target = _load(target_path, tokens, threads)
        loaded.append((TARGET, target))
        text = target.tokenize(_text().encode(), add_special=True, parse_special=False)[:tokens]
        log(f"measuring the drafts for {Path(target_path).name}: the target writes…")
        answers = _answers(target)
        target.eval(text, 1)            # (the context the timings run after)
        for name, path in drafts:
            log(f"measuring the drafts for {Path(target_path).name}: reading with {name}…")
            try:
                model = _load(path, tokens, threads)
            except EdgespecError as e:
                probe.failed[name] = str(e)
                continue
            loaded.append((f"draft {len(probe.drafts)}", model))
            probe.drafts.append(Measured(name, Path(path), _agreement(model, answers)))
            model.eval(text, 1)
        base = len(text)
        for m in loaded:       # untimed: the first passes after a load fault in the weights
            _round([m], 0, text, base)
        meter, start, times = watch(), time.perf_counter(), []
        for r in range(rounds):
            if r >= MIN_ROUNDS and time.perf_counter() - start > BUDGET:
                break
            log(f"measuring the drafts for {Path(target_path).name}: timing {r + 1}/{rounds}…")
            times.append(_round(loaded, r, text, base))
        probe.others = meter.others()
    finally:
        for _, m in loaded:
            m.close()
    return _summed(probe, times)


def _answers(target) -> list[tuple[list[int], list[int]]]:
    """(prompt, the target's greedy answer) for each of :data:`PROBE_PROMPTS`."""
    out = []
    for text in PROBE_PROMPTS:
        prompt = target.tokenize(text.encode(), add_special=True, parse_special=False)
        target.truncate(0)
        row, answer = target.eval(prompt, 1)[0], []
        while len(answer) < GENERATED:
            t = int(row.argmax())
            if t in target.vocab.eog:
                break
            answer.append(t)
            row = target.eval([t], 1)[0]
        out.append((prompt, answer))
    target.truncate(0)
    return out


def _agreement(model, answers: list[tuple[list[int], list[int]]]) -> float:
    """The share of the answers' tokens that ``model`` predicts after the tokens before them
    (one pass per answer)."""
    hits = total = 0
    for prompt, answer in answers:
        if not answer:
            continue
        model.truncate(0)
        guess = model.eval(prompt + answer[:-1], len(answer)).argmax(axis=1)
        hits += int((guess == answer).sum())
        total += len(answer)
    model.truncate(0)
    return hits / total if total else 0.0


def _summed(probe: Probe, times: list[dict[str, float]]) -> Probe:
    """The rounds' timings as the drafts' shares, ranked; busy or not."""
    share = shares(times)
    probe.rows = {n: share[f"rows {n}"] for n in ROW_SIZES}
    probe.read_target = share[f"read {TARGET}"]
    for i, d in enumerate(probe.drafts):
        d.step_share, d.read_share = share[f"draft {i}"], share[f"read draft {i}"]
    probe.drafts = rank(probe.drafts, probe.rows, probe.read_target)
    probe.busy = is_busy(probe.others, [t[TARGET] for t in times])
    return probe
