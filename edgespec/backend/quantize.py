"""llama.cpp's own quantizer: any precision of a GGUF, e.g. a low-bit draft of a target."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp.llama_cpp as C

from ..errors import BackendError, EdgespecError
from ..gguf_file import read_gguf
from .runtime import ensure_init

FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
          "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
          "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "BF16": 32}


def check_ftype(ftype: str) -> str:
    """``ftype`` in canonical (upper) case; an unknown name is a one-line error."""
    if not isinstance(ftype, str) or ftype.upper() not in FTYPES:
        raise EdgespecError(f"unknown quantisation '{ftype}': choose one of {', '.join(FTYPES)}")
    return ftype.upper()


def quantize(src: str | os.PathLike, dst: str | os.PathLike, ftype: str,
             n_threads: int | None = None) -> Path:
    """Write ``src`` re-quantised to ``ftype`` at ``dst`` (atomically: via a temporary name)."""
    ensure_init()
    src, dst = Path(src), Path(dst)
    ftype = check_ftype(ftype)
    read_gguf(src)      # a damaged file is refused here, not by an abort inside llama.cpp
    params = C.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
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
