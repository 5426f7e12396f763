"""A draft chosen for a target that comes without one (edgespec/registry/auto_draft.py and
draft_probe.py): the candidates (smaller, same tokenizer), the measurement, the one line, the
record (the next start measures nothing; a candidate changed or added measures again), the
overrides, ``Engine.load(draft="auto")``, the chat's and the server's view of it; and the pure
ranking on hand-made timings (an outlier round does not flip a choice, a busy measurement is
provisional). Real models in a models folder of the test's own; nothing asserts that a draft
pays on this machine (a loaded one may rightly choose n-gram drafting)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgespec.registry import auto_draft
from edgespec.registry.auto_draft import (MAX_TRIES, Candidate, DraftChoice, candidates,
                                          choose_draft, decide, draft_option, measure_again,
                                          read_records, record_key, still_valid)
from edgespec.registry.draft_probe import (Measured, Probe, is_busy, rank, robust_median,
                                           shares)

SMOL = ("smol-q4_1", "smol-q2_k")        # the candidates: SmolLM2's tokenizer, smaller


class Quiet:
    """A load meter that saw no other process (the record is then not provisional)."""

    def others(self) -> float:
        return 0.0


SMALL = dict(tokens=32, rounds=2, watch=Quiet, n_threads=1)    # a short probe


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smollm2_f32_path, smollm2_q4_path, smollm2_q2k_path,
           gemma_q4_path):
    """A models folder: an F32 target, its Q4_1 and Q2_K copies (the Q2_K a file of its own,
    touched below), Gemma (another tokenizer, smaller than the target too)."""
    root = tmp_path_factory.mktemp("auto-draft")
    models = root / "models"
    models.mkdir()
    (models / "target-f32.gguf").symlink_to(smollm2_f32_path)
    (models / "smol-q4_1.gguf").symlink_to(smollm2_q4_path)
    shutil.copy(smollm2_q2k_path, models / "smol-q2_k.gguf")
    (models / "gemma.gguf").symlink_to(gemma_q4_path)
    env = {"EDGESPEC_MODELS": str(models), "HF_HUB_CACHE": str(root / "hub"),
           "EDGESPEC_STORES": "none"}
    return {"models": models, "target": models / "target-f32.gguf", "env": env}


@pytest.fixture
def env(folder, monkeypatch):
    for k, v in folder["env"].items():
        monkeypatch.setenv(k, v)
    return folder


@pytest.fixture(scope="module")
def first(folder) -> DraftChoice:
    """The first start: measured (once for the module)."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in folder["env"].items():
            mp.setenv(k, v)
        said: list[str] = []
        choice = choose_draft(folder["target"], say=said.append, **SMALL)
    assert said and said[0].startswith("choosing a draft for target-f32.gguf: measuring 2 ")
    return choice


def test_a_target_without_a_draft_gets_one_chosen_said_and_remembered(env, first):
    assert not first.remembered and not first.provisional
    assert set(first.measured) == set(SMOL)              # not Gemma: another tokenizer
    line = first.line()
    assert "\n" not in line and line.startswith("draft: ") and " — --draft " in line
    if first.path is not None:
        assert first.name in SMOL and first.path.parent == env["models"]
        assert f"draft: {first.name} (same tokenizer; agrees on " in line
        assert first.speedup > 1.0
    else:
        assert line.startswith("draft: none, n-gram drafting (no smaller model of its tokenizer "
                               "pays here")
        assert "`edgespec pair derive " in line      # an F32 target: a copy would be worth it
    record = env["models"] / auto_draft.RECORDS_FILE
    before = (record.read_bytes(), record.stat().st_mtime_ns)
    said: list[str] = []
    again = choose_draft(env["target"], say=said.append, **SMALL)
    assert again.remembered and said == []              # nothing loaded, nothing measured
    assert (again.path, again.line()) == (first.path, line)
    assert (record.read_bytes(), record.stat().st_mtime_ns) == before


def test_a_changed_or_new_candidate_invalidates_the_record(env, first):
    me = Candidate.of("target", env["target"])
    rec = read_records()["choices"][record_key(me)]
    assert still_valid(rec, candidates(me, {}))
    copy = env["models"] / "smol-q2_k.gguf"
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))       # changed
    try:
        assert not still_valid(rec, candidates(me, {}))
    finally:
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert still_valid(rec, candidates(me, {}))
    extra = env["models"] / "smol-q2_k-again.gguf"                     # a new one
    os.link(copy, extra)
    try:
        assert not still_valid(rec, candidates(me, {}))
    finally:
        extra.unlink()
    assert still_valid(rec, candidates(me, {}))


