"""A self-speculative draft derived from a target: the target re-quantised by llama.cpp
(``edgespec pair derive``; :mod:`.draft_choice` measures which precision to derive).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from .. import paths
from ..errors import EdgespecError, ModelLoadError


def derive_draft(target: str | os.PathLike, quant: str, out: Optional[str | os.PathLike] = None,
                 *, force: bool = False, log: Callable[[str], None] = lambda s: None) -> Path:
    """Write a self-speculative draft: ``target`` re-quantised to ``quant`` by llama.cpp.

    The draft shares the target's tokenizer by construction; the pair check still runs on the
    result. ``out`` defaults to ``<models dir>/<target stem>.draft-<QUANT>.gguf``.
    """
    from ..backend import check_compatible_files, check_ftype, quantize
    target = Path(target)
    q = check_ftype(quant)
    if not target.is_file():
        raise ModelLoadError(target, "no such file")
    dest = Path(out) if out else paths.models_dir() / f"{target.stem}.draft-{q}.gguf"
    if dest.exists() and not force:
        raise EdgespecError(f"{dest} already exists: pass --force to rebuild it, or --out PATH")
    if dest.resolve() == target.resolve():
        raise EdgespecError("the draft would overwrite the target: pass a different --out")
    log(f"quantizing {target.name} to {q} with llama.cpp…")
    quantize(target, dest, q)
    check_compatible_files(target, dest)
    return dest
