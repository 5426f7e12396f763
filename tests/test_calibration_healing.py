"""A calibration that cannot poison itself (issue 16): a busy measurement is measured again
and replaced once the machine is quiet, and costs refined while decoding are kept for the
next process. Real models through real llama.cpp; what counts as busy is fixed by the test
(the thresholds are patched), never by how busy this machine happens to be."""

from __future__ import annotations

import json

import pytest

from edgespec import Engine, SamplingParams
from edgespec.drafting import calibration
from edgespec.drafting.costs import Costs
from edgespec.engine.costing import EngineCosts

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["Give three tips for learning a new language.",
           "Explain how a rainbow forms, in a short paragraph."]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "edgespec" / "calibration.json"


def entries(cache) -> dict:
    return json.loads(cache.read_text()) if cache.is_file() else {}


def load(target, draft):
    # Pinned threads: no governor backs off on a shared machine (close() would then not keep
    # the refined costs, by design). No suffix index across requests: the prompts are asked
    # again and again, and from the third time on its n-gram rounds draft the answer whole,
    # a round or two an answer, so the model's costs would hardly be refined at all.
    return Engine.load(target=target, draft=draft, n_ctx=1024, n_threads=2, suffix=False)


def test_a_busy_calibration_is_measured_again_and_the_quiet_one_kept(
        cache, monkeypatch, smollm2_f32_path, smollm2_q4_path):
    monkeypatch.setattr(calibration, "QUIET", -1.0)
    monkeypatch.setattr(calibration, "STEADY", 0.5)           # every measurement is "busy"
    with load(smollm2_f32_path, smollm2_q4_path) as eng:
        costs = eng.costs
        assert costs.busy and not cache.exists()                # used, not kept
        busy_t1 = costs.pass_seconds(1)
        # Not due yet: the first answers run on the busy figures.
        eng.generate(PROMPTS[0], max_tokens=8, sampling=GREEDY)
        assert costs.busy

        # Still busy when it is due: measured again, not kept, next try later.
        eng._drafting.costing._remeasure_at = 0.0
        wait = eng._drafting.costing._remeasure_wait
        eng.generate(PROMPTS[0], max_tokens=8, sampling=GREEDY)
        assert costs.busy and not cache.exists()
        assert eng._drafting.costing._remeasure_wait == 2 * wait

        # The machine is quiet now: the next due answer measures again and keeps it.
        monkeypatch.setattr(calibration, "QUIET", 1e9)
        monkeypatch.setattr(calibration, "STEADY", 1e9)
        monkeypatch.setattr(EngineCosts, "REMEASURE_BUDGET", 1e9)
        eng._drafting.costing._remeasure_at = 0.0
        out = eng.generate(PROMPTS[1], max_tokens=24, sampling=GREEDY)
        assert out.text and not costs.busy
        assert costs is eng.costs             # replaced in place
        assert costs.pass_seconds(1) != busy_t1
        (entry,) = entries(cache).values()
        assert entry["source"] == "calibration"
        assert entry["target"]["1"] == pytest.approx(costs.pass_seconds(1), rel=0.5)


