"""The llama.cpp adapter: the only module that imports ``llama_cpp``.

A :class:`LlamaModel` owns one model and one context (its own KV cache, batch and threads).
It keeps ``tokens``, the exact token sequence held in its KV cache (position ``i`` holds
``tokens[i]``), so that callers reason about caches as lists: :meth:`LlamaModel.eval` appends,
:meth:`LlamaModel.truncate` removes a suffix with ``llama_memory_seq_rm``.

Logits are returned as numpy views of llama.cpp's output buffer, only for the rows asked for;
they stay valid until the next ``eval`` on the same model. Every bound that llama.cpp would
enforce with an abort (batch size, context size, number of outputs) is checked here first and
raised as an :class:`~edgespec.errors.EdgespecError` instead.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

import llama_cpp.llama_cpp as C

from .config import ModelConfig
from .errors import (BackendError, ContextOverflowError, IncompatiblePairError,
                     ModelLoadError)
from .gguf_file import GGUFInfo, check_causal_lm, read_gguf

log = logging.getLogger(__name__)

LLAMA_CPP_VERSION = getattr(sys.modules.get("llama_cpp"), "__version__", "unknown")

_VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2"}

# ---------------------------------------------------------------------------------------------
# Process-wide state: backend initialisation and the log filter.

_init_lock = threading.Lock()
_initialised = False
_verbose = False


@C.llama_log_callback
def _log_callback(level, text, user_data):  # pragma: no cover - called from C
    if _verbose and text:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


def _ensure_init(verbose: bool) -> None:
    global _initialised, _verbose
    with _init_lock:
        _verbose = _verbose or verbose
        if not _initialised:
            C.llama_log_set(_log_callback, ctypes.c_void_p(0))
            C.llama_backend_init()
            _initialised = True


def set_verbose(verbose: bool) -> None:
    """Show (True) or silence (False) llama.cpp's own log on stderr."""
    global _verbose
    _ensure_init(verbose)
    _verbose = verbose


def _ggml_devices() -> list[dict]:
    """The compute devices llama.cpp was built with (CPU, CUDA, Metal, …)."""
    try:
        lib_dir = Path(C.__file__).parent / "lib"
        names = [n for n in os.listdir(lib_dir) if n.startswith("libggml.") or n == "ggml.dll" or n.startswith("libggml.dylib")]
        base = ctypes.CDLL(str(lib_dir / names[0]))
    except (OSError, IndexError):
        return []
    base.ggml_backend_dev_count.restype = ctypes.c_size_t
    base.ggml_backend_dev_get.restype = ctypes.c_void_p
    base.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for f in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(base, f).restype = ctypes.c_char_p
        getattr(base, f).argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    kinds = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
    out = []
    for i in range(base.ggml_backend_dev_count()):
        dev = base.ggml_backend_dev_get(i)
        out.append({"name": base.ggml_backend_dev_name(dev).decode(),
                    "description": base.ggml_backend_dev_description(dev).decode(),
                    "type": kinds.get(base.ggml_backend_dev_type(dev), "other")})
    return out


