"""The Engine: a target model, an optional draft, and the API everything else calls.

``Engine.load`` opens both models (each with its own context), checks that they share a
tokenizer, and builds the drafter. ``stream`` turns a prompt (text or chat messages) into
committed tokens through :func:`edgespec.speculative.decode` and into text through
:class:`~edgespec.textstream.TextAssembler`; ``generate`` collects a stream. Both caches are
kept between calls: a prompt that extends the previous one (the next chat turn) evaluates only
its new tokens.

Threads: one llama.cpp context is not thread-safe, so the generations of one Engine take
turns (first come, first served; see :mod:`edgespec.streams`), whichever threads call it. Each
generation has its own cancel flag: ``Stream.cancel()`` stops that one, ``Engine.cancel()``
the one running now; either takes effect within one decoding step and leaves the caches
holding exactly what was generated. ``close()`` stops the running and queued generations,
waits for the step in progress and frees both models; engines still open at interpreter exit
are closed the same way (an ``atexit`` hook), so a generation running in a daemon thread
cannot outlive the models it uses.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from .backend import LlamaModel, backend_info, check_compatible, release_free_heap
from .chat import ChatTemplate, validate_messages
from .config import ModelConfig, SamplingParams, SpecConfig, default_threads
from .drafters import (HEAD_MIN_VOCAB, AdaptiveLength, Costs, FixedLength, HybridDrafter,
                       HybridPolicy, ModelDrafter, NgramDrafter, ReducedHead,
                       calibrate_cached)
from .errors import ContextOverflowError, EngineClosedError, InvalidParameterError
from .gguf_file import read_gguf
from .speculative import LoopStats, decode
from .streams import AsyncStream, Job, Stream, Turnstile
from .textstream import TextAssembler

log = logging.getLogger(__name__)

Prompt = Union[str, Sequence[Mapping[str, str]]]


@dataclass
class GenerationStats:
    """What one generation cost and how speculation did (times in seconds)."""

    prompt_tokens: int = 0
    prompt_tokens_evaluated: int = 0   # not found in the KV cache, so evaluated (target)
    completion_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    target_passes: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    llama_seconds: float = 0.0         # inside llama_decode, both models, decoding phase
    head_seconds: float = 0.0          # the draft's reduced output layer (numpy), decoding
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    speculative: bool = False
    tested_at: list = field(default_factory=list)   # per draft position, see LoopStats
    accepted_at: list = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.completion_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decoding speed: completion tokens over decoding time (prompt processing excluded)."""
        return self.completion_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return (self.prompt_tokens_evaluated / self.prompt_seconds
                if self.prompt_seconds else 0.0)

    @property
    def python_seconds(self) -> float:
        """Decoding wall time spent outside the models' compute (drafting logic,
        verification, text): outside llama.cpp and the draft's reduced output layer."""
        return max(0.0, self.decode_seconds - self.llama_seconds - self.head_seconds)

    @property
    def python_share(self) -> float:
        return self.python_seconds / self.decode_seconds if self.decode_seconds else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("acceptance_rate", "tokens_per_pass", "tokens_per_second",
                     "prompt_tokens_per_second", "python_seconds", "python_share"):
            d[name] = getattr(self, name)
        return d


