"""The llama.cpp adapter: the only package that imports ``llama_cpp``.

- :mod:`.runtime` — backend initialisation, its log, the ggml library, devices, heap trim
- :mod:`.model` — :class:`LlamaModel`: one GGUF and its context (eval, truncate, tokenize)
- :mod:`.sequence` — one sequence of a context (a lane's cache), its states copied aside
- :mod:`.step_hooks` — what a model tells of each pass (the thread governors' hooks)
- :mod:`.weights` — loading a GGUF's weights, with or without the extra CPU buffers
- :mod:`.embedding` — an embedding model's context and pooling
- :mod:`.tap` — the eval-callback tap that reads the final hidden state
- :mod:`.vocab` — vocabularies and the pair compatibility check
- :mod:`.vocab_map` — the map between two vocabularies, for a draft of another family
- :mod:`.quantize` — llama.cpp's quantizer
- :mod:`.peer` — llama-cpp-python's high-level API, for benchmarks
- :mod:`.rpc` — llama.cpp's RPC backend (workers, endpoints, probes), through ctypes
- :mod:`.remote` — a model whose layers are on RPC workers, run in a child process
- :mod:`.pair` — a target and its draft opened as one step (the pair check included)
- :mod:`.preflight` — a child process (:mod:`.probe`) checks that llama.cpp's extra CPU
  kernels (AMX, repacked weights) do not kill the process on this CPU, before a model uses them
"""

from .model import LlamaModel
from .pair import open_pair, same_network
from .preflight import info as cpu_check_info
from .quantize import FTYPES, check_ftype, quantize
from .remote import RemoteModel, open_model
from .rpc import placement, rpc_endpoints
from .runtime import LLAMA_CPP_VERSION, backend_info, release_free_heap
from .vocab import (GrammarVocab, VocabOnly, check_compatible, check_compatible_files,
                    file_fim)
from .vocab_map import VocabMap, check_pair, check_pair_files

__all__ = ["LlamaModel", "FTYPES", "check_ftype", "quantize", "LLAMA_CPP_VERSION",
           "backend_info", "cpu_check_info", "release_free_heap", "GrammarVocab", "VocabOnly",
           "file_fim", "check_compatible", "check_compatible_files", "RemoteModel", "open_model",
           "placement", "rpc_endpoints", "open_pair", "same_network", "VocabMap", "check_pair",
           "check_pair_files"]