def backend_info() -> dict:
    """What llama.cpp here can run on: devices, GPU offload support, CPU features."""
    _ensure_init(False)
    devices = _ggml_devices()
    gpus = [d for d in devices if d["type"] in ("gpu", "igpu")]
    return {
        "llama_cpp_python": LLAMA_CPP_VERSION,
        "backend": ", ".join(d["name"] for d in gpus) if gpus else "CPU",
        "gpu_offload": bool(C.llama_supports_gpu_offload()),
        "devices": devices,
        "system_info": C.llama_print_system_info().decode(errors="replace").strip(),
    }


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``); elsewhere a
    no-op. Freeing a model and its context leaves tens of MiB of freed blocks that glibc keeps
    resident; an application that unloads a model expects its memory back. Measured with a
    SmolLM2 pair (load, generate, close, 50 times): 103-114 MiB resident after each close
    without this, 53-54 with it."""
    global _malloc_trim
    if _malloc_trim is None:
        _malloc_trim = False
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None).malloc_trim   # absent from musl
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
                _malloc_trim = fn
            except (OSError, AttributeError):
                pass
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


# ---------------------------------------------------------------------------------------------
# The hidden-state tap

# The final normed hidden state is named "result_norm" in every llama.cpp model graph; the
# output layer (the language-model head) is computed right after it.
_HIDDEN_NODE = b"result_norm"
_EVAL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool,
                                  ctypes.c_void_p)
_ggml_lib = None


def _ggml():
    """ggml's tensor accessors (from the ggml library that llama-cpp-python ships), or None."""
    global _ggml_lib
    if _ggml_lib is None:
        _ggml_lib = False
        import glob
        libdir = Path(C.__file__).parent / "lib"
        for cand in sorted(glob.glob(str(libdir / "*ggml-base*"))):
            try:
                lib = ctypes.CDLL(cand)
                lib.ggml_get_name.restype = ctypes.c_char_p
                lib.ggml_get_name.argtypes = [ctypes.c_void_p]
                lib.ggml_get_data_f32.restype = ctypes.c_void_p
                lib.ggml_get_data_f32.argtypes = [ctypes.c_void_p]
                lib.ggml_nelements.restype = ctypes.c_int64
                lib.ggml_nelements.argtypes = [ctypes.c_void_p]
            except (OSError, AttributeError):
                continue
            _ggml_lib = lib
            break
    return _ggml_lib or None


class _Tap:
    """State of a context's eval callback: while ``on``, the scheduler stops the graph right
    after the final norm and the last row of that hidden state is copied to ``hidden``.

    Uses llama.cpp's public scheduler eval callback (``cb_eval``, as its eval-callback and
    imatrix tools do): the callback asks for the ``result_norm`` node, reads it, and returns
    false, which ends the graph before the output layer. The KV cache is written by each
    layer before that node, so the cache stays complete.
    """

    def __init__(self, lib, n_embd: int):
        self.on = False
        self.hidden: Optional[np.ndarray] = None
        get_name, get_data, nelements = lib.ggml_get_name, lib.ggml_get_data_f32, \
            lib.ggml_nelements

        # The scheduler asks about each of the graph's ~700 nodes (Gemma-3-270M) every step;
        # a ctypes call per node to read its name cost ~0.3 ms a step. Node addresses repeat
        # from step to step (llama.cpp rebuilds a graph in the same memory), so each address
        # is named once. A hit is always re-checked by name; a stale "not it" can only hide
        # the node, and then the whole graph runs and eval_hidden() forgets these addresses.
        self.known: dict[int, bool] = {}
        known = self.known

        def callback(t, ask, _user):
            if ask:
                if not self.on:
                    return False
                hit = known.get(t)
                if hit is None or hit:
                    hit = known[t] = get_name(t) == _HIDDEN_NODE
                return hit
            n = nelements(t)
            if n >= n_embd:
                buf = (ctypes.c_float * n_embd).from_address(get_data(t) + 4 * (n - n_embd))
                self.hidden = np.frombuffer(buf, dtype=np.float32).copy()
            return False
        self.c_callback = _EVAL_CALLBACK(callback)


# ---------------------------------------------------------------------------------------------
# Vocabulary


@dataclass(frozen=True)
class VocabInfo:
    """Tokenizer facts the pair check and the decoding loop need."""

    n_vocab: int
    vocab_type: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool
    eog: frozenset[int]

    @property
    def type_name(self) -> str:
        return _VOCAB_TYPES.get(self.vocab_type, str(self.vocab_type))


# ---------------------------------------------------------------------------------------------
# One model with its own context


