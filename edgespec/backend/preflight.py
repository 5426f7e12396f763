"""Preflight for CPU code paths that can kill the process: llama.cpp's extra CPU buffer types.

llama.cpp moves quantised weights into "extra" CPU buffer types at load time (``AMX`` on Intel
Xeons that report it, ``CPU_REPACK`` on AVX2 and newer) and runs their own kernels on them.
Those kernels trust what the CPU reports; when the OS or the hypervisor has not enabled the
feature for every thread, the first batched ``llama_decode`` ends the whole process with
SIGILL (measured on a Xeon with AMX under Linux 6.18: llama.cpp PR #26954, issue #28328), and
an app that embeds edgespec cannot catch that.

So before the first model with quantised weights is loaded, a child process
(``python -m edgespec.backend.probe``) writes a tiny GGUF with the ``gguf`` package,
quantises it to the types those kernels handle and decodes batches with it, once with the
extra buffer types and once without, side by side. The verdict is kept per CPU, kernel and
llama.cpp build in the cache folder (:func:`edgespec.paths.cpu_check_file`): later loads in
this process cost nothing, later processes one small file read. When the child dies by a
signal, models load with the extra buffer types off (``use_extra_bufts = False``); where a third
child, with only the repacked kernels (``CPU_REPACK`` named weight by weight, :mod:`.repack`),
decodes without a fault, models keep those (on Q4_K weights they are worth 26% a token:
docs/decisions.md#repack-without-amx). The process that found it says so in one note (a kept
verdict stays quiet: ``edgespec info`` shows it).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import llama_cpp.llama_cpp as C

from .. import paths
from ..config import CPU_EXTRA_BUFFERS
from ..errors import BackendError
from .repack import PLAIN_TYPES, REPACK, Overrides, overrides
from .runtime import LLAMA_CPP_VERSION, cpu_extra_bufts

log = logging.getLogger(__name__)

UPSTREAM = "llama.cpp #26954"
CHECK_TIMEOUT = 60.0      # seconds for one child; a tiny model decodes in milliseconds
CHECK_VERSION = 2         # what a kept verdict holds (2: the repacked kernels alone)
# The children: the extra buffer types on, off, and off but for the repacked kernels
MODES = ("on", "off", "repack")


@dataclass(frozen=True)
class Verdict:
    """What the preflight found on this CPU, kernel and llama.cpp build."""

    extra_buffers: tuple        # the CPU's extra buffer types in this build, e.g. ("AMX", …)
    faults: bool                # a decode with them died by a signal
    cause: str                  # how it died ("SIGILL on Q4_0 weights, a batch of 8 tokens")
    fallback_faults: bool       # …and the decode without them died too
    seconds: float              # wall time of the check
    checked: str                # when (ISO 8601, UTC)
    timed_out: bool = False     # a child neither finished nor died in time: not kept
    cached: bool = False        # read from the cache folder, not measured by this process
    # the repacked kernels alone (CPU_REPACK by name, the others off: .repack) decoded without
    # a fault; checked beside the others where the build has CPU_REPACK and another type
    repack: bool = False

    @property
    def repack_alone(self) -> bool:
        """Whether models keep the repacked kernels while the others are off."""
        return self.faults and self.repack and not self.fallback_faults

    @property
    def use_extra_buffers(self) -> bool:
        return bool(self.extra_buffers) and not self.faults

    def note(self) -> str:
        """The one line a user is told when the extra buffer types are off."""
        what = "AMX unit" if "AMX" in self.extra_buffers else \
            "extra CPU kernels (" + ", ".join(self.extra_buffers) + ")"
        it = "it" if what == "AMX unit" else "them"
        kept = " (llama.cpp's repacked kernels kept)" if self.repack_alone else ""
        return (f"this CPU's {what} faults under this kernel ({self.cause}; {UPSTREAM}): "
                f"running without {it}{kept}; cpu_extra_buffers='on' forces {it}")

    def describe(self) -> str:
        """``edgespec info``'s line."""
        if not self.extra_buffers:
            return "none in this build"
        names = ", ".join(self.extra_buffers)
        if self.faults and self.repack_alone:
            others = ", ".join(n for n in self.extra_buffers if n != REPACK)
            return (f"{names}: {others} faults on this CPU ({self.cause}; {UPSTREAM}): "
                    f"{others} off, {REPACK} on")
        if self.faults:
            return f"{names}: fault on this CPU ({self.cause}; {UPSTREAM}): off"
        return f"{names}: checked, they work here: on"


# ---------------------------------------------------------------------------------------------
# The extra buffer types of this build

