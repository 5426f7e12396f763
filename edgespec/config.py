"""Frozen configuration objects, validated on construction, and the home of the defaults.
``ModelConfig.streams`` is the exception: it is checked where it enters, by
:func:`check_streams`, as ``parallel`` is by :func:`check_parallel` (the only checks of both).

Each invalid value raises :class:`~edgespec.errors.InvalidParameterError` naming the
parameter and its valid range, so a typo at the command line or in an HTTP body gets the same
one-line explanation. The shells (command line, chat, server) and `Engine.load` take their
defaults from here.
"""

from __future__ import annotations

import math
import os
from dataclasses import InitVar, dataclass, field, fields, replace
from enum import Enum
from pathlib import Path

from .errors import InvalidParameterError

class DrafterKind(str, Enum):
    """Where drafts come from (``SpecConfig.drafter``); compares equal to its name."""

    MODEL = "model"         # the draft model
    NGRAM = "ngram"         # prompt lookup: continuations of n-grams found in the context
    HYBRID = "hybrid"       # a long n-gram match when there is one, else the draft model
    NONE = "none"           # plain target decoding

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def drafts(self) -> bool:
        return self is not DrafterKind.NONE

    @property
    def uses_draft_model(self) -> bool:
        """Drafts come (at least partly) from a draft model, which must be loaded."""
        return self in (DrafterKind.MODEL, DrafterKind.HYBRID)


DRAFTERS = tuple(k.value for k in DrafterKind)
# The acceptance rules for unseeded sampling (SpecConfig.verifier; edgespec/verify.py), and
# the default one
VERIFIERS = ("block", "token")
VERIFIER = "block"

TEMPERATURE_MAX = 1e6     # the engine's bound (an API may state a lower one)
N_CTX = 4096              # context window of each model, in tokens
N_BATCH = 512             # most tokens per llama.cpp call
MAX_STREAMS = 64          # most generations one Engine runs at once (sequences)
MAX_TOKENS = 256          # most tokens per generation (API, `edgespec run`, the server)
MAX_LOGPROBS = 20         # most alternatives to each token's log probability (an API may say 5)
PARALLEL = 4              # whole contexts `edgespec serve` gives each model (generations at once)
CHAT_MAX_TOKENS = 1024    # most tokens per answer in `edgespec chat`
# Host memory for the KV states of conversations other than the live one (both models;
# edgespec/prompt_cache.py). 0 turns the cache off.
CACHE_RAM_MIB = 1024
N_OUTPUTS_MIN = 64        # logits rows a target pass can return: bounds the longest draft
RPC_PORT = 50052          # `edgespec worker`'s port (llama.cpp rpc-server's default)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_real(name: str, value: object, lo: float, hi: float, *, lo_open: bool = False,
                valid: str) -> None:
    if not _is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
        raise InvalidParameterError(name, value, valid)
    if value < lo or (lo_open and value == lo) or value > hi:
        raise InvalidParameterError(name, value, valid)


