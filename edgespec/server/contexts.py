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

Asking is checked before anything loads: at most the model's trained context (the GGUF's
``<arch>.context_length``; a larger one would be a silent degradation, not the context asked
for) or the ``max_ctx`` a server sets (an app serving one Engine that cannot be reloaded),
and within ``--max-ram``: :meth:`ContextPolicy.ask` raises
:class:`~edgespec.errors.InvalidParameterError` (a 400) naming the limit. Nothing is ever
loaded with less than was asked.
"""

from __future__ import annotations

from typing import Optional

from ..catalogue import CatalogEntry
from ..errors import InvalidParameterError
from .slots import Budget, gb


class ContextPolicy:
    """The contexts asked for, per model (see the module docstring). ``default``: the
    server's context (0: the loader's own); ``max_ctx``: the most any request may ask for
    (None: each model's trained context)."""

    def __init__(self, default: int, budget: Budget, max_ctx: Optional[int] = None):
        self.default, self.budget, self.max_ctx = default, budget, max_ctx
        self._asked: dict[str, int] = {}

    def load_context(self, entry: CatalogEntry) -> int:
        """The context ``entry`` is loaded with: the largest asked for it, at least the
        default (0 when neither is known: the loader's own)."""
        return max(self.default, self._asked.get(entry.name, 0))

    def ask(self, entry: CatalogEntry, n_ctx: Optional[int]) -> None:
        """A request asks ``entry`` for ``n_ctx`` tokens of context (None: any). Checked,
        then recorded for the model's next load; raises :class:`~edgespec.errors.
        InvalidParameterError` when it is over the model's trained context, ``max_ctx`` or
        the memory budget."""
        if n_ctx is None or n_ctx <= self.load_context(entry):
            return
        limit, why = self._limit(entry)
        if limit is not None and n_ctx > limit:
            raise InvalidParameterError("num_ctx", n_ctx, f"at most {limit} for the model "
                                        f"'{entry.name}' ({why})")
        need, ram = self.budget.memory(entry, n_ctx), self.budget.max_ram
        # (a model that does not fit even as it is gets the budget's own refusal)
        loaded = self.budget.memory(entry, self.load_context(entry))
        if ram is not None and need > ram >= loaded:
            fits = (ram - entry.size) // max(1, entry.kv_bytes_per_token)
            raise InvalidParameterError(
                "num_ctx", n_ctx, f"at most {fits} for the model '{entry.name}': at {n_ctx} "
                f"tokens it needs about {gb(need)} (files and KV cache), more than --max-ram "
                f"{gb(ram)} allows")
        self._asked[entry.name] = n_ctx

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
