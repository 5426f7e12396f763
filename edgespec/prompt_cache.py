"""The KV states of recent conversations, kept in host memory: :class:`PromptCache`.

One llama.cpp context holds one conversation. Without this, two chat windows served in turn
(or a chat beside an autocomplete) evaluate the whole prompt again at every switch, on both
models. With it, a generation whose prompt would throw away much of what a model's cache
holds first copies that state aside (``llama_state_seq_get_data``); and a generation whose
prompt shares a longer prefix with a state kept aside than with the live cache copies that
state back (``llama_state_seq_set_data``) and evaluates only what follows it. Copying a state
costs a memcpy of its KV cells (~20 KB a token for the small models here), evaluating it costs
a forward pass per batch.

Each model has its own states (the target's and the draft's caches hold the same tokens, but
the draft's may lag or be absent); a state may carry a companion's snapshot (the draft's
reduced output layer and the rows it added for that conversation). All states share one
budget in bytes; the least recently used go first, and a state whose tokens begin another
state of the same model is dropped when that longer one is kept. A restored state leaves the
cache (it is the live cache now; it is copied aside again when another conversation needs
the context).

Restoring is exact: the cells come back bit for bit, so the generation that follows is the
one a cache that had never left would give (greedy outputs are compared with a fresh Engine's
in tests/test_prompt_cache.py).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

from .errors import InvalidParameterError
from .lm import SavedState, StatefulModel, common_prefix

log = logging.getLogger(__name__)

# A state is kept aside, or brought back, only when it saves evaluating at least this many
# tokens: below that, evaluating is as cheap as copying.
MIN_TOKENS = 32


class Companion(Protocol):
    """State that follows a model's conversation (the reduced draft head)."""

    def snapshot(self) -> Any: ...

    def restore(self, snap: Any) -> None: ...

    @staticmethod
    def snapshot_bytes(snap: Any) -> int: ...


@dataclass(eq=False)
class _Entry:
    owner: object                 # the model whose caches can take it (its state_owner)
    state: SavedState
    companion_snap: Any = None
    nbytes: int = 0
    used: int = 0

    @property
    def tokens(self) -> tuple:
        return self.state.tokens


@dataclass
class CacheStats:
    """What the cache has done since it was made."""

    saved: int = 0                # states copied aside
    restored: int = 0             # states copied back
    tokens_restored: int = 0      # prompt tokens not evaluated thanks to a restore
    evicted: int = 0              # states dropped for the budget


class PromptCache:
    """Conversations' KV states in host memory, at most ``max_bytes`` in all (see the module
    docstring). Used by generations in turn (under an Engine's turnstile); :meth:`describe`
    may be read from any thread."""

    def __init__(self, max_bytes: int, min_tokens: int = MIN_TOKENS):
        self.max_bytes = max(0, int(max_bytes))
        self.min_tokens = min_tokens
        self._entries: list[_Entry] = []
        self._clock = 0
        self._lock = threading.Lock()
        self.stats = CacheStats()

    @classmethod
    def of_mib(cls, cache_ram) -> "PromptCache":
        """A cache of ``cache_ram`` MiB (an Engine's option: 0 turns it off)."""
        if not isinstance(cache_ram, int) or isinstance(cache_ram, bool) or cache_ram < 0:
            raise InvalidParameterError("cache_ram", cache_ram, "an integer >= 0 (MiB; 0 "
                                        "turns the prompt cache off)")
        return cls(cache_ram * 2**20)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def describe(self) -> dict:
        with self._lock:
            return {"states": len(self._entries), "bytes": self.nbytes,
                    "max_bytes": self.max_bytes, "saved": self.stats.saved,
                    "restored": self.stats.restored,
                    "tokens_restored": self.stats.tokens_restored,
                    "evicted": self.stats.evicted}

    def prepare(self, model: StatefulModel, want: Sequence[int],
                companion: Optional[Companion] = None) -> int:
        """Before ``model``'s cache is made to hold ``want``: keep its live state aside when
        ``want`` would discard much of it, and bring back a kept state that shares a longer
        prefix with ``want``. Returns the number of tokens a restore brought back (0: none).
        ``companion``'s snapshot travels with the model's state."""
        if not self.enabled:
            return 0
        want = list(want)
        live = model.tokens
        keep = common_prefix(live, want)
        best, best_n = None, keep
        # A recurrent state cannot be cut back without a checkpoint, which a kept state does
        # not carry: on such a model only a state that begins ``want`` (short of its last
        # token, which the prefill evaluates) is of use.
        whole = getattr(model.state_owner, "recurrent", False)
        for e in self._entries:
            if e.owner is model.state_owner:
                n = common_prefix(e.tokens, want)
                if whole and not n == len(e.tokens) < len(want):
                    continue
                if n > best_n:
                    best, best_n = e, n
        if best is not None and best_n - keep < self.min_tokens:
            best = None
        if best is not None:
            with self._lock:      # out of the cache: it becomes the live state
                self._entries.remove(best)
        if len(live) - keep >= self.min_tokens:
            self._save(model, companion)
        if best is None:
            return 0
        model.restore_state(best.state)
        if companion is not None and best.companion_snap is not None:
            companion.restore(best.companion_snap)
        self.stats.restored += 1
        self.stats.tokens_restored += best_n
        log.debug("prompt cache: restored %d tokens of %s", best_n, model.path.name)
        return best_n

    def _save(self, model: StatefulModel, companion: Optional[Companion]) -> None:
        state = model.save_state()
        snap = companion.snapshot() if companion is not None else None
        nbytes = state.nbytes + (companion.snapshot_bytes(snap) if snap is not None else 0)
        if nbytes > self.max_bytes:
            return
        self._clock += 1
        entry = _Entry(model.state_owner, state, snap, nbytes, self._clock)
        with self._lock:
            # a state that begins this one is covered by it
            self._entries = [e for e in self._entries if not (
                e.owner is model.state_owner and len(e.tokens) <= len(state.tokens)
                and state.tokens[:len(e.tokens)] == e.tokens)]
            self._entries.append(entry)
            while self.nbytes > self.max_bytes:
                oldest = min(self._entries, key=lambda e: e.used)
                self._entries.remove(oldest)
                self.stats.evicted += 1
        self.stats.saved += 1
        log.debug("prompt cache: kept %d tokens of %s aside (%d states, %.1f MiB)",
                  len(state.tokens), model.path.name, len(self._entries), self.nbytes / 2**20)

    def forget(self, model=None) -> None:
        """Drop every state (of ``model`` only, when given)."""
        with self._lock:
            self._entries = [e for e in self._entries
                             if model is not None and e.owner is not model.state_owner]
