"""llama.cpp's RPC backend (ggml-rpc), through ctypes: both sides of it.

- the client side: :func:`parse_endpoints`, :func:`probe` (a worker answers, in this
  protocol version, within a bounded time), :func:`model_devices` (a worker's devices as a
  ``llama_model_params.devices`` list);
- the worker side: :func:`serve` (``ggml_backend_rpc_start_server``, which never returns).

llama-cpp-python does not wrap ``ggml_backend_rpc_*``; the signatures here are those of
``ggml-rpc.h`` in the llama.cpp it vendors (0.3.36: protocol 7.0.0). ggml-rpc's client aborts
the whole process when a worker cannot be reached or stops answering (``GGML_ABORT`` on any
failed send or receive), so :func:`probe` speaks the protocol's HELLO from Python, with a
timeout, before llama.cpp ever connects, and a model with RPC devices runs in a child process
(:mod:`.remote`). Nothing here registers a device globally: only the model that names the
devices uses them, so a draft loaded in the same process stays local.
"""

from __future__ import annotations

import ctypes
import re
import socket
import struct
import sys
from pathlib import Path
from typing import Optional, Sequence

import llama_cpp.llama_cpp as C

from ..config import RPC_PORT as DEFAULT_PORT
from ..errors import InvalidParameterError, RPCError
from .runtime import device_handles, ensure_init, ggml

PROBE_TIMEOUT = 5.0          # seconds for a worker to accept and answer HELLO
REBUILD = ('rebuild llama-cpp-python with CMAKE_ARGS="-DGGML_RPC=on" pip install '
           '--force-reinstall --no-cache-dir --no-deps llama-cpp-python — see README')

# From ggml-rpc.h / ggml-rpc.cpp of the vendored llama.cpp: RPC_CMD_HELLO is 14 in every
# version ("must be always 14"), the request is conn_caps[24], the answer major, minor,
# patch, padding, conn_caps[24].
_CMD_HELLO = 14
_CAPS = 24
_PROTO_MAJOR_FALLBACK = 7


def _proto_major() -> int:
    """The protocol major version this llama.cpp speaks: read from the ``ggml-rpc.h`` that
    llama-cpp-python installs next to its libraries, else the vendored 0.3.36 value."""
    for cand in (Path(C.__file__).parent.parent / "include" / "ggml-rpc.h",):
        try:
            m = re.search(r"RPC_PROTO_MAJOR_VERSION\s+(\d+)", cand.read_text())
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return _PROTO_MAJOR_FALLBACK


PROTO_MAJOR = _proto_major()


# ---------------------------------------------------------------------------------------------
# The library

_LIB: list = []


def _lib() -> ctypes.CDLL:
    """libggml-rpc with the functions edgespec calls typed; :class:`RPCError` (the rebuild
    hint) when llama.cpp was built without RPC."""
    if _LIB:
        return _LIB[0]
    ensure_init()
    if not getattr(C, "llama_supports_rpc", lambda: False)():
        raise RPCError(f"this llama.cpp was built without the RPC backend: {REBUILD}")
    libdir = Path(C.__file__).parent / "lib"
    names = sorted(libdir.glob("*ggml-rpc.*")) + sorted(libdir.glob("*ggml.*"))
    for cand in names:
        try:
            lib = ctypes.CDLL(str(cand))
            lib.ggml_backend_rpc_add_server     # noqa: B018 - present or AttributeError
        except (OSError, AttributeError):
            continue
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        lib.ggml_backend_rpc_add_server.restype = vp
        lib.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
        lib.ggml_backend_rpc_start_server.restype = None
        lib.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, sz, sz,
                                                      ctypes.POINTER(vp)]
        _LIB.append(lib)
        return lib
    raise RPCError(f"llama.cpp reports RPC support but libggml-rpc was not found in {libdir}: "
                   f"{REBUILD}")


def available() -> bool:
    """Whether this llama.cpp has the RPC backend."""
    try:
        _lib()
    except RPCError:
        return False
    return True