def _check_int(name: str, value: object, lo: int, hi: int | None, valid: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (
            hi is not None and value > hi):
        raise InvalidParameterError(name, value, valid)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from a model's logits.

    The same warp (see :func:`edgespec.sampling.warp`) is applied to the target's logits (p)
    and the draft's logits (q), in llama.cpp's order: repeat penalty → top-k → top-p → min-p
    → temperature. ``temperature == 0`` is greedy decoding (argmax after the penalty).
    Defaults are llama.cpp's. ``top_k=0``, ``top_p=1``, ``min_p=0`` disable the cut-offs;
    :meth:`neutral` gives a pure softmax.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    # The highest temperature allowed: an API's own range where it states one (OpenAI's 2,
    # Anthropic's 1); not a field: the check below is the only one.
    temperature_max: InitVar[float] = TEMPERATURE_MAX

    def __post_init__(self, temperature_max: float) -> None:
        _check_real("temperature", self.temperature, 0.0, temperature_max,
                    valid="a finite number >= 0 (0 = greedy)" if temperature_max >= TEMPERATURE_MAX
                    else f"a number in [0, {temperature_max:g}] (0 = greedy)")
        _check_int("top_k", self.top_k, 0, None, valid="an integer >= 0 (0 = disabled)")
        _check_real("top_p", self.top_p, 0.0, 1.0, lo_open=True,
                    valid="a number in (0, 1] (1 = disabled)")
        _check_real("min_p", self.min_p, 0.0, 1.0, valid="a number in [0, 1] (0 = disabled)")
        _check_real("repeat_penalty", self.repeat_penalty, 0.0, 1e6, lo_open=True,
                    valid="a finite number > 0 (1 = disabled)")
        _check_int("repeat_last_n", self.repeat_last_n, 0, None,
                   valid="an integer >= 0 (0 = disabled)")
        _check_real("presence_penalty", self.presence_penalty, -2.0, 2.0,
                    valid="a number in [-2, 2] (0 = disabled)")
        _check_real("frequency_penalty", self.frequency_penalty, -2.0, 2.0,
                    valid="a number in [-2, 2] (0 = disabled)")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**64 - 1, valid="an integer in [0, 2**64) or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_penalty(self) -> bool:
        return self.repeat_last_n > 0 and (self.repeat_penalty != 1.0
                                           or self.presence_penalty != 0.0
                                           or self.frequency_penalty != 0.0)

    @classmethod
    def neutral(cls, temperature: float = 1.0, seed: int | None = None) -> "SamplingParams":
        """Plain softmax at ``temperature``: no cut-offs, no penalty."""
        return cls(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=seed)

    def replace(self, **changes) -> "SamplingParams":
        return replace(self, **changes)


@dataclass(frozen=True)
class SpecConfig:
    """How drafts are made and how long they are.

    ``drafter``: ``model`` (a draft model), ``ngram`` (prompt lookup), ``hybrid`` (an n-gram
    match when there is a long one, else the model) or ``none`` (plain target decoding); by
    default :meth:`default_drafter`'s with a draft model (``Engine.load`` asks it too).
    Draft length: with ``draft_max=None`` and ``adaptive=True`` (the default) a cost model picks
    each round's K in [0, ``k_max``]; ``draft_max=K`` pins K, and ``adaptive=False`` pins it to
    ``FIXED_DEFAULT``. With a pinned K, ``p_min`` stops a draft early when the draft model's top
    probability falls below it (llama.cpp's ``--draft-p-min``). ``verifier``: how unseeded
    sampling accepts drafts, ``block`` (block verification: the draft judged as a whole, at
    least as many tokens accepted in expectation) or ``token`` (token-wise rejection
    sampling); both are lossless. Greedy and seeded decoding have their own rules.
    ``suffix``: the n-gram drafts also come from earlier requests' prompts and answers (a
    suffix index per Engine, :mod:`edgespec.drafting.suffix`), not only from the context.
    """

    FIXED_DEFAULT = 16        # K when adaptive=False and draft_max is not given
    K_LIMIT = 256             # the longest draft one may ask for

    drafter: DrafterKind = field(default_factory=lambda: SpecConfig.default_drafter(True))
    draft_max: int | None = None
    adaptive: bool = True
    p_min: float = 0.0
    k_max: int = 32           # the longest draft the cost model may choose
    verifier: str = VERIFIER  # the acceptance rule for unseeded sampling: "block" or "token"
    suffix: bool = True       # n-gram drafts from earlier requests too (drafting/suffix.py)

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise InvalidParameterError("drafter", self.drafter, "one of " + ", ".join(DRAFTERS))
        object.__setattr__(self, "drafter", DrafterKind(self.drafter))
        lim = self.K_LIMIT
        if self.draft_max is not None:
            _check_int("draft_max", self.draft_max, 0, lim, valid=f"an integer in [0, {lim}]")
        _check_real("p_min", self.p_min, 0.0, 1.0, valid="a number in [0, 1]")
        _check_int("k_max", self.k_max, 1, lim, valid=f"an integer in [1, {lim}]")
        if self.verifier not in VERIFIERS:
            raise InvalidParameterError("verifier", self.verifier, "'block' or 'token'")

    @staticmethod
    def default_drafter(has_draft_model: bool) -> DrafterKind:
        """The drafter when none is named (here, and by ``Engine.load``): ``hybrid`` with a
        draft model (n-gram matches from the context are free drafts, the model drafts the
        rest: the fastest on every pair measured), else ``none``."""
        return DrafterKind.HYBRID if has_draft_model else DrafterKind.NONE

    @property
    def drafts(self) -> bool:
        """Anything drafts (not plain decoding)."""
        return self.drafter.drafts

    @property
    def uses_draft_model(self) -> bool:
        """A draft model makes (some of) the drafts: it must be loaded and kept in step."""
        return self.drafter.uses_draft_model

    @property
    def is_adaptive(self) -> bool:
        return self.adaptive and self.draft_max is None

    @property
    def fixed_k(self) -> int:
        return self.FIXED_DEFAULT if self.draft_max is None else self.draft_max

    @property
    def most_drafts(self) -> int:
        return self.k_max if self.is_adaptive else self.fixed_k


CPU_EXTRA_BUFFERS = ("auto", "on", "off", "repack")
# llama.cpp's flash attention (-fa): "auto" is llama.cpp's choice (on for the CPU too: off
# verifies several drafts at a long context faster but reads prompts and decodes one token
# slower, measured in docs/decisions.md#flash-attention); "on"/"off" decide.
FLASH_ATTN = ("auto", "on", "off")
# How a recurrent or hybrid model's cache goes back after rejected drafts
# (edgespec/backend/rollback.py, docs/decisions.md#recurrent-rollback): "checkpoints" copies
# its recurrent state before each pass that may be rolled back; "snapshots" has llama.cpp
# keep the state after each of a pass's last SNAPSHOT_ROWS tokens (only some architectures
# can: the others use checkpoints); "auto" is edgespec's measured choice.
ROLLBACK = ("auto", "checkpoints", "snapshots")
SNAPSHOT_ROWS = 8           # positions llama.cpp's snapshots reach back (its n_rs_seq)
CHECKPOINTS = 16            # most recurrent-state copies kept per sequence
# ... and at most this much memory for them (at least two copies): Qwen3.5-0.8B's state is
# 19 MiB, and fresh memory costs more to touch than a copy (docs/decisions.md)
CHECKPOINT_MIB = 64
# After a restore, at most this many tokens to evaluate again go at the front of the
# sequence's next pass rather than in a pass of their own (which costs a pass's fixed part
# more: docs/decisions.md#recurrent-rollback); more wait for a pass of their own, after
# which a checkpoint can be taken.
REDO_FOLD = 4


def default_threads() -> int:
    """Threads for llama.cpp: all cores on small machines, roughly the physical cores above."""
    n = os.cpu_count() or 1
    return n if n <= 4 else max(4, n // 2)


@dataclass(frozen=True)
class ModelConfig:
    """How one GGUF is loaded: its own context, batch and offload settings."""

    path: Path
    n_ctx: int = N_CTX
    n_batch: int = N_BATCH
    n_threads: int = field(default_factory=default_threads)
    n_gpu_layers: int = -1
    n_outputs_max: int = N_OUTPUTS_MIN
    # sequences the context holds (streams decoded together), each up to n_ctx positions;
    # checked where it enters (Engine.load: check_streams)
    streams: int = 1
    # KV cells all sequences share (0: n_ctx for each); at least n_ctx
    n_cells: int = 0
    verbose: bool = False
    rpc: tuple = ()           # "HOST:PORT" of the RPC workers that hold its layers
    # llama.cpp's extra CPU buffer types (AMX, repacked weights): "auto" checks once that they
    # do not fault on this CPU (backend/preflight.py), "on" or "off" decide without a check,
    # "repack": the repacked kernels alone, without AMX (backend/repack.py)
    cpu_extra_buffers: str = "auto"
    flash_attn: str = "auto"        # FLASH_ATTN
    rollback: str = "auto"          # ROLLBACK (recurrent and hybrid models only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path).expanduser())
        object.__setattr__(self, "rpc", tuple(self.rpc or ()))
        _check_int("n_ctx", self.n_ctx, 16, 1 << 24, valid="an integer in [16, 16777216]")
        _check_int("n_batch", self.n_batch, 1, 1 << 16, valid="an integer in [1, 65536]")
        _check_int("n_threads", self.n_threads, 1, 1024, valid="an integer in [1, 1024]")
        _check_int("n_gpu_layers", self.n_gpu_layers, -1, None,
                   valid="an integer >= -1 (-1 = all layers)")
        _check_int("n_outputs_max", self.n_outputs_max, 1, 1 << 16,
                   valid="an integer in [1, 65536]")
        if self.n_cells and not self.n_ctx <= self.n_cells <= self.n_ctx * self.streams:
            raise InvalidParameterError("n_cells", self.n_cells, f"0 or in [{self.n_ctx}, "
                                        f"{self.n_ctx * self.streams}] (n_ctx to n_ctx × "
                                        "streams)")
        if self.cpu_extra_buffers not in CPU_EXTRA_BUFFERS:
            raise InvalidParameterError("cpu_extra_buffers", self.cpu_extra_buffers,
                                        "'auto', 'on', 'off' or 'repack'")
        if self.flash_attn not in FLASH_ATTN:
            raise InvalidParameterError("flash_attn", self.flash_attn, "'auto', 'on' or 'off'")
        if self.rollback not in ROLLBACK:
            raise InvalidParameterError("rollback", self.rollback,
                                        "'auto', 'checkpoints' or 'snapshots'")


def check_parallel(parallel: object, remote: bool = False) -> int:
    """``parallel`` as the whole contexts of KV cache each model holds, the generations that
    run at once whatever their length (``Engine.load``'s, ``edgespec serve --parallel``'s:
    the only check of it): an integer in [1, MAX_STREAMS], 1 where a model is on RPC workers
    (``remote``)."""
    if remote and parallel != 1:
        raise InvalidParameterError("parallel", parallel, "1 with RPC workers (a model on "
                                    "workers serves one generation at a time)")
    _check_int("parallel", parallel, 1, MAX_STREAMS, valid=f"an integer in [1, {MAX_STREAMS}] "
               "(whole contexts of KV cache: generations at once)")
    return parallel


def check_streams(streams: object, parallel: int, remote: bool = False) -> int:
    """``streams`` (None: ``parallel``) as the generations that run at once on the KV cache of
    ``parallel`` whole contexts, those beyond ``parallel`` while their lengths fit (the only
    check of it): an integer in [parallel, MAX_STREAMS], ``parallel`` with RPC workers."""
    streams = parallel if streams is None else streams
    if remote and streams != parallel:
        raise InvalidParameterError("streams", streams, f"{parallel} (parallel) with RPC "
                                    "workers (a model on workers serves one generation at a "
                                    "time)")
    _check_int("streams", streams, parallel, MAX_STREAMS, valid=f"an integer in [{parallel}, "
               f"{MAX_STREAMS}] (generations at once: those beyond parallel={parallel} share "
               "its whole contexts)")
    return streams


# Engine.load's settings, by the config they belong to (the configs hold their defaults).
_MODEL_SETTINGS = {f.name for f in fields(ModelConfig)} - {"path", "n_outputs_max", "streams",
                                                         "n_cells"}
_SPEC_SETTINGS = {f.name for f in fields(SpecConfig)}


def split_settings(settings: dict) -> tuple[dict, dict]:
    """Settings by name as (ModelConfig's, SpecConfig's); a name of neither is refused."""
    for name in settings:
        if name not in _MODEL_SETTINGS and name not in _SPEC_SETTINGS:
            raise InvalidParameterError(name, settings[name], "left out: not a setting of "
                                        "Engine.load (see edgespec.config.ModelConfig and "
                                        "SpecConfig)")
    return ({k: v for k, v in settings.items() if k in _MODEL_SETTINGS},
            {k: v for k, v in settings.items() if k in _SPEC_SETTINGS})
