"""The context each model is loaded with, when requests ask for one (Ollama's
``options.num_ctx``, ``num_ctx`` on OpenAI's routes).

The rule, the same for every model: a model is loaded with the largest context asked for it
so far, and at least the server's own (``--ctx-size``). A request served by a model loaded
with at least the context it asks for uses it as it is: no reload for less. A request that
asks for more reloads the model with that context once the requests using it have ended
(the manager never unloads a model under a lease); requests arriving meanwhile wait for the
reload and are served by it. The contexts asked for only grow (until the server stops),
so requests that ask for different contexts reload a model at most once per larger
context, never back and forth, and a model unloaded when idle comes back with the context
its clients asked for.

Asking more than a model can have is clamped, as Ollama does: to the model's trained context
(the GGUF's ``<arch>.context_length``; more would be a silent degradation) or the ``max_ctx``
a server sets (an app serving one Engine that cannot be reloaded); the log says so, and the
response's ``X-Edgespec-Num-Ctx`` header gives the context served (apps such as aider send
``num_ctx`` = 1.25 × the prompt + 8192 on every request, and retry a refusal until they give
up). Only what ``--max-ram`` cannot hold is refused: :meth:`ContextPolicy.ask` raises
:class:`~edgespec.errors.InvalidParameterError` (a 400) naming the most that fits.

Without ``--ctx-size`` (``default`` 0 and ``auto``), each model's own default is chosen
(:func:`auto_context`): its trained context, as far as its files and the KV caches of both
models for every lane fit in ``--max-ram`` or, without one, a quarter of this machine's
memory; never below llama.cpp's usual 4096 (or the trained context, if smaller).
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from .. import config
from ..catalogue import CatalogEntry, ModelKind
from ..errors import InvalidParameterError
from .slots import Budget, gb

log = logging.getLogger("edgespec.server")

AUTO_RAM_SHARE = 0.25          # of the machine's memory, for one model's default context
CONTEXT_STEP = 256             # a chosen context is a multiple of this


def machine_memory() -> Optional[int]:
    """Bytes of physical memory (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def auto_context(entry: CatalogEntry, budget: Budget) -> tuple[int, str]:
    """The context ``entry`` is loaded with when the server was given no ``--ctx-size``, and
    why, in words (see the module docstring)."""
    trained = entry.n_ctx_train or config.N_CTX
    floor = min(config.N_CTX, trained)
    if budget.max_ram is not None:
        ram, where = budget.max_ram, f"--max-ram {gb(budget.max_ram)}"
    else:
        total = machine_memory()
        if total is None:
            return floor, "the usual default: this machine does not say its memory"
        ram, where = int(total * AUTO_RAM_SHARE), f"a quarter of this machine's {gb(total)}"
    per_token = budget.memory(entry, 1) - entry.size
    fits = (ram - entry.size) // per_token if per_token > 0 else trained
    n = max(floor, min(trained, fits) // CONTEXT_STEP * CONTEXT_STEP)
    lanes = budget.parallel if entry.kind is not ModelKind.EMBEDDING else 1
    if n == trained:
        why = f"the context it was trained with; {lanes} lane(s) fit in {where}"
    elif n == floor:
        why = f"the usual default: more does not fit {where}"
    else:
        why = f"the most that fits {where} with {lanes} lane(s); trained with {trained}"
    return n, why


class ContextPolicy:
    """The contexts asked for, per model (see the module docstring). ``default``: the
    server's context (0: the loader's own, or with ``auto``, each model's :func:`auto_context`);
    ``max_ctx``: the most any request may have (None: each model's trained context)."""

    def __init__(self, default: int, budget: Budget, max_ctx: Optional[int] = None,
                 auto: bool = False):
        self.default, self.budget, self.max_ctx, self.auto = default, budget, max_ctx, auto
        self._asked: dict[str, int] = {}
        self._auto: dict[str, tuple[int, str]] = {}

    def base(self, entry: CatalogEntry) -> int:
        """The context ``entry`` is loaded with when no request asked for more."""
        if not self.auto:
            return self.default
        if entry.name not in self._auto:
            self._auto[entry.name] = auto_context(entry, self.budget)
        return self._auto[entry.name][0]

    def why(self, entry: CatalogEntry) -> str:
        """Why ``entry`` has its :meth:`base` context, in words."""
        if not self.auto:
            return "--ctx-size"
        self.base(entry)
        return self._auto[entry.name][1]

    def load_context(self, entry: CatalogEntry) -> int:
        """The context ``entry`` is loaded with: the largest asked for it, at least the
        base (0 when neither is known: the loader's own)."""
        return max(self.base(entry), self._asked.get(entry.name, 0))

    def clamp(self, entry: CatalogEntry, n_ctx: Optional[int]) -> Optional[int]:
        """``n_ctx`` within what ``entry`` can have (its trained context, ``max_ctx``)."""
        limit, _ = self._limit(entry)
        return n_ctx if n_ctx is None or limit is None else min(n_ctx, limit)

    def ask(self, entry: CatalogEntry, n_ctx: Optional[int]) -> Optional[int]:
        """A request asks ``entry`` for ``n_ctx`` tokens of context (None: any): the context
        it gets, clamped (and logged) where more than the model can have, recorded for the
        model's next load; raises :class:`~edgespec.errors.InvalidParameterError` when the
        memory budget cannot hold it."""
        if n_ctx is None:
            return None
        clamped = self.clamp(entry, n_ctx)
        if clamped != n_ctx:
            _, why = self._limit(entry)
            log.warning("num_ctx %d asked for %s is more than its %d tokens (%s): served "
                        "with %d", n_ctx, entry.name, clamped, why, clamped)
        if clamped <= self.load_context(entry):
            return clamped
        need, ram = self.budget.memory(entry, clamped), self.budget.max_ram
        # (a model that does not fit even as it is gets the budget's own refusal)
        loaded = self.budget.memory(entry, self.load_context(entry))
        if ram is not None and need > ram >= loaded:
            per_token = max(1, self.budget.memory(entry, 1) - entry.size)
            fits = (ram - entry.size) // per_token
            raise InvalidParameterError(
                "num_ctx", n_ctx, f"at most {fits} for the model '{entry.name}': at {clamped} "
                f"tokens it needs about {gb(need)} (files and KV cache), more than --max-ram "
                f"{gb(ram)} allows")
        self._asked[entry.name] = clamped
        return clamped

    def failed(self, entry: CatalogEntry) -> None:
        """Loading ``entry`` with its context failed: forget what was asked for it, so that
        the next load tries the default again (a request may ask again)."""
        self._asked.pop(entry.name, None)

    def _limit(self, entry: CatalogEntry) -> tuple[Optional[int], str]:
        if self.max_ctx is not None:
            return self.max_ctx, "this server cannot load it with another context"
        if entry.n_ctx_train:
            return entry.n_ctx_train, "the context it was trained with"
        return None, ""

    def serves(self, loaded: int, n_ctx: Optional[int]) -> bool:
        """Whether a model loaded with ``loaded`` tokens serves a request asking ``n_ctx``."""
        return n_ctx is None or n_ctx <= loaded
