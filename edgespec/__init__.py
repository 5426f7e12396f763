"""edgespec: lossless speculative decoding for local GGUF models on llama.cpp.

>>> from edgespec import Engine, SamplingParams
>>> with Engine.load(target="target.gguf", draft="draft.gguf") as eng:   # doctest: +SKIP
...     print(eng.generate("Hello", sampling=SamplingParams(temperature=0)).text)

``import edgespec`` is cheap: the Engine (and llama.cpp with it) loads on first use of a name
that needs it, so the pure parts (``edgespec.speculative``, ``edgespec.drafting``, the
verifier) import without llama.cpp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .config import SamplingParams, SpecConfig
from .errors import (BackendError, ConstraintError, ContextOverflowError, EdgespecError,
                     EngineBusyError, EngineClosedError, IncompatiblePairError,
                     InputTooLongError, InvalidModelError, InvalidParameterError, ModelLoadError,
                     ModelNotFoundError, PromptTooLargeError, TemplateError, TemplateRefused)
from .engine.request import GenerationRequest
from .results import Generation, GenerationStats, StreamEvent, TokenLogprob

if TYPE_CHECKING:
    from .constraints import Constraint
    from .embedding import Embedder, Embeddings
    from .engine.engine import Engine
    from .engine.streams import AsyncStream, Stream
    from .tools import Tool, ToolCall

__version__ = "0.1.0"

_LAZY = {"Engine": "engine.engine", "Embedder": "embedding", "Embeddings": "embedding",
         "Stream": "engine.streams", "AsyncStream": "engine.streams",
         "Constraint": "constraints", "Tool": "tools", "ToolCall": "tools"}

__all__ = ["Engine", "Embedder", "Embeddings", "GenerationRequest", "SamplingParams",
           "SpecConfig", "Generation",
           "GenerationStats", "Stream", "AsyncStream", "StreamEvent", "TokenLogprob",
           "Constraint", "Tool", "ToolCall",
           "EdgespecError", "InvalidParameterError", "ConstraintError",
           "ModelLoadError", "InvalidModelError", "IncompatiblePairError", "ContextOverflowError",
           "InputTooLongError",
           "BackendError", "ModelNotFoundError", "EngineClosedError", "EngineBusyError",
           "TemplateError", "TemplateRefused", "PromptTooLargeError", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
