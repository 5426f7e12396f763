"""The Engine: a target model, an optional draft, and the API everything else calls.

``Engine.load`` opens both models (each with its own context), checks that they share a
tokenizer, and measures what each costs. ``stream`` checks its arguments, turns the prompt
(text or chat messages) into tokens and queues a generation (:mod:`edgespec.generation`);
``generate`` collects a stream. Both caches are kept between calls: a prompt that extends the
previous one (the next chat turn) evaluates only its new tokens.

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
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from . import config
from .backend import (GrammarVocab, VocabMap, backend_info, check_pair, open_pair, placement,
                      release_free_heap, rpc_endpoints)
from .chat_template import ChatTemplate, validate_messages
from .config import ModelConfig, SamplingParams, SpecConfig, default_threads
from .constraints import Constraint, GrammarState, tokenizer_for
from .drafting import HEAD_MIN_VOCAB, Drafter, EngineDrafting, ReducedHead, Translation
from .embedding import Embedder, Embeddings, Inputs
from .errors import ContextOverflowError, EngineClosedError, InvalidParameterError
from .generation import not_started, run_generation
from .lm import LoadedModel
from .prompt_cache import PromptCache
from .request import GenerationRequest, Prompt, Request, Speculation, check_limits
from .results import Generation
from .streams import AsyncStream, Job, Stream, Turnstile
from .threads import govern
from .tools import plan_request

log = logging.getLogger(__name__)


class Engine:
    """A loaded target (and optional draft) ready to generate. See the module docstring.

    Build one with :meth:`load`. The constructor takes models already loaded (``draft_head``:
    a draft output layer to share with another Engine on the same draft model).
    """

    def __init__(self, target: LoadedModel, draft: Optional[LoadedModel], spec: SpecConfig, *,
                 draft_head: Optional[ReducedHead] = None, adaptive_threads: bool = False,
                 recalibrate: bool = False, cache_ram: int = config.CACHE_RAM_MIB,
                 vocab_map: Union[VocabMap, None, str] = "check",
                 progress: Callable[[str], None] = lambda s: None):
        self.target = target
        self.draft = draft
        # A draft of another vocabulary drafts through a map between the two ("check": the
        # pair was not checked yet; None: the draft shares the target's tokenizer).
        if isinstance(vocab_map, str):
            vocab_map = check_pair(target, draft) if draft is not None else None
        self.vocab_map: Optional[VocabMap] = vocab_map

        def special(t: int) -> str:
            return target.token_text(t).decode("utf-8", "replace") if t >= 0 else ""
        self.template = ChatTemplate(target.info.chat_template,
                                     bos_token=special(target.vocab.bos),
                                     eos_token=special(target.vocab.eos))
        # A draft with a large vocabulary, run on the CPU, skips llama.cpp's output layer and
        # applies a reduced one (drafting/reduced_head.py).
        if draft_head is None and draft is not None and draft.can_tap \
                and draft.n_vocab >= HEAD_MIN_VOCAB and spec.uses_draft_model:
            draft_head = ReducedHead(draft, shared=vocab_map.keep if vocab_map else None)
        self.draft_head = draft_head
        self._drafting = EngineDrafting(spec, target, draft, draft_head,
                                        cross=self._cross(target, draft, vocab_map),
                                        recalibrate=recalibrate, progress=progress)
        # Threads that follow the machine's load (edgespec/threads.py), one governor a model;
        # none when the caller pinned a count.
        self._governors = (govern(target, draft, self._drafting.costs) if adaptive_threads
                           else {})
        self._parked = self._governors      # kept while pinned: they resume what they knew
        self._turnstile = Turnstile()
        self._check_cache_ram(cache_ram)
        # The states of other conversations than the live one, in host memory
        self.prompt_cache = PromptCache(cache_ram * 2**20)
        # Embeddings of the target, on a context of their own made on first use
        self._embedder = Embedder.sharing(target)
        # Held while the models are used outside a turn (tokenizing, info) and by close()
        # while it frees them.
        self._life = threading.Lock()
        self._closed = False
        _open_engines.add(self)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def load(cls, target: Union[str, Path, None] = None, draft: Union[str, Path, None] = None,
             *, pair: Optional[str] = None, n_ctx: int = config.N_CTX,
             n_batch: int = config.N_BATCH, n_threads: Optional[int] = None,
             n_gpu_layers: int = -1, draft_n_gpu_layers: int = -1,
             drafter: Optional[str] = None, draft_max: Optional[int] = None,
             adaptive: bool = True, p_min: float = 0.0, verbose: bool = False,
             recalibrate: bool = False, rpc=None, draft_rpc=None,
             cpu_extra_buffers: str = "auto", cache_ram: int = config.CACHE_RAM_MIB,
             progress: Callable[[str], None] = lambda s: None) -> "Engine":
        """Load a target GGUF and optionally a draft GGUF (or a registry ``pair`` name).

        ``drafter`` is ``"hybrid"`` (the default when a draft is given: n-gram matches from
        the context, else the draft model), ``"model"`` (the draft model only), ``"ngram"``
        (prompt lookup, no draft model needed) or ``"none"`` (plain decoding).
        ``draft_max=None`` lets a cost model choose each round's draft length
        (``adaptive=False`` pins it to 16; ``draft_max=K`` pins it to K; ``p_min`` then cuts
        drafts whose top probability is below it). The cost model's calibration is measured
        once per model file and setting and kept; ``recalibrate=True`` measures it again;
        ``progress`` is told what loading is doing (a line at a time). Raises
        :class:`~edgespec.errors.ModelLoadError` for files that cannot be loaded and
        :class:`~edgespec.errors.IncompatiblePairError` when the draft's tokenizer differs.
        ``rpc``: ``"HOST:PORT,…"`` (or a list) of ``edgespec worker`` processes that hold the
        target's layers; the draft stays local unless ``draft_rpc`` names workers for it
        (:class:`~edgespec.errors.RPCError` when one cannot be reached).
        ``cpu_extra_buffers``: ``"auto"`` lets llama.cpp's extra CPU kernels (AMX, repacked
        weights) run only where a child process showed that they do not crash this CPU
        (checked once per CPU and llama.cpp build); ``"on"``/``"off"`` decide without a check.
        """
        if pair is not None:
            if target is not None or draft is not None:
                raise InvalidParameterError("pair", pair, "used alone, without target/draft")
            from .registry import resolve_pair     # apps may name a pair; the core never does
            target, draft = resolve_pair(pair)
        if target is None:
            raise InvalidParameterError("target", None, "a path to a GGUF file (or pair=NAME)")
        if drafter is None:
            drafter = SpecConfig.default_drafter(draft is not None)
        spec = SpecConfig(drafter=drafter, draft_max=draft_max, adaptive=adaptive, p_min=p_min)
        if spec.uses_draft_model and draft is None:
            raise InvalidParameterError("drafter", drafter, "'ngram' or 'none' when no draft "
                                        "model is given (or pass draft=PATH)")
        rpc, draft_rpc = rpc_endpoints(rpc, draft_rpc)
        common = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads or default_threads(),
                      verbose=verbose, cpu_extra_buffers=cpu_extra_buffers)
        t_cfg = ModelConfig(target, n_gpu_layers=n_gpu_layers, rpc=rpc, **common,
                            n_outputs_max=max(config.N_OUTPUTS_MIN, spec.most_drafts + 1))
        d_cfg = (ModelConfig(draft, n_gpu_layers=draft_n_gpu_layers, rpc=draft_rpc,
                             n_outputs_max=1, **common)
                 if draft is not None and spec.uses_draft_model else None)
        t_model, d_model, vmap = open_pair(t_cfg, d_cfg, draft_tap_min_vocab=HEAD_MIN_VOCAB,
                                           progress=progress)
        try:
            return cls(t_model, d_model, spec, adaptive_threads=n_threads is None,
                       recalibrate=recalibrate, cache_ram=cache_ram, vocab_map=vmap,
                       progress=progress)
        except BaseException:
            for m in (d_model, t_model):
                if m is not None:
                    m.close()
            raise

    @staticmethod
    def _cross(target: LoadedModel, draft: Optional[LoadedModel],
               vmap: Optional[VocabMap]) -> Optional[tuple]:
        """What a drafter of another vocabulary needs (drafting/cross_vocab.py): the context
        in the draft's tokens, and the draft's ids to the target's."""
        if vmap is None or draft is None:
            return None
        t_vocab, d_info = target.vocabulary, draft.vocab

        def tokenize(raw: bytes) -> list[int]:
            return draft.tokenize(raw, add_special=False, parse_special=False) if raw else []
        bos = (target.vocab.bos, [d_info.bos] if d_info.add_bos and d_info.bos >= 0 else [])
        translation = Translation(vmap.to_draft, lambda t: t_vocab.piece(t, special=True),
                                  tokenize, bos)
        return translation, vmap.to_target

    @staticmethod
    def _check_cache_ram(cache_ram) -> None:
        if not isinstance(cache_ram, int) or isinstance(cache_ram, bool) or cache_ram < 0:
            raise InvalidParameterError("cache_ram", cache_ram, "an integer >= 0 (MiB; 0 "
                                        "turns the prompt cache off)")

    @property
    def spec(self) -> SpecConfig:
        """The drafting settings in force."""
        return self._drafting.spec

    def _drafter(self, sampling: SamplingParams) -> Optional[Drafter]:
        return self._drafting.for_sampling(sampling)

    def set_draft_max(self, draft_max: Optional[int]) -> None:
        """Pin the draft length to ``draft_max`` tokens per round, or let the cost model choose
        it again (``None``). Takes effect from the next generation.

        Raises :class:`~edgespec.errors.InvalidParameterError` when the Engine has no drafter,
        or when this Engine's target cannot verify that many tokens in one pass (the rows of
        logits it returns per pass are fixed when it is loaded; load it with
        ``draft_max=K`` for longer drafts).
        """
        with self._life:
            self._drafting.set_draft_max(draft_max)

    # -- information ----------------------------------------------------------------------

    def info(self) -> dict:
        """Pair, backend and settings, for status lines and ``/v1/models``."""
        with self._life:
            self._check_open()
            return {"target": self.target.describe(),
                    "draft": self.draft.describe() if self.draft else None,
                    "draft_vocabulary": (None if self.draft is None else "shared"
                                         if self.vocab_map is None else
                                         f"mapped: {self.vocab_map.share} of its tokens "
                                         f"are the target's"),
                    "drafter": self.spec.drafter, "draft_max": self.spec.draft_max,
                    "adaptive": self.spec.is_adaptive, "p_min": self.spec.p_min,
                    "backend": placement(backend_info()["backend"], self.target, self.draft),
                    "chat_template": "fallback (ChatML)" if self.template.is_fallback else "model"}

    def set_threads(self, n_threads: Optional[int]) -> None:
        """Pin both models to ``n_threads`` CPU threads, or (``None``) let each follow the
        machine's load again, up to the count it was loaded with. From the next step on."""
        limit = self.target.config.n_threads
        if n_threads is not None and (not isinstance(n_threads, int) or isinstance(
                n_threads, bool) or not 1 <= n_threads <= limit):
            raise InvalidParameterError("n_threads", n_threads,
                                        f"None or an integer in [1, {limit}] for this Engine")
        with self._life:
            self._governors = govern(self.target, self.draft, self._drafting.costs,
                                     pin=n_threads, governors=self._parked)
            self._parked = self._governors or self._parked

    @property
    def threads(self) -> dict:
        """CPU threads each model runs with now, the most it may use, whether they follow the
        machine's load, and whether they backed off because the machine was busy."""
        return {"target": self.target.n_threads,
                "draft": self.draft.n_threads if self.draft is not None else None,
                "max": self.target.config.n_threads, "adaptive": bool(self._governors),
                "backed_off": any(g.backed_off for g in self._governors.values())}

    @property
    def can_speculate(self) -> bool:
        """Whether this Engine has a drafter (a draft model, or n-gram lookup)."""
        return self.spec.drafts

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

    def prompt_tokens(self, prompt: Prompt, raw: bool = False,
                      tools: Optional[list[dict]] = None, _validated: bool = False) -> list[int]:
        """The exact tokens both models will see for ``prompt`` (``tools``: declared to a
        template that reads them)."""
        if isinstance(prompt, str) and raw:
            text = prompt
        else:
            messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                        else prompt if _validated else validate_messages(prompt))
            with self._life:   # one render at a time: the sandbox's deadline is shared state
                text = self.template.render(messages, add_generation_prompt=True, tools=tools,
                                            validate=False)
        tokens = self.tokenize(text)
        bos = self.target.vocab.bos
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]  # the template wrote BOS itself; do not double it
        if not tokens:
            raise InvalidParameterError("prompt", prompt, "a non-empty text")
        return tokens

    # -- generation -----------------------------------------------------------------------

    def generate(self, prompt: Prompt, **kwargs) -> Generation:
        """Generate a completion of ``prompt`` (text, or a list of chat messages); the
        arguments are :meth:`stream`'s.

        ``raw=True`` sends text as-is; otherwise it is wrapped as a user message in the
        model's chat template. ``speculative=False`` decodes with the target alone.
        ``constraint`` (a :class:`~edgespec.constraints.Constraint`) makes the output match a
        JSON schema, a regex or a grammar; ``tools`` lets the model call functions
        (``Generation.tool_calls``). Any thread may call it (generations take turns); a
        generation stopped by :meth:`cancel` or :meth:`close` returns with ``finish_reason
        "cancelled"``.
        """
        s = self.stream(prompt, **kwargs)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def chat(self, messages: Sequence[Mapping[str, str]], **kwargs) -> Generation:
        return self.generate(messages, **kwargs)

    def stream(self, prompt: Prompt, *, max_tokens: int = config.MAX_TOKENS,
               sampling: Optional[SamplingParams] = None, speculative: bool = True,
               raw: bool = False, stop: Sequence[str] = (),
               constraint: Optional[Constraint] = None, tools: Optional[Sequence] = None,
               tool_choice: Any = None, parallel_tool_calls: bool = False,
               logprobs: Optional[int] = None) -> Stream:
        """Like :meth:`generate`, streaming :class:`StreamEvent` objects as tokens commit.

        ``tools``: functions the model may call (OpenAI's shape, or :class:`~edgespec.tools.
        Tool`); ``tool_choice``: ``"auto"`` (default), ``"none"``, ``"required"`` or a tool's
        name; ``parallel_tool_calls=True``: several calls in one answer (off by default).
        With tools the events carry the raw output; the result's ``text`` and
        ``tool_calls`` are what it means. ``logprobs``: give ``Generation.logprobs``, with
        this many alternatives per token (0: the chosen token's only).

        Arguments are checked and the prompt tokenized here (errors are raised by this call);
        the generation waits for its turn when the stream is first advanced. See
        :class:`~edgespec.streams.Stream` for cancelling and closing it.
        """
        return self.submit(GenerationRequest(
            prompt, max_tokens=max_tokens, sampling=sampling, speculative=speculative, raw=raw,
            stop=stop, constraint=constraint, tools=tools, tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls, logprobs=logprobs))

    def submit(self, req: GenerationRequest) -> Stream:
        """:meth:`stream` for a request built beforehand (a server's parsed body): the same
        checks, errors and stream."""
        stop = check_limits(req.max_tokens, req.stop, req.logprobs)
        sampling = req.sampling if req.sampling is not None else SamplingParams()
        constraint = req.constraint
        self._check_open()
        plan = plan_request(req.prompt, req.tools, req.tool_choice,
                            parallel=req.parallel_tool_calls,
                            native_template=self.template.writes_tool_call_tags)
        if plan is not None:
            if constraint is not None and plan.constraint is not None:
                raise InvalidParameterError("constraint", "a Constraint", "None when tools "
                                            "may be called (tool_choice='none' allows one)")
            constraint = plan.constraint or constraint
            tokens = self.prompt_tokens(plan.messages, tools=plan.template_tools,
                                        _validated=True)
        else:
            tokens = self.prompt_tokens(req.prompt, raw=req.raw)
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(len(tokens), self.n_ctx)
        run = Request(tokens, req.max_tokens, sampling, stop=stop,
                      grammar=self._grammar(constraint), logprobs=req.logprobs,
                      finish=plan.finish if plan is not None else None,
                      speculation=self._speculation(sampling) if req.speculative else None)
        job = Job(self._turnstile, not_started(run))
        return Stream(job, run_generation(job, self._turnstile, self.target, run,
                                          self.prompt_cache))

    def _speculation(self, sampling: SamplingParams) -> Optional[Speculation]:
        """How a generation with ``sampling`` drafts on this Engine; None: it cannot."""
        if not self.can_speculate:
            return None
        return Speculation(drafter=lambda: self._drafter(sampling), draft=self.draft,
                           head=self.draft_head, plain_cost=self._drafting.plain_pass_seconds,
                           verifier=self.spec.verifier,
                           draft_tokens=self._drafting.draft_tokens)

    def _grammar(self, constraint: Optional[Constraint]) -> Optional[GrammarState]:
        """A constraint's state over the target's vocabulary, for one generation (the grammar
        engine's tokenizer is built on first use of a model file, then kept)."""
        if constraint is None:
            return None
        if not isinstance(constraint, Constraint):
            raise InvalidParameterError("constraint", type(constraint).__name__,
                                        "a Constraint: Constraint.json_schema(schema), "
                                        ".json(), .regex(pattern) or .grammar(text)")
        path = self.target.path
        tokenizer = tokenizer_for(path, lambda: GrammarVocab(path))
        return GrammarState(constraint, tokenizer, self.target.n_vocab)

    def astream(self, prompt: Prompt, **kwargs) -> AsyncStream:
        """:meth:`stream` for asyncio: ``async for event in engine.astream(...)``.

        Same arguments and errors (raised by this call). The generation runs in a thread of
        its own so the event loop stays responsive; see :class:`~edgespec.streams.AsyncStream`.
        """
        return AsyncStream(self.stream(prompt, **kwargs))

    def asubmit(self, req: GenerationRequest) -> AsyncStream:
        """:meth:`submit` for asyncio, as :meth:`astream` is :meth:`stream`'s."""
        return AsyncStream(self.submit(req))

    async def agenerate(self, prompt: Prompt, **kwargs) -> Generation:
        """:meth:`generate` for asyncio (cancelling the awaiting task cancels it)."""
        s = self.astream(prompt, **kwargs)
        async with s:
            async for _ in s:
                pass
        return s.result

    def embed(self, inputs: Inputs, *, truncate: bool = True,
              dimensions: Optional[int] = None, normalize: bool = True) -> Embeddings:
        """One vector per input text (or token-id list) from the target's last hidden states,
        mean-pooled and L2-normalised, on a llama.cpp context of its own (made on the first
        call; generations go on beside it). See :class:`~edgespec.embedding.Embedder` for
        the arguments; ``Embedder.load`` loads an embedding model of its own."""
        self._check_open()
        return self._embedder.embed(inputs, truncate=truncate, dimensions=dimensions,
                                    normalize=normalize)

    def cancel(self) -> None:
        """Stop the generation running now (not the queued ones), within one decoding step.

        Thread-safe and never blocks; the stopped generation ends with ``finish_reason
        "cancelled"``. A no-op when nothing is running.
        """
        job = self._turnstile.owner
        if job is not None:
            job.cancel()

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
        # Refined costs are kept for the next session when they describe every thread: each
        # governor has run its last steps at its full count (the costs' moving averages have
        # forgotten a spell on fewer threads by then).
        if all(g.settled for g in self._governors.values()):
            self._drafting.save_refined()
        self.prompt_cache.forget()
        with self._life:
            self._embedder.close()          # its context is made on the target's weights
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

