"""One generation: wait for the turn, prefill both caches, decode, assemble text, and fill in
the result whichever way it ends.

:class:`~edgespec.engine.Engine.stream` checks the arguments and tokenizes the prompt, then
hands :func:`run_generation` to a :class:`~edgespec.streams.Stream`; this generator is
everything that happens once the stream is advanced.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

import numpy as np

from .config import SamplingParams
from .drafting import Drafter, ReducedHead
from .lm import LanguageModel
from .results import Generation, GenerationStats, StreamEvent, TokenLogprob
from .speculative import LoopStats, decode
from .streams import Job, Turnstile
from .textstream import TextAssembler

if TYPE_CHECKING:
    from .backend import LlamaModel
    from .constraints import GrammarState


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n and a[:n] == b[:n]:
        return n
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


def prefill(model: LanguageModel, prompt: list[int], cancelled: threading.Event) -> int:
    """Make ``model``'s cache hold ``prompt[:-1]``, reusing its common prefix.

    Returns how many tokens were evaluated. Checks for cancellation between batches.
    """
    want = prompt[:-1]
    keep = common_prefix(model.tokens, want)
    model.truncate(keep)
    todo = want[keep:]
    for start in range(0, len(todo), model.n_batch):
        if cancelled.is_set():
            break
        model.eval(todo[start:start + model.n_batch], 0)
    return len(model.tokens) - keep + 1


def run_generation(job: Job, turnstile: Turnstile, target: "LlamaModel",
                   draft: Optional["LlamaModel"], draft_head: Optional[ReducedHead],
                   get_drafter: Callable[[], Optional[Drafter]], prompt: list[int], *,
                   max_tokens: int, sampling: SamplingParams, stop: list[str],
                   speculative: bool, grammar: Optional["GrammarState"] = None,
                   logprobs: Optional[int] = None,
                   finish: Optional[Callable[[Generation], Generation]] = None,
                   plain_cost: Callable[[], Optional[float]] = lambda: None
                   ) -> Iterator[StreamEvent]:
    """The generation behind a Stream: waits for its turn, then prefill → decode → text.

    ``draft``: the draft model to prefill (None without one, or for plain decoding);
    ``get_drafter`` is asked once the turn is taken (it may calibrate). ``grammar``: the
    output's constraint, at the start of the output. ``logprobs``: record each token's log
    probability and this many alternatives. ``finish`` turns the result into its final form
    (tool calls read from the output). ``plain_cost``: the cost model's seconds for a plain
    target pass (None: no cost model), the speed-up's reference when no round was plain.
    Holds the turn until it ends; whichever way it ends (last token, cancel, close, an error)
    its ``finally`` trims the caches to what was generated and hands the turn on.
    """
    if not turnstile.enter(job):      # cancelled, or the Engine closed, while queued
        job.result = job.cancelled_result
        return
    cancelled = job.cancelled
    tail, ended = "", False
    try:
        drafter = get_drafter() if speculative else None
        stats = GenerationStats(prompt_tokens=len(prompt), speculative=speculative,
                                loop=LoopStats())
        models = [target] + ([draft] if draft is not None else [])
        out_tokens: list[int] = []
        token_logprobs: list[TokenLogprob] = []
        text: list[str] = []
        finish_reason = "length"
        t0 = time.perf_counter()
        stats.prompt_tokens_evaluated = prefill(target, prompt, cancelled)
        if draft is not None:
            prefill(draft, prompt, cancelled)
        t1 = time.perf_counter()
        stats.prompt_seconds = t1 - t0
        llama0 = sum(m.decode_seconds for m in models)
        head0 = draft_head.seconds if draft_head is not None else 0.0
        assembler = TextAssembler(stop)
        eog = target.vocab.eog
        steps = (decode(target, list(prompt), params=sampling,
                        rng=np.random.default_rng(sampling.seed), max_new=max_tokens,
                        drafter=drafter, stats=stats.loop, should_stop=cancelled.is_set,
                        constraint=grammar, logprobs=logprobs)
                 if not cancelled.is_set() else iter(()))
        try:
            if cancelled.is_set():  # cancelled during prompt processing
                finish_reason = "cancelled"
            else:
                for step in steps:
                    if step.token in eog:
                        finish_reason = "stop"
                        break
                    out_tokens.append(step.token)
                    lp = None
                    if step.logprob is not None:
                        lp = TokenLogprob(step.token, *step.logprob)
                        token_logprobs.append(lp)
                    piece = assembler.push(target.token_bytes(step.token))
                    text.append(piece)
                    yield StreamEvent(piece, step.token, step.from_draft, lp)
                    if assembler.stopped:
                        finish_reason = "stop"
                        break
                    if cancelled.is_set():
                        finish_reason = "cancelled"
                        break
                else:   # the loop ended by itself: budget or context full, or a cancel
                    finish_reason = "cancelled" if cancelled.is_set() else "length"
        except GeneratorExit:   # closed mid-stream: the output is what was yielded
            finish_reason, ended = "cancelled", True
            raise
        except BaseException as e:   # the caller gets the exception, not a result
            ended = True
            job.error = e
            raise
        finally:
            if hasattr(steps, "close"):
                steps.close()
            stats.decode_seconds = time.perf_counter() - t1
            stats.llama_seconds = sum(m.decode_seconds for m in models) - llama0
            stats.head_seconds = (draft_head.seconds - head0
                                  if draft_head is not None else 0.0)
            stats.completion_tokens = len(out_tokens)
            stats.target_threads = target.n_threads
            stats.draft_threads = draft.n_threads if draft is not None else 0
            lp = stats.loop
            if lp.plain_passes >= 4:        # its own plain rounds: the most like-for-like
                stats.plain_pass_seconds = lp.plain_seconds / lp.plain_passes
            elif speculative:
                stats.plain_pass_seconds = plain_cost() or 0.0
            if grammar is not None:
                stats.grammar_seconds = grammar.seconds
            if not ended:
                tail = assembler.finish()
                text.append(tail)
            if job.error is None:
                result = Generation("".join(text), out_tokens, finish_reason, stats,
                                    logprobs=token_logprobs if logprobs is not None else None)
                job.result = finish(result) if finish is not None else result
    except BaseException as e:
        if job.error is None and not isinstance(e, GeneratorExit):
            job.error = e       # failed during prompt processing
        raise
    finally:
        turnstile.leave(job)
    if tail:
        yield StreamEvent(tail, out_tokens[-1] if out_tokens else -1, False)
