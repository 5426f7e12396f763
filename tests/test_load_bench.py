"""`edgespec bench --load`: real busy processes, started and ended by their ids, beside a
real Engine on the SmolLM2 pair (what it measures is reported, never asserted)."""

from __future__ import annotations

import os
import re

import pytest

from edgespec import Engine
from edgespec.bench.load import format_load_report, run_load_bench


@pytest.mark.real
def test_the_load_bench_runs_every_setting_and_ends_its_busy_processes(smollm2_f32_path,
                                                                        smollm2_q4_path):
    said = []
    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path, n_ctx=1024) as eng:
        costs = eng.costs
        res = run_load_bench(eng, ["Name a colour.", "Count to three."], load=1, max_tokens=4,
                             raw=False, peers=False, log=said.append)
        assert eng.costs is costs and eng.threads["adaptive"]   # as it was
    most = eng.target.config.n_threads
    settings = [f"pinned {t}" for t in range(1, most + 1)] + ["adaptive"]
    assert res["settings"] == settings and res["conditions"] == ["idle", "1 busy"]
    for cond in res["conditions"]:
        for s in settings:
            for mode in ("plain", "speculative"):
                cell = res["cells"][f"{cond}|{s}|{mode}"]
                assert cell["tokens"] > 0 and cell["tokens_per_second"] > 0
    (line,) = [s for s in said if "busy processes: pids" in s]
    pids = [int(p) for p in re.findall(r"\d+", line.split("pids", 1)[1])]
    assert len(pids) == 1
    for pid in pids:                     # ended, and reaped: no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    report = format_load_report(res)
    assert "adaptive vs pinned" in report and "busy/idle spec" in report
