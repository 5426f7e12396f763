"""A GGUF's weights loaded by llama.cpp with edgespec's settings (offload, extra CPU buffer
types, devices): the ``llama_model`` that a generating context (:mod:`.model`) and an
embedding context (:mod:`.embedding`) are made on; how such a context is freed; and the output
layer's rows read from the file (a draft's reduced head)."""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

import llama_cpp.llama_cpp as C

from ..config import ModelConfig
from ..errors import ModelLoadError
from ..gguf_file import GGUFInfo
from .preflight import cpu_kernels
from .runtime import gpu_devices


def load_weights(config: ModelConfig, info: GGUFInfo,
                 devices: Optional[ctypes.Array] = None) -> tuple[object, bool, int]:
    """(the ``llama_model`` handle, whether llama.cpp's extra CPU buffer types are used, how
    many weights keep the repacked kernels while they are not) for ``config``'s file, whose
    header is ``info``. ``devices``: a NULL-terminated device list
    (llama.cpp keeps the pointer: the caller keeps the array alive). Raises
    :class:`~edgespec.errors.ModelLoadError` when llama.cpp cannot load it."""
    mparams = C.llama_model_default_params()
    mparams.n_gpu_layers = config.n_gpu_layers if config.n_gpu_layers >= 0 else 999
    # AMX and repacked weights only where a child process showed that they do not kill
    # the process on this CPU, and where AMX faults but the repacked kernels do not, those by
    # name when every layer stays here (backend/preflight.py, backend/repack.py)
    on_cpu = not config.rpc and devices is None and (config.n_gpu_layers == 0
                                                     or not gpu_devices())
    extra, kept = cpu_kernels(info.tensors, config.cpu_extra_buffers, on_cpu)
    mparams.use_extra_bufts = extra
    if kept is not None:
        mparams.tensor_buft_overrides = kept.pointer
    if devices is not None:
        mparams.devices = ctypes.cast(devices, ctypes.c_void_p)
    handle = C.llama_model_load_from_file(str(config.path).encode(), mparams)
    if not handle:
        raise ModelLoadError(config.path, "llama.cpp could not load this model (unsupported "
                                          "architecture or damaged tensors; load it with "
                                          "verbose=True to see llama.cpp's log)",
                             options=("verbose",))
    return handle, extra, kept.weights if kept is not None else 0


def free_context(ctx, batch) -> None:
    """Free a llama.cpp context and its batch (either may be None), before their model."""
    if batch is not None:
        C.llama_batch_free(batch)
    if ctx:
        C.llama_free(ctx)


def output_rows(path, info: GGUFInfo, ids) -> "np.ndarray":
    """Rows ``ids`` of the output layer's weights in the GGUF at ``path`` (``output.weight``,
    or the tied token embeddings), dequantized to float32: shape ``(len(ids), n_embd)``."""
    from gguf.quants import dequantize
    name = "output.weight" if "output.weight" in info.tensors else "token_embd.weight"
    dims, ttype, offset, nbytes = info.tensors[name]
    n_rows = dims[1] if len(dims) > 1 else 1
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=offset,
                   shape=(n_rows, nbytes // n_rows))
    try:
        raw = np.asarray(mm[np.asarray(ids, dtype=np.int64)])
    finally:
        del mm
    return np.ascontiguousarray(dequantize(raw, ttype).reshape(len(ids), -1), dtype=np.float32)
