"""The cost calibration and its per-machine cache, on a real model through real llama.cpp."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from edgespec.backend import LlamaModel
from edgespec.config import ModelConfig
from edgespec.drafting import calibrate, calibrate_cached, calibration, cost_cache


@pytest.fixture(scope="module")
def q4(smollm2_q4_path):
    m = LlamaModel(ModelConfig(smollm2_q4_path, n_ctx=512))
    yield m
    m.close()


def test_calibration_measures_and_restores_the_cache(q4):
    q4.eval([1, 2, 3], 1)
    before = list(q4.tokens)
    cal = calibrate(q4, q4, sizes=(1, 4, 16))
    costs = cal.costs
    assert q4.tokens == before                    # the models' contents are left as they were
    assert set(costs.target) == {1, 4, 16}
    assert all(v > 0 for v in costs.target.values()) and costs.draft > 0
    assert costs.draft_attention >= 0             # (measured after 500 tokens, then removed)
    # the draft reading a context in a batch: less a token than a one-token step
    assert 0 < costs.draft_read < costs.draft
    assert costs.target[16] > costs.target[1]     # 16 tokens cost more than one on a CPU
    q4.truncate(0)


@pytest.fixture
def quiet(monkeypatch):
    """Whatever this machine is doing, count every calibration as quiet (these tests are
    about the cache, not about telling a busy machine)."""
    monkeypatch.setattr(calibration, "QUIET", 1e9)
    monkeypatch.setattr(calibration, "STEADY", 1e9)
    monkeypatch.setattr(calibration, "CALIBRATION_BUDGET", 1e9)


def test_cache_is_reused_and_drops_entries_for_files_that_are_gone(q4, tmp_path, monkeypatch,
                                                                  smollm2_q4_path, quiet):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "edgespec" / "calibration.json"
    gone = tmp_path / "gone.gguf"
    shutil.copy(smollm2_q4_path, gone)
    st = gone.stat()
    now = time.time()
    stale = {
        # a model file since deleted (a test's temporary copy, a removed model)
        f"{gone}|{st.st_size}|{int(st.st_mtime)}|t2|ngl-1||-": {"target": {"1": 1.0},
                                                                 "draft": 1.0, "saved": now},
        # the file exists but was rewritten since it was measured
        f"{smollm2_q4_path.resolve()}|1|2|t2|ngl-1||-": {"target": {"1": 1.0}, "draft": 1.0,
                                                         "saved": now},
        # an older key format
        f"{smollm2_q4_path.resolve()}|1|2|t2|ngl-1|ctx4096||-": {"target": {"1": 1.0},
                                                                "draft": 1.0, "saved": now},
    }
    gone.unlink()
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(stale))

    first = calibrate_cached(q4, None)
    saved = json.loads(cache.read_text())
    assert len(saved) == 1 and not set(saved) & set(stale)
    (key, entry), = saved.items()
    assert key.startswith(str(smollm2_q4_path.resolve()) + "|") and key.endswith("||-")
    assert entry["target"]["1"] == pytest.approx(first.pass_seconds(1))

    # A second load on this machine reads the cache instead of measuring again.
    entry["target"] = {n: 123.0 for n in entry["target"]}
    cache.write_text(json.dumps(saved))
    assert calibrate_cached(q4, None).pass_seconds(1) == 123.0
    # ... until the entry is older than CACHE_DAYS: then it is measured again.
    entry["saved"] = time.time() - (cost_cache.CACHE_DAYS + 1) * 86400
    cache.write_text(json.dumps(saved))
    assert calibrate_cached(q4, None).pass_seconds(1) != 123.0


def test_a_busy_calibration_is_used_but_not_kept(q4, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "QUIET", -1.0)
    monkeypatch.setattr(calibration, "STEADY", 0.5)      # no measurement is steady enough
    said = []
    costs = calibrate_cached(q4, None, progress=said.append)
    assert costs.pass_seconds(1) > 0 and said and "measuring" in said[0]
    assert not (tmp_path / "cache" / "edgespec" / "calibration.json").exists()


def test_a_slow_calibration_stops_early_and_is_not_kept(q4, monkeypatch):
    monkeypatch.setattr(calibration, "CALIBRATION_BUDGET", 0.0)
    said = []
    cal = calibrate(q4, None, progress=said.append)
    assert not cal.quiet and len(cal.costs.target) == 2        # the first two sizes only
    assert cal.costs.pass_seconds(33) > cal.costs.pass_seconds(2)      # extended along their line
    assert any("busy" in s for s in said)


def _cpu_seconds(pids):
    """Seconds of CPU the processes ``pids`` have used (utime + stime from /proc)."""
    import os
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_a_calibration_during_a_real_busy_process_is_not_quiet(q4):
    import os
    from edgespec.bench.load import BusyProcesses
    from edgespec.cpuload import _proc_stat_busy
    if _proc_stat_busy() is None:
        pytest.skip("no /proc/stat here: the step-time fallback is tested above")
    # A spinner for every core: the calibration's own threads cannot crowd them all out.
    with BusyProcesses(os.cpu_count() or 2) as busy:
        before, t0 = _cpu_seconds(busy.pids), time.monotonic()
        cal = calibrate(q4, None, sizes=(1, 4))       # a few hundredths of a second of work
        spun = (_cpu_seconds(busy.pids) - before) / (time.monotonic() - t0)
    assert cal.seconds >= calibration.LOAD_SPAN       # filled out so the reading means something
    # The meter sees the load the spinners really put on the machine (the scheduler decides
    # how much that is; clock ticks make the two readings differ by a little).
    assert cal.others >= 0.6 * spun - 0.1, (cal.others, spun)
    if spun >= 2 * calibration.QUIET:
        assert cal.others >= calibration.QUIET and not cal.quiet
