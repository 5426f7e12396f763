"""edgespec: lossless speculative decoding for local GGUF models on llama.cpp.

>>> from edgespec import Engine, SamplingParams
>>> with Engine.load(target="target.gguf", draft="draft.gguf") as eng:   # doctest: +SKIP
...     print(eng.generate("Hello", sampling=SamplingParams(temperature=0)).text)
"""

from .config import SamplingParams, SpecConfig
from .engine import Engine, Generation, GenerationStats, StreamEvent
from .errors import (BackendError, ContextOverflowError, EdgespecError, EngineBusyError,
                     EngineClosedError, IncompatiblePairError, InvalidModelError,
                     InvalidParameterError, ModelLoadError, ModelNotFoundError)
from .streams import AsyncStream, Stream

__version__ = "0.1.0"

__all__ = ["Engine", "SamplingParams", "SpecConfig", "Generation", "GenerationStats", "Stream",
           "AsyncStream", "StreamEvent", "EdgespecError", "InvalidParameterError",
           "ModelLoadError", "InvalidModelError", "IncompatiblePairError", "ContextOverflowError",
           "BackendError", "ModelNotFoundError", "EngineClosedError", "EngineBusyError",
           "__version__"]
