"""Verification stamps: which cached file was hashed, and its sha256.

A stamp records a blob's path, size, mtime and sha256 under ``paths.hub_stamps_dir()``. A file
whose stamp still matches was verified and need not be hashed again; one without (fetched by
another tool, or left by a process killed between transfer and check) is hashed first.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from .. import paths


def stamp_path(blob: Path) -> Path:
    key = hashlib.sha256(str(blob).encode()).hexdigest()[:32]
    return paths.hub_stamps_dir() / f"{key}.json"


def stamped_sha256(path: Path) -> Optional[str]:
    blob = Path(os.path.realpath(path))
    try:
        rec = json.loads(stamp_path(blob).read_text())
        st = blob.stat()
    except (OSError, ValueError):
        return None
    if rec.get("blob") != str(blob) or rec.get("size") != st.st_size \
            or rec.get("mtime_ns") != st.st_mtime_ns:
        return None
    return rec.get("sha256")


def write_stamp(path: Path, sha256: str) -> None:
    blob = Path(os.path.realpath(path))
    st = blob.stat()
    stamp = stamp_path(blob)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"blob": str(blob), "size": st.st_size,
                               "mtime_ns": st.st_mtime_ns, "sha256": sha256}))
    os.replace(tmp, stamp)


def discard(path: Path) -> None:
    """Delete a cached copy: its snapshot link, its blob and its stamp."""
    blob = Path(os.path.realpath(path))
    stamp_path(blob).unlink(missing_ok=True)
    if path.is_symlink():
        path.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)
