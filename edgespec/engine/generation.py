"""One generation: wait for a lane, prefill both caches, decode, assemble text, and fill in
the result whichever way it ends.

:meth:`edgespec.engine.engine.Engine.stream` checks the arguments, tokenizes the prompt and builds a
:class:`~edgespec.engine.request.Prepared`, then hands :func:`run_generation` to a
:class:`~edgespec.engine.streams.Stream`; this generator is everything that happens once the stream
is advanced.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, Optional

import numpy as np

from .lanes import Lane, Lanes
from ..lm import LanguageModel, LoadedModel
from ..prompt_cache import PromptCache, common_prefix
from .request import Prepared
from ..results import Generation, GenerationStats, LoopStats, StreamEvent, TokenLogprob
from .rounds import Cancelled
from ..speculative import decode
from .streams import Job
from ..textstream import TextAssembler


def prefill(model: LanguageModel, prompt: list[int],
            cancelled: threading.Event) -> tuple[int, Optional[np.ndarray]]:
    """Make ``model``'s cache hold ``prompt``, reusing its common prefix but always evaluating
    the last token: its logits give the first token without another pass.

    Returns how many tokens were evaluated and the logits row after the prompt (None when
    cancelled before its end). Checks for cancellation between batches.
    """
    keep = common_prefix(model.tokens, prompt[:-1])
    model.truncate(keep)
    model.checkpoint()      # a recurrent model's way back here (to answer again, say)
    todo = prompt[keep:]
    start = 0
    while start < len(todo):
        if cancelled.is_set():
            return len(model.tokens) - keep, None
        chunk = model.n_batch       # (smaller while other streams decode beside this one)
        last = start + chunk >= len(todo)
        rows = model.eval(todo[start:start + chunk], 1 if last else 0)
        if last:
            return len(model.tokens) - keep, np.array(rows[0], dtype=np.float32)
        start += chunk
    return len(model.tokens) - keep, None


def new_stats(prepared: Prepared, loop: Optional[LoopStats] = None,
              **figures) -> GenerationStats:
    """The statistics of ``prepared``: before anything ran (a result that never started has
    these), or with the decoding loop's counters (``loop``) and the ``figures`` measured."""
    return GenerationStats(prompt_tokens=len(prepared.prompt), speculative=prepared.speculative,
                           loop=loop if loop is not None else LoopStats(), **figures)


def not_started(prepared: Prepared) -> Generation:
    """The result of a generation cancelled (or whose Engine closed) before its turn came."""
    return Generation("", [], "cancelled", new_stats(prepared))


def run_generation(job: Job, lanes: Lanes, prepared: Prepared,
                   cache: Optional[PromptCache] = None) -> Iterator[StreamEvent]:
    """The generation behind a Stream: waits for a lane, then prefill → decode → result.

    Holds the lane until it ends; whichever way it ends (last token, cancel, close, an error)
    the loop's own ``finally`` trims the caches to what was generated, the statistics are
    finished, and the lane is handed on. A stop string's held-back text comes last, after
    the lane is handed on. While it holds a lane its passes are batched with the other
    lanes' (:mod:`edgespec.engine.rounds`): it is a member of the rounds while it decodes, parked
    whenever its reader is away. ``cache``: conversations' states kept aside, consulted
    before each model's prefill (:mod:`edgespec.prompt_cache`).
    """
    lane = lanes.enter(job, prepared.prompt, prepared.request.max_tokens)
    if lane is None:                  # cancelled, or the Engine closed, while queued
        job.finish(job.cancelled_result)
        return
    member, rounds = lane.member, lanes.rounds
    member.enter(job.cancelled.is_set)
    rounds.join(member, job.arrival)
    job.report_advances(lambda on: rounds.running(member) if on else rounds.parked(member))
    run = _Run(lane, prepared, job.cancelled, cache)
    try:
        run.prefill()
        yield from run.events()
        run.finish_text()
    except GeneratorExit:             # closed mid-stream: the output is what was yielded
        run.cancelled_here()
        raise
    except Cancelled:                 # cancelled while its pass waited for the others'
        run.cancelled_here()
    except BaseException as e:        # the caller gets the exception, not a result
        job.fail(e)
        raise
    finally:
        run.close()
        job.report_advances(None)
        rounds.leave(member)
        if job.error is None:
            job.finish(run.result())
        lanes.leave(lane)
    if run.tail:
        yield StreamEvent(run.tail, run.tokens[-1] if run.tokens else -1, False)


