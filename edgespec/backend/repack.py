"""llama.cpp's repacked CPU kernels without its AMX ones: the weights that the ``CPU_REPACK``
buffer type takes, named to llama.cpp through ``tensor_buft_overrides`` (``--override-tensor``).

Where the AMX unit faults (:mod:`.preflight`), models load with ``use_extra_bufts = False``,
which drops the repacked kernels with the AMX ones: on Q4_K weights a plain token then costs
26% more and a 5-row verify pass 43% more (Qwen2.5-Coder 1.5B on a 2-core Xeon:
docs/decisions.md#repack-without-amx). llama.cpp has no switch for AMX alone, so the weights the
repacked kernels would take go to ``CPU_REPACK`` by name. Which weights: the ones llama.cpp's
own loader would find ``CPU_REPACK`` supports, asked the way it asks (``weight_buft_supported``
in llama-model-loader.cpp: a matrix product of the weight and a 512-row input, the weight in a
zero-size buffer of that type, ``ggml_backend_dev_supports_op``), so no repacking rule of
llama.cpp's is copied here; only the 2-D weights of the layers and the output layer, the ones
llama.cpp multiplies (the token embeddings are read by row, which the repacked layout cannot).
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from .runtime import cpu_extra_bufts, ggml

REPACK = "CPU_REPACK"
# ggml types whose weights stay in plain buffers whatever the build: F32, F16, BF16
PLAIN_TYPES = {0, 1, 30}
_WEIGHT = re.compile(r"blk\.(\d+)\.(.+)")
_ROWS = 512                         # the input's rows in llama.cpp's own check


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class _Override(ctypes.Structure):
    """``llama_model_tensor_buft_override``: a pattern and the buffer type it sends to."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass
class Overrides:
    """What a load passes as ``tensor_buft_overrides`` (``array``: keep it alive while the
    model loads), the patterns in it and how many weights they send to ``CPU_REPACK``."""

    array: ctypes.Array
    patterns: list
    weights: int

    @property
    def pointer(self) -> int:
        return ctypes.cast(self.array, ctypes.c_void_p).value


class _Ggml:
    """The ggml calls the check needs, typed; None of :func:`_api` where this build lacks one
    or the CPU device has no ``CPU_REPACK``."""

    def __init__(self, lib: ctypes.CDLL, dev: int, buft: int):
        self.lib, self.dev, self.buft = lib, dev, buft


@functools.cache
def _api() -> Optional[_Ggml]:
    dev, bufts = cpu_extra_bufts()
    buft = dict(bufts).get(REPACK)
    lib = ggml()
    if buft is None or lib is None:
        return None
    vp, i64, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    try:
        for name, res, args in (
                ("ggml_init", vp, [_InitParams]), ("ggml_free", None, [vp]),
                ("ggml_tensor_overhead", ctypes.c_size_t, []),
                ("ggml_new_tensor_2d", vp, [vp, ci, i64, i64]),
                ("ggml_new_tensor_4d", vp, [vp, ci, i64, i64, i64, i64]),
                ("ggml_mul_mat", vp, [vp, vp, vp]),
                ("ggml_backend_buft_alloc_buffer", vp, [vp, ctypes.c_size_t]),
                ("ggml_backend_buffer_free", None, [vp]),
                ("ggml_backend_dev_supports_op", ctypes.c_bool, [vp, vp])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
    except AttributeError:
        return None
    return _Ggml(lib, dev, buft)


def _takes(api: _Ggml, ttype: int, dims) -> bool:
    """Whether ``CPU_REPACK`` supports the product of a weight of this type and shape, as
    llama.cpp's loader asks it."""
    lib = api.lib
    ctx = lib.ggml_init(_InitParams(lib.ggml_tensor_overhead() * 8, None, True))
    if not ctx:
        return False
    try:
        w = lib.ggml_new_tensor_2d(ctx, ttype, dims[0], dims[1])
        x = lib.ggml_new_tensor_4d(ctx, 0, dims[0], _ROWS, 1, 1)
        op = lib.ggml_mul_mat(ctx, w, x)
        # ggml_tensor begins {enum ggml_type type; ggml_backend_buffer * buffer; int64 ne[4]}:
        # checked before the buffer is set, so that another layout is never written into
        slot = ctypes.c_void_p.from_address(w + 8)
        if (ctypes.c_int.from_address(w).value != ttype or slot.value
                or ctypes.c_int64.from_address(w + 16).value != dims[0]):
            return False
        buf = lib.ggml_backend_buft_alloc_buffer(api.buft, 0)
        if not buf:
            return False
        slot.value = buf
        try:
            return bool(lib.ggml_backend_dev_supports_op(api.dev, op))
        finally:
            slot.value = None
            lib.ggml_backend_buffer_free(buf)
    finally:
        lib.ggml_free(ctx)


def repack_weights(tensors: dict) -> list:
    """The names of the weights (a :class:`~edgespec.gguf_file.GGUFInfo`'s ``tensors``) that
    llama.cpp's ``CPU_REPACK`` buffer type takes in this build on this CPU; [] where it has
    none."""
    api = _api()
    if api is None:
        return []
    names = []
    for name, (dims, ttype, _, _) in tensors.items():
        if len(dims) != 2 or ttype in PLAIN_TYPES:
            continue
        if not (name == "output.weight" or _WEIGHT.fullmatch(name)):
            continue
        if _takes(api, ttype, dims):
            names.append(name)
    return names


def patterns(names: list) -> list:
    """Few regular expressions naming exactly ``names`` (llama.cpp compiles every pattern for
    every tensor it loads: one per weight kind, its layers alternated, not one per weight)."""
    layers: dict = defaultdict(list)
    out = []
    for name in names:
        m = _WEIGHT.fullmatch(name)
        if m:
            layers[m.group(2)].append(int(m.group(1)))
        else:
            out.append("^" + re.escape(name) + "$")
    for kind, ids in layers.items():
        out.append(r"^blk\.(" + "|".join(str(i) for i in sorted(set(ids))) + r")\."
                   + re.escape(kind) + "$")
    return out


def overrides(tensors: dict) -> Optional[Overrides]:
    """The ``tensor_buft_overrides`` that send the weights ``CPU_REPACK`` takes there (None:
    none it takes, or no ``CPU_REPACK`` in this build)."""
    names = repack_weights(tensors)
    if not names:
        return None
    pats = patterns(names)
    buft = _api().buft
    array = (_Override * (len(pats) + 1))(*[_Override(p.encode(), buft) for p in pats],
                                           _Override(None, None))
    return Overrides(array, pats, len(names))
