"""Models other apps keep, read where they are, under the names those apps show them.

- Ollama (:mod:`.ollama`): ``$OLLAMA_MODELS``, else ``~/.ollama/models``, and the Linux
  service's ``/usr/share/ollama/.ollama/models``; named ``qwen2.5-coder:1.5b``,
  ``namespace/model:tag``, ``hf.co/namespace/model:tag`` (``:latest`` may be left off);
- LM Studio (:mod:`.folders`): ``~/.lmstudio/models`` and ``~/.cache/lm-studio/models``,
  named ``publisher/repo/file.gguf``;
- llama.cpp's download cache: ``$LLAMA_CACHE``, else ``~/.cache/llama.cpp``, by file name;
- the Hugging Face cache (``paths.hub_cache_dir()``): ``org/repo/file.gguf``;
- the folders ``EDGESPEC_MODEL_DIRS`` names (``os.pathsep`` between them), by file name.

An LM Studio or Hugging Face file answers to its file name without ``.gguf`` and to its
repository's name too, where no other file claims it. ``EDGESPEC_STORES`` picks the apps'
stores read (``ollama,lmstudio,llama.cpp,huggingface``, the default; ``none``).

Nothing is written, copied or moved: a store is listed (directory listings, ``stat``, small
manifests, GGUF headers, each cached by size and mtime), and the file itself is what llama.cpp
is handed. A file llama.cpp cannot load is listed with why (:attr:`StoreFile.problem`) and
never offered as a model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Union

from .. import paths
from ..errors import ModelLoadError, ModelNotFoundError
from .base import StoreFile, header_problem
from .folders import (FOLDER, HUGGINGFACE, LLAMA_CPP, LMSTUDIO, MODEL_DIRS_ENV, folder_files,
                      hub_files, llama_cache_dir, llama_cache_files, lmstudio_dirs,
                      lmstudio_files, model_dirs)
from .ollama import OLLAMA, PROJECTOR_SUFFIX, ollama_dirs, ollama_files

__all__ = ["LABELS", "StoreFile", "find_models", "model_file", "real_path", "searched",
           "store_files", "store_model"]

STORES_ENV = "EDGESPEC_STORES"
APPS = (OLLAMA, LMSTUDIO, LLAMA_CPP, HUGGINGFACE)        # read unless EDGESPEC_STORES says
LABELS = {OLLAMA: "Ollama", LMSTUDIO: "LM Studio", LLAMA_CPP: "llama.cpp's cache",
          HUGGINGFACE: "the Hugging Face cache", FOLDER: MODEL_DIRS_ENV}
_READERS = {OLLAMA: ollama_files, LMSTUDIO: lmstudio_files, LLAMA_CPP: llama_cache_files,
            HUGGINGFACE: hub_files, FOLDER: folder_files}


def apps() -> list[str]:
    """The apps' stores read: ``EDGESPEC_STORES`` (comma-separated; ``none``), else all."""
    text = os.environ.get(STORES_ENV)
    if text is None:
        return list(APPS)
    asked = {s.strip().lower() for s in text.split(",")}
    return [a for a in APPS if a in asked]


def store_dirs() -> list[tuple[str, Path]]:
    """(store, folder) of every folder read, existing or not."""
    dirs = {OLLAMA: ollama_dirs, LMSTUDIO: lmstudio_dirs, LLAMA_CPP: lambda: [llama_cache_dir()],
            HUGGINGFACE: lambda: [paths.hub_cache_dir()]}
    return [(a, d) for a in apps() for d in dirs[a]()] + [(FOLDER, d) for d in model_dirs()]


def searched() -> str:
    """The folders read that exist, as an error message names them."""
    here: dict[str, list[str]] = {}
    for store, folder in store_dirs():
        if folder.is_dir():
            here.setdefault(store, []).append(str(folder))
    return ", ".join(f"{LABELS[s]} ({', '.join(d)})" for s, d in here.items()) if here \
        else "no other app's store is on this machine"


