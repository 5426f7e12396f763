"""Stores of plain GGUF files, read where they are: LM Studio's models folder, llama.cpp's
download cache, the Hugging Face cache and the folders ``EDGESPEC_MODEL_DIRS`` names.

Each is a listing of ``*.gguf`` files (hidden ones, files being written and the later parts
of a split model left out); a vision projector (``mmproj*``) is listed as not a model."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Iterator

from .. import paths
from .base import StoreFile

LMSTUDIO, LLAMA_CPP, HUGGINGFACE, FOLDER = "lmstudio", "llama.cpp", "huggingface", "folder"
MODEL_DIRS_ENV = "EDGESPEC_MODEL_DIRS"
_LATER_PART = re.compile(r"-(\d{5})-of-\d{5}$")      # model-00002-of-00003.gguf
PROJECTOR = "a vision projector (mmproj), not a language model"


def lmstudio_dirs() -> list[Path]:
    """LM Studio's models folders: ``~/.lmstudio/models``, and the older
    ``~/.cache/lm-studio/models``."""
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def llama_cache_dir() -> Path:
    """llama.cpp's download cache (``-hf``, ``-mu``): ``$LLAMA_CACHE``, else the platform's
    cache folder's ``llama.cpp``."""
    env = os.environ.get("LLAMA_CACHE")
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") \
            / "llama.cpp"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


def model_dirs() -> list[Path]:
    """The folders ``EDGESPEC_MODEL_DIRS`` names (separated by ``os.pathsep``)."""
    text = os.environ.get(MODEL_DIRS_ENV, "")
    return [Path(d).expanduser() for d in text.split(os.pathsep) if d.strip()]


def gguf_files(root: Path, depth: int) -> list[Path]:
    """The ``*.gguf`` files under ``root`` at most ``depth`` folders down, sorted: not hidden,
    not in hidden folders, not the second or later part of a split model."""
    found = []
    root_depth = len(root.parts)
    for folder, dirs, files in os.walk(root):        # (unreadable folders are skipped)
        here = Path(folder)
        if len(here.parts) - root_depth >= depth:
            dirs.clear()
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = here / name
            if (name.lower().endswith(".gguf") and not name.startswith(".")
                    and not _later_part(path) and path.is_file()):
                found.append(path)
    return sorted(found)


def _later_part(path: Path) -> bool:
    m = _LATER_PART.search(path.stem)
    return m is not None and int(m[1]) > 1


def _file(name: str, path: Path, store: str, home: Path, short=()) -> StoreFile:
    if "mmproj" in path.name.lower():
        return StoreFile(name, path, store, home, problem=PROJECTOR)
    return StoreFile(name, path, store, home, tuple(short))


def lmstudio_files() -> Iterator[StoreFile]:
    """LM Studio's ``<publisher>/<repo>/<file>.gguf``, named so (and by the file's name
    without ``.gguf``, and the repository's name, where unique)."""
    for home in lmstudio_dirs():
        for path in gguf_files(home, 3):
            rel = path.relative_to(home)
            yield _file(rel.as_posix(), path, LMSTUDIO, home,
                        (path.stem, *rel.parts[-2:-1]))


def llama_cache_files() -> Iterator[StoreFile]:
    """llama.cpp's cache: each file by its name without ``.gguf`` (``user_repo_file``)."""
    home = llama_cache_dir()
    for path in gguf_files(home, 4):
        yield _file(path.stem, path, LLAMA_CPP, home)


def hub_files() -> Iterator[StoreFile]:
    """The Hugging Face cache's ``models--<org>--<repo>/snapshots/<rev>/…/*.gguf`` as
    ``org/repo/file.gguf`` (and by the file's and the repository's names, where unique): the
    revision ``refs/main`` names first, then the others."""
    home = paths.hub_cache_dir()
    try:
        repos = sorted(p for p in home.glob("models--*") if p.is_dir())
    except OSError:
        return
    for repo_dir in repos:
        repo_id = repo_dir.name[len("models--"):].replace("--", "/", 1)
        try:
            main = (repo_dir / "refs" / "main").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            main = ""
        snapshots = sorted((repo_dir / "snapshots").glob("*"), key=lambda p: p.name != main)
        seen = set()
        for snapshot in snapshots:
            for path in gguf_files(snapshot, 3):
                name = f"{repo_id}/{path.relative_to(snapshot).as_posix()}"
                if name not in seen:
                    seen.add(name)
                    yield _file(name, path, HUGGINGFACE, home,
                                (path.stem, repo_id.rsplit("/", 1)[-1]))


def folder_files() -> Iterator[StoreFile]:
    """The folders of ``EDGESPEC_MODEL_DIRS``: each file by its name without ``.gguf``."""
    for home in model_dirs():
        for path in gguf_files(home, 2):
            yield _file(path.stem, path, FOLDER, home)
