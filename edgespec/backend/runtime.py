"""llama.cpp's process-wide side: backend initialisation, its log, the ggml library, the
compute devices, and giving freed C heap back to the system.

llama.cpp keeps one backend and one log callback per process, so this module holds the only
process-wide state edgespec has, in one :class:`_Runtime` object.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import sys
import threading
from pathlib import Path
from typing import Optional

import llama_cpp.llama_cpp as C

LLAMA_CPP_VERSION = getattr(sys.modules.get("llama_cpp"), "__version__", "unknown")

_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


@C.llama_log_callback
def _log_callback(level, text, user_data):  # pragma: no cover - called from C
    if _RUNTIME.verbose and text:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


class _Runtime:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.initialised = False
        self.verbose = False
        self.ggml: Optional[ctypes.CDLL] = None
        self.ggml_loaded = False
        self.malloc_trim = None
        self.malloc_trim_looked_up = False


_RUNTIME = _Runtime()


def ensure_init(verbose: bool = False) -> None:
    """Initialise llama.cpp's backend once per process; ``verbose`` shows its log (once any
    model asked for it, it stays on)."""
    rt = _RUNTIME
    with rt.lock:
        rt.verbose = rt.verbose or verbose
        if not rt.initialised:
            C.llama_log_set(_log_callback, ctypes.c_void_p(0))
            C.llama_backend_init()
            rt.initialised = True


def ggml() -> Optional[ctypes.CDLL]:
    """The ggml library that llama-cpp-python ships, with the accessors edgespec uses typed
    (tensors for the hidden-state tap, devices for :func:`backend_info`); None if absent.

    ``libggml`` depends on ``libggml-base``; symbols of both resolve through its handle.
    """
    rt = _RUNTIME
    with rt.lock:
        if rt.ggml_loaded:
            return rt.ggml
        rt.ggml_loaded = True
        libdir = Path(C.__file__).parent / "lib"
        for cand in sorted(glob.glob(str(libdir / "*ggml.*"))) + \
                sorted(glob.glob(str(libdir / "*ggml-base*"))):
            try:
                lib = ctypes.CDLL(cand)
                _declare(lib)
            except (OSError, AttributeError):
                continue
            rt.ggml = lib
            break
        return rt.ggml


def _declare(lib: ctypes.CDLL) -> None:
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, res, args in (
            ("ggml_get_name", ctypes.c_char_p, [vp]),
            ("ggml_get_data_f32", vp, [vp]),
            ("ggml_nelements", ctypes.c_int64, [vp]),
            ("ggml_backend_dev_count", sz, []),
            ("ggml_backend_dev_get", vp, [sz]),
            ("ggml_backend_dev_name", ctypes.c_char_p, [vp]),
            ("ggml_backend_dev_description", ctypes.c_char_p, [vp]),
            ("ggml_backend_dev_type", ctypes.c_int, [vp])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


@functools.cache
def cpu_extra_bufts() -> tuple:
    """(the CPU device, ((name, ``ggml_backend_buffer_type_t``), …)) of its extra buffer
    types (``ggml_backend_dev_get_extra_bufts``), in llama.cpp's order of preference; (None,
    ()) when ggml cannot be read. Asked once per process: the build's list does not change
    while it runs."""
    ensure_init()
    lib = ggml()
    if lib is None:
        return None, ()
    vp = ctypes.c_void_p
    try:
        for name, res, args in (("ggml_backend_dev_by_type", vp, [ctypes.c_int]),
                                ("ggml_backend_dev_backend_reg", vp, [vp]),
                                ("ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p]),
                                ("ggml_backend_buft_name", ctypes.c_char_p, [vp])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
    except AttributeError:
        return None, ()
    dev = lib.ggml_backend_dev_by_type(0)               # GGML_BACKEND_DEVICE_TYPE_CPU
    if not dev:
        return None, ()
    proc = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(dev),
                                                  b"ggml_backend_dev_get_extra_bufts")
    if not proc:
        return dev, ()
    arr = ctypes.CFUNCTYPE(ctypes.POINTER(vp), vp)(proc)(dev)
    out = []
    i = 0
    while arr and arr[i]:
        out.append((lib.ggml_backend_buft_name(arr[i]).decode(errors="replace"), arr[i]))
        i += 1
    return dev, tuple(out)


def device_handles() -> list[tuple[int, int]]:
    """(``ggml_backend_dev_t``, type) of each device registered in this process (type 0 CPU,
    1 GPU, 2 iGPU, 3 accelerator); [] without the ggml library."""
    ensure_init()
    lib = ggml()
    if lib is None:
        return []
    handles = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    return [(dev, lib.ggml_backend_dev_type(dev)) for dev in handles]


def devices() -> list[dict]:
    """The compute devices llama.cpp was built with (CPU, CUDA, Metal, RPC servers …)."""
    handles = device_handles()
    lib = ggml()
    return [{"name": lib.ggml_backend_dev_name(dev).decode(),
             "description": lib.ggml_backend_dev_description(dev).decode(),
             "type": _DEVICE_KINDS.get(kind, "other")} for dev, kind in handles]


def gpu_devices() -> list[dict]:
    """The devices other than the CPU that llama.cpp may run work on (a GPU, an RPC server).

    Not ``llama_supports_gpu_offload()``: a CPU build with the RPC backend compiled in
    answers true there with no device at all."""
    return [d for d in devices() if d["type"] in ("gpu", "igpu")]


def backend_info() -> dict:
    """What llama.cpp here can run on: devices, GPU offload support, CPU features."""
    devs = devices()
    gpus = [d for d in devs if d["type"] in ("gpu", "igpu")]
    return {
        "llama_cpp_python": LLAMA_CPP_VERSION,
        "backend": ", ".join(d["name"] for d in gpus) if gpus else "CPU",
        "gpu_offload": bool(gpus),
        "devices": devs,
        "system_info": C.llama_print_system_info().decode(errors="replace").strip(),
    }


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``); elsewhere a
    no-op. Freeing a model leaves tens of MiB of freed blocks resident (docs/decisions.md)."""
    rt = _RUNTIME
    if not rt.malloc_trim_looked_up:
        rt.malloc_trim_looked_up = True
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None).malloc_trim   # absent from musl
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
                rt.malloc_trim = fn
            except (OSError, AttributeError):
                pass
    if rt.malloc_trim is not None:
        rt.malloc_trim(0)
