"""One GGUF model with one llama.cpp context: the :class:`~edgespec.lm.LanguageModel` the
loop runs on.

A :class:`LlamaModel` keeps ``tokens``, the exact sequence its KV cache holds, so callers
reason about caches as lists: :meth:`LlamaModel.eval` appends, :meth:`LlamaModel.truncate`
removes a suffix with ``llama_memory_seq_rm``. A context may hold several sequences
(``ModelConfig.streams``, one per stream, each reaching ``n_ctx`` positions, all sharing one
unified KV buffer of ``n_cells``): :attr:`LlamaModel.sequences` are their caches
(:mod:`.sequence`; the model's own ``tokens``/``eval``/``truncate`` are the first one's), and
:meth:`LlamaModel.decode` evaluates the rows of several in one ``llama_decode``. Logits come
back as numpy views of llama.cpp's output buffer, only for the rows asked for, valid until
the next ``eval``. Every bound that llama.cpp enforces with an abort (batch size, context
size, number of outputs) is checked here first and raised as an
:class:`~edgespec.errors.EdgespecError` instead.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Optional, Sequence

import numpy as np

import llama_cpp.llama_cpp as C

from ..config import SNAPSHOT_ROWS, ModelConfig
from ..errors import BackendError, ModelLoadError
from ..gguf_file import GGUFInfo, check_causal_lm, read_gguf
from ..lm import VocabInfo
from .runtime import ensure_init, ggml, gpu_devices
from .rollback import is_recurrent
from .sequence import KVSequence, ModelState, check_parts, plan_calls
from .step_hooks import StepHooks
from .tap import Tap
from .vocab import HasVocabulary, Vocabulary
from .weights import free_context, load_weights, output_rows

_FLASH_ATTN = {"auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED}
_DECODE_ERRORS = {1: "no room in the KV cache", 2: "aborted", -1: "invalid batch"}


class LlamaModel(HasVocabulary, StepHooks):
    """One GGUF model and one llama.cpp context (see the module docstring)."""

    endpoints: tuple = ()       # RPC workers holding its layers: none (RemoteModel's have)

    @property
    def state_owner(self) -> "LlamaModel":
        return self

    def __init__(self, config: ModelConfig, tap_min_vocab: Optional[int] = None,
                 devices: Optional[ctypes.Array] = None):
        """``tap_min_vocab``: make :meth:`eval_hidden` skip the output layer when the
        vocabulary has at least this many entries and llama.cpp has no GPU backend.
        ``devices``: the NULL-terminated device list to offload to (``rpc.model_devices``;
        default: llama.cpp's choice of this process's devices)."""
        ensure_init(config.verbose)
        self.config = config
        self.path = config.path
        self.info: GGUFInfo = read_gguf(config.path)   # before llama.cpp sees the file
        check_causal_lm(self.info)
        self._model = self._ctx = self._batch = None
        self._tap: Optional[Tap] = None
        self._closed = False
        # Every llama.cpp call on the context holds this: several threads' sequences share it.
        self.lock = threading.RLock()
        self.decode_seconds = 0.0     # wall time inside llama_decode, cumulative
        self.n_threads = config.n_threads
        self._last_spans: list = []   # the last call's (first batch index, rows) per part

        self._devices = devices     # llama.cpp keeps the pointer: keep the array alive
        self._model, self.extra_buffers, self.repacked = load_weights(config, self.info,
                                                                       devices)
        try:
            self._open_context(tap_min_vocab)
        except BaseException:
            self.close()
            raise

    def _open_context(self, tap_min_vocab: Optional[int]) -> None:
        model, config = self._model, self.config
        if C.llama_model_has_encoder(model) and not C.llama_model_has_decoder(model):
            raise ModelLoadError(self.path, "is an encoder-only model, not a text-generation "
                                            "model")
        self.vocabulary = Vocabulary(C.llama_model_get_vocab(model), self.path)
        self.vocab: VocabInfo = self.vocabulary.info
        self.n_ctx_train = C.llama_model_n_ctx_train(model)
        self.n_embd = C.llama_model_n_embd(model)
        self.recurrent = is_recurrent(model)     # (going back takes rollback.py's copies)
        n_seq = config.streams
        self.n_outputs_max = min(config.n_outputs_max, config.n_batch)      # per sequence
        # all sequences' rows in one call, within the batch
        self.n_outputs_total = min(self.n_outputs_max * n_seq, config.n_batch)
        cparams = C.llama_context_default_params()
        # Every sequence may reach n_ctx positions; together they hold at most n_cells.
        cparams.n_ctx = config.n_cells or config.n_ctx * n_seq
        cparams.n_batch = cparams.n_ubatch = config.n_batch
        cparams.n_seq_max = n_seq
        # One KV buffer for every sequence: a batch of rows from several sequences is then one
        # ubatch (split KV streams split it into equal rows per sequence: docs/decisions.md).
        cparams.kv_unified = True
        cparams.n_outputs_max = self.n_outputs_total
        cparams.n_threads = cparams.n_threads_batch = config.n_threads
        cparams.no_perf = True
        # Flash attention (config.FLASH_ATTN): "auto" is llama.cpp's choice (docs/decisions.md)
        cparams.flash_attn_type = _FLASH_ATTN[config.flash_attn]
        if self.recurrent and config.rollback == "snapshots":
            cparams.n_rs_seq = SNAPSHOT_ROWS     # (llama.cpp sets 0 where it has none)
        # Only where llama.cpp has no device but the CPU: with one, even a model kept on the
        # CPU may have large batches' products run there (op offload), and the tapped tensor
        # would then be device memory.
        if tap_min_vocab is not None and self.vocab.n_vocab >= tap_min_vocab \
                and not gpu_devices() and (lib := ggml()) is not None:
            self._tap = Tap(lib, self.n_embd)
            cparams.cb_eval = ctypes.cast(self._tap.c_callback, type(cparams.cb_eval))
            cparams.cb_eval_user_data = None
        self._ctx = C.llama_init_from_model(model, cparams)
        if not self._ctx:
            raise ModelLoadError(self.path, f"llama.cpp could not create a context of "
                                            f"{config.n_ctx} tokens (out of memory? try a "
                                            "smaller n_ctx)")
        self.memory = C.llama_get_memory(self._ctx)
        self.snapshots = C.llama_n_rs_seq(self._ctx) if self.recurrent else 0
        # llama.cpp pads the context up (to a multiple of 256); honour what was asked.
        self.n_cells = C.llama_n_ctx(self._ctx)                 # all sequences together
        self.n_ctx = min(config.n_ctx, self.n_cells if config.n_cells     # per sequence
                         else self.n_cells // n_seq)
        self.n_batch = C.llama_n_batch(self._ctx)
        self._batch = C.llama_batch_init(self.n_batch, 0, 1)
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
        self.sequences = tuple(KVSequence(self, i) for i in range(n_seq))

    # -- metadata -------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    def describe(self) -> dict:
        return {"path": str(self.path), "name": self.info.name,
                "architecture": self.info.architecture,
                "size_bytes": self.info.file_size,
                "n_params": int(C.llama_model_n_params(self._model)),
                "n_ctx": self.n_ctx, "n_ctx_train": self.n_ctx_train,
                "n_vocab": self.n_vocab, "n_threads": self.n_threads,
                "n_gpu_layers": self.config.n_gpu_layers,
                "cpu_extra_buffers": self.extra_buffers, "flash_attn": self.config.flash_attn,
                # weights kept on the repacked kernels while the others fault (repack.py)
                "repacked_weights": self.repacked,
                # how rejected drafts leave the cache (a recurrent part: rollback.py)
                "rollback": "checkpoints" if self.recurrent and not self.snapshots else
                            "snapshots" if self.recurrent else "positions"}

    # -- the KV cache (the first sequence's) -----------------------------------------------

    @property
    def tokens(self) -> list[int]:
        return self.sequences[0].tokens

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` to the cache and return logits for the last ``n_logits`` of them.

        Returns a float32 array of shape ``(n_logits, n_vocab)`` that views llama.cpp's
        buffer: valid until the next ``eval``; copy what must outlive it. Tokens longer than
        ``n_batch`` are sent in several ``llama_decode`` calls.
        """
        return self.decode([(self.sequences[0], tokens, n_logits)])[0]

    # The first sequence's: truncate (llama_memory_seq_rm, or back to a checkpoint), the
    # checkpoint and the time spent going back, save_state/restore_state (the cache's cells
    # in host memory), cache_span (the positions llama.cpp holds): KVSequence's methods.

    def truncate(self, n: int) -> None:
        self.sequences[0].truncate(n)

    def checkpoint(self) -> None:
        self.sequences[0].checkpoint()

    @property
    def rollback_seconds(self) -> float:
        return self.sequences[0].rollback_seconds

    def save_state(self, buffer=None) -> "ModelState":
        return self.sequences[0].save_state(buffer)

    def restore_state(self, state: "ModelState") -> None:
        self.sequences[0].restore_state(state)

    def cache_span(self) -> tuple[int, int]:
        return self.sequences[0].cache_span()

    # -- passes over several sequences ----------------------------------------------------

    def decode(self, parts: Sequence[tuple[KVSequence, Sequence[int], int]]
               ) -> list[np.ndarray]:
        """Append each part's tokens to its sequence (at most one part per sequence) and return
        each part's logits for the last ``n_logits`` of its tokens, ``(n_logits, n_vocab)``.

        All parts go in one ``llama_decode`` when they fit in ``n_batch`` tokens; otherwise a
        part's tokens are sent in chunks and the parts in several calls. The rows view
        llama.cpp's buffer, valid until the next pass, when they all came from the last call;
        rows of earlier calls are copies.
        """
        check_parts(self, parts)
        with self.lock:
            self._check_open()
            # a few tokens to evaluate again ride in front of the part (no pass of their own)
            parts = [(seq, [*seq.fold(), *tokens], n) for seq, tokens, n in parts]
            self.evaluate_pending([seq for seq, _, _ in parts])
            return self._run(parts)

    def evaluate_pending(self, seqs: Sequence[KVSequence]) -> None:
        """Evaluate what ``seqs`` hold but llama.cpp does not (:meth:`KVSequence.pending`)."""
        parts = [part for seq in seqs for part in (seq.pending() or ())]
        if parts:
            t0 = time.perf_counter()
            self._run(parts)
            for seq in {id(p[0]): p[0] for p in parts}.values():     # (each is charged)
                seq.redo_seconds += time.perf_counter() - t0

    def _run(self, parts) -> list[np.ndarray]:
        """:meth:`decode` of ``parts`` (checked), in as few ``llama_decode`` calls as fit."""
        calls = plan_calls(parts, self.n_batch, self.n_outputs_total)
        out: list[list[np.ndarray]] = [[] for _ in parts]
        for c, call in enumerate(calls):
            spans = self._decode(call)
            last = c == len(calls) - 1
            for (i, *_), (first, n) in zip(call, spans):
                if n:
                    rows = self._logits_view(first, n)
                    out[i].append(rows if last else rows.copy())
        return [rows[0] if len(rows) == 1 else
                np.concatenate(rows) if rows else np.empty((0, self.n_vocab), np.float32)
                for rows in out]

    def _decode(self, call: list[tuple]) -> list[tuple[int, int]]:
        """One ``llama_decode`` of ``call``'s segments; each one's (first batch index with
        logits, rows). The sequences' records follow what llama.cpp kept."""
        b = self._batch
        tok, pos, lg, sid = b.token, b.pos, b.logits, b.seq_id
        j, spans, n_rows = 0, [], 0
        for _, seq, chunk, first_logit in call:
            seq.before_pass(len(chunk))
            pos0 = len(seq.tokens)
            spans.append((j + first_logit, max(0, len(chunk) - first_logit)))
            for i, t in enumerate(chunk):
                tok[j] = t
                pos[j] = pos0 + i
                sid[j][0] = seq.seq_id
                lg[j] = i >= first_logit
                j += 1
            n_rows += spans[-1][1]
        b.n_tokens = j
        if self.before_step is not None:
            self.set_threads(self.before_step())
        t0 = time.perf_counter()
        rc = C.llama_decode(self._ctx, b)
        C.llama_synchronize(self._ctx)
        seconds = time.perf_counter() - t0
        self.decode_seconds += seconds
        if self.on_step is not None and rc == 0:
            self.set_threads(self.on_step(j, n_rows, seconds))
        if rc != 0:
            # On failure llama.cpp may have kept some ubatches: resynchronise our records.
            for _, seq, chunk, _ in call:
                seq.after_failed_pass(chunk)
            raise BackendError(f"llama_decode failed with code {rc} ("
                               f"{_DECODE_ERRORS.get(rc, 'fatal error')})")
        for _, seq, chunk, _ in call:
            seq.redo_seconds += seconds * seq.folded / j    # tokens evaluated again
            seq.folded = 0
            seq.after_pass(chunk)
        self._last_spans = spans
        return spans

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

    def set_threads(self, n: int) -> None:
        """Run the next passes on ``n`` CPU threads (cheap: llama.cpp's thread pool is
        resized on the next pass)."""
        if n != self.n_threads:
            with self.lock:
                self._check_open()
                C.llama_set_n_threads(self._ctx, n, n)
                self.n_threads = n

    # -- the hidden state (a draft's reduced output layer) --------------------------------

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
        hidden = self.decode_hidden([(self.sequences[0], tokens)])
        return None if hidden is None else hidden[0]

    def decode_hidden(self, parts: Sequence[tuple[KVSequence, Sequence[int]]]
                      ) -> Optional[np.ndarray]:
        """:meth:`eval_hidden` of several sequences in one pass: the last token's hidden
        state of each part, ``(len(parts), n_embd)``; None when not read (then
        :meth:`last_rows` holds each part's logits row)."""
        tap = self._tap
        if tap is None:
            self.decode([(seq, tokens, 1) for seq, tokens in parts])
            return None
        with self.lock:
            self.evaluate_pending([seq for seq, _ in parts])   # (not with the tap on)
            if sum(len(tokens) for _, tokens in parts) > self.n_batch:
                # all but each part's last token first, without outputs (in chunks)
                self.decode([(seq, tokens[:-1], 0) for seq, tokens in parts if len(tokens) > 1])
                parts = [(seq, tokens[-1:]) for seq, tokens in parts]
            tap.on, tap.rows = True, len(parts)
            try:
                self.decode([(seq, tokens, 1) for seq, tokens in parts])
            finally:
                tap.on = False
            return tap.take()

    def last_logits(self) -> np.ndarray:
        """The logits row of the last evaluated token (after an eval that asked for it)."""
        return self.last_rows()[-1]

    def last_rows(self) -> np.ndarray:
        """The logits rows of the last ``llama_decode``, in the order of its parts (after a
        pass that asked for them)."""
        views = [self._logits_view(first, n) for first, n in self._last_spans if n]
        return views[0] if len(views) == 1 else np.concatenate(views)

    def output_rows(self, ids: Sequence[int]) -> np.ndarray:
        """Rows ``ids`` of the output layer's weights (``output.weight``, or the tied token
        embeddings), dequantized to float32: shape ``(len(ids), n_embd)``."""
        return output_rows(self.path, self.info, ids)

    # -- lifetime -------------------------------------------------------------------------

    def check_open(self) -> None:
        if self._closed:
            raise BackendError(f"{self.path.name}: model is closed")

    _check_open = check_open

    @property
    def context(self):
        """The llama.cpp context (for :mod:`.sequence`)."""
        return self._ctx

    @property
    def weights(self):
        """The llama.cpp model (for a second context on the same weights: :mod:`.embedding`;
        close that one before this model)."""
        return self._model

    def close(self) -> None:
        """Free the context, the batch and the model. Safe to call twice."""
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        free_context(self._ctx, self._batch)
        self._ctx = self._batch = None
        self._tap = None    # the callback may go only once no context can call it
        if self._model:
            C.llama_model_free(self._model)
            self._model = None

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
