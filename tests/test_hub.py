"""Hub downloads with the real ``huggingface_hub`` client over real HTTP, against a local hub
(``tests/hubserver.py``) on 127.0.0.1 reached through ``HF_ENDPOINT``. No request leaves the
machine; every request the client makes is recorded and counted."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubserver import FakeHub, default_sigint

from edgespec.registry import downloads, hub
from edgespec.registry.downloads import (ChecksumMismatchError, DownloadError,
                                         NotEnoughDiskSpaceError)
from edgespec.errors import ModelNotFoundError

REPO = "test-org/tiny-GGUF"
NAME = "tiny-Q4_K_M.gguf"
DATA = os.urandom(3_000_000)  # synthetic bytes: the client never looks inside


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A running local hub serving REPO/NAME, with the environment pointed at it."""
    with FakeHub(tmp_path / "server") as server:
        server.add_file(REPO, NAME, DATA)
        for k, v in server.env(tmp_path / "hf", EDGESPEC_MODELS=str(tmp_path / "models")).items():
            monkeypatch.setenv(k, v)
        for k in ("HF_HUB_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
            monkeypatch.delenv(k, raising=False)
        yield server


def tiny(**kw) -> hub.HubFile:
    return hub.HubFile(REPO, NAME, **kw)


def blobs_dir(tmp_path: Path) -> Path:
    return tmp_path / "hf" / "hub" / "models--test-org--tiny-GGUF" / "blobs"


# ---------------------------------------------------------------------------------------------
# Clean download, cache reuse, environment


def test_clean_download_lands_in_the_hub_cache_verified(fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_the_test")
    path = hub.download(tiny())
    assert path.read_bytes() == DATA
    assert str(path).startswith(str(tmp_path / "hf" / "hub"))  # HF_HOME honoured
    assert hub.verified_path(tiny()) == path
    # HF_TOKEN goes to the hub, never to the CDN host the file is redirected to
    heads = [r for r in fake_hub.requests if r.method == "HEAD"]
    assert heads and all(r.headers.get("authorization") == "Bearer hf_secret_for_the_test"
                         for r in heads)
    (get,) = fake_hub.cdn_gets()
    assert "authorization" not in get.headers
    # the hub's LFS sha256 was asked for before the transfer
    assert fake_hub.count("POST", f"/api/models/{REPO}/paths-info/") == 1


def test_second_download_transfers_nothing(fake_hub):
    first = hub.download(tiny())
    fake_hub.requests.clear()
    assert hub.download(tiny()) == first
    assert fake_hub.cdn_gets() == []
    assert fake_hub.count() == 1  # one HEAD to learn whether `main` moved


def test_progress_bar_shows_the_file_name_only_when_asked(fake_hub, monkeypatch, capsys):
    monkeypatch.setenv("TQDM_POSITION", "-1")  # the hub client's switch: bars on, even off a TTY
    hub.download(hub.HubFile(REPO, NAME), show_progress=False)
    assert "100%" not in capsys.readouterr().err
    fake_hub.add_file(REPO, "second.gguf", DATA[::-1])
    hub.download(hub.HubFile(REPO, "second.gguf"), show_progress=True)
    err = capsys.readouterr().err
    assert "second.gguf: 100%" in err and "3.00M/3.00M" in err


def test_pinned_commit_cached_needs_no_request_at_all(fake_hub):
    commit = fake_hub.repos[REPO].commit
    path = hub.download(tiny(revision=commit), require_commit=True)
    fake_hub.requests.clear()
    assert hub.download(tiny(revision=commit), require_commit=True) == path
    assert fake_hub.count() == 0


def test_pinning_refuses_a_branch_name(fake_hub):
    with pytest.raises(DownloadError, match="not a commit id"):
        hub.download(tiny(revision="main"), require_commit=True)
    assert fake_hub.count() == 0


# ---------------------------------------------------------------------------------------------
# Faults during the transfer


def test_dropped_connection_early_restarts_the_transfer(fake_hub):
    fake_hub.drop_after = 1_000_000   # the server closes the socket a third of the way in
    fake_hub.drop_times = 1
    path = hub.download(tiny())
    assert path.read_bytes() == DATA
    first, second = fake_hub.cdn_gets()
    # The client keeps only whole 10 MiB chunks, so a drop inside the first one restarts.
    assert "range" not in first.headers and "range" not in second.headers


@pytest.fixture
def big(fake_hub):
    """A file of two and a bit transfer chunks: the client writes to disk in whole 10 MiB
    chunks, so only a file this big shows partial progress on disk."""
    import huggingface_hub
    chunk = huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE
    data = os.urandom(2 * chunk + 12345)
    fake_hub.add_file(REPO, "big.gguf", data)
    return hub.HubFile(REPO, "big.gguf"), data, chunk


def test_dropped_connection_later_resumes_with_a_range_request(fake_hub, big):
    f, data, chunk = big
    fake_hub.drop_after = chunk + 500_000   # dropped in the middle of the second chunk
    fake_hub.drop_times = 1
    path = hub.download(f)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    first, second = fake_hub.cdn_gets()
    assert "range" not in first.headers
    assert second.headers.get("range") == f"bytes={chunk}-"  # resumed, not restarted


def test_progress_is_reported_per_chunk_and_can_stop_the_transfer(fake_hub, tmp_path, big):
    f, data, chunk = big
    sha = hashlib.sha256(data).hexdigest()
    seen: list[downloads.Progress] = []

    def stop_in_the_middle(p: downloads.Progress) -> None:
        seen.append(p)
        if p.done > chunk:
            raise downloads.DownloadCancelled("stopped")

    with pytest.raises(downloads.DownloadCancelled):
        hub.download(f, progress=stop_in_the_middle)
    assert [p.done for p in seen] == [0, chunk, 2 * chunk]
    assert all(p.total == len(data) and p.sha256 == sha for p in seen)
    assert _partials(tmp_path) == [] and hub.cached_path(f) is None   # nothing half-written

    seen.clear()
    path = hub.download(f, progress=seen.append)            # a new transfer, whole
    assert path.read_bytes() == data
    assert [(p.done, p.verifying) for p in seen] == [
        (0, False), (chunk, False), (2 * chunk, False), (len(data), False),
        (len(data), True), (len(data), False)]
    seen.clear()
    assert hub.download(f, progress=seen.append) == path    # here: reported whole at once
    assert [(p.file, p.done, p.total, p.sha256) for p in seen] == [
        ("big.gguf", len(data), len(data), sha)]


def _pull(*args):
    return subprocess.Popen([sys.executable, "-m", "edgespec", "pull", *args], env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)


def _wait_for(cond, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _partials(tmp_path):
    return sorted(blobs_dir(tmp_path).glob("*.incomplete")) if blobs_dir(tmp_path).is_dir() else []


def _start_stalled_pull(fake_hub, tmp_path, f, chunk):
    """Start `edgespec pull` in a process and return once a partial chunk is on disk."""
    fake_hub.stall_after = chunk + 1000
    proc = _pull(str(f))
    assert _wait_for(lambda: any(p.stat().st_size >= chunk for p in _partials(tmp_path))), \
        proc.stderr.read() if proc.poll() is not None else "no partial file appeared"
    return proc


def test_killed_download_leaves_nothing_that_looks_like_a_model(fake_hub, tmp_path, big):
    """A process killed mid-transfer (power cut, OOM killer): no model appears; the next pull
    restarts, finishes and verifies; the abandoned partial file is swept once it is stale."""
    f, data, chunk = big
    proc = _start_stalled_pull(fake_hub, tmp_path, f, chunk)
    proc.kill()
    proc.communicate(timeout=10)
    fake_hub.release()

    assert hub.cached_path(f) is None and hub.verified_path(f) is None
    snapshots = blobs_dir(tmp_path).parent / "snapshots"
    assert not list(snapshots.rglob("big.gguf"))
    (left,) = _partials(tmp_path)  # only an oddly named partial file remains
    os.utime(left, (time.time() - 3600, time.time() - 3600))  # ...and it goes stale

    path = hub.download(f)
    assert path.read_bytes() == data
    assert _partials(tmp_path) == []  # swept


def test_interrupted_pull_exits_130_and_cleans_up(fake_hub, tmp_path, big):
    f, data, chunk = big
    proc = _start_stalled_pull(fake_hub, tmp_path, f, chunk)
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    out, err = proc.communicate(timeout=20)
    fake_hub.release()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _partials(tmp_path) == [] and hub.cached_path(f) is None


# ---------------------------------------------------------------------------------------------
# Integrity


def test_altered_bytes_of_the_right_size_are_rejected_and_deleted(fake_hub, tmp_path):
    good = hashlib.sha256(DATA).hexdigest()
    fake_hub.tamper(REPO, NAME)
    bad = hashlib.sha256(fake_hub.repos[REPO].files[NAME].served.read_bytes()).hexdigest()

    # The hub client itself does not notice: same size, so its only check passes.
    import huggingface_hub
    plain = huggingface_hub.hf_hub_download(REPO, NAME, cache_dir=tmp_path / "plain-cache",
                                            endpoint=fake_hub.url)
    assert hashlib.sha256(Path(plain).read_bytes()).hexdigest() == bad

    with pytest.raises(ChecksumMismatchError) as e:
        hub.download(tiny())
    msg = str(e.value)
    assert good in msg and bad in msg and "deleted" in msg and "\n" not in msg
    assert hub.cached_path(tiny()) is None
    assert [p for p in blobs_dir(tmp_path).iterdir()] == []


def test_registry_hash_disagreeing_with_the_hub_stops_before_the_transfer(fake_hub):
    wrong = "0" * 64
    with pytest.raises(ChecksumMismatchError) as e:
        hub.download(tiny(sha256=wrong))
    assert wrong in str(e.value) and hashlib.sha256(DATA).hexdigest() in str(e.value)
    assert "nothing was downloaded" in str(e.value)
    assert fake_hub.cdn_gets() == []


def test_registry_hash_checked_when_the_hub_publishes_none(fake_hub):
    fake_hub.add_file(REPO, "plain.bin", b"not an LFS file", lfs=False)
    with pytest.raises(ChecksumMismatchError, match="the registry"):
        hub.download(hub.HubFile(REPO, "plain.bin", sha256="1" * 64))
    assert hub.cached_path(hub.HubFile(REPO, "plain.bin")) is None
    ok = hashlib.sha256(b"not an LFS file").hexdigest()
    assert hub.download(hub.HubFile(REPO, "plain.bin", sha256=ok)).read_bytes() == \
        b"not an LFS file"


def test_a_cached_file_without_a_stamp_is_hashed_before_first_use(fake_hub, tmp_path):
    import huggingface_hub  # another tool filled the cache: no edgespec stamp
    p = Path(huggingface_hub.hf_hub_download(REPO, NAME, cache_dir=tmp_path / "hf" / "hub",
                                             endpoint=fake_hub.url))
    assert hub.verified_path(tiny()) is None
    assert hub.local_path(tiny()) == p            # hashed against the blob's sha256 name
    assert hub.verified_path(tiny()) == p         # and stamped

    blob = Path(os.path.realpath(p))              # now corrupt it behind our back
    data = bytearray(blob.read_bytes())
    data[10] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert hub.verified_path(tiny()) is None      # the stamp no longer matches the file
    with pytest.raises(ChecksumMismatchError):
        hub.local_path(tiny())
    assert not blob.exists()


# ---------------------------------------------------------------------------------------------
# Offline, missing things, disk space, hostile names


def test_offline_uses_the_cache_with_zero_requests(fake_hub, monkeypatch):
    path = hub.download(tiny())
    fake_hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.download(tiny()) == path
    with pytest.raises(ModelNotFoundError) as e:
        hub.download(hub.HubFile(REPO, "other.gguf"))
    assert "HF_HUB_OFFLINE=1" in str(e.value)
    assert f"edgespec pull {REPO}/other.gguf" in str(e.value)
    assert fake_hub.count() == 0


@pytest.mark.parametrize("f, message", [
    (hub.HubFile("nobody/nothing-GGUF", NAME), "repository nobody/nothing-GGUF not found"),
    (hub.HubFile(REPO, "missing.gguf"), "has no file 'missing.gguf'"),
    (hub.HubFile(REPO, NAME, revision="v9"), "revision 'v9' not found"),
])
def test_missing_things_give_one_line_errors(fake_hub, f, message):
    with pytest.raises(DownloadError) as e:
        hub.download(f)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert fake_hub.cdn_gets() == []


def test_unreachable_hub_says_so(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    with pytest.raises(DownloadError, match="cannot reach the hub at http://127.0.0.1:9"):
        hub.download(tiny())


def test_not_enough_disk_is_refused_before_downloading(fake_hub, monkeypatch):
    monkeypatch.setattr(downloads, "free_bytes", lambda path: 10_000_000)
    with pytest.raises(NotEnoughDiskSpaceError) as e:
        hub.download(tiny())
    assert "3.0 MB needed" in str(e.value) and "10.0 MB free" in str(e.value)
    assert fake_hub.cdn_gets() == [] and hub.cached_path(tiny()) is None


@pytest.mark.parametrize("spec", ["a/b/../../../etc/passwd", "a/b//etc/passwd", "a/b/./x.gguf",
                                  "a/b/..", "a/b/x\\..\\y.gguf", "../b/x.gguf", "a/b/C:x.gguf"])
def test_hostile_file_names_are_refused(fake_hub, spec):
    with pytest.raises(DownloadError):
        hub.HubFile.parse(spec)
    assert fake_hub.count() == 0


@pytest.mark.parametrize("filename", ["/etc/passwd", "", "x/../../y.gguf"])
def test_absolute_and_escaping_names_are_refused(filename):
    with pytest.raises(DownloadError, match="refusing file name"):
        hub.HubFile(REPO, filename)


@pytest.mark.parametrize("revision", ["../../outside", "/abs", "", "a//b"])
def test_hostile_revisions_are_refused(revision):
    with pytest.raises(DownloadError, match="refusing revision"):
        hub.HubFile(REPO, NAME, revision=revision)


def test_spec_parsing():
    f = hub.HubFile.parse("Qwen/Qwen3-0.6B-GGUF/sub/dir/Qwen3-0.6B-Q8_0.gguf@abc")
    assert (f.repo, f.filename, f.revision) == ("Qwen/Qwen3-0.6B-GGUF",
                                                "sub/dir/Qwen3-0.6B-Q8_0.gguf", "abc")
    with pytest.raises(DownloadError, match="REPO_ID/FILENAME"):
        hub.HubFile.parse("just-a-name.gguf")


def test_remove_frees_the_blob_and_keeps_other_files(fake_hub):
    fake_hub.add_file(REPO, "other.gguf", b"x" * 1000)
    path = hub.download(tiny())
    other = hub.download(hub.HubFile(REPO, "other.gguf"))
    assert hub.remove(tiny()) == len(DATA)
    assert not path.exists() and hub.cached_path(tiny()) is None
    assert other.read_bytes() == b"x" * 1000
    assert hub.remove(tiny()) == 0