@dataclass
class Generation:
    """The result of a generation."""

    text: str
    tokens: list[int]
    finish_reason: str          # "stop" | "length" | "cancelled"
    stats: GenerationStats = field(default_factory=GenerationStats)

    def to_dict(self) -> dict:
        return {"text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict()}


@dataclass
class StreamEvent:
    """A piece of streamed output: the text released with ``token`` (may be '' while a
    character or a possible stop string is incomplete)."""

    text: str
    token: int
    from_draft: bool


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n and a[:n] == b[:n]:
        return n
    arr_a = np.asarray(a[:n], dtype=np.int64)
    arr_b = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(arr_a != arr_b)
    return int(diff[0]) if diff.size else n


class Engine:
    """A loaded target (and optional draft) ready to generate. See the module docstring."""

    def __init__(self, target: LlamaModel, draft: Optional[LlamaModel], spec: SpecConfig):
        self.target = target
        self.draft = draft
        self.spec = spec
        special = lambda t: target.token_text(t).decode("utf-8", "replace") if t >= 0 else ""
        self.template = ChatTemplate(target.info.chat_template,
                                     bos_token=special(target.vocab.bos),
                                     eos_token=special(target.vocab.eos))
        if self.template.is_fallback:
            log.warning("%s: %s; chat messages use the ChatML format", target.path.name,
                        self.template.fallback_reason)
        # A draft with a large vocabulary, run on the CPU, skips llama.cpp's output layer and
        # applies a reduced one (drafters.ReducedHead); shared by engines on the same draft.
        self.draft_head = (ReducedHead.shared(draft) if draft is not None and draft.can_tap
                           and draft.n_vocab >= HEAD_MIN_VOCAB
                           and spec.drafter in ("model", "hybrid") else None)
        self.drafter = self._make_drafter()
        self._policies: dict = {}
        self._costs = None
        if spec.is_adaptive and self.drafter is not None:
            # An n-gram drafter costs microseconds, whatever the draft model would cost.
            self._costs = calibrate_cached(target, draft if spec.drafter != "ngram" else None,
                                           head=self.draft_head)
        self._turnstile = Turnstile()
        # Held while the models are used outside a turn (tokenizing, info) and by close()
        # while it frees them.
        self._life = threading.Lock()
        self._closed = False
        _open_engines.add(self)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def load(cls, target: Union[str, Path, None] = None, draft: Union[str, Path, None] = None,
             *, pair: Optional[str] = None, n_ctx: int = 4096, n_batch: int = 512,
             n_threads: Optional[int] = None, n_gpu_layers: int = -1,
             draft_n_gpu_layers: int = -1, drafter: Optional[str] = None,
             draft_max: Optional[int] = None, adaptive: bool = True,
             p_min: float = 0.0, verbose: bool = False) -> "Engine":
        """Load a target GGUF and optionally a draft GGUF (or a registry ``pair`` name).

        ``drafter`` is ``"hybrid"`` (the default when a draft is given: n-gram matches from
        the context, else the draft model), ``"model"`` (the draft model only), ``"ngram"``
        (prompt lookup, no draft model needed) or ``"none"`` (plain decoding). ``draft_max=None`` lets a cost model choose each
        round's draft length (``adaptive=False`` pins it to 16; ``draft_max=K`` pins it to K;
        ``p_min`` then cuts drafts whose top probability is below it). Raises
        :class:`~edgespec.errors.ModelLoadError` for files that cannot be loaded and
        :class:`~edgespec.errors.IncompatiblePairError` when the draft's tokenizer differs.
        """
        if pair is not None:
            if target is not None or draft is not None:
                raise InvalidParameterError("pair", pair, "used alone, without target/draft")
            from .pairs import resolve_pair
            target, draft = resolve_pair(pair)
        if target is None:
            raise InvalidParameterError("target", None, "a path to a GGUF file (or pair=NAME)")
        if drafter is None:
            # With a draft model: long n-gram matches from the context are free drafts, the
            # model drafts the rest (measured the fastest on every pair here; see README).
            drafter = "hybrid" if draft is not None else "none"
        spec = SpecConfig(drafter=drafter, draft_max=draft_max, adaptive=adaptive, p_min=p_min)
        if drafter in ("model", "hybrid") and draft is None:
            raise InvalidParameterError("drafter", drafter, "'ngram' or 'none' when no draft "
                                        "model is given (or pass draft=PATH)")
        threads = n_threads or default_threads()
        n_out = max(64, spec.most_drafts + 1)
        t_model = LlamaModel(ModelConfig(target, n_ctx=n_ctx, n_batch=n_batch, n_threads=threads,
                                         n_gpu_layers=n_gpu_layers, n_outputs_max=n_out,
                                         verbose=verbose))
        d_model = None
        try:
            if draft is not None and drafter in ("model", "hybrid"):
                d_model = LlamaModel(ModelConfig(draft, n_ctx=n_ctx, n_batch=n_batch,
                                                 n_threads=threads,
                                                 n_gpu_layers=draft_n_gpu_layers,
                                                 n_outputs_max=1, verbose=verbose),
                                     tap_hidden=read_gguf(draft).n_vocab >= HEAD_MIN_VOCAB)
                check_compatible(t_model, d_model)
            return cls(t_model, d_model, spec)
        except BaseException:
            if d_model is not None:
                d_model.close()
            t_model.close()
            raise

    def _make_drafter(self):
        kind = self.spec.drafter
        if kind == "model":
            return ModelDrafter(self.draft, self.target.vocab.eog, self.draft_head)
        if kind == "ngram":
            return NgramDrafter()
        if kind == "hybrid":
            return HybridDrafter(ModelDrafter(self.draft, self.target.vocab.eog,
                                              self.draft_head))
        return None

    def _policy(self, sampling: SamplingParams):
        """The draft-length policy for this kind of sampling (acceptance differs between
        greedy and sampled decoding, so each learns its own; the measured costs are shared)."""
        spec = self.spec
        if not spec.is_adaptive or (sampling.seed is not None and not sampling.greedy):
            # A seeded sample must be reproducible; the adaptive length follows measured
            # speed, and a different K consumes the random stream differently.
            return FixedLength(spec.fixed_k, spec.p_min)
        key = sampling.greedy
        if key not in self._policies:
            k_max = min(spec.k_max, self.target.n_outputs_max - 1)
            policy = AdaptiveLength(self._costs, k_max=k_max)
            if spec.drafter == "hybrid":
                free = Costs(dict(self._costs.target), draft=1e-4)   # n-gram drafts are free
                policy = HybridPolicy(policy, AdaptiveLength(free, k_max=k_max))
            self._policies[key] = policy
        return self._policies[key]

    # -- information ----------------------------------------------------------------------

    def info(self) -> dict:
        """Pair, backend and settings, for status lines and ``/v1/models``."""
        with self._life:
            self._check_open()
            return {"target": self.target.describe(),
                    "draft": self.draft.describe() if self.draft else None,
                    "drafter": self.spec.drafter, "draft_max": self.spec.draft_max,
                    "adaptive": self.spec.is_adaptive, "p_min": self.spec.p_min,
                    "backend": backend_info()["backend"],
                    "chat_template": "fallback (ChatML)" if self.template.is_fallback else "model"}

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    @property
    def busy(self) -> bool:
        """Whether a generation holds the caches now."""
        return self._turnstile.owner is not None

    @property
    def waiting(self) -> int:
        """How many generations are queued behind the running one."""
        return self._turnstile.waiting

    @property
    def closed(self) -> bool:
        return self._closed

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        with self._life:
            self._check_open()
            return self.target.tokenize(text, add_special=add_special, parse_special=True)

    def prompt_tokens(self, prompt: Prompt, raw: bool = False) -> list[int]:
        """The exact tokens both models will see for ``prompt``."""
        if isinstance(prompt, str) and raw:
            text = prompt
        else:
            messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                        else validate_messages(prompt))
            with self._life:   # one render at a time: the sandbox's deadline is shared state
                text = self.template.render(messages, add_generation_prompt=True)
        tokens = self.tokenize(text)
        bos = self.target.vocab.bos
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]  # the template wrote BOS itself; do not double it
        if not tokens:
            raise InvalidParameterError("prompt", prompt, "a non-empty text")
        return tokens

    # -- generation -----------------------------------------------------------------------

    def generate(self, prompt: Prompt, *, max_tokens: int = 256,
                 sampling: Optional[SamplingParams] = None, speculative: bool = True,
                 raw: bool = False, stop: Sequence[str] = ()) -> Generation:
        """Generate a completion of ``prompt`` (text, or a list of chat messages).

        ``raw=True`` sends text as-is; otherwise it is wrapped as a user message in the
        model's chat template. ``speculative=False`` decodes with the target alone. Any
        thread may call it (generations take turns); a generation stopped by :meth:`cancel`
        or :meth:`close` returns with ``finish_reason "cancelled"``.
        """
        s = self.stream(prompt, max_tokens=max_tokens, sampling=sampling,
                        speculative=speculative, raw=raw, stop=stop)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def chat(self, messages: Sequence[Mapping[str, str]], **kwargs) -> Generation:
        return self.generate(messages, **kwargs)

    def stream(self, prompt: Prompt, *, max_tokens: int = 256,
               sampling: Optional[SamplingParams] = None, speculative: bool = True,
               raw: bool = False, stop: Sequence[str] = ()) -> Stream:
        """Like :meth:`generate`, streaming :class:`StreamEvent` objects as tokens commit.

        Arguments are checked and the prompt tokenized here (errors are raised by this call);
        the generation waits for its turn when the stream is first advanced. See
        :class:`~edgespec.streams.Stream` for cancelling and closing it.
        """
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InvalidParameterError("max_tokens", max_tokens, "an integer >= 1")
        if isinstance(stop, str):
            stop = [stop]
        if any(not isinstance(s, str) or not s for s in stop):
            raise InvalidParameterError("stop", list(stop), "a list of non-empty strings")
        sampling = sampling if sampling is not None else SamplingParams()
        self._check_open()
        tokens = self.prompt_tokens(prompt, raw=raw)
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(len(tokens), self.n_ctx)
        speculative = speculative and self.drafter is not None
        job = Job(self._turnstile, Generation("", [], "cancelled", GenerationStats(
            prompt_tokens=len(tokens), speculative=speculative)))
        return Stream(job, self._run(job, tokens, max_tokens, sampling, speculative,
                                     list(stop)))

    def astream(self, prompt: Prompt, **kwargs) -> AsyncStream:
        """:meth:`stream` for asyncio: ``async for event in engine.astream(...)``.

        Same arguments and errors (raised by this call). The generation runs in a thread of
        its own so the event loop stays responsive; see :class:`~edgespec.streams.AsyncStream`.
        """
        return AsyncStream(self.stream(prompt, **kwargs))

    async def agenerate(self, prompt: Prompt, **kwargs) -> Generation:
        """:meth:`generate` for asyncio (cancelling the awaiting task cancels it)."""
        s = self.astream(prompt, **kwargs)
        async with s:
            async for _ in s:
                pass
        return s.result

    def cancel(self) -> None:
        """Stop the generation running now (not the queued ones), within one decoding step.

        Thread-safe and never blocks; the stopped generation ends with ``finish_reason
        "cancelled"``. A no-op when nothing is running.
        """
        job = self._turnstile.owner
        if job is not None:
            job.cancel()

    def _run(self, job: Job, prompt: list[int], max_tokens: int,
             sampling: SamplingParams, speculative: bool,
             stop: list[str]) -> Iterator[StreamEvent]:
        """The generation behind a Stream: waits for its turn, then prefill → decode → text.

        Holds the turn until it ends; whichever way it ends (last token, cancel, close, an
        error) its ``finally`` trims the caches to what was generated and hands the turn on.
        """
        if not self._turnstile.enter(job):      # cancelled, or the Engine closed, while queued
            job.result = job.cancelled_result
            return
        cancelled = job.cancelled
        tail, ended, failed = "", False, False
        try:
            stats = GenerationStats(prompt_tokens=len(prompt), speculative=speculative)
            out_tokens: list[int] = []
            text: list[str] = []
            finish = "length"
            target = self.target
            models = [target] + ([self.draft] if speculative and self.draft else [])
            t0 = time.perf_counter()
            stats.prompt_tokens_evaluated = self._prefill(target, prompt, cancelled)
            if speculative and self.draft is not None:
                self._prefill(self.draft, prompt, cancelled)
            t1 = time.perf_counter()
            stats.prompt_seconds = t1 - t0
            llama0 = sum(m.decode_seconds for m in models)
            head0 = self.draft_head.seconds if self.draft_head is not None else 0.0

            context = list(prompt)
            loop_stats = LoopStats()
            rng = np.random.default_rng(sampling.seed)
            assembler = TextAssembler(stop)
            eog = target.vocab.eog
            steps = (decode(target, context, params=sampling, rng=rng, max_new=max_tokens,
                            drafter=self.drafter if speculative else None,
                            policy=self._policy(sampling), stats=loop_stats,
                            should_stop=cancelled.is_set)
                     if not cancelled.is_set() else iter(()))
            try:
                if cancelled.is_set():  # cancelled during prompt processing
                    finish = "cancelled"
                else:
                    for step in steps:
                        if step.token in eog:
                            finish = "stop"
                            break
                        out_tokens.append(step.token)
                        piece = assembler.push(target.token_bytes(step.token))
                        if assembler.stopped:
                            finish = "stop"
                            text.append(piece)
                            yield StreamEvent(piece, step.token, step.from_draft)
                            break
                        text.append(piece)
                        yield StreamEvent(piece, step.token, step.from_draft)
                        if cancelled.is_set():
                            finish = "cancelled"
                            break
                    else:   # the loop ended by itself: budget or context full, or a cancel
                        finish = "cancelled" if cancelled.is_set() else "length"
            except GeneratorExit:   # closed mid-stream: the output is what was yielded
                finish, ended = "cancelled", True
                raise
            except BaseException:   # the caller gets the exception, not a result
                ended = failed = True
                raise
            finally:
                if hasattr(steps, "close"):
                    steps.close()
                t2 = time.perf_counter()
                stats.decode_seconds = t2 - t1
                stats.llama_seconds = sum(m.decode_seconds for m in models) - llama0
                stats.head_seconds = (self.draft_head.seconds - head0
                                      if self.draft_head is not None else 0.0)
                stats.completion_tokens = len(out_tokens)
                stats.drafted, stats.accepted = loop_stats.drafted, loop_stats.accepted
                stats.target_passes = loop_stats.target_passes
                stats.draft_seconds = loop_stats.draft_seconds
                stats.verify_seconds = loop_stats.verify_seconds
                stats.tested_at = loop_stats.tested_at
                stats.accepted_at = loop_stats.accepted_at
                if not ended:
                    tail = assembler.finish()
                    text.append(tail)
                if not failed:
                    job.result = Generation("".join(text), out_tokens, finish, stats)
        finally:
            self._turnstile.leave(job)
        if tail:
            yield StreamEvent(tail, out_tokens[-1] if out_tokens else -1, False)

    def _prefill(self, model: LlamaModel, prompt: list[int], cancelled: threading.Event) -> int:
        """Make ``model``'s cache hold ``prompt[:-1]``, reusing its common prefix.

        Returns how many tokens were evaluated. Checks for cancellation between batches.
        """
        want = prompt[:-1]
        keep = _common_prefix(model.tokens, want)
        model.truncate(keep)
        todo = want[keep:]
        for start in range(0, len(todo), model.n_batch):
            if cancelled.is_set():
                break
            model.eval(todo[start:start + model.n_batch], 0)
        return len(model.tokens) - keep + 1

    # -- lifetime -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this Engine is closed; load a new one")

    def close(self) -> None:
        """Stop every generation and free both models. Any thread; a second call is a no-op.

        Queued generations end ``"cancelled"`` without running; the running one is cancelled
        and this waits for its step in progress (at most one decoding step), so no thread is
        inside llama.cpp when the models are freed. Afterwards every call that needs the
        models raises :class:`~edgespec.errors.EngineClosedError`.
        """
        with self._life:
            if self._closed:
                return
            self._closed = True
        owner = self._turnstile.close()
        if owner is not None:
            owner.close()
        self._turnstile.wait_idle()
        with self._life:
            if self.draft is not None:
                self.draft.close()
            self.target.close()
        release_free_heap()
        _open_engines.discard(self)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Engines not closed yet. At interpreter exit they are closed while the interpreter is still
# whole: a generation running in a daemon thread is stopped before the models are freed,
# instead of running on into the interpreter's (and llama.cpp's) teardown.
_open_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _close_open_engines() -> None:
    for engine in list(_open_engines):
        try:
            engine.close()
        except Exception:   # pragma: no cover - best effort at exit
            log.exception("closing an Engine at exit failed")