class LlamaModel:
    """One GGUF model and one llama.cpp context (see module docstring for the contract)."""

    def __init__(self, config: ModelConfig, tap_hidden: bool = False):
        """``tap_hidden``: make :meth:`eval_hidden` available (CPU-only llama.cpp builds)."""
        _ensure_init(config.verbose)
        self.config = config
        self._tap: Optional[_Tap] = None
        self.path = config.path
        self.info: GGUFInfo = read_gguf(config.path)
        check_causal_lm(self.info)
        self._model = None
        self._ctx = None
        self._batch = None
        self._closed = False

        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = config.n_gpu_layers if config.n_gpu_layers >= 0 else 999
        model = C.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise ModelLoadError(self.path, "llama.cpp could not load this model (unsupported "
                                            "architecture or damaged tensors; run with "
                                            "--verbose to see llama.cpp's log)")
        self._model = model
        try:
            if C.llama_model_has_encoder(model) and not C.llama_model_has_decoder(model):
                raise ModelLoadError(self.path, "is an encoder-only model, not a text-generation "
                                                "model")
            self._vocab_p = C.llama_model_get_vocab(model)
            self.n_ctx_train = C.llama_model_n_ctx_train(model)
            self.n_outputs_max = min(config.n_outputs_max, config.n_batch)
            cparams = C.llama_context_default_params()
            cparams.n_ctx = config.n_ctx
            cparams.n_batch = config.n_batch
            cparams.n_ubatch = config.n_batch
            cparams.n_seq_max = 1
            cparams.n_outputs_max = self.n_outputs_max
            cparams.n_threads = config.n_threads
            cparams.n_threads_batch = config.n_threads
            cparams.no_perf = True
            self.n_embd = C.llama_model_n_embd(model)
            # Only where llama.cpp has no GPU backend: with one, even a model kept on the CPU
            # may have large batches' products run on the GPU (op offload), and the tapped
            # tensor would then be device memory.
            on_cpu = not C.llama_supports_gpu_offload()
            lib = _ggml() if tap_hidden and on_cpu else None
            if lib is not None:
                self._tap = _Tap(lib, self.n_embd)
                cparams.cb_eval = ctypes.cast(self._tap.c_callback,
                                              type(cparams.cb_eval))
                cparams.cb_eval_user_data = None
            ctx = C.llama_init_from_model(model, cparams)
            if not ctx:
                raise ModelLoadError(self.path, f"llama.cpp could not create a context of "
                                                f"{config.n_ctx} tokens (out of memory? try a "
                                                "smaller n_ctx)")
            self._ctx = ctx
            self._mem = C.llama_get_memory(ctx)
            # llama.cpp pads the context up (to a multiple of 256); honour what was asked.
            self.n_ctx = min(config.n_ctx, C.llama_n_ctx(ctx))
            self.n_batch = C.llama_n_batch(ctx)
            self.vocab = self._read_vocab()
            self._batch = C.llama_batch_init(self.n_batch, 0, 1)
            self._seq_ids = [self._batch.seq_id[i] for i in range(self.n_batch)]
            for i in range(self.n_batch):
                self._batch.n_seq_id[i] = 1
                self._seq_ids[i][0] = 0
        except BaseException:
            self.close()
            raise
        self.tokens: list[int] = []
        self._piece_cache: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self.decode_seconds = 0.0  # wall time spent inside llama_decode, cumulative
        self.decode_calls = 0
        self.n_gpu_layers_requested = config.n_gpu_layers

    # -- metadata -------------------------------------------------------------------------

    def _read_vocab(self) -> VocabInfo:
        v = self._vocab_p
        n = C.llama_vocab_n_tokens(v)
        is_eog = C.llama_vocab_is_eog
        # llama.cpp marks end-of-generation tokens by id and by text; asking it for every id
        # is the only exact answer and costs ~0.1 s for a 262k vocabulary, once.
        eog = frozenset(i for i in range(n) if is_eog(v, i))
        return VocabInfo(n_vocab=n, vocab_type=C.llama_vocab_type(v), bos=C.llama_vocab_bos(v),
                         eos=C.llama_vocab_eos(v), add_bos=bool(C.llama_vocab_get_add_bos(v)),
                         add_eos=bool(C.llama_vocab_get_add_eos(v)), eog=eog)

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    def token_text(self, token: int) -> bytes:
        """The raw vocabulary entry (as stored in the GGUF), for the pair check."""
        return C.llama_vocab_get_text(self._vocab_p, token) or b""

    def describe(self) -> dict:
        return {"path": str(self.path), "name": self.info.name,
                "architecture": self.info.architecture,
                "size_bytes": self.info.file_size,
                "n_params": int(C.llama_model_n_params(self._model)),
                "n_ctx": self.n_ctx, "n_ctx_train": self.n_ctx_train,
                "n_vocab": self.n_vocab, "n_threads": self.config.n_threads,
                "n_gpu_layers": self.n_gpu_layers_requested}

    # -- text <-> tokens ------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        """Tokens of ``text``; ``add_special`` adds BOS/EOS as the model asks."""
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self._vocab_p, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self._vocab_p, raw, len(raw), buf, cap, add_special,
                                 parse_special)
        if n < 0:
            raise BackendError(f"tokenization failed for a text of {len(raw)} bytes")
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token contributes to the output (control tokens contribute none)."""
        piece = self._piece_cache.get(token)
        if piece is None:
            n = C.llama_token_to_piece(self._vocab_p, token, self._piece_buf, 256, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(self._vocab_p, token, buf, -n, 0, False)
                piece = buf.raw[:n]
            else:
                piece = self._piece_buf.raw[:n]
            self._piece_cache[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    # -- the KV cache ---------------------------------------------------------------------

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` to the cache and return logits for the last ``n_logits`` of them.

        Returns a float32 array of shape ``(n_logits, n_vocab)`` that views llama.cpp's
        buffer: valid until the next ``eval``; copy what must outlive it. Tokens longer than
        ``n_batch`` are sent in several ``llama_decode`` calls.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("eval() needs at least one token")
        if not 0 <= n_logits <= min(n, self.n_outputs_max):
            raise ValueError(f"n_logits={n_logits} must be in [0, min({n}, "
                             f"{self.n_outputs_max})]")
        if len(self.tokens) + n > self.n_ctx:
            raise ContextOverflowError(len(self.tokens) + n, self.n_ctx)
        self._check_open()
        start = 0
        while start < n:
            chunk = tokens[start:start + self.n_batch]
            first_logit = max(0, (n - n_logits) - start)
            self._decode(chunk, first_logit)
            start += len(chunk)
        self._last_chunk = len(chunk)
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return self._logits_view(len(chunk) - n_logits, n_logits)

    def _decode(self, chunk: Sequence[int], first_logit: int) -> None:
        b = self._batch
        pos0 = len(self.tokens)
        m = len(chunk)
        tok, pos, lg = b.token, b.pos, b.logits
        for i, t in enumerate(chunk):
            tok[i] = t
            pos[i] = pos0 + i
            lg[i] = i >= first_logit
        b.n_tokens = m
        t0 = time.perf_counter()
        rc = C.llama_decode(self._ctx, b)
        C.llama_synchronize(self._ctx)
        self.decode_seconds += time.perf_counter() - t0
        self.decode_calls += 1
        if rc != 0:
            # On failure llama.cpp may have kept some ubatches: resynchronise our record.
            kept = C.llama_memory_seq_pos_max(self._mem, 0) + 1
            self.tokens = (self.tokens + list(chunk))[:kept]
            self.truncate(pos0)
            raise BackendError(f"llama_decode failed with code {rc} ("
                               + {1: "no room in the KV cache", 2: "aborted",
                                  -1: "invalid batch"}.get(rc, "fatal error") + ")")
        self.tokens.extend(chunk)

    def _logits_view(self, first_row: int, n_rows: int) -> np.ndarray:
        p0 = C.llama_get_logits_ith(self._ctx, first_row)
        if not p0:
            raise BackendError("llama.cpp returned no logits for a row that asked for them")
        addr0 = ctypes.cast(p0, ctypes.c_void_p).value
        if n_rows > 1:
            last = ctypes.cast(C.llama_get_logits_ith(self._ctx, first_row + n_rows - 1),
                               ctypes.c_void_p).value
            if last != addr0 + (n_rows - 1) * self.n_vocab * 4:
                return np.stack([self._logits_view(first_row + i, 1)[0] for i in range(n_rows)])
        arr = (ctypes.c_float * (n_rows * self.n_vocab)).from_address(addr0)
        return np.frombuffer(arr, dtype=np.float32).reshape(n_rows, self.n_vocab)

    @property
    def can_tap(self) -> bool:
        """Whether :meth:`eval_hidden` can skip the output layer on this model."""
        return self._tap is not None

    def eval_hidden(self, tokens: Sequence[int]) -> Optional[np.ndarray]:
        """Append ``tokens`` like ``eval(tokens, 1)``, but stop llama.cpp's graph after the
        final norm and return the last token's hidden state (``n_embd`` float32, a copy):
        the caller applies its own output rows (:meth:`output_rows`). On a 262k-entry
        vocabulary the output layer is most of a small model's step (Gemma-3-270M Q4_K_M:
        13 ms with it, 5 ms without).

        Returns None when the hidden state could not be read (no tap on this model, or a graph
        without that node): the whole graph then ran and :meth:`last_logits` holds the row.
        """
        tap = self._tap
        if tap is None:
            self.eval(tokens, 1)
            return None
        n = len(tokens)
        if n > self.n_batch:        # earlier chunks have no outputs: evaluate them plainly
            self.eval(tokens[:n - self.n_batch], 0)
            tokens = tokens[n - self.n_batch:]
        tap.on, tap.hidden = True, None
        try:
            self.eval(tokens, 1)
        finally:
            tap.on = False
        h, tap.hidden = tap.hidden, None
        if h is None:
            tap.known.clear()       # the graph changed under the cached node addresses
        return h

    def last_logits(self) -> np.ndarray:
        """The logits row of the last evaluated token (after an eval that asked for it)."""
        return self._logits_view(self._last_chunk - 1, 1)[0]

    def output_rows(self, ids: Sequence[int]) -> np.ndarray:
        """Rows ``ids`` of the output layer's weights (``output.weight``, or the tied token
        embeddings), dequantized to float32: shape ``(len(ids), n_embd)``."""
        from gguf.quants import dequantize
        name = "output.weight" if "output.weight" in self.info.tensors else "token_embd.weight"
        dims, ttype, offset, nbytes = self.info.tensors[name]
        n_rows = dims[1] if len(dims) > 1 else 1
        row_bytes = nbytes // n_rows
        mm = np.memmap(self.path, dtype=np.uint8, mode="r", offset=offset,
                       shape=(n_rows, row_bytes))
        try:
            raw = np.asarray(mm[np.asarray(ids, dtype=np.int64)])
        finally:
            del mm
        return np.ascontiguousarray(dequantize(raw, ttype).reshape(len(ids), -1),
                                    dtype=np.float32)

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` cache positions (``llama_memory_seq_rm``)."""
        if n >= len(self.tokens):
            return
        self._check_open()
        if not C.llama_memory_seq_rm(self._mem, 0, n, -1):
            raise BackendError(
                f"{self.path.name}: llama.cpp cannot remove positions from this model's cache "
                "(recurrent or hybrid architecture); speculative decoding needs a model whose "
                "cache can be trimmed — use --no-spec")
        del self.tokens[n:]

    def cache_span(self) -> tuple[int, int]:
        """(first, last) position llama.cpp holds in the cache; (-1, -1) when empty."""
        self._check_open()
        return (C.llama_memory_seq_pos_min(self._mem, 0), C.llama_memory_seq_pos_max(self._mem, 0))

    def reset(self) -> None:
        self._check_open()
        C.llama_memory_clear(self._mem, True)
        self.tokens.clear()

    # -- lifetime -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(f"{self.path.name}: model is closed")

    def close(self) -> None:
        """Free the context, the batch and the model. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._batch is not None:
            C.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            C.llama_free(self._ctx)
            self._ctx = None
        self._tap = None    # the callback may go only once no context can call it
        if self._model:
            C.llama_model_free(self._model)
            self._model = None

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# Pair compatibility (as llama.cpp's common_speculative_are_compatible)

VOCAB_SIZE_TOLERANCE = 128
VOCAB_CHECK_START = 5


class VocabOnly:
    """A GGUF's tokenizer, loaded without weights or a context (llama.cpp ``vocab_only``)."""

    def __init__(self, path: str | os.PathLike):
        _ensure_init(False)
        self.path = Path(path).expanduser()
        self.info = read_gguf(self.path)
        check_causal_lm(self.info)
        params = C.llama_model_default_params()
        params.vocab_only = True
        self._model = C.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise ModelLoadError(self.path, "llama.cpp could not read this model's tokenizer")
        self._vocab_p = C.llama_model_get_vocab(self._model)
        self.vocab = LlamaModel._read_vocab(self)

    token_text = LlamaModel.token_text

    def close(self) -> None:
        if self._model:
            C.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "VocabOnly":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_compatible_files(target: str | os.PathLike, draft: str | os.PathLike) -> None:
    """The pair check on two files, reading only their tokenizers (fast, little memory)."""
    with VocabOnly(target) as t, VocabOnly(draft) as d:
        check_compatible(t, d)


