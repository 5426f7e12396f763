"""One generation's request, as asked for and as carried out, and the speculation decided
once for it.

A :class:`GenerationRequest` is what a caller asks for (a prompt, limits, sampling, tools):
every protocol in front of the Engine (the Python API's keyword arguments, the server's
OpenAI and Ollama bodies) builds one and hands it to :meth:`edgespec.engine.engine.Engine.submit`,
which checks it, tokenizes the prompt and builds a :class:`Request`;
:func:`edgespec.engine.generation.run_generation` carries that out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from .. import config
from ..config import SamplingParams
from ..errors import InvalidParameterError
from ..results import Generation

if TYPE_CHECKING:
    from ..constraints import Constraint, GrammarState
    from ..drafting import Drafter
    from ..drafting.suffix import SuffixIndex
    from .lanes import Lane

Prompt = Union[str, Sequence[Mapping[str, str]]]


@dataclass(frozen=True)
class GenerationRequest:
    """What one generation asks for, before anything is checked or tokenized.

    ``prompt``: a text, or chat messages; ``raw=True`` sends a text as-is, else it is wrapped
    as a user message in the model's chat template. At most ``max_tokens``, sampled with
    ``sampling``, stopped at any of ``stop``; ``speculative=False`` decodes with the target
    alone. ``constraint``: the output matches it (a :class:`~edgespec.constraints.
    Constraint`); ``tools`` / ``tool_choice`` / ``parallel_tool_calls``: functions the model
    may call; ``logprobs``: each token's log probability with this many alternatives;
    ``think``: a thinking model's reasoning on or off (None: its template's default).
    ``suffix``: fill in the middle: the output goes between ``prompt`` (a text, sent as-is)
    and this text, in the model's fill-in-the-middle tokens (code models; None: no suffix).
    ``index_key``: whose earlier requests its drafts may come from and it adds to (a
    server's API key, digested; None: the Engine's own callers; see
    :mod:`edgespec.drafting.suffix`). :meth:`Engine.stream <edgespec.engine.engine.Engine.stream>`
    documents each; its defaults are these."""

    prompt: Prompt
    max_tokens: int = config.MAX_TOKENS
    sampling: Optional[SamplingParams] = None      # None: SamplingParams()
    speculative: bool = True
    raw: bool = False
    stop: Sequence[str] = ()
    constraint: Optional["Constraint"] = None
    tools: Optional[Sequence] = None
    tool_choice: Any = None
    parallel_tool_calls: bool = False
    logprobs: Optional[int] = None
    think: Any = None
    index_key: Optional[str] = None
    suffix: Optional[str] = None


@dataclass(frozen=True)
class Speculation:
    """How one generation drafts, decided before it starts: the drafter of the lane it gets
    (asked for once it holds one: the lane's draft model, reduced output layer and what its
    drafter learned), the cost model's seconds for a plain target pass (the speed-up's
    reference when no round was plain), the acceptance rule for unseeded sampling
    (``SpecConfig.verifier``), and the context as the lane's draft cache holds it
    (``draft_tokens``: the target's tokens in the draft's, for a draft of another
    vocabulary)."""

    drafter: Callable[["Lane"], Optional["Drafter"]]
    plain_cost: Callable[[], Optional[float]] = lambda: None
    verifier: str = "block"
    draft_tokens: Callable[["Lane", list[int]], list[int]] = lambda lane, tokens: tokens
    index: Optional["SuffixIndex"] = None   # earlier requests' tokens, read and fed


@dataclass(frozen=True)
class Request:
    """What to generate: ``prompt`` (token ids), at most ``max_tokens``, sampled with
    ``sampling``, stopped at any of ``stop``; ``grammar``: the output's constraint at its
    start; ``logprobs``: each token's log probability and this many alternatives;
    ``finish``: turns the result into its final form (tool calls read from the output);
    ``speculation``: None for plain decoding."""

    prompt: list
    max_tokens: int
    sampling: SamplingParams
    stop: tuple = ()
    grammar: Optional["GrammarState"] = None
    logprobs: Optional[int] = None
    finish: Optional[Callable[[Generation], Generation]] = None
    speculation: Optional[Speculation] = None

    @property
    def speculative(self) -> bool:
        return self.speculation is not None


def check_limits(max_tokens, stop, logprobs) -> tuple:
    """The caller's ``max_tokens``, ``stop`` (a string or a list) and ``logprobs`` checked
    (:class:`~edgespec.errors.InvalidParameterError` names the first bad one); the stop
    strings as a tuple."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidParameterError("max_tokens", max_tokens, "an integer >= 1")
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not isinstance(s, str) or not s for s in stop):
        raise InvalidParameterError("stop", list(stop), "a list of non-empty strings")
    if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                 or not 0 <= logprobs <= 20):
        raise InvalidParameterError("logprobs", logprobs, "None or an integer in [0, 20]")
    return stop