def extra_buffer_types() -> tuple:
    """Names of the CPU device's extra buffer types, in llama.cpp's order of preference; ()
    when there are none or ggml cannot be read (:func:`.runtime.cpu_extra_bufts`)."""
    return tuple(name for name, _ in cpu_extra_bufts()[1])


def has_quantised_weights(tensors: dict) -> bool:
    """Whether a model (a :class:`~edgespec.gguf_file.GGUFInfo`'s ``tensors``) has weights
    that llama.cpp may put in an extra buffer type."""
    return any(ttype not in PLAIN_TYPES and len(dims) >= 2
               for dims, ttype, _, _ in tensors.values())


# ---------------------------------------------------------------------------------------------
# The verdict: this process, the cache folder, or a check

def cache_key() -> tuple[str, dict]:
    """(key, what it is made of): the CPU (model and feature flags), the kernel and the
    llama.cpp build (its version and its libraries' sizes and dates)."""
    cpu = {"model": platform.processor() or platform.machine(), "flags": ""}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and cpu["model"] in ("", platform.machine(), "x86_64"):
                    cpu["model"] = v.strip()
                elif k in ("flags", "Features") and not cpu["flags"]:
                    cpu["flags"] = hashlib.sha256(v.strip().encode()).hexdigest()[:16]
                if cpu["flags"] and k == "" and cpu["model"]:
                    break
    except OSError:
        pass
    libdir = Path(C.__file__).parent / "lib"
    libs = []
    for p in sorted(libdir.glob("*")):
        try:
            st = p.stat()
        except OSError:
            continue
        libs.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
    parts = {"cpu": cpu["model"], "cpu_flags": cpu["flags"],
             "kernel": f"{platform.system()} {platform.release()} {platform.version()}",
             "llama_cpp_python": LLAMA_CPP_VERSION, "check": CHECK_VERSION,
             "build": hashlib.sha256("\n".join(libs).encode()).hexdigest()[:16]}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
    return key, parts


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.verdict: Optional[Verdict] = None
        self.noted = False


_STATE = _State()


def verdict(refresh: bool = False, *,
            command: Optional[Callable[[str], Sequence[str]]] = None) -> Verdict:
    """This build's verdict on this CPU: from this process, else the cache folder, else a
    check in child processes (``refresh=True``: check again). ``command(mode)`` is the
    child's command line for a mode of :data:`MODES` (tests give one that dies by a real signal)."""
    with _STATE.lock:
        if _STATE.verdict is not None and not refresh:
            return _STATE.verdict
        key, parts = cache_key()
        found = None if refresh else _read_cache(key)
        if found is None:
            found = run_check(command)
            if not found.timed_out:      # a stalled child may be a busy machine: ask again
                _write_cache(key, parts, found)
        _STATE.verdict = found
        return found


def forget() -> None:
    """Drop this process's verdict (tests; an app that changed llama.cpp's build)."""
    with _STATE.lock:
        _STATE.verdict = None
        _STATE.noted = False


def use_extra_buffers(tensors: dict, mode: str = "auto") -> bool:
    """Whether a model with these weights may use the CPU's extra buffer types (``mode``:
    ``"on"`` and ``"off"`` decide without a check; ``"auto"`` asks :func:`verdict` when it
    matters: quantised weights and a build that has extra buffer types). Raises
    :class:`BackendError` when llama.cpp dies on this CPU even without them."""
    assert mode in CPU_EXTRA_BUFFERS, mode       # ModelConfig checked it
    if mode != "auto":
        return mode == "on"
    if not has_quantised_weights(tensors) or not extra_buffer_types():
        return True
    v = verdict()
    if v.fallback_faults:
        raise BackendError(
            f"llama.cpp dies on this CPU even without its extra CPU kernels ({v.cause}): "
            "this llama-cpp-python was built for a CPU this one is not; rebuild it for this "
            "machine (see the README, Installing: CMAKE_ARGS with GGML_NATIVE=OFF)")
    if v.faults:
        # Said when found (once); a kept verdict stays quiet (`edgespec info` shows it).
        with _STATE.lock:
            first, _STATE.noted = not _STATE.noted and not v.cached, True
        if first:
            log.warning(v.note(), extra={"note": True, "options": ("cpu_extra_buffers",)})
        return False
    return True


def repack_alone(tensors: dict, mode: str = "auto") -> Optional[Overrides]:
    """The ``tensor_buft_overrides`` that keep the repacked kernels alone
    (:func:`.repack.overrides`): with ``mode`` ``"repack"``, and with ``"auto"`` where the
    extra buffer types are off because one of them faults and the repacked kernels alone were
    checked to work; else None."""
    if mode == "repack":
        return overrides(tensors)
    if mode != "auto" or not has_quantised_weights(tensors) or REPACK not in extra_buffer_types():
        return None
    v = verdict()
    return overrides(tensors) if v.repack_alone else None