def _base() -> ctypes.CDLL:
    lib = ggml()
    if lib is None:
        raise RPCError(f"the ggml library was not found next to llama-cpp-python: {REBUILD}")
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, res, args in (("ggml_backend_reg_dev_count", sz, [vp]),
                            ("ggml_backend_reg_dev_get", vp, [vp, sz])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


# ---------------------------------------------------------------------------------------------
# Endpoints

def parse_endpoints(value, what: str = "rpc") -> tuple[str, ...]:
    """``"HOST:PORT[,HOST:PORT…]"`` (or a list of them) as a tuple of ``"HOST:PORT"``."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    out = []
    for item in items:
        text = str(item).strip()
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535 \
                or any(c.isspace() for c in host):
            raise InvalidParameterError(what, value, "HOST:PORT[,HOST:PORT…] (e.g. "
                                        f"192.168.1.20:{DEFAULT_PORT}), each port 1-65535")
        out.append(f"{host}:{int(port)}")
    if not out:
        raise InvalidParameterError(what, value, "at least one HOST:PORT")
    if len(set(out)) != len(out):
        raise InvalidParameterError(what, value, "each HOST:PORT once")
    return tuple(out)


def _fix(endpoint: str) -> str:
    host, _, port = endpoint.rpartition(":")
    return f"start one there with `edgespec worker --host {host} --port {port}`"


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> tuple[int, int, int]:
    """Connect to a worker, say HELLO as llama.cpp's client does, and return its protocol
    version; :class:`RPCError` (one line: the endpoint, what happened, the fix) when it
    cannot be reached, does not answer within ``timeout`` seconds, does not speak the
    protocol, or speaks another major version. The worker then sees a client come and go."""
    host, _, port = endpoint.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except socket.timeout:
        raise RPCError(f"RPC worker {endpoint} did not accept a connection within "
                       f"{timeout:g} s (wrong address, or a firewall): {_fix(endpoint)}") from None
    except OSError as e:
        raise RPCError(f"cannot reach RPC worker {endpoint} ({e.strerror or e}): "
                       f"{_fix(endpoint)}") from None
    try:
        sock.settimeout(timeout)
        sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS) + bytes(_CAPS))
        head = _recv(sock, 8)
        size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        body = _recv(sock, size) if 4 <= size <= 1024 else b""
    except socket.timeout:
        raise RPCError(f"RPC worker {endpoint} accepted the connection but did not answer "
                       f"within {timeout:g} s: it serves one client at a time (is another "
                       "edgespec using it?), or it is not an RPC worker") from None
    except OSError as e:
        body, size = b"", -1
        if not isinstance(e, ConnectionResetError):
            raise RPCError(f"RPC worker {endpoint}: {e.strerror or e}") from None
    finally:
        sock.close()
    if size < 4 or len(body) != size:
        raise RPCError(f"{endpoint} does not speak llama.cpp's RPC protocol v{PROTO_MAJOR} (a "
                       "worker of another llama.cpp version closes the connection): run the "
                       "same edgespec and llama-cpp-python version there")
    major, minor, patch = body[0], body[1], body[2]
    if major != PROTO_MAJOR:
        raise RPCError(f"RPC worker {endpoint} speaks protocol v{major}.{minor}.{patch}, this "
                       f"client v{PROTO_MAJOR}: run the same edgespec and llama-cpp-python "
                       "version on both machines")
    return major, minor, patch


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def model_devices(endpoints: Sequence[str], local: bool = True) -> ctypes.Array:
    """A NULL-terminated ``ggml_backend_dev_t`` array for ``llama_model_params.devices``:
    every device of each worker (``ggml_backend_rpc_add_server``; :func:`probe` each first,
    since a failure here aborts the process), then this machine's GPUs when ``local``. The
    CPU is never listed: llama.cpp keeps the layers it does not offload there."""
    lib, base = _lib(), _base()
    devs: list[int] = []
    for ep in endpoints:
        reg = lib.ggml_backend_rpc_add_server(ep.encode())
        if not reg:
            raise RPCError(f"RPC worker {ep} reports no device: restart it")
        devs += [base.ggml_backend_reg_dev_get(reg, i)
                 for i in range(base.ggml_backend_reg_dev_count(reg))]
    if local:
        devs += [d for d, kind in _local_devices() if kind in (1, 2)]
    return (ctypes.c_void_p * (len(devs) + 1))(*devs, None)


_local_devices = device_handles      # this process's own devices (never a worker's)


# ---------------------------------------------------------------------------------------------
# The worker

def serve(host: str, port: int, n_threads: int, cache_dir: Optional[str] = None) -> None:
    """Serve this machine's devices to RPC clients: its GPUs, or the CPU when it has none (as
    llama.cpp's ``rpc-server``). Blocks in C for good; the caller runs it in a thread."""
    lib = _lib()
    devs = [d for d, kind in _local_devices() if kind in (1, 2)] or \
        [d for d, kind in _local_devices() if kind == 0][:1]
    arr = (ctypes.c_void_p * max(1, len(devs)))(*devs)
    endpoint = f"{host}:{port}".encode()
    lib.ggml_backend_rpc_start_server(endpoint, cache_dir.encode() if cache_dir else None,
                                      n_threads, len(devs), arr)
    # Returns only when the socket could not be created (ggml-rpc printed why).
    raise RPCError(f"cannot serve on {host}:{port} (the port is in use, or the address is not "
                   "this machine's): pick another with --port/--host")


def worker_devices() -> list[str]:
    """The names of the devices :func:`serve` would serve, for its banner."""
    lib = ggml()
    kinds = _local_devices()
    devs = [d for d, k in kinds if k in (1, 2)] or [d for d, k in kinds if k == 0][:1]
    if lib is None:
        return []
    return [f"{lib.ggml_backend_dev_name(d).decode()} "
            f"({lib.ggml_backend_dev_description(d).decode()})" for d in devs]


if __name__ == "__main__":   # pragma: no cover - a manual check: python -m edgespec.backend.rpc EP
    print(probe(sys.argv[1]))


# ---------------------------------------------------------------------------------------------
# Where models run


def where(model) -> str:
    """Where a model's layers run, in a few words (for status lines and stats)."""
    endpoints = model.endpoints
    if not endpoints:
        return "local"
    ngl = model.config.n_gpu_layers
    local = 0 <= ngl <= model.n_layer     # llama.cpp counts the output layer as one more
    return f"RPC {','.join(endpoints)}" + (" + local" if local else "")


def placement(backend: str, target, draft) -> str:
    """The backend's name, and where each model runs when one of them uses RPC workers."""
    if not target.endpoints and not (draft is not None and draft.endpoints):
        return backend
    return f"{backend} · target {where(target)}" + (
        f" · draft {where(draft)}" if draft is not None else "")


def rpc_endpoints(rpc, draft_rpc) -> tuple[tuple, tuple]:
    """``rpc`` and ``draft_rpc`` (``"HOST:PORT,…"``, a list, or None) as endpoint tuples; the
    rebuild hint when llama.cpp has no RPC backend. A worker serves one client at a time, so
    the two lists may not share one (each model with RPC layers is a client of its own)."""
    t = parse_endpoints(rpc, "rpc") if rpc else ()
    d = parse_endpoints(draft_rpc, "draft_rpc") if draft_rpc else ()
    if t or d:
        _lib()
    if set(t) & set(d):
        raise InvalidParameterError("draft_rpc", ",".join(d), "workers other than the "
                                    "target's (a worker serves one client at a time)")
    return t, d
