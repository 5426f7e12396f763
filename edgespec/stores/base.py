"""What every store reader gives back (:class:`StoreFile`), and whether llama.cpp can load a
file, read from its GGUF header (:func:`header_problem`, cached by path, size and mtime)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from ..errors import EdgespecError, ModelLoadError
from ..gguf_file import (GGUFInfo, check_causal_lm, check_embedding_model, is_embedding_model,
                         read_gguf)

# Tensor name prefixes of a vision or audio encoder and its projector (llama.cpp's mtmd files):
# a text model's file holds none; Ollama's own engine keeps them inside the model file.
ENCODER_PREFIXES = ("v.", "mm.", "a.")
MAX_CHECKS_KEPT = 1024


@dataclass(frozen=True)
class StoreFile:
    """A model file found in another app's store.

    ``name``: the name that app shows (and edgespec accepts); ``path``: the file itself,
    handed to llama.cpp as it is (an Ollama blob, a Hugging Face snapshot's file); ``store``:
    which app's store (``ollama``, ``lmstudio``, ``llama.cpp``, ``huggingface``, ``folder``);
    ``home``: that store's folder; ``short``: other names it answers to, each unique;
    ``problem``: why llama.cpp cannot load it ("" when it can, as far as can be told without
    loading it)."""

    name: str
    path: Path
    store: str
    home: Path
    short: tuple[str, ...] = ()
    problem: str = ""

    def but(self, problem: str) -> "StoreFile":
        """This file, unusable for ``problem``."""
        return dataclasses.replace(self, problem=problem)


@functools.lru_cache(maxsize=1)
def _known_architectures() -> frozenset:
    """The architectures llama.cpp knows (gguf-py's list, kept with llama.cpp's)."""
    from gguf.constants import MODEL_ARCH_NAMES
    return frozenset(MODEL_ARCH_NAMES.values())


def check_loadable(info: GGUFInfo) -> None:
    """Refuse a file llama.cpp cannot load: not a model, a text model's file that holds an
    encoder too (Ollama's own engine's format), an architecture llama.cpp does not know."""
    if is_embedding_model(info):
        check_embedding_model(info)
    else:
        check_causal_lm(info)
    arch = info.architecture
    if arch not in _known_architectures():
        raise ModelLoadError(info.path, f"architecture '{arch}' is not one this llama.cpp "
                                        "knows (a newer llama.cpp, or Ollama's own engine, "
                                        "may run it)")
    encoder = next((t for t in info.tensors if t.startswith(ENCODER_PREFIXES)), None)
    if encoder is not None:
        raise ModelLoadError(info.path, f"the file holds an image or audio encoder too (tensor "
                                        f"'{encoder}'): a format only Ollama's own engine "
                                        "runs, not llama.cpp")


# Verdicts, by (path, size, mtime_ns): a re-scan reads only new or changed files.
_CHECKED: dict[tuple[str, int, int], str] = {}


def header_problem(path: Path) -> str:
    """Why llama.cpp cannot load ``path``, from its header ("" when it can)."""
    try:
        st = path.stat()
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _CHECKED:
        try:
            check_loadable(read_gguf(path))
            why = ""
        except EdgespecError as e:
            text = str(e)
            prefix = f"{getattr(e, 'path', path)}: "
            why = text[len(prefix):] if text.startswith(prefix) else text
        if len(_CHECKED) >= MAX_CHECKS_KEPT:
            _CHECKED.clear()
        _CHECKED[key] = why
    return _CHECKED[key]