def _discover() -> list[StoreFile]:
    """Every file of every store, before its header is read: the first of a name or a path
    wins (another is marked), and a short name stays only where one file claims it."""
    found: list[StoreFile] = []
    names: dict[str, StoreFile] = {}
    places: dict[Path, StoreFile] = {}
    for store in [*apps(), FOLDER]:
        for f in _READERS[store]():
            real = real_path(f.path)
            first = names.get(f.name) or (places.get(real) if f.store != OLLAMA else None)
            if first is not None and not f.problem:
                f = f.but(f"the same file as {LABELS[first.store]}'s '{first.name}'"
                          if first.name != f.name else
                          f"its name is taken by {LABELS[first.store]}'s {first.path} (run "
                          "this one by its path)")
            names.setdefault(f.name, f)
            places.setdefault(real, f)
            found.append(f)
    claims: dict[str, int] = {}
    for f in found:
        for s in set(f.short):
            claims[s] = claims.get(s, 0) + 1
    return [StoreFile(f.name, f.path, f.store, f.home,
                      tuple(dict.fromkeys(s for s in f.short if claims[s] == 1
                                          and s not in names and s != f.name)), f.problem)
            for f in found]


def real_path(path: Path) -> Path:
    """``path`` with its links resolved (as it is, where that fails)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path


def store_files(check: bool = True) -> list[StoreFile]:
    """Every model file in the stores read (:func:`apps`, ``EDGESPEC_MODEL_DIRS``), by store,
    usable or not; ``check``: each usable file's header read too (cached), else only what its
    name and its store say."""
    files = _discover()
    if not check:
        return files
    return [f.but(why) if not f.problem and (why := header_problem(f.path)) else f
            for f in files]


def _matches(files: Sequence[StoreFile], name: str) -> list[StoreFile]:
    """The files ``name`` names: their own name (Ollama's ``:latest`` tag or not), else a
    short name, else either case-insensitively."""
    bare = name[:-len(":latest")] if name.endswith(":latest") else name
    hits = [f for f in files if f.name in (name, bare)] or [f for f in files if bare in f.short]
    if not hits:
        low = bare.lower()
        hits = [f for f in files if low in (f.name.lower(), *(s.lower() for s in f.short))]
    return hits


def find_models(name: str) -> list[StoreFile]:
    """The store files ``name`` names (one, or several when it is ambiguous), usable or not;
    their headers unread."""
    return _matches([f for f in _discover() if not f.name.endswith(PROJECTOR_SUFFIX)], name)


def _exists(text: str) -> bool:
    try:
        return Path(text).expanduser().exists()
    except (OSError, RuntimeError, ValueError):     # (too long for a path, ~user of no user)
        return False


def store_model(text: str) -> Optional[StoreFile]:
    """The one store file ``text`` names, unless it names a file or folder that exists."""
    hits = [] if _exists(text) else find_models(text)
    return hits[0] if len(hits) == 1 else None


def _looks_like_path(text: str) -> bool:
    return (text.lower().endswith(".gguf") or text.startswith((".", "~", os.sep))
            or Path(text).is_absolute())


def model_file(model: Union[str, Path, None]) -> Union[str, Path, None]:
    """The file a ``--target``, ``--draft`` or ``Engine.load`` argument names: a path as it
    is (a ``Path``, or text naming something that exists); else the model of another app's
    store that the name names, else the models folder's ``NAME.gguf``.

    Raises :class:`~edgespec.errors.ModelLoadError` for a store's model llama.cpp cannot load
    (saying why), :class:`~edgespec.errors.ModelNotFoundError` for a name nothing has (naming
    the stores searched). Text that looks like a path (``….gguf``, ``./…``, ``~/…``) and names
    no file is left to the loader's own "no such file"."""
    if model is None or isinstance(model, Path):
        return model
    text = str(model)
    if _exists(text):
        return model
    hits = find_models(text)
    if len(hits) > 1:
        raise ModelNotFoundError(f"'{text}' names {len(hits)} models: "
                                 f"{', '.join(repr(f.name) for f in hits)}; give one of those")
    if hits:
        found = hits[0]
        why = found.problem or header_problem(found.path)
        if why:
            raise ModelLoadError(f"'{found.name}' ({LABELS[found.store]}: {found.path})", why)
        return found.path
    own = paths.models_dir() / f"{text}.gguf"
    if "/" not in text and os.sep not in text and own.is_file():
        return own
    if _looks_like_path(text):
        return model
    raise ModelNotFoundError(
        f"no model '{text}' here: it names no file, and no store edgespec reads has it "
        f"(searched the models folder {paths.models_dir()}; {searched()}); `edgespec pairs` "
        "lists the models found (a registry pair: --pair NAME)")
