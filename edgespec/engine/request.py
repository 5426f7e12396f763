"""One generation's request, and what the Engine prepares to carry it out.

A :class:`GenerationRequest` is what a caller asks for (a prompt, limits, sampling, tools),
checked once, when it is made: every edge in front of the Engine (the Python API's keyword
arguments, ``edgespec run``, the chat, the server's OpenAI, Ollama and Anthropic bodies) builds
one and hands it to :meth:`Engine.submit <edgespec.engine.engine.Engine.submit>`. The same
object travels to the loop: the Engine's prompter tokenizes its prompt into a
:class:`Prepared` that holds it (the tokens, the grammar's state, the speculation), and
:func:`edgespec.engine.generation.run_generation` reads its limits and sampling from it.
The range of each parameter is checked in one place, when the request is made:
:class:`~edgespec.config.SamplingParams` for sampling, :func:`check_max_tokens`,
:func:`check_stop` and :func:`check_logprobs` for the rest. An edge whose API states a lower
bound passes it as the request is made (``context``, ``logprobs_max``, as SamplingParams takes
``temperature_max``) and names a refused field as its client sent it
(:func:`edgespec.server.wire.generation_request`).
"""

from __future__ import annotations

import copy
from dataclasses import InitVar, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from .. import config
from ..config import SamplingParams
from ..errors import InvalidParameterError
from ..results import Generation

if TYPE_CHECKING:
    from ..constraints import Constraint, GrammarState
    from .drafting import Speculation

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
    ``infill_files``: with a suffix, other files' ``(filename, text)`` before the gap's, as
    llama.cpp's ``/infill`` sends them (the model's repo-level tokens where it has them), the
    prompt cut to fit the context as that does; None: the plain prefix-suffix-middle prompt.
    ``index_key``: whose earlier requests its drafts may come from and it adds to (a
    server's API key, digested; None: the Engine's own callers; see
    :mod:`edgespec.drafting.suffix`). :meth:`Engine.stream <edgespec.engine.engine.Engine.stream>`
    documents each; its defaults are these."""

    prompt: Prompt
    max_tokens: int = config.MAX_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
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
    infill_files: Optional[Sequence[tuple[str, str]]] = None
    # The bounds an edge's API states (not fields: the checks below are the only ones):
    # ``context``, the tokens of context the request runs in, which max_tokens may not pass
    # (None: any; OpenAI's routes refuse more, the loop would stop at the context's end);
    # ``logprobs_max``, the most alternatives to a token (OpenAI's legacy completions: 5).
    context: InitVar[Optional[int]] = None
    logprobs_max: InitVar[int] = config.MAX_LOGPROBS

    def __post_init__(self, context: Optional[int], logprobs_max: int) -> None:
        if self.sampling is None:
            object.__setattr__(self, "sampling", SamplingParams())
        elif not isinstance(self.sampling, SamplingParams):
            raise InvalidParameterError("sampling", type(self.sampling).__name__,
                                        "a SamplingParams")
        check_max_tokens(self.max_tokens, most=context)
        object.__setattr__(self, "stop", check_stop(self.stop))
        check_logprobs(self.logprobs, most=logprobs_max)
        if self.infill_files is not None:
            object.__setattr__(self, "infill_files", check_infill_files(self.infill_files,
                                                                        self.suffix))

    def keyed(self, index_key: Optional[str]) -> "GenerationRequest":
        """This request with ``index_key``. Its fields were checked when it was made, with its
        API's bounds; a copy is not checked again (``dataclasses.replace`` would, without
        them)."""
        out = copy.copy(self)
        object.__setattr__(out, "index_key", index_key)
        return out

    @classmethod
    def of(cls, prompt: Prompt, **options) -> "GenerationRequest":
        """A request from keyword arguments (:meth:`Engine.stream
        <edgespec.engine.engine.Engine.stream>`'s); a name it does not have is an
        :class:`~edgespec.errors.InvalidParameterError`."""
        unknown = sorted(set(options) - _FIELDS)
        if unknown:
            raise InvalidParameterError(unknown[0], options[unknown[0]],
                                        "left out: not a generation option (see "
                                        "edgespec.GenerationRequest)")
        return cls(prompt, **options)


_FIELDS = {f.name for f in fields(GenerationRequest)} - {"prompt"}


@dataclass(frozen=True)
class Prepared:
    """A :class:`GenerationRequest` made ready to run: ``request`` itself (its limits, stops
    and sampling are read from it, not copied), ``prompt`` (token ids, with the tools it may
    call declared), ``grammar``: the output's constraint at its start; ``finish``: turns the
    result into its final form (tool calls read from the output); ``speculation``: None for
    plain decoding."""

    request: GenerationRequest
    prompt: list
    grammar: Optional["GrammarState"] = None
    finish: Optional[Callable[[Generation], Generation]] = None
    speculation: Optional["Speculation"] = None

    @property
    def speculative(self) -> bool:
        return self.speculation is not None


def check_max_tokens(value: Any, most: Optional[int] = None) -> int:
    """``value`` as the most tokens to generate: an integer >= 1 (at most ``most``, the
    context size, where an edge holds it to one)."""
    if (not isinstance(value, int) or isinstance(value, bool) or value < 1
            or (most is not None and value > most)):
        raise InvalidParameterError("max_tokens", value, "an integer >= 1" if most is None
                                    else f"an integer in [1, {most}] (the context size)")
    return value


def check_stop(value: Any, name: str = "stop", most: Optional[int] = None,
               one_string: bool = True) -> tuple:
    """``value`` as stop strings: a list of non-empty strings (at most ``most``), or, where
    ``one_string``, one string; a tuple."""
    stop = [value] if one_string and isinstance(value, str) else value
    if (not isinstance(stop, (list, tuple)) or (most is not None and len(stop) > most)
            or any(not isinstance(s, str) or not s for s in stop)):
        many = "a list" if most is None else f"a list of at most {most}"
        raise InvalidParameterError(name, list(value) if isinstance(value, tuple) else value,
                                    ("a non-empty string or " if one_string else "")
                                    + f"{many} non-empty strings")
    return tuple(stop)


def check_infill_files(value: Any, suffix: Optional[str]) -> tuple:
    """``value`` as a fill in the middle's other files: ``(filename, text)`` pairs of strings,
    with a suffix given; a tuple of tuples."""
    if (suffix is None or not isinstance(value, (list, tuple))
            or any(not isinstance(f, (list, tuple)) or len(f) != 2
                   or not all(isinstance(s, str) for s in f) for f in value)):
        raise InvalidParameterError("infill_files", value, "None, or with a suffix a list of "
                                    "(filename, text) pairs of strings")
    return tuple((name, text) for name, text in value)


def check_logprobs(value: Any, most: int = config.MAX_LOGPROBS) -> Optional[int]:
    """``value`` as the number of alternatives to each token's log probability: None or an
    integer in [0, ``most``]."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or not 0 <= value <= most):
        raise InvalidParameterError("logprobs", value, f"None or an integer in [0, {most}]")
    return value
