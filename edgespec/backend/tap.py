"""The hidden-state tap: stop a llama.cpp graph right after the final norm and read it.

Uses llama.cpp's public scheduler eval callback (``cb_eval``, as its eval-callback and
imatrix tools do): asked about each graph node, the callback claims ``result_norm``, copies
the rows of the pass's outputs from it, and returns false, which ends the graph before the
output layer. Every layer writes the KV cache before that node, so the cache stays complete.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

# The final normed hidden state is named "result_norm" in every llama.cpp model graph; the
# output layer (the language-model head) is computed right after it.
HIDDEN_NODE = b"result_norm"

EVAL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)


class Tap:
    """State of one context's eval callback: while ``on``, the graph stops after the final
    norm and its last ``rows`` rows (one per output of the pass) land in ``hidden``,
    ``(rows, n_embd)``. ``c_callback`` must stay alive as long as a context can call it."""

    def __init__(self, lib: ctypes.CDLL, n_embd: int):
        self.on = False
        self.rows = 1           # outputs of the pass (the last rows of the node are theirs)
        self.hidden: Optional[np.ndarray] = None
        get_name, get_data, nelements = lib.ggml_get_name, lib.ggml_get_data_f32, \
            lib.ggml_nelements

        # Reading every node's name through ctypes costs ~0.3 ms a step (docs/decisions.md).
        # Node addresses repeat from step to step (llama.cpp rebuilds a graph in the same
        # memory), so each address is named once. A hit is always re-checked by name; a stale
        # "not it" can only hide the node, and then the whole graph runs and :meth:`take`
        # forgets them.
        self.known: dict[int, bool] = {}
        known = self.known

        def callback(t, ask, _user):
            if ask:
                if not self.on:
                    return False
                hit = known.get(t)
                if hit is None or hit:
                    hit = known[t] = get_name(t) == HIDDEN_NODE
                return hit
            n, want = nelements(t), self.rows * n_embd
            if n >= want:
                buf = (ctypes.c_float * want).from_address(get_data(t) + 4 * (n - want))
                self.hidden = np.frombuffer(buf, dtype=np.float32).reshape(self.rows, n_embd) \
                    .copy()
            return False
        self.c_callback = EVAL_CALLBACK(callback)

    def take(self) -> Optional[np.ndarray]:
        """The hidden state of the pass that just ran (None: the graph ran whole, so the
        cached node addresses are stale and are forgotten)."""
        h, self.hidden = self.hidden, None
        if h is None:
            self.known.clear()
        return h
