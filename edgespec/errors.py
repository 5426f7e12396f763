"""One exception hierarchy for edgespec.

Every message is written for the person at the keyboard: it names the problem and, where
there is one, the fix. The command-line shells print ``error: <message>`` and exit 1; the
Python API lets these propagate so that an embedding application can do the same.
"""

from __future__ import annotations


class EdgespecError(Exception):
    """Base class of every error edgespec raises on purpose."""


class InvalidParameterError(EdgespecError, ValueError):
    """A sampling or runtime parameter is out of its valid range."""

    def __init__(self, name: str, value: object, valid: str):
        self.name, self.value, self.valid = name, value, valid
        super().__init__(f"{name}={value!r} is invalid: {name} must be {valid}")


class ModelLoadError(EdgespecError):
    """A model file is missing, unreadable, not a GGUF, or not something we can run."""

    def __init__(self, path: object, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


class InvalidModelError(ModelLoadError):
    """The file exists but is not a valid GGUF model."""

    def __init__(self, path: object, reason: str):
        super().__init__(path, f"not a valid GGUF model ({reason})")
        self.reason = reason


class IncompatiblePairError(EdgespecError):
    """The draft model does not share the target's tokenizer."""

    def __init__(self, difference: str):
        self.difference = difference
        super().__init__(
            f"draft and target are not compatible: {difference}; the draft must share the "
            "target's tokenizer (same vocabulary and special tokens) — pick a draft of the same "
            "model family, or run with --no-spec")


class ContextOverflowError(EdgespecError):
    """The prompt alone does not fit in the context window."""

    def __init__(self, n_prompt: int, n_ctx: int):
        self.n_prompt, self.n_ctx = n_prompt, n_ctx
        super().__init__(
            f"prompt is {n_prompt} tokens but the context holds {n_ctx}: shorten the prompt "
            "or load the models with a larger n_ctx (--ctx-size)")


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


class Cancelled(EdgespecError):
    """A generation was cancelled before it started producing tokens."""


class EngineClosedError(EdgespecError):
    """The Engine was closed; load a new one."""


class EngineBusyError(EdgespecError):
    """This thread would wait for a generation that only it can finish (a stream it left
    open on the same Engine)."""


class RPCError(BackendError):
    """An RPC worker cannot be reached, speaks another protocol, or stopped during a pass; or
    llama.cpp was built without RPC. The message names the endpoint and the fix."""
