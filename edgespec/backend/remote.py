"""A model whose layers live on RPC workers, run in a child process: :class:`RemoteModel`.

ggml-rpc's client ends the whole process (``GGML_ABORT``, exit by SIGABRT) when a send or a
receive fails, which is what happens when a worker dies during a pass (measured:
docs/decisions.md). So the llama.cpp context of such a model lives in a child process
(``python -m edgespec.backend.remote``) and this process talks to it over two pipes; its
logits rows come back through a shared memory-mapped file, so a verify pass costs one small
message each way and no copy here. When the child dies the pass raises
:class:`~edgespec.errors.RPCError` at once, naming the workers and the reason ggml-rpc gave;
the caller's conversation is untouched, and the next pass probes the workers and starts a
fresh child (the cache is rebuilt from the prompt, as for a new conversation).

Tokenizing stays here, on a vocabulary-only load of the same file: only passes cross over.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
from typing import Optional, Sequence

import numpy as np

from ..config import ModelConfig
from ..errors import BackendError, ContextOverflowError, ModelLoadError, RPCError
from ..gguf_file import GGUFInfo, check_causal_lm, read_gguf
from .model import LlamaModel
from .sequence import ModelState, check_eval
from .step_hooks import StepHooks
from .rpc import probe, where
from .vocab import HasVocabulary, VocabOnly

_HEAD = struct.Struct("<I")
CLOSE_WAIT = 5.0            # seconds a child gets to free its model before it is killed
# A pass that has not answered after this long (plus PASS_PER_TOKEN per token of the batch) is
# taken as a worker that stopped without closing its connection (a stopped process, a pulled
# cable): ggml-rpc itself would wait forever.
PASS_TIMEOUT = 60.0
PASS_PER_TOKEN = 0.05


def _write(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEAD.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int):
    head = _read_exact(fd, _HEAD.size)
    return pickle.loads(_read_exact(fd, _HEAD.unpack(head)[0]))


def _read_exact(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class RemoteModel(HasVocabulary, StepHooks):
    """A :class:`~edgespec.lm.LanguageModel` whose llama.cpp context runs in a child process
    with the layers on ``config.rpc``'s workers (see the module docstring)."""

    can_tap = False         # the hidden state would be on a worker: no reduced head
    rollback_seconds = 0.0  # (the child's copies of a recurrent state are not reported)

    def __init__(self, config: ModelConfig):
        self.config = config
        self.path = config.path
        self.endpoints = tuple(config.rpc)
        self.info: GGUFInfo = read_gguf(config.path)
        check_causal_lm(self.info)
        for ep in self.endpoints:                 # bounded, before llama.cpp connects
            probe(ep)
        self._vocab_only = VocabOnly(config.path)
        self.vocabulary = self._vocab_only.vocabulary
        self.vocab = self.vocabulary.info
        self.tokens: list[int] = []
        self.decode_seconds = 0.0
        self.n_threads = config.n_threads
        self.n_outputs_max = min(config.n_outputs_max, config.n_batch)
        self._rows = self.n_outputs_max * self.n_vocab
        self._shm = tempfile.TemporaryFile(prefix="edgespec-logits-")
        self._shm.truncate(self._rows * 4)
        self._map = mmap.mmap(self._shm.fileno(), self._rows * 4)
        self._logits = np.frombuffer(self._map, dtype=np.float32).reshape(
            self.n_outputs_max, self.n_vocab)
        self._proc: Optional[subprocess.Popen] = None
        self._closed = False
        self._last = 0
        self._mark = False      # a checkpoint asked for, sent with the next pass
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    # -- the child ------------------------------------------------------------------------

    def _start(self) -> None:
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        if getattr(self, "_err", None) is not None:
            self._err.close()
        self._err = tempfile.TemporaryFile(prefix="edgespec-rpc-")
        env = dict(os.environ, GGML_NO_BACKTRACE="1")   # ggml would run gdb before aborting
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "edgespec.backend.remote", str(to_child), str(from_child),
             str(self._shm.fileno())],
            pass_fds=(to_child, from_child, self._shm.fileno()), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=None if self.config.verbose else self._err,
            env=env)
        os.close(to_child)
        os.close(from_child)
        facts = self._call("load", self.config, self.n_outputs_max)
        (self.n_ctx, self.n_batch, self.n_params, self.n_ctx_train, self.n_layer,
         self.recurrent) = facts
        self.tokens = []
        self.n_threads = self.config.n_threads

    def _call(self, *msg, timeout: Optional[float] = None):
        """Send one request and wait for its answer (at most ``timeout`` seconds); the child's
        death, or its silence past the timeout, is an RPCError."""
        if self._proc is None:
            self._restart()
        try:
            _write(self._out, msg)
            if timeout is not None and not select.select([self._in], [], [], timeout)[0]:
                self._kill()
                self.tokens = []
                raise RPCError(f"the RPC worker{'s' if len(self.endpoints) > 1 else ''} "
                               f"{','.join(self.endpoints)} did not answer a pass within "
                               f"{timeout:.0f} s (stopped, or the network is down): check the "
                               "worker and retry; nothing was lost")
            status, value = _read(self._in)
        except (EOFError, BrokenPipeError, OSError):
            self._lost()
        except BaseException:        # interrupted mid-message: the channel is out of step
            self._kill()
            self.tokens = []
            raise
        if status == "ok":
            return value
        kind, text, extra = value
        if kind == "ModelLoadError":
            raise ModelLoadError(self.path, extra)
        if kind == "ContextOverflowError":
            raise ContextOverflowError(*extra)
        raise BackendError(text)

    def _lost(self):
        """The child ended: say why in one line, and start afresh on the next pass."""
        self._kill()
        self.tokens = []
        reason = ""
        try:
            self._err.seek(0)
            lines = [ln.strip() for ln in self._err.read().decode(errors="replace").splitlines()
                     if ln.strip()]
            reason = lines[-1].split(": ", 1)[-1] if lines else ""
        except (OSError, ValueError):
            pass
        raise RPCError(f"the RPC worker{'s' if len(self.endpoints) > 1 else ''} "
                       f"{','.join(self.endpoints)} stopped answering during a pass"
                       f"{f' ({reason})' if reason else ''}: nothing was lost — retry when "
                       "the worker is back")

    def _restart(self) -> None:
        if self._closed:
            raise BackendError(f"{self.path.name}: model is closed")
        for ep in self.endpoints:
            probe(ep)
        self._start()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for fd in ("_out", "_in"):
            if getattr(self, fd, None) is not None:
                try:
                    os.close(getattr(self, fd))
                except OSError:
                    pass
                setattr(self, fd, None)

    # -- the model protocol ---------------------------------------------------------------

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        n = check_eval(self, tokens, n_logits)
        if self._proc is None:
            self._restart()
        if self.before_step is not None:
            self.set_threads(self.before_step())
        mark, self._mark = self._mark, False
        steps = self._call("eval", list(tokens), n_logits, mark,
                           timeout=PASS_TIMEOUT + PASS_PER_TOKEN * n)
        self.tokens.extend(tokens)
        self._last = n_logits
        for n_tok, n_rows, seconds in steps:
            self.decode_seconds += seconds
            if self.on_step is not None:
                self.set_threads(self.on_step(n_tok, n_rows, seconds))
        return self._logits[:n_logits]

    def eval_hidden(self, tokens: Sequence[int]) -> None:
        self.eval(tokens, 1)
        return None

    def last_logits(self) -> np.ndarray:
        return self._logits[self._last - 1]

    @property
    def state_owner(self) -> "RemoteModel":
        return self

    @property
    def sequences(self) -> tuple:
        """Its one sequence is itself (a model on workers holds one conversation)."""
        return (self,)

    def decode(self, parts) -> list[np.ndarray]:
        """:meth:`eval` of its one sequence's part (the batched passes' interface)."""
        (seq, tokens, n_logits), = parts
        return [self.eval(tokens, n_logits)]

    def checkpoint(self) -> None:   # (the child's model takes it, with the next pass)
        self._mark = self.recurrent

    def truncate(self, n: int) -> None:
        if n >= len(self.tokens):
            return
        if self._proc is None:      # the cache went with the child
            self.tokens = []
            return
        self._call("truncate", n)
        del self.tokens[n:]

    def save_state(self, buffer=None) -> ModelState:
        """The child's cache contents, copied here (see :meth:`LlamaModel.save_state`; they
        arrive as bytes: ``buffer`` is not used)."""
        if self._proc is None:      # the cache went with the child
            self.tokens = []
            return ModelState((), b"", 0)
        data = self._call("save", timeout=PASS_TIMEOUT)
        return ModelState(tuple(self.tokens), data, len(data))

    def restore_state(self, state: ModelState) -> None:
        if self._proc is None:
            self._restart()
        self.tokens = []
        self._call("restore", state.tokens, state.data, timeout=PASS_TIMEOUT)
        self.tokens = list(state.tokens)

    def set_threads(self, n: int) -> None:
        if n != self.n_threads and self._proc is not None:
            self._call("threads", n)
            self.n_threads = n

    def cache_span(self) -> tuple[int, int]:
        return self._call("span") if self._proc is not None else (-1, -1)

    def describe(self) -> dict:
        return {"path": str(self.path), "name": self.info.name,
                "architecture": self.info.architecture, "size_bytes": self.info.file_size,
                "n_params": self.n_params, "n_ctx": self.n_ctx, "n_ctx_train": self.n_ctx_train,
                "n_vocab": self.n_vocab, "n_threads": self.n_threads,
                "n_gpu_layers": self.config.n_gpu_layers, "rpc": list(self.endpoints),
                "runs_on": where(self)}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                _write(self._out, ("close",))
                proc.wait(CLOSE_WAIT)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._logits = None
        try:
            self._map.close()
        except (BufferError, AttributeError):
            pass            # a caller still holds a logits view: the GC frees it later
        for f in ("_shm", "_err"):
            if getattr(self, f, None) is not None:
                getattr(self, f).close()
        if getattr(self, "_vocab_only", None) is not None:
            self._vocab_only.close()

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def open_model(config: ModelConfig, tap_min_vocab: Optional[int] = None):
    """A :class:`LlamaModel`, or a :class:`RemoteModel` when ``config.rpc`` names workers."""
    return RemoteModel(config) if config.rpc else LlamaModel(config, tap_min_vocab)


