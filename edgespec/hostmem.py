"""Host memory for copies of a model's KV cells (:func:`host_bytes`).

numpy asks the kernel for transparent huge pages on every array of 4 MiB or more; where the
kernel then compacts memory on the page fault (``defrag`` set to ``madvise``, the default of
many distributions), first touching a fresh 44 MB array took 95-440 ms on the 2-core machine
this was measured on, where the same memory in 4 KiB pages took 19-27 ms and copying 1,870
tokens of SmolLM2's cells into it 5 ms (docs/decisions.md, "Copying the target's cells").
"""

from __future__ import annotations

import mmap

import numpy as np

# Below this numpy gives no advice: its own allocation is as fast.
_ADVISED = 4 << 20


def host_bytes(size: int) -> np.ndarray:
    """A writable uint8 array of ``size`` bytes, not zeroed for the caller (its contents are
    the kernel's zero pages or numpy's leftovers), in ordinary pages."""
    if size < _ADVISED or not hasattr(mmap, "MAP_PRIVATE"):
        return np.empty(size, dtype=np.uint8)
    # An anonymous private mapping, freed with the last array that views it.
    return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE), dtype=np.uint8)
