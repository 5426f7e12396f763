"""One exception hierarchy for edgespec.

Every message is written for the person at the keyboard: it names the problem and, where
there is one, the fix, in the Python API's terms (``n_ctx``, ``speculative=False``); an error
lists those parameters in ``options``, and a shell adds its own name for each (the command
line's ``--ctx-size``, ``--no-spec``). The command-line shells print ``error: <message>`` and
exit 1; the Python API lets these propagate so that an embedding application can do the same.
"""

from __future__ import annotations


class EdgespecError(Exception):
    """Base class of every error edgespec raises on purpose. ``options``: the API parameters
    that the message asks the user to change (a shell names its own flag for each)."""

    options: tuple = ()

    def __init__(self, *args, options: tuple = ()):
        super().__init__(*args)
        if options:
            self.options = tuple(options)


class InvalidParameterError(EdgespecError, ValueError):
    """A sampling or runtime parameter is out of its valid range. ``options``: by default the
    parameter it names (the one to change)."""

    def __init__(self, name: str, value: object, valid: str, *, options: tuple = ()):
        self.name, self.value, self.valid = name, value, valid
        super().__init__(f"{name}={value!r} is invalid: {name} must be {valid}",
                         options=options or (name,))


class ModelLoadError(EdgespecError):
    """A model file is missing, unreadable, not a GGUF, or not something we can run."""

    def __init__(self, path: object, reason: str, *, options: tuple = ()):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}", options=options)


class InvalidModelError(ModelLoadError):
    """The file exists but is not a valid GGUF model."""

    def __init__(self, path: object, reason: str):
        super().__init__(path, f"not a valid GGUF model ({reason})")
        self.reason = reason


class IncompatiblePairError(EdgespecError):
    """The draft model neither shares the target's tokenizer nor enough of its tokens to
    draft across vocabularies."""

    options = ("draft",)

    def __init__(self, difference: str):
        self.difference = difference
        super().__init__(
            f"draft and target are not compatible: {difference}; pick a draft that shares the "
            "target's tokenizer or most of its tokens (one of the same model family drafts "
            "best), or load the target without a draft")


class ContextOverflowError(EdgespecError):
    """The prompt alone does not fit in the context window."""

    options = ("n_ctx",)

    def __init__(self, n_prompt: int, n_ctx: int):
        self.n_prompt, self.n_ctx = n_prompt, n_ctx
        super().__init__(
            f"prompt is {n_prompt} tokens but the context holds {n_ctx}: shorten the prompt "
            "or load the models with a larger n_ctx")


class InputTooLongError(ContextOverflowError):
    """A text to embed is longer than the model embeds, and truncating was not allowed."""

    options = ("truncate",)

    def __init__(self, index: int, n_tokens: int, n_ctx: int):
        self.index = index
        EdgespecError.__init__(
            self, f"input {index} is {n_tokens} tokens but this model embeds at most {n_ctx} "
            f"(its context): shorten it, or pass truncate=True to embed its first {n_ctx}")
        self.n_prompt, self.n_ctx = n_tokens, n_ctx


class BackendError(EdgespecError):
    """llama.cpp refused an operation (decode failure, cache that cannot be trimmed, …)."""


class TemplateError(EdgespecError):
    """A chat template could not be rendered within its limits (time, size, sandbox)."""


class TemplateRefused(EdgespecError):
    """The model's own template rejected the conversation (its ``raise_exception``)."""


class PromptTooLargeError(EdgespecError):
    """The conversation is too large to be turned into a prompt."""


class ConstraintError(EdgespecError, ValueError):
    """A JSON schema, regular expression, grammar or tool definition cannot be used (the
    grammar engine's message says why), or an output does not match it."""


class ConversationFileError(EdgespecError):
    """A saved conversation could not be read or written."""


class ModelNotFoundError(EdgespecError):
    """A named model or pair is not available locally."""


class EngineClosedError(EdgespecError):
    """The Engine was closed; load a new one."""


class MemoryBudgetError(EdgespecError):
    """A model needs more memory than the budget a server was given for its models
    (``--max-ram``): the message names the model, its estimate and the budget."""


class EngineBusyError(EdgespecError):
    """This thread would wait for a generation that only it can finish (a stream it left
    open on the same Engine)."""


class RPCError(BackendError):
    """An RPC worker cannot be reached, speaks another protocol, or stopped during a pass; or
    llama.cpp was built without RPC. The message names the endpoint and the fix."""
