"""GGUF files from the Hugging Face hub. The only module that imports ``huggingface_hub``.

Contract:

- Files live in the hub cache, shared with every other hub tool. The environment is read at
  call time: ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``, ``HF_HOME`` / ``HF_HUB_CACHE``.
- ``huggingface_hub`` writes each transfer to a temporary name and renames it once the byte count
  is right, and it resumes a dropped connection with a Range request. It never checks content
  hashes: a file of the right size with altered bytes passes. :func:`download` does: before
  the transfer it asks the hub for the file's LFS sha256; after it, the file's sha256 must equal
  that and the registry's value. A mismatch deletes the cached copy and raises
  :class:`ChecksumMismatchError` showing both hashes.
- A cached file counts as a model only once verified. Verifying leaves a stamp (path, size,
  mtime, sha256) under ``paths.hub_stamps_dir()``; a cached file without one (fetched by
  another tool, or left by a process killed between transfer and check) is hashed before its
  first use. So nothing half-written or unchecked is ever handed to llama.cpp.
- With ``HF_HUB_OFFLINE=1`` only the cache is read; no request leaves the machine.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable, Optional

import huggingface_hub
import huggingface_hub.utils.logging
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import tqdm as hf_tqdm

from . import downloads, stamps
from .downloads import (ChecksumMismatchError, DownloadError, Progress, ProgressSink,
                        human_size, report_present, sha256_file)
from .hub_file import SHA256_RE as _SHA256_RE
from .hub_file import HubFile
from .. import paths
from ..errors import ModelNotFoundError

log_ = logging.getLogger(__name__)

_TRUE = {"1", "on", "yes", "true"}
STALE_PARTIAL_SECONDS = 600  # a partial blob untouched this long belongs to a dead process


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Where the environment says things live


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or hf_constants.ENDPOINT).rstrip("/")


def is_offline() -> bool:
    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return env.strip().lower() in _TRUE or bool(hf_constants.HF_HUB_OFFLINE)


def stop_log_propagation() -> None:
    """Stop the hub client's log records from also reaching the root logger's handlers.

    The client prints its warnings (e.g. "Trying to resume download...") through a stderr
    handler of its own; a shell that also configures the root logger would show each twice.
    """
    huggingface_hub.utils.logging.disable_propagation()


def _repo_dir(f: HubFile) -> Path:
    return paths.hub_cache_dir() / repo_folder_name(repo_id=f.repo, repo_type="model")


# ---------------------------------------------------------------------------------------------
# The local side: cached, verified, removed (never a network call)


def snapshot_path(f: HubFile) -> Path:
    """Where the hub client puts ``f``: ``snapshots/<commit>/<filename>`` in its repo folder
    (the revision's name stands in for the commit until the hub has resolved it)."""
    repo, rev = _repo_dir(f), f.revision
    ref = repo / "refs" / rev
    if not f.pinned and ref.is_file():
        rev = ref.read_text().strip()
    return repo / "snapshots" / rev / f.filename


def cached_path(f: HubFile) -> Optional[Path]:
    """The cached copy of ``f`` at its revision, verified or not; None if not cached."""
    p = huggingface_hub.try_to_load_from_cache(f.repo, f.filename, cache_dir=paths.hub_cache_dir(),
                                               revision=f.revision)
    return Path(p) if isinstance(p, str) and os.path.isfile(p) else None


def verified_path(f: HubFile) -> Optional[Path]:
    """The cached copy if it carries a valid stamp (and matches ``f.sha256``); never hashes."""
    p = cached_path(f)
    if p is None:
        return None
    sha = stamps.stamped_sha256(p)
    if sha is None or (f.sha256 and sha != f.sha256.lower()):
        return None
    return p


def local_path(f: HubFile, *, log: Callable[[str], None] = _quiet) -> Optional[Path]:
    """The verified cached copy, hashing it first if it has no stamp yet; None if not cached.

    An unstamped copy is checked against ``f.sha256`` or, failing that, its blob name (the hub
    stores LFS files under their sha256). A mismatch deletes it and raises.
    """
    p = cached_path(f)
    if p is None:
        return None
    stamped = stamps.stamped_sha256(p)
    if stamped is not None:
        return p if not f.sha256 or stamped == f.sha256.lower() else None
    blob_name = Path(os.path.realpath(p)).name
    expected = (f.sha256 or "").lower() or (blob_name if _SHA256_RE.fullmatch(blob_name) else "")
    log(f"verifying {f} before first use ({human_size(p.stat().st_size)})…")
    _check_sha256(p, f, expected, "the registry" if f.sha256 else "the hub cache's blob name")
    return p


def remove(f: HubFile) -> int:
    """Delete every cached revision of ``f`` (snapshot links, unshared blobs, stamps).

    Returns the bytes freed. Other files of the same repository are left alone.
    """
    snapshots = _repo_dir(f) / "snapshots"
    if not snapshots.is_dir():
        return 0
    pointers = [p for d in snapshots.iterdir() if (p := d / f.filename).is_symlink()
                or p.is_file()]
    blobs = {Path(os.path.realpath(p)) for p in pointers}
    for p in pointers:
        p.unlink()
    still_used = {Path(os.path.realpath(p)) for p in snapshots.rglob("*") if p.is_symlink()}
    freed = 0
    for blob in blobs - still_used:
        if blob.is_file():
            freed += blob.stat().st_size
            stamps.stamp_path(blob).unlink(missing_ok=True)
            blob.unlink()
    return freed


# ---------------------------------------------------------------------------------------------
# Verification


def _check_sha256(path: Path, f: HubFile, expected: str, source: str) -> str:
    actual = sha256_file(path)
    if expected and actual != expected:
        stamps.discard(path)
        raise ChecksumMismatchError(
            f"{f}: sha256 mismatch, expected {expected} ({source}), got {actual}; the bad copy "
            "was deleted — run the command again, and if it fails the same way the server is "
            "sending altered data")
    stamps.write_stamp(path, actual)
    return actual


# ---------------------------------------------------------------------------------------------
# Downloading


class _Bar(hf_tqdm):
    """The hub client's progress bar, shown on stderr (HF_HUB_DISABLE_PROGRESS_BARS wins)."""


class _NoBar(hf_tqdm):
    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def _bar_class(show: bool, report: Optional[Callable[[int, Optional[int]], None]]):
    """The progress bar class for one transfer (shown or not); with ``report``, each update
    also calls ``report(bytes done, total)`` (which may raise to stop the transfer)."""
    base = _Bar if show else _NoBar
    if report is None:
        return base

    class _Reporting(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.done = kwargs.get("initial") or 0
            report(self.done, kwargs.get("total"))

        def update(self, n=1):
            self.done += n
            report(self.done, self.total)
            return super().update(n)
    return _Reporting


def download(f: HubFile, *, require_commit: bool = False, show_progress: bool = False,
             log: Callable[[str], None] = _quiet, pull_command: Optional[str] = None,
             progress: ProgressSink = None) -> Path:
    """Return the verified local path of ``f``, downloading it into the hub cache if needed.

    ``require_commit`` refuses revisions that are not 40-hex commit ids. Offline, only the
    cache is consulted; a file that is not there raises :class:`ModelNotFoundError` naming
    ``pull_command`` (default ``edgespec pull REPO_ID/FILENAME``). Not enough free disk space
    raises before any byte is transferred. Every failure is a one-line :class:`DownloadError`.
    ``progress``: told how the transfer goes and when the sha256 is checked
    (:class:`~.downloads.Progress`), and may stop it (the partial transfer is deleted).
    """
    path = _download(f, require_commit, show_progress, log, pull_command, progress)
    report_present(progress, path, stamps.stamped_sha256(path))
    return path


def _download(f: HubFile, require_commit: bool, show_progress: bool,
              log: Callable[[str], None], pull_command: Optional[str],
              progress: ProgressSink) -> Path:
    if require_commit and not f.pinned:
        raise DownloadError(f"{f}: revision '{f.revision}' is not a commit id; pinning needs a "
                            "40-hex commit id, not a branch or tag")
    if is_offline():
        p = local_path(f, log=log)
        if p is None:
            cmd = pull_command or f"edgespec pull {f}"
            raise ModelNotFoundError(f"{f} is not in the hub cache ({paths.hub_cache_dir()}) and "
                                     f"HF_HUB_OFFLINE=1 is set: run `{cmd}` with network access")
        return p
    if f.pinned and (done := verified_path(f)) is not None:
        return done  # a commit never changes: no need to ask the hub

    meta = _metadata(f)
    pointer = _repo_dir(f) / "snapshots" / meta.commit_hash / f.filename
    etag_sha = meta.etag.lower() if _SHA256_RE.fullmatch(meta.etag.lower()) else None
    expected = (f.sha256 or etag_sha or "-").lower()
    if pointer.is_file() and stamps.stamped_sha256(pointer) == expected:
        return pointer  # this commit's file is cached and verified: nothing more to ask
    expected = _expected_sha256(f, meta)
    name = f.filename.rsplit("/", 1)[-1]
    report = None if progress is None else \
        (lambda done, total: progress(Progress(name, expected, done, total or meta.size)))
    path = _transfer(f, meta, _bar_class(show_progress, report), log)
    if expected is None:
        log_.warning("the hub gives no sha256 for %s (not an LFS file): only its size was "
                     "checked", f)
    stamped = stamps.stamped_sha256(path)  # set when this blob was verified before (another rev)
    if stamped is None or (expected and stamped != expected):
        log(f"verifying sha256 of {f.filename}…")
        if progress is not None:
            size = path.stat().st_size
            progress(Progress(name, expected, size, size, verifying=True))
        _check_sha256(path, f, expected or "", "the registry" if f.sha256 else
                      "the hub's LFS metadata")
    return path


def _metadata(f: HubFile):
    """HEAD the file on the hub: commit, ETag, size, download location."""
    meta = _call(f, "metadata", lambda: huggingface_hub.get_hf_file_metadata(
        huggingface_hub.hf_hub_url(f.repo, f.filename, revision=f.revision,
                                   endpoint=endpoint())))
    if not meta.commit_hash or not meta.etag:
        raise DownloadError(f"{endpoint()} did not answer like a Hugging Face hub for {f} (no "
                            "X-Repo-Commit or ETag header): check HF_ENDPOINT and any proxy")
    if f.size and meta.size and f.size != meta.size:
        raise DownloadError(f"{f}: the hub's file is {meta.size} bytes but the registry expects "
                            f"{f.size}; the file changed upstream — pin the revision in "
                            "pairs.toml")
    return meta


def _expected_sha256(f: HubFile, meta) -> Optional[str]:
    """The sha256 the download must have: the registry's, which must agree with the hub's."""
    hub_sha = _hub_sha256(f, meta)
    if f.sha256 and hub_sha and f.sha256.lower() != hub_sha:
        raise ChecksumMismatchError(
            f"{f}: the hub's file at {meta.commit_hash[:12]} has sha256 {hub_sha} but the "
            f"registry expects {f.sha256.lower()}; the file changed upstream — pin the revision "
            "in pairs.toml (nothing was downloaded)")
    return (f.sha256 or hub_sha or "").lower() or None


def _transfer(f: HubFile, meta, bar, log: Callable[[str], None]) -> Path:
    """Have the hub client fetch ``f`` into its cache, after the disk-space check; ``bar``:
    the progress bar class it reports to."""
    blobs = _repo_dir(f) / "blobs"
    _sweep_stale_partials(blobs, meta.etag, log)
    if meta.size and not (blobs / meta.etag).exists():
        downloads.check_free_space(paths.hub_cache_dir(), meta.size, str(f))
        log(f"downloading {f} ({human_size(meta.size)}) from {endpoint()}")
    return Path(_call(f, "transfer", lambda: huggingface_hub.hf_hub_download(
        f.repo, f.filename, revision=f.revision, cache_dir=paths.hub_cache_dir(),
        endpoint=endpoint(), tqdm_class=bar)))


def _sweep_stale_partials(blobs: Path, etag: str, log: Callable[[str], None]) -> None:
    """Delete partial transfers of this blob that no process has written to for a while.

    The hub client deletes its temporary file when a transfer fails or is interrupted, but a
    process that is killed outright leaves it behind under a process-unique name that no later
    transfer reuses. A live transfer writes every few seconds, so an old one is dead.
    """
    cutoff = time.time() - STALE_PARTIAL_SECONDS
    for p in blobs.glob(f"{etag}*.incomplete"):
        try:
            if p.stat().st_mtime < cutoff:
                size = p.stat().st_size
                p.unlink()
                log(f"removed an abandoned partial download ({human_size(size)})")
        except OSError:
            pass


def _hub_sha256(f: HubFile, meta) -> Optional[str]:
    """The LFS sha256 the hub publishes for ``f`` at the commit ``meta`` resolved to."""
    try:
        api = huggingface_hub.HfApi(endpoint=endpoint())
        infos = api.get_paths_info(f.repo, [f.filename], revision=meta.commit_hash)
    except Exception as e:  # noqa: BLE001 - a mirror without this API: the ETag below
        log_.debug("paths-info failed for %s: %s", f, e)
        infos = []
    for info in infos:
        lfs = getattr(info, "lfs", None)
        if getattr(info, "path", None) == f.filename and lfs:
            sha = getattr(lfs, "sha256", None) or lfs.get("sha256")
            if sha and _SHA256_RE.fullmatch(sha.lower()):
                return sha.lower()
    etag = (meta.etag or "").lower()
    return etag if _SHA256_RE.fullmatch(etag) else None  # the hub's ETag of an LFS file


def _call(f: HubFile, stage: str, fn):
    """Run a hub call, turning its exceptions into one-line :class:`DownloadError`s."""
    try:
        return fn()
    except DownloadError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the hub client raised, said in one line
        raise DownloadError(_explain(f, stage, e)) from None


def _explain(f: HubFile, stage: str, e: Exception) -> str:
    where = endpoint()
    detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if isinstance(e, hf_errors.GatedRepoError):
        return (f"{f.repo} is gated: accept its licence at {where}/{f.repo} and set HF_TOKEN to "
                "a token of that account")
    if isinstance(e, hf_errors.RepositoryNotFoundError):
        return (f"repository {f.repo} not found on {where} (check the name; if it is private, "
                "set HF_TOKEN)")
    if isinstance(e, hf_errors.RevisionNotFoundError):
        return f"revision '{f.revision}' not found in {f.repo} on {where}"
    if isinstance(e, hf_errors.LocalEntryNotFoundError):
        return (f"cannot reach the hub at {where} and {f} is not cached: check the network "
                "connection or HF_ENDPOINT")
    if isinstance(e, hf_errors.EntryNotFoundError):
        return (f"{f.repo} has no file '{f.filename}' at revision '{f.revision}' (names are "
                f"case-sensitive; see {where}/{f.repo}/tree/{f.revision})")
    if isinstance(e, hf_errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", "?")
        hint = ": HF_TOKEN is not valid" if status == 401 else ""
        return f"the hub at {where} answered HTTP {status} for {f}{hint}"
    if isinstance(e, ValueError):
        return f"{f}: {detail}"
    if stage == "transfer":
        return (f"download of {f} was interrupted ({type(e).__name__}: {detail}); nothing was "
                "kept — run the command again")
    return f"cannot reach the hub at {where} ({type(e).__name__}: {detail})"


def download_model(entry, *, show_progress: bool = False, require_commit: bool = False,
                   log: Callable[[str], None] = _quiet, progress: ProgressSink = None) -> Path:
    """:func:`download` for a registry :class:`~edgespec.registry.pairs.ModelEntry` of kind
    ``hub``."""
    return download(hub_file(entry), require_commit=require_commit, show_progress=show_progress,
                    log=log, pull_command=f"edgespec pull {entry.name}", progress=progress)


def hub_file(entry) -> HubFile:
    src = entry.source
    return HubFile(src["repo"], src["filename"], src.get("revision", "main"), entry.sha256,
                   entry.size)
