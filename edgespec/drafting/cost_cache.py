"""Measured costs remembered on disk (:class:`CostCache`), so that only the first load of a pair
on a machine pays for calibrating it (:func:`calibrate_cached`).

The cache (``paths.calibration_file()``) keys each entry by the model files (path, size,
mtime), the thread count, the offload and the CPU kernels the weights run on, so that a
measurement is reused only where it still describes the machine's work.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

from .. import paths
from ..lm import HiddenStateModel
from .calibration import calibrate
from .costs import Costs
from .reduced_head import HEAD_ROWS, ReducedHead

CACHE_DAYS = 30         # a kept calibration is measured again after this long


def _fingerprint(model: HiddenStateModel) -> str:
    st = model.path.stat()
    c = model.config
    # the CPU kernels its weights run on (extra buffer types, or the repacked ones alone:
    # backend/repack.py), which change a pass's cost by a quarter on Q4_K weights
    kernels = "all" if getattr(model, "extra_buffers", True) else \
        f"rp{getattr(model, 'repacked', 0)}"
    return f"{model.path.resolve()}|{st.st_size}|{int(st.st_mtime)}|t{c.n_threads}|" \
           f"ngl{c.n_gpu_layers},fa-{c.flash_attn},rb-{c.rollback},cpu-{kernels}" + \
           (f"@rpc={','.join(c.rpc)}" if c.rpc else "")


def _current(key: str, entry) -> bool:
    """Whether a calibration entry still describes files on this machine and is recent: entries
    for deleted or rewritten files (a removed model, a test's temporary copy), for an older key
    format and older than CACHE_DAYS are dropped when the cache is next written."""
    if not isinstance(entry, dict) or time.time() - entry.get("saved", 0) > CACHE_DAYS * 86400:
        return False
    for part in key.split("||"):
        if part == "-" or part.startswith("head"):
            continue
        fields = part.split("|")
        if len(fields) != 5:
            return False
        try:
            st = Path(fields[0]).stat()
        except OSError:
            return False
        if f"{st.st_size}|{int(st.st_mtime)}" != "|".join(fields[1:3]):
            return False
    return True


class CostCache:
    """Measured costs on disk (``paths.calibration_file()``), one entry per pair of model
    files, thread count and offload. A measurement taken on a busy machine is used but not
    kept; costs refined while decoding are kept (:meth:`save`), so a poor start heals."""

    def __init__(self, target, draft, head: Optional[ReducedHead] = None):
        self.path = paths.calibration_file()
        self.key = _fingerprint(target) + "||" + (_fingerprint(draft) if draft is not None
                                                  else "-")
        self.has_draft = draft is not None
        if head is not None:
            self.key += f"||head{HEAD_ROWS}"

    def _read(self) -> dict:
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def load(self) -> Optional[Costs]:
        entry = self._read().get(self.key)
        if not _current(self.key, entry) or "target" not in entry or "draft" not in entry:
            return None
        if self.has_draft and "draft_read" not in entry:
            return None     # kept before the draft's reading was measured: measured again
        try:
            return Costs({int(n): float(v) for n, v in entry["target"].items()},
                         float(entry["draft"]), attention=float(entry.get("attention", 0.0)),
                         draft_attention=float(entry.get("draft_attention", 0.0)),
                         draft_read=float(entry.get("draft_read", 0.0)),
                         draft_batch={int(b): float(v) for b, v in
                                      entry.get("draft_batch", {}).items()},
                         checkpoint=float(entry.get("checkpoint", 0.0)),
                         restore=float(entry.get("restore", 0.0)),
                         redo=bool(entry.get("redo", False)))
        except (TypeError, ValueError, AttributeError):
            return None

    def save(self, costs: Costs, source: str) -> None:
        saved = {k: v for k, v in self._read().items() if _current(k, v)}
        saved[self.key] = {"target": costs.target, "draft": costs.draft,
                           "attention": costs.attention, "draft_attention": costs.draft_attention,
                           "draft_read": costs.draft_read,
                           "draft_batch": costs.draft_batch, "checkpoint": costs.checkpoint,
                           "restore": costs.restore, "redo": costs.redo,
                           "saved": time.time(), "source": source}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(saved, indent=1))
            tmp.replace(self.path)
        except OSError:
            pass  # a read-only home only costs a recalibration next time


def calibrate_cached(target, draft, head: Optional[ReducedHead] = None, *,
                     force: bool = False,
                     progress: Callable[[str], None] = lambda s: None) -> Costs:
    """:func:`calibrate`, remembered per model file, threads and offload in the user's cache
    directory so that only the first load of a pair on a machine pays for it (~1 s), unless
    ``force``. ``target``/``draft``: loaded models with ``path`` and ``config`` (a
    :class:`~edgespec.backend.LlamaModel`)."""
    cache = CostCache(target, draft, head)
    costs = None if force else cache.load()
    if costs is not None:
        return costs
    cal = calibrate(target, draft, head=head, progress=progress)
    if cal.quiet:
        cache.save(cal.costs, "calibration")
    c = cal.costs
    return Costs(dict(c.target), c.draft, busy=not cal.quiet, draft_attention=c.draft_attention,
                 draft_read=c.draft_read, checkpoint=c.checkpoint, restore=c.restore, redo=c.redo)
