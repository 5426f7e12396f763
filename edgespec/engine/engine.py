"""The Engine: a target model, an optional draft, and the API everything else calls.

``Engine.load`` opens both models (each with its own context), checks that they share a
tokenizer, and measures what each costs. ``stream`` checks its arguments, turns the prompt
(text or chat messages) into tokens and queues a generation (:mod:`edgespec.engine.generation`);
``generate`` collects a stream. Both caches are kept between calls: a prompt that extends the
previous one (the next chat turn) evaluates only its new tokens.

Threads: an Engine loaded with ``parallel=N`` (and ``streams=S``, default N) runs up to S
generations at once, each in a lane of its own (a sequence of each model's context,
:mod:`edgespec.engine.lanes`), their passes batched into one ``llama_decode`` per round
(:mod:`edgespec.engine.rounds`) and their draft lengths planned together; more wait in arrival
order (:mod:`edgespec.engine.streams`), whichever threads call it. Each generation has its own
cancel flag: ``Stream.cancel()`` stops that one, ``Engine.cancel()`` the ones running now;
either takes effect within one decoding step and leaves the caches holding exactly what was
generated. ``close()`` stops the running and queued generations, waits for their steps in
progress and frees both models; engines still open at interpreter exit are closed the same way
(``atexit``), so a generation running in a daemon thread cannot outlive the models it uses.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from .. import config
from ..backend import (VocabMap, backend_info, open_pair, placement,
                      release_free_heap, rpc_endpoints)
from ..config import ModelConfig, SpecConfig, check_parallel, check_streams, split_settings
from ..drafting import HEAD_MIN_VOCAB, Costs, ReducedHead
from .drafting import EngineDrafting
from ..embedding import Embedder, Embeddings, Inputs
from ..errors import EngineClosedError, InvalidParameterError
from .generation import not_started, run_generation
from .lanes import Lanes, shared_cells
from ..lm import LoadedModel
from ..prompt_cache import PromptCache
from .prompting import Prompter
from .request import GenerationRequest, Prompt
from ..results import Generation
from .streams import AsyncStream, Job, Stream
from .threads import BlasHold, EngineThreads

log = logging.getLogger(__name__)


class Engine:
    """A loaded target (and optional draft) ready to generate. See the module docstring.

    Build one with :meth:`load`. The constructor takes models already loaded (``draft_head``:
    a draft output layer to share with another Engine on the same draft model).
    """

    def __init__(self, target: LoadedModel, draft: Optional[LoadedModel], spec: SpecConfig, *,
                 draft_head: Optional[ReducedHead] = None, adaptive_threads: bool = False,
                 recalibrate: bool = False, cache_ram: int = config.CACHE_RAM_MIB,
                 vocab_map: Union[VocabMap, None, str] = "check", streams: int = 1,
                 progress: Callable[[str], None] = lambda s: None, draft_choice=None):
        self.target = target
        self.draft = draft
        self.draft_choice = draft_choice    # a draft chosen here (load's draft="auto"), and why
        # Held while the models are used outside a generation (tokenizing, info), and by close()
        self._life = threading.Lock()
        self._prompter = Prompter(target, self._life)
        self.template = self._prompter.template
        self._drafting = EngineDrafting(
            spec, target, draft, draft_head, vocab_map=vocab_map, recalibrate=recalibrate,
            progress=progress, streams=streams)
        self.vocab_map: Optional[VocabMap] = self._drafting.vocab_map
        self.draft_head = self._drafting.head       # (a reduced output layer, or None)
        # Threads following the machine's load (threads.py), a governor a model; none if pinned
        self._threads = EngineThreads(target, draft, self._drafting.costs, adaptive_threads)
        self.streams = streams
        # Where generations run, ``streams`` at once (lanes.py; in the KV cells of ``parallel``
        # whole contexts when loaded so): its figures (running, waiting, rows …) are public.
        self.lanes = Lanes(target, draft if spec.uses_draft_model else None, self.draft_head,
                           streams, plan=self._drafting.plan_round,
                           on_pass=self._drafting.observe_pass if streams > 1 else None,
                           cells=target.config.n_cells or None, margin=spec.most_drafts + 1)
        self._drafting.follow(self.lanes)
        # The states of other conversations than the live ones, in host memory
        self.prompt_cache = PromptCache.of_mib(cache_ram)
        # Embeddings of the target, on a context of their own made on first use
        self._embedder = Embedder.sharing(target)
        self._closed = False
        _open_engines.add(self)
        BlasHold.acquire()

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def load(cls, target: Union[str, Path, None] = None, draft: Union[str, Path, None] = None,
             *, pair: Optional[str] = None, draft_n_gpu_layers: Optional[int] = None,
             draft_rpc=None, parallel: int = 1, streams: Optional[int] = None,
             cache_ram: int = config.CACHE_RAM_MIB,
             recalibrate: bool = False, progress: Callable[[str], None] = lambda s: None,
             **settings) -> "Engine":
        """Load a target GGUF and optionally a draft GGUF (or a registry ``pair`` name;
        ``draft="auto"``: one measured here, :mod:`edgespec.registry.auto_draft`, the Engine's
        ``draft_choice`` saying why); a file another app keeps may be named as it names it
        (``target="qwen2.5-coder:1.5b"``: :func:`edgespec.stores.model_file`). ``settings`` are the
        fields of the two configs, by name, their defaults theirs:
        :class:`~edgespec.config.ModelConfig`'s for both models (``n_ctx``, ``n_batch``,
        ``n_threads``: None or left out follows the machine's load; ``n_gpu_layers``, ``verbose``,
        ``cpu_extra_buffers``, ``flash_attn``; ``rpc``: ``"HOST:PORT,…"`` of ``edgespec worker``
        processes holding the target's layers) and :class:`~edgespec.config.SpecConfig`'s for
        drafting (``drafter``: hybrid when a draft is given, else ngram; ``draft_max``,
        ``adaptive``, ``p_min``, ``verifier``, ``suffix``, ``k_max``); any other name is an
        :class:`~edgespec.errors.InvalidParameterError`. The draft's own: its ``draft_n_gpu_layers``
        (default: ModelConfig's) and ``draft_rpc`` workers (it stays local without them).
        ``parallel``: how many generations run at once (each with ``n_ctx`` tokens of KV cache in
        each model, batched together); more wait for a free lane. ``streams`` (default
        ``parallel``): up to this many share the KV cells of ``parallel`` full contexts, each
        entering while the positions it can reach fit beside the others'
        (:func:`~edgespec.engine.lanes.shared_cells`). ``cache_ram``: MiB for conversations' caches
        kept aside (:mod:`edgespec.prompt_cache`). The cost model's calibration is measured once per
        model file and setting and kept; ``recalibrate=True`` measures it again; ``progress`` is
        told what loading is doing (a line at a time). Raises
        :class:`~edgespec.errors.ModelLoadError` for files that cannot be loaded,
        :class:`~edgespec.errors.ModelNotFoundError` for a name of none,
        :class:`~edgespec.errors.IncompatiblePairError` when the draft cannot be mapped to the
        target's vocabulary, :class:`~edgespec.errors.RPCError` when a worker cannot be reached."""
        if pair is not None:
            if target is not None or draft is not None:
                raise InvalidParameterError("pair", pair, "used alone, without target/draft")
            from ..registry import resolve_pair     # apps may name a pair; the core never does
            target, draft = resolve_pair(pair)
        from ..stores import model_file             # a model where another app keeps it
        choice, auto = None, draft == "auto"
        target, draft = model_file(target), None if auto else model_file(draft)
        if target is None:
            raise InvalidParameterError("target", None, "a path to a GGUF file (or pair=NAME)")
        model, spec_settings = split_settings(settings)
        rpc, draft_rpc = rpc_endpoints(model.pop("rpc", None), draft_rpc)
        remote = bool(rpc or draft_rpc)
        parallel = check_parallel(parallel, remote)
        streams = check_streams(streams, parallel, remote)
        if auto:                                    # (the registry measures; the core never)
            from ..registry.auto_draft import engine_draft
            draft, choice = engine_draft(target, spec_settings, model, progress)
        if spec_settings.get("drafter") is None:
            spec_settings["drafter"] = SpecConfig.default_drafter(draft is not None)
        spec = SpecConfig(**spec_settings)
        if spec.uses_draft_model and draft is None:
            raise InvalidParameterError("drafter", spec.drafter, "'ngram' or 'none' when no "
                                        "draft model is given (or pass draft=PATH)")
        cells, d_cells = shared_cells(parallel, streams, model.get("n_ctx"), target, draft)
        adaptive_threads = model.get("n_threads") is None
        if adaptive_threads:
            model.pop("n_threads", None)
        target_gpu = {k: model.pop(k) for k in ("n_gpu_layers",) if k in model}
        draft_gpu = {"n_gpu_layers": draft_n_gpu_layers} if draft_n_gpu_layers is not None else {}
        t_cfg = ModelConfig(target, rpc=rpc, streams=streams, n_cells=cells, **target_gpu, **model,
                            n_outputs_max=max(config.N_OUTPUTS_MIN, spec.most_drafts + 1))
        d_cfg = (ModelConfig(draft, rpc=draft_rpc, streams=streams, n_cells=d_cells,
                             n_outputs_max=1, **draft_gpu, **model)
                 if draft is not None and spec.uses_draft_model else None)
        t_model, d_model, vmap = open_pair(t_cfg, d_cfg, draft_tap_min_vocab=HEAD_MIN_VOCAB,
                                           progress=progress)
        try:
            return cls(t_model, d_model, spec, adaptive_threads=adaptive_threads,
                       recalibrate=recalibrate, cache_ram=cache_ram, vocab_map=vmap,
                       streams=streams, progress=progress, draft_choice=choice)
        except BaseException:
            for m in (d_model, t_model):
                if m is not None:
                    m.close()
            raise

    @property
    def spec(self) -> SpecConfig:
        """The drafting settings in force."""
        return self._drafting.spec

    def set_draft_max(self, draft_max: Optional[int]) -> None:
        """Pin the draft length to ``draft_max`` tokens per round, or let the cost model choose
        it again (``None``). Takes effect from the next generation.

        Raises :class:`~edgespec.errors.InvalidParameterError` when the Engine has no drafter,
        or when this Engine's target cannot verify that many tokens in one pass (the rows of
        logits it returns per pass are fixed when it is loaded; load it with ``draft_max=K``
        for longer drafts); :func:`~edgespec.engine.draft_limit.with_draft_max` checks."""
        with self._life:
            self._drafting.set_draft_max(draft_max)

    @property
    def costs(self) -> Optional[Costs]:
        """The drafters' cost model, to read (refined in place; None: a pinned length)."""
        return self._drafting.costs

    def note_draft_choice(self, choice) -> None:
        """A draft chosen for this pair before it was loaded: which and why (a shell's)."""
        self.draft_choice = choice

    # -- information ----------------------------------------------------------------------

    def info(self) -> dict:
        """Pair, backend and settings, for status lines and ``/v1/models``."""
        with self._life:
            self._check_open()
            return {"target": self.target.describe(),
                    "draft": self.draft.describe() if self.draft else None,
                    **self._drafting.describe(),
                    "backend": placement(backend_info()["backend"], self.target, self.draft),
                    "chat_template": self.template.label}

    def set_threads(self, n_threads: Optional[int]) -> None:
        """Pin both models to ``n_threads`` CPU threads, or (``None``) let each follow the
        machine's load again, up to the count it was loaded with. From the next step on."""
        with self._life:
            self._threads.pin(n_threads)

    @property
    def threads(self) -> dict:
        """CPU threads each model runs with now, the most it may use, whether they follow the
        machine's load, and whether they backed off because the machine was busy."""
        return self._threads.describe()

    @property
    def can_speculate(self) -> bool:
        """Whether this Engine has a drafter (a draft model, or n-gram lookup)."""
        return self.spec.drafts

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    @property
    def busy(self) -> bool:
        """Whether a generation holds a lane now."""
        return bool(self.lanes.owners)

    @property
    def waiting(self) -> int:
        """How many generations are queued for a lane."""
        return self.lanes.waiting

    @property
    def closed(self) -> bool:
        return self._closed

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        self._check_open()
        return self._prompter.tokenize(text, add_special)

    def prompt_tokens(self, prompt: Prompt, raw: bool = False,
                      tools: Optional[list[dict]] = None, _validated: bool = False,
                      think: Any = None) -> list[int]:
        """The exact tokens both models will see for ``prompt`` (``tools``: declared to a
        template that reads them; ``think``: thinking on or off, :mod:`edgespec.thinking`)."""
        self._check_open()
        return self._prompter.tokens(prompt, raw, tools, _validated, think)

    # -- generation -----------------------------------------------------------------------

    def generate(self, prompt: Prompt, **kwargs) -> Generation:
        """Generate a completion of ``prompt`` (text, or a list of chat messages); the
        arguments are :meth:`stream`'s.

        ``raw=True`` sends text as-is; otherwise it is wrapped as a user message in the
        model's chat template. ``speculative=False`` decodes with the target alone.
        ``constraint`` makes the output match a JSON schema, a regex or a grammar; ``tools``
        lets the model call functions. Any thread may call it; one stopped by :meth:`cancel`
        or :meth:`close` returns with ``finish_reason "cancelled"``.
        """
        s = self.stream(prompt, **kwargs)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def chat(self, messages: Sequence[Mapping[str, str]], **kwargs) -> Generation:
        return self.generate(messages, **kwargs)

    def stream(self, prompt: Prompt, **options) -> Stream:
        """Like :meth:`generate`, streaming :class:`StreamEvent` objects as tokens commit.

        ``options`` are :class:`~edgespec.engine.request.GenerationRequest`'s fields, each
        documented there: ``max_tokens``, ``sampling``, ``speculative``, ``raw``, ``stop``,
        ``constraint``, ``tools``/``tool_choice``/``parallel_tool_calls`` (the events carry
        the raw output, the result's ``text`` and ``tool_calls`` what it means),
        ``logprobs``, ``think`` (a thinking model's reasoning: its events and result carry it
        in ``thinking``, :mod:`edgespec.thinking`) and ``suffix`` (fill in the middle, for
        models with fill-in-the-middle tokens; others raise :class:`~edgespec.errors.
        InvalidParameterError`).

        Arguments are checked and the prompt tokenized here (errors are raised by this call);
        the generation waits for a lane when the stream is first advanced. See
        :class:`~edgespec.engine.streams.Stream` for cancelling and closing it.
        """
        return self.submit(GenerationRequest.of(prompt, **options))

    def submit(self, req: GenerationRequest) -> Stream:
        """:meth:`stream` for a request built beforehand (a server's parsed body): the same
        checks, errors and stream."""
        self._check_open()
        with self.lanes.rounds.arriving() as arrival:   # a prompt pass waits a moment for it
            prepared, thinking = self._prompter.prepare(req, self.n_ctx, speculation=(
                self._drafting.speculation(req.sampling, req.index_key) if req.speculative
                else None))
        job = Job(self.lanes, not_started(prepared), arrival)
        events = run_generation(job, self.lanes, prepared, self.prompt_cache)
        return Stream(job, thinking.events(events) if thinking is not None else events)

    def request_tokens(self, req: GenerationRequest) -> list[int]:
        """The prompt tokens :meth:`submit` would generate ``req`` from (tools declared);
        nothing is queued. What a server's token-counting endpoint answers."""
        self._check_open()
        return self._prompter.plan(req)[1]

    def astream(self, prompt: Prompt, **kwargs) -> AsyncStream:
        """:meth:`stream` for asyncio: ``async for event in engine.astream(...)``; the same
        arguments and errors. It runs in a thread of its own (:class:`AsyncStream`)."""
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
        """One vector per input (text or token ids) from the target's pooled last hidden states,
        on a context of its own (:class:`~edgespec.embedding.Embedder`: the arguments)."""
        self._check_open()
        return self._embedder.embed(inputs, truncate=truncate, dimensions=dimensions,
                                    normalize=normalize)

    def cancel(self) -> None:
        """Stop the generations running now (not the queued ones) within one decoding step;
        they end with ``finish_reason "cancelled"``. Any thread; never blocks."""
        for job in self.lanes.running:
            job.cancel()

    # -- lifetime -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this Engine is closed; load a new one")

    def close(self) -> None:
        """Stop every generation and free both models. Any thread; a second call is a no-op.

        Queued generations end ``"cancelled"`` without running; the running ones are cancelled
        and this waits for their steps in progress (at most one decoding step), so no thread is
        inside llama.cpp when the models are freed. Afterwards every call that needs the
        models raises :class:`~edgespec.errors.EngineClosedError`.
        """
        with self._life:
            if self._closed:
                return
            self._closed = True
        for job in self.lanes.close():
            job.close()
        self.lanes.wait_idle()
        self.lanes.rounds.close()
        self._drafting.save_refined(settled=self._threads.settled)
        self.prompt_cache.forget()
        with self._life:
            self._embedder.close()          # its context is made on the target's weights
            if self.draft is not None:
                self.draft.close()
            self.target.close()
        release_free_heap()
        _open_engines.discard(self)
        BlasHold.release()

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