def test_refined_costs_are_kept_and_the_next_process_starts_from_them(
        cache, monkeypatch, smollm2_f32_path, smollm2_q4_path):
    monkeypatch.setattr(calibration, "QUIET", 1e9)
    monkeypatch.setattr(calibration, "STEADY", 1e9)
    monkeypatch.setattr(calibration, "CALIBRATION_BUDGET", 1e9)
    monkeypatch.setattr(EngineCosts, "SAVE_AFTER", 24)      # (64 in use: ~15 s more here)
    with load(smollm2_f32_path, smollm2_q4_path) as eng:
        costs = eng.costs
        # A start as wrong as a calibration taken on a machine ten times slower.
        costs.adopt(Costs({n: 10 * v for n, v in costs.target.items()},
                          10 * costs.draft))
        costs.attention = 3e-6         # as if learned over a long prompt (test_drafters.py)
        costs.draft_read = 2e-3        # the draft reading a prompt, as a calibration measures
        poisoned = Costs(dict(costs.target), costs.draft)
        # Every answer takes at least one target pass, each one observed: a bound in answers
        # as large as the passes needed, however long the drafts run (this Q4_1 draft of
        # the same model is accepted whole for rounds on end: 4-8 passes an answer).
        i = 0
        while costs.observed < EngineCosts.SAVE_AFTER:
            eng.generate(PROMPTS[i % 2], max_tokens=64, sampling=GREEDY)
            i += 1
            assert i <= EngineCosts.SAVE_AFTER, "the loop never refined the costs"
        refined = dict(costs.target), costs.draft      # what is saved: the table itself
        attention, draft_attention = costs.attention, costs.draft_attention
    (entry,) = entries(cache).values()
    assert entry["source"] == "refined"
    saved = {int(n): v for n, v in entry["target"].items()}
    assert saved == pytest.approx(refined[0]) and entry["draft"] == pytest.approx(refined[1])
    assert entry["attention"] == pytest.approx(attention) and attention > 0
    assert entry["draft_attention"] == pytest.approx(draft_attention)
    # Every draft step moved the draft's cost, and every target pass its batch size's, toward
    # what they measure: far below ten times the calibration.
    assert entry["draft"] < poisoned.draft
    # (a size the calibration did not measure is compared with its interpolation)
    assert any(saved[n] < poisoned.pass_seconds(n) for n in saved)

    with load(smollm2_f32_path, smollm2_q4_path) as eng:     # the next process
        start = eng.costs
        assert not start.busy
        assert start.target == pytest.approx(saved) and start.draft == pytest.approx(
            entry["draft"])
        assert start.attention == pytest.approx(attention)
        assert start.draft_attention == pytest.approx(draft_attention)
        # the calibration's reading cost, kept through the refinements and the cache
        assert start.draft_read == pytest.approx(entry["draft_read"]) and start.draft_read > 0
        # The engine tells its costs where its target is: a pass's cost grows with it.
        eng.generate(PROMPTS[0], max_tokens=1, sampling=GREEDY)
        assert start.position() == len(eng.target.tokens) > 0
        assert start.pass_seconds(4) > float(start.bare(4))


def test_a_busy_calibration_heals_even_while_the_threads_are_backed_off(
        cache, monkeypatch, smollm2_f32_path, smollm2_q4_path):
    # The busy spell made the governors drop a thread; the quiet re-measure runs on every
    # thread (what the cache entry describes) and leaves the governors' count as it was.
    monkeypatch.setattr(calibration, "QUIET", -1.0)
    monkeypatch.setattr(calibration, "STEADY", 0.5)
    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path, n_ctx=1024) as eng:
        costs = eng.costs
        assert costs.busy and eng.threads["adaptive"]
        for m in (eng.target, eng.draft):
            m.set_threads(1)
        seen = []
        real = calibration.calibrate

        def watched(target, draft, **kw):
            seen.append((target.n_threads, draft.n_threads))
            return real(target, draft, **kw)

        monkeypatch.setattr("edgespec.engine.costing.calibrate", watched)
        monkeypatch.setattr(calibration, "QUIET", 1e9)
        monkeypatch.setattr(calibration, "STEADY", 1e9)
        monkeypatch.setattr(EngineCosts, "REMEASURE_BUDGET", 1e9)
        assert eng._drafting.remeasure(force=True)
        assert seen == [(eng.target.config.n_threads, eng.draft.config.n_threads)]
        assert (eng.target.n_threads, eng.draft.n_threads) == (1, 1)
        assert not costs.busy and entries(cache)


def test_costs_that_several_streams_refined_are_not_kept(
        cache, monkeypatch, smollm2_f32_path, smollm2_q4_path):
    """Passes over several streams ran beside the others' Python work and over several
    sequences: what they taught is not one stream's table, and the file is every session's."""
    monkeypatch.setattr(calibration, "QUIET", 1e9)
    monkeypatch.setattr(calibration, "STEADY", 1e9)
    monkeypatch.setattr(calibration, "CALIBRATION_BUDGET", 1e9)
    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path, n_ctx=1024, n_threads=2,
                     parallel=2) as eng:
        before = entries(cache)
        costs = eng.costs
        for _ in range(EngineCosts.SAVE_AFTER):
            eng._drafting.observe_pass(True, 4, 0.5, 10)      # a contended batch's pass
        assert costs.observed >= EngineCosts.SAVE_AFTER
    assert all(e["source"] != "refined" for e in entries(cache).values())
    assert entries(cache) == before