def check_compatible(target, draft) -> None:
    """Raise :class:`IncompatiblePairError` naming the first difference between vocabularies.

    ``target``/``draft`` are :class:`LlamaModel` or :class:`VocabOnly` objects.
    """
    t, d = target.vocab, draft.vocab
    if t.vocab_type != d.vocab_type:
        raise IncompatiblePairError(f"tokenizer types differ (target {t.type_name}, draft "
                                    f"{d.type_name})")
    if t.add_bos != d.add_bos or (t.add_bos and t.bos != d.bos):
        raise IncompatiblePairError(f"BOS differs (target add_bos={t.add_bos} id={t.bos}, draft "
                                    f"add_bos={d.add_bos} id={d.bos})")
    if t.add_eos != d.add_eos or t.eos != d.eos:
        raise IncompatiblePairError(f"EOS differs (target add_eos={t.add_eos} id={t.eos}, draft "
                                    f"add_eos={d.add_eos} id={d.eos})")
    if abs(t.n_vocab - d.n_vocab) > VOCAB_SIZE_TOLERANCE:
        raise IncompatiblePairError(f"vocabulary sizes differ by more than "
                                    f"{VOCAB_SIZE_TOLERANCE} (target {t.n_vocab}, draft "
                                    f"{d.n_vocab})")
    for i in range(VOCAB_CHECK_START, min(t.n_vocab, d.n_vocab)):
        a, b = target.token_text(i), draft.token_text(i)
        if a != b:
            raise IncompatiblePairError(
                f"token {i} differs (target {a.decode('utf-8', 'replace')!r}, draft "
                f"{b.decode('utf-8', 'replace')!r})")