def cpu_kernels(tensors: dict, mode: str = "auto",
                on_cpu: bool = True) -> tuple[bool, Optional[Overrides]]:
    """What a load of a model with these weights runs on this CPU: (whether llama.cpp's extra
    buffer types are on, the weights that keep the repacked kernels while they are off or
    None). The repacked kernels are kept by name only when every layer stays on this CPU
    (``on_cpu``): a name outranks a layer's device, and would pull layers back from a GPU or
    an RPC worker. Edgespec's loads and the llama-cpp-python peer decide the same way."""
    extra = use_extra_buffers(tensors, mode)
    return extra, None if extra or not on_cpu else repack_alone(tensors, mode)


def info(recheck: bool = False) -> dict:
    """What ``edgespec info`` shows: the extra buffer types, the verdict (checked now when
    there is none yet), when and how long it took, and whether it came from the cache."""
    extra = extra_buffer_types()
    if not extra:
        return {"extra_buffers": [], "faults": False, "use": True, "cached": False,
                "summary": "none in this build (nothing to check)"}
    v = verdict(refresh=recheck)
    when = "kept from " + v.checked if v.cached else f"checked now in {v.seconds:.2f} s"
    return {"extra_buffers": list(v.extra_buffers), "faults": v.faults, "cause": v.cause,
            "fallback_faults": v.fallback_faults, "use": v.use_extra_buffers,
            "repack_alone": v.repack_alone,
            "checked": v.checked, "seconds": v.seconds, "cached": v.cached,
            "cache_file": str(paths.cpu_check_file()),
            "summary": f"{v.describe()} ({when}; --cpu-extra-buffers on|off overrides)"}


def _read_cache(key: str) -> Optional[Verdict]:
    try:
        entry = json.loads(paths.cpu_check_file().read_text())[key]["verdict"]
        return Verdict(**{**entry, "extra_buffers": tuple(entry["extra_buffers"]),
                          "cached": True})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(key: str, parts: dict, v: Verdict) -> None:
    path = paths.cpu_check_file()
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[key] = {"of": parts, "verdict": {k: val for k, val in asdict(v).items()
                                          if k != "cached"}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cpu-check-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:          # a read-only cache: check again next time
        log.debug("cannot keep the CPU check in %s: %s", path, e)


# ---------------------------------------------------------------------------------------------
# The check

def child_command(mode: str) -> list[str]:
    """The check's child (:mod:`.probe`) in a mode of :data:`MODES`."""
    return [sys.executable, "-m", "edgespec.backend.probe", mode]


def run_check(command: Optional[Callable[[str], Sequence[str]]] = None) -> Verdict:
    """Decode with and without the extra buffer types (and, where the build has the repacked
    kernels beside others, with those alone), each in a child process, all at once; a child
    that dies by a signal is a fault. Never raises for what a child does."""
    command = command or child_command
    extra = extra_buffer_types()
    modes = MODES if REPACK in extra and len(extra) > 1 else MODES[:2]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONFAULTHANDLER="0")
    procs = {mode: subprocess.Popen(list(command(mode)), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    env=env, text=True)
             for mode in modes}
    results = {}
    for mode, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(1.0, CHECK_TIMEOUT - (time.perf_counter() - t0)))
            results[mode] = (proc.returncode, out)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            results[mode] = (None, out)
    seconds = time.perf_counter() - t0

    def death(mode: str) -> str:
        rc, out = results[mode]
        step = (out or "").strip().splitlines()[-1:] or [""]
        where = step[0].removeprefix("step ").strip()
        if rc is None:
            return f"no answer within {CHECK_TIMEOUT:g} s" + (f" on {where}" if where else "")
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return name + (f" on {where}" if where else "")
        return ""

    for mode, (rc, out) in results.items():
        if rc is not None and rc > 0:
            log.debug("CPU check child (%s) exited with %s: %s", mode, rc, (out or "")[-500:])
    cause_on, cause_off = death("on"), death("off")
    # the repacked kernels count as working only where their child finished its decodes
    repack = "repack" in results and results["repack"][0] == 0 and \
        (results["repack"][1] or "").strip().endswith("ok")
    return Verdict(extra_buffers=extra, faults=bool(cause_on), cause=cause_on or cause_off,
                   fallback_faults=bool(cause_off), seconds=round(seconds, 3),
                   timed_out=any(rc is None for rc, _ in results.values()), repack=repack,
                   checked=datetime.datetime.now(datetime.timezone.utc)
                   .isoformat(timespec="seconds"))