def edgespec(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_the_command_line_says_it_in_one_line_and_obeys_the_overrides(env, first):
    common = ("run", "a b a b a b a b a b", "--target", env["target"], "--raw", "--json",
              "-n", "8", "--temperature", "0", "--ctx-size", "256",
              "--draft-max", "4")       # (a pinned length: no calibration to wait for)
    auto = edgespec(*common)
    assert auto.returncode == 0, auto.stderr
    assert [ln for ln in auto.stderr.splitlines() if ln.startswith("draft:")] == [first.line()]
    plain = edgespec(*common, "--draft", "none")           # no draft model: n-gram drafting
    assert plain.returncode == 0, plain.stderr
    assert "draft:" not in plain.stderr
    assert json.loads(plain.stdout)["tokens"] == json.loads(auto.stdout)["tokens"]
    assert json.loads(plain.stdout)["stats"]["drafted"] > 0
    # --draft FILE, --drafter, --no-spec: nothing is chosen (nothing measured or read)
    base = dict(draft=None, no_spec=False, drafter=None, threads=None, auto_draft=True)
    named = Namespace(**{**base, "draft": str(env["models"] / "smol-q4_1.gguf")})
    assert Path(draft_option(named, env["target"], print)) == env["models"] / "smol-q4_1.gguf"
    for over in ({"drafter": "ngram"}, {"no_spec": True}, {"auto_draft": False}):
        args = Namespace(**{**base, **over})
        assert draft_option(args, env["target"], print) is None
        assert not hasattr(args, "draft_choice")


def test_the_server_says_it_at_start_and_in_api_ps_and_api_show(env, first):
    from server_helpers import ServerProcess, post, request, stop_checked
    s = ServerProcess("--target", env["target"], "--ctx-size", 256, "--draft-max", 4)
    try:
        assert [ln for ln in s.lines if ln.startswith("draft:")] == [first.line()]
        ps = json.loads(request(s.port, "GET", "/api/ps")[2])["models"][0]["edgespec"]
        assert ps == {"draft": first.name or None, "draft_reason": first.reason}
        status, show = post(s.port, "/api/show", {"model": "target-f32"})
        assert status == 200, show
        assert show["edgespec"]["draft_reason"] == first.reason
        assert show["edgespec"]["draft_choice"]["remembered"] is True
    finally:
        stop_checked(s)


def test_engine_load_with_draft_auto_and_the_chats_status(env, first):
    from edgespec import Engine, SamplingParams
    from edgespec.tui.render import stats_text
    from edgespec.tui.session import ChatSession
    lines: list[str] = []
    with Engine.load(target=str(env["target"]), draft="auto", n_ctx=256, draft_max=4,
                     progress=lines.append) as eng:
        choice = eng.draft_choice
        assert choice.remembered and first.line() in lines
        if first.path is not None:
            assert eng.draft is not None and eng.draft.path.resolve() == first.path.resolve()
        else:
            assert eng.draft is None and eng.spec.drafter == "ngram"
        out = eng.generate("The capital of France is", max_tokens=4,
                           sampling=SamplingParams(temperature=0.0), raw=True)
        assert out.text
        session = ChatSession(eng, label="target-f32")
        assert first.line() in stats_text(session).splitlines()


def test_a_bad_target_is_one_line():
    from edgespec.errors import ModelLoadError
    with pytest.raises(ModelLoadError, match="no such file"):
        choose_draft("/no/such/model.gguf")
    proc = edgespec("run", "hi", "--target", "/no/such/model.gguf")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no such file" in lines[0]


# ---------------------------------------------------------------------------------------------
# The ranking, on hand-made timings


def rounds(q8_steps: list[float]) -> list[dict[str, float]]:
    """Rounds of timings (seconds): a 10 ms target step; Q8_0's steps as given, Q4_0 at 2.5 ms;
    each model's read a token at 1 ms, the target's passes of n rows at n-independent 12 ms."""
    return [{"target": 0.010, "draft 0": q8, "draft 1": 0.0025, "read target": 0.001,
             "read draft 0": 0.0004, "read draft 1": 0.0004, "rows 4": 0.012, "rows 8": 0.013,
             "rows 16": 0.016} for q8 in q8_steps]


def test_an_outlier_step_does_not_flip_the_choice():
    # The failure: on a busy machine one Q8_0 step measured at 26.7x the target's.
    times = rounds([0.003, 0.003, 0.267, 0.0031, 0.0029])
    share = shares(times)
    assert share["draft 0"] == pytest.approx(0.3, rel=0.05)
    q8, q4 = Measured("q8_0", Path("q8"), 0.96), Measured("q4_0", Path("q4"), 0.67)
    for d, key in ((q8, "draft 0"), (q4, "draft 1")):
        d.step_share, d.read_share = share[key], share[f"read {key}"]
    rows = {n: share[f"rows {n}"] for n in (4, 8, 16)}
    assert [d.name for d in rank([q4, q8], rows, share["read target"])] == ["q8_0", "q4_0"]
    # (a mean would have let the outlier decide)
    mean = sum(t["draft 0"] / t["target"] for t in times) / len(times)
    q8.step_share = mean
    assert [d.name for d in rank([q4, q8], rows, share["read target"])][0] == "q4_0"
    assert robust_median([1.0, 1.1, 0.9, 1.0, 50.0]) == pytest.approx(1.0)


def test_a_draft_that_does_not_pay_loses_to_ngram_drafting(tmp_path):
    slow = Measured("slow", tmp_path / "slow.gguf", 0.5, step_share=0.9, read_share=1.0)
    probe = Probe(rank([slow], {4: 1.1, 8: 1.3, 16: 1.8}, 0.1))
    assert probe.drafts[0].whole <= 1.0
    best, reason = decide(probe, tmp_path / "target.gguf")
    assert best is None and reason.startswith("no smaller model of its tokenizer pays here: "
                                              "the best, slow, agrees on 50%")
    line = DraftChoice(tmp_path, None, "", reason).line()
    assert line.startswith("draft: none, n-gram drafting (") and "--draft PATH|NAME" in line


def test_a_busy_measurement_is_provisional_and_measured_again(tmp_path):
    assert is_busy(0.5, [0.01, 0.01]) and not is_busy(0.1, [0.01, 0.05])
    assert is_busy(None, [0.01, 0.03]) and not is_busy(None, [0.01, 0.011])   # no meter
    fast = Measured("fast", tmp_path / "fast.gguf", 0.95, step_share=0.1, read_share=0.05)
    probe = Probe(rank([fast], {4: 1.05, 8: 1.1, 16: 1.3}, 0.05), busy=True)
    best, reason = decide(probe, tmp_path / "target.gguf")
    assert best is fast and reason.endswith("; measured on a busy machine: again at the next "
                                            "start")
    assert decide(probe, tmp_path / "t.gguf", again=False)[1].endswith(
        f"; measured on a busy machine {MAX_TRIES} times: kept")
    assert measure_again({"provisional": True, "tries": 1}, "a start later")
    assert not measure_again({"provisional": True, "tries": MAX_TRIES}, "given up")
    assert not measure_again({"provisional": False, "tries": 1}, "quiet")
    auto_draft._MEASURED_HERE.add("this process")
    assert not measure_again({"provisional": True, "tries": 1}, "this process")


def test_the_records_validity(tmp_path):
    a, b = (Candidate(n, tmp_path / f"{n}.gguf", 10, 1) for n in "ab")
    rec = {"candidates": {a.key: [10, 1], b.key: [10, 1]}, "choice": a.key}
    assert still_valid(rec, [a, b]) and still_valid(rec, [a])        # a loser went: still so
    assert not still_valid(rec, [b])                                  # the chosen one went
    assert not still_valid(rec, [a, Candidate("a", a.path, 11, 1)])   # changed
    assert not still_valid(rec, [a, b, Candidate("c", tmp_path / "c.gguf", 1, 1)])  # new
    assert not still_valid(None, [a]) and not still_valid({"candidates": []}, [a])


def test_the_server_says_it_in_api_ps_and_api_show(tmp_path):
    from edgespec.server.ollama.replies import ps_body, show_body
    choice = DraftChoice(tmp_path / "t.gguf", tmp_path / "d.gguf", "d", "same tokenizer; …",
                         1.4).describe()
    entry = SimpleNamespace(name="t", target=tmp_path / "t.gguf", draft=tmp_path / "d.gguf",
                            kind="pair", size=1, modified=0.0, details={}, digest="00",
                            n_ctx_train=0)
    ps = ps_body([SimpleNamespace(name="t", entry=entry, size=1, expires_at=None, n_ctx=256,
                                  draft_choice=choice)])["models"][0]
    assert ps["edgespec"] == {"draft": "d", "draft_reason": "same tokenizer; …"}
    show = show_body(entry, {}, "", (256, 256), False, draft_choice=choice)["edgespec"]
    assert show["draft_reason"] == "same tokenizer; …" and show["draft_choice"] == choice
    assert show["draft"] == str(tmp_path / "d.gguf")