class _Run:
    """The state of one generation while it holds its lane: its steps, in order, are
    :meth:`prefill`, :meth:`events`, :meth:`finish_text`, then always :meth:`close`."""

    def __init__(self, lane: Lane, prepared: Prepared, cancelled: threading.Event,
                 cache: Optional[PromptCache] = None):
        self.lane, self.prepared = lane, prepared
        self.target, self.cancelled, self.cache = lane.target, cancelled, cache
        spec = prepared.speculation
        self.draft = lane.draft if spec else None        # the draft model kept in step
        self.head = lane.head if spec else None
        self.models: list[LoadedModel] = [self.target] + (
            [self.draft] if self.draft is not None else [])
        self.drafter = None             # asked for when the lane is held (prefill)
        self.loop = LoopStats()         # the decoding loop's counters
        self.figures: dict = {}         # the rest of its GenerationStats, as measured
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.text: list[str] = []
        self.tail = ""
        self.finish_reason = "length"
        self.assembler = TextAssembler(list(prepared.request.stop))
        self.steps = None               # the decoding loop, once it runs
        self.first_row: Optional[np.ndarray] = None     # the target's logits after the prompt
        self.t_decode: Optional[float] = None
        self.t0 = 0.0                   # when the lane was held
        self.llama0 = self.head0 = self.back0 = 0.0

    def prefill(self) -> None:
        """The target's cache holds the prompt (keeping its common prefix, the last token
        always evaluated: its logits row gives the first token). The draft's keeps what it
        shares with the prompt (or what the prompt cache brings back) and no more: the drafter
        catches up between target steps when that pays
        (:meth:`edgespec.drafting.reading.Reading.catch_up`), so the first token never waits for
        the draft. The drafter is asked for first: building one may calibrate."""
        spec = self.prepared.speculation
        self.drafter = spec.drafter(self.lane) if spec else None
        t0 = self.t0 = time.perf_counter()
        want = self.prepared.prompt[:-1]
        if self.cache is not None:
            self.figures["prompt_tokens_restored"] = self.cache.prepare(self.target, want)
        self.figures["prompt_tokens_evaluated"], self.first_row = prefill(
            self.target, self.prepared.prompt, self.cancelled)
        self.lane.member.prompted()
        if self.draft is not None:
            want = spec.draft_tokens(self.lane, want)
            if self.cache is not None:
                self.cache.prepare(self.draft, want, companion=self.head)
            self.draft.truncate(common_prefix(self.draft.tokens, want))
        self.t_decode = time.perf_counter()
        self.figures["prompt_seconds"] = self.t_decode - t0
        self.llama0 = sum(m.decode_seconds for m in self.models)
        self.back0 = sum(m.rollback_seconds for m in self.models)
        self.head0 = self.head.seconds if self.head is not None else 0.0

    def events(self) -> Iterator[StreamEvent]:
        """The loop's tokens as text, until the end of generation, a stop string, the budget,
        the context's edge or a cancel (``finish_reason`` says which)."""
        if self.cancelled.is_set():     # during prompt processing
            self.finish_reason = "cancelled"
            return
        prepared, eog = self.prepared, self.target.vocab.eog
        req = prepared.request
        self.steps = decode(self.target, list(prepared.prompt), first_row=self.first_row,
                            params=req.sampling,
                            rng=np.random.default_rng(req.sampling.seed),
                            max_tokens=req.max_tokens, drafter=self.drafter,
                            stats=self.loop, should_stop=self.cancelled.is_set,
                            constraint=prepared.grammar, logprobs=req.logprobs,
                            verifier=(prepared.speculation.verifier if prepared.speculation
                                      else "block"))
        for step in self.steps:
            if not self.figures.get("first_token_seconds"):
                self.figures["first_token_seconds"] = time.perf_counter() - self.t0
            if step.token in eog:
                self.finish_reason = "stop"
                return
            self.tokens.append(step.token)
            lp = None
            if step.logprob is not None:
                lp = TokenLogprob(step.token, *step.logprob)
                self.logprobs.append(lp)
            piece = self.assembler.push(self.target.token_bytes(step.token))
            self.text.append(piece)
            yield StreamEvent(piece, step.token, step.from_draft, lp, step.round)
            if self.assembler.stopped:
                self.finish_reason = "stop"
                return
            if self.cancelled.is_set():
                self.finish_reason = "cancelled"
                return
        # the loop ended by itself: the budget or the context's edge, or a cancel
        self.finish_reason = "cancelled" if self.cancelled.is_set() else "length"

    def cancelled_here(self) -> None:
        """It ended cancelled: closed mid-stream, or its pass dropped while it waited."""
        self.finish_reason = "cancelled"

    def finish_text(self) -> None:
        """The text a stop string's check held back, now that no stop string can follow."""
        self.tail = self.assembler.finish()
        self.text.append(self.tail)

    def close(self) -> None:
        """The loop closed (its ``finally`` trims the caches), the statistics finished."""
        if self.steps is not None:
            self.steps.close()
        if self.t_decode is None:       # failed before decoding
            return
        s, lp = self.figures, self.loop
        s["decode_seconds"] = time.perf_counter() - self.t_decode
        s["llama_seconds"] = sum(m.decode_seconds for m in self.models) - self.llama0
        s["rollback_seconds"] = sum(m.rollback_seconds for m in self.models) - self.back0
        s["head_seconds"] = self.head.seconds - self.head0 if self.head is not None else 0.0
        s["completion_tokens"] = len(self.tokens)
        s["target_threads"] = self.target.n_threads
        s["draft_threads"] = self.draft.n_threads if self.draft is not None else 0
        if lp.plain_passes >= 4:        # its own plain rounds: the most like-for-like
            s["plain_pass_seconds"] = lp.plain_seconds / lp.plain_passes
        elif self.prepared.speculative:
            s["plain_pass_seconds"] = self.prepared.speculation.plain_cost() or 0.0
        if self.prepared.grammar is not None:
            s["grammar_seconds"] = self.prepared.grammar.seconds
        spec = self.prepared.speculation
        if spec is not None and spec.index is not None:
            # What this request read and wrote, for the next ones to draft from.
            spec.index.add(list(self.prepared.prompt) + self.tokens)

    def result(self) -> Generation:
        prepared = self.prepared
        out = Generation("".join(self.text), self.tokens, self.finish_reason,
                         new_stats(prepared, self.loop, **self.figures),
                         logprobs=self.logprobs if prepared.request.logprobs is not None else None)
        return prepared.finish(out) if prepared.finish is not None else out