# ---------------------------------------------------------------------------------------------
# The child: python -m edgespec.backend.remote IN OUT LOGITS


def _child(fd_in: int, fd_out: int, fd_logits: int) -> None:  # pragma: no cover - a child
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort writes no core file
    except (ImportError, ValueError, OSError):
        pass
    import llama_cpp.llama_cpp as C

    from ..errors import EdgespecError
    from .rpc import model_devices
    model: Optional[LlamaModel] = None
    logits = None
    steps: list = []
    while True:
        try:
            msg = _read(fd_in)
        except EOFError:        # the parent is gone
            os._exit(0)
        op, args = msg[0], msg[1:]
        try:
            if op == "load":
                config, n_out = args
                model = LlamaModel(config, devices=model_devices(config.rpc))
                model.set_step_hooks(lambda n, rows, s, m=model:
                                     steps.append((n, rows, s)) or m.n_threads, None)
                size = n_out * model.n_vocab * 4
                logits = np.frombuffer(mmap.mmap(fd_logits, size), dtype=np.float32).reshape(
                    n_out, model.n_vocab)
                d = model.describe()
                reply = (model.n_ctx, model.n_batch, d["n_params"], d["n_ctx_train"],
                         int(C.llama_model_n_layer(model._model)), model.recurrent)
            elif op == "eval":
                tokens, n_logits, mark = args
                steps.clear()
                if mark:
                    model.checkpoint()
                rows = model.eval(tokens, n_logits)
                if n_logits:
                    logits[:n_logits] = rows
                reply = list(steps)
            elif op == "truncate":
                model.truncate(args[0])
                reply = None
            elif op == "threads":
                model.set_threads(args[0])
                reply = None
            elif op == "save":
                state = model.save_state()
                reply = state.data[:state.nbytes].tobytes()
            elif op == "restore":
                tokens, data = args
                model.restore_state(ModelState(tuple(tokens), data, len(data)))
                reply = None
            elif op == "span":
                reply = model.cache_span()
            elif op == "close":
                if model is not None:
                    model.close()
                os._exit(0)
            else:
                raise BackendError(f"unknown request {op!r}")
            _write(fd_out, ("ok", reply))
        except EdgespecError as e:
            extra = (e.reason if isinstance(e, ModelLoadError) else
                     (e.n_prompt, e.n_ctx) if isinstance(e, ContextOverflowError) else None)
            _write(fd_out, ("err", (type(e).__name__, str(e), extra)))
        except Exception as e:   # noqa: BLE001 - said in one line by the parent
            _write(fd_out, ("err", (type(e).__name__, f"{type(e).__name__}: {e}", None)))


if __name__ == "__main__":   # pragma: no cover
    _child(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