# ---------------------------------------------------------------------------------------------
# Quantisation (llama.cpp's own quantizer)

FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
          "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
          "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "BF16": 32}


def quantize(src: str | os.PathLike, dst: str | os.PathLike, ftype: str,
             n_threads: int | None = None) -> Path:
    """Write ``src`` re-quantised to ``ftype`` at ``dst`` (atomically: via a temporary name)."""
    _ensure_init(False)
    src, dst = Path(src), Path(dst)
    if ftype.upper() not in FTYPES:
        raise ValueError(f"unknown quantisation {ftype!r}; choose one of {', '.join(FTYPES)}")
    read_gguf(src)
    params = C.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype.upper()]
    params.allow_requantize = True
    params.nthread = n_threads or 0
    tmp = dst.with_name(dst.name + ".partial")
    dst.parent.mkdir(parents=True, exist_ok=True)
    rc = C.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise BackendError(f"llama.cpp could not quantize {src} to {ftype} (code {rc})")
    os.replace(tmp, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# Peers for side-by-side benchmarks: llama-cpp-python's own high-level API


class LlamaCppPythonPeer:
    """``llama_cpp.Llama`` decoding greedily, plain or with its ``LlamaPromptLookupDecoding``
    (the options a Python user would otherwise pick), timed the way edgespec times itself."""

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 2048,
                 n_threads: Optional[int] = None, prompt_lookup: bool = False,
                 num_pred_tokens: int = 10):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        _ensure_init(False)
        draft = LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens) if prompt_lookup \
            else None
        self.llm = Llama(str(path), n_ctx=n_ctx, n_threads=n_threads,
                         n_threads_batch=n_threads, draft_model=draft, verbose=False)
        self.eog = {t for t in range(self.llm.n_vocab())
                    if C.llama_vocab_is_eog(self.llm._model.vocab, t)} \
            if hasattr(self.llm._model, "vocab") else {self.llm.token_eos()}

    def generate(self, tokens: Sequence[int], max_tokens: int) -> tuple[int, float]:
        """(tokens generated, decoding seconds) for a greedy completion of ``tokens``."""
        n = 0
        t_first = None
        for tok in self.llm.generate(list(tokens), temp=0.0, top_k=1, reset=True):
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            if tok in self.eog:
                break
            n += 1
            if n >= max_tokens:
                break
        # The first token comes out of prompt processing; time the rest, per token.
        return n, (time.perf_counter() - t_first) * n / max(n - 1, 1) if t_first else 0.0

    def close(self) -> None:
        self.llm.close() if hasattr(self.llm, "close") else None
