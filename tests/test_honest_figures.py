"""The speed-up figures people are shown: estimated only from like-for-like measurements of the
loop itself, shown only with the evidence for it, never above the tokens per target pass, and
replaced by a plain statement when drafting does not pay (issue 16).

The first tests build the statistics by hand (no model); the last drives `edgespec chat` in a
real terminal (tmux) with a draft that cannot pay: the target's own F32 weights as its draft.
"""

from __future__ import annotations

import os
import re
import sys
from types import SimpleNamespace

import pytest

from edgespec.results import GenerationStats
from edgespec.results import LoopStats
from edgespec.tui.render import speedup_basis, status_line

NOT_PAYING = "the draft does not pay on this machine now: decoding plainly"
SPEEDUP = re.compile(r"≈[\d.]+×")


def stats(*, passes, plain, drafted, accepted, emitted, draft_s, verify_s, plain_pass,
          plain_s=0.0, speculative=True) -> GenerationStats:
    loop = LoopStats(rounds=passes, target_passes=passes, drafted=drafted, accepted=accepted,
                     emitted=emitted, draft_seconds=draft_s, verify_seconds=verify_s,
                     plain_passes=plain, plain_seconds=plain_s)
    return GenerationStats(completion_tokens=emitted, decode_seconds=draft_s + verify_s,
                           speculative=speculative, plain_pass_seconds=plain_pass, loop=loop)


def test_estimate_is_plain_pass_cost_over_the_loops_cost_per_token():
    # 20 drafting rounds, 60 tokens in 0.6 s of drafting and verifying: 10 ms a token, against
    # a plain pass of 20 ms: 2× (below the 3 tokens per pass).
    s = stats(passes=20, plain=0, drafted=60, accepted=40, emitted=60, draft_s=0.2,
              verify_s=0.4, plain_pass=0.020)
    assert s.speedup_estimate == pytest.approx(2.0)
    assert "≈2.00× plain speed" in s.summary()
    assert "≈2.00×" in speedup_basis(s) and "20.0 ms" in speedup_basis(s)


def test_estimate_never_exceeds_the_tokens_per_target_pass():
    # A stale plain-pass cost (a calibration on a busy machine) would claim 6×; the answer made
    # 1.5 tokens per target pass, so at most 1.5× is shown.
    s = stats(passes=20, plain=0, drafted=40, accepted=10, emitted=30, draft_s=0.05,
              verify_s=0.25, plain_pass=0.060)
    assert s.tokens_per_pass == pytest.approx(1.5)
    assert s.speedup_estimate == pytest.approx(1.5)


def test_no_estimate_without_enough_drafting_rounds_or_a_reference():
    few = stats(passes=12, plain=5, drafted=14, accepted=10, emitted=22, draft_s=0.1,
                verify_s=0.2, plain_pass=0.02)
    assert few.speedup_estimate is None and not SPEEDUP.search(few.summary())
    assert "fewer than 8" in speedup_basis(few)
    pinned = stats(passes=20, plain=0, drafted=60, accepted=40, emitted=60, draft_s=0.2,
                   verify_s=0.4, plain_pass=0.0)
    assert pinned.speedup_estimate is None and not SPEEDUP.search(pinned.summary())
    assert "not estimated" in speedup_basis(pinned)


def test_a_slower_answer_is_said_to_be_slower():
    s = stats(passes=20, plain=0, drafted=40, accepted=4, emitted=24, draft_s=0.3,
              verify_s=0.5, plain_pass=0.02)
    assert s.speedup_estimate == pytest.approx(0.6)
    assert "≈0.60× plain speed" in s.summary()


@pytest.mark.parametrize("drafted, plain", [(0, 30), (3, 29)])
def test_nothing_or_almost_nothing_drafted_says_decoding_plainly(drafted, plain):
    s = stats(passes=30, plain=plain, drafted=drafted, accepted=0, emitted=30, draft_s=0.01,
              verify_s=0.6, plain_pass=0.02, plain_s=0.02 * plain)
    assert s.decoding_plainly and s.speedup_estimate is None
    line = s.summary()
    assert NOT_PAYING in line and not SPEEDUP.search(line) and "×" not in line
    assert speedup_basis(s).startswith("none:")


def test_plain_decoding_has_no_figure_and_no_verdict():
    s = stats(passes=30, plain=30, drafted=0, accepted=0, emitted=30, draft_s=0.0,
              verify_s=0.6, plain_pass=0.02, plain_s=0.6, speculative=False)
    assert not s.decoding_plainly and s.speedup_estimate is None
    assert "speculation off" in s.summary() and NOT_PAYING not in s.summary()


def test_the_chat_status_line_shows_the_same_verdict():
    session = SimpleNamespace(label="pair", backend="CPU", context_used=40,
                              engine=SimpleNamespace(n_ctx=1024))
    s = stats(passes=30, plain=30, drafted=0, accepted=0, emitted=30, draft_s=0.01,
              verify_s=0.6, plain_pass=0.02, plain_s=0.6)
    line = status_line(session, SimpleNamespace(generation=SimpleNamespace(stats=s)))
    assert line.startswith("pair · CPU · ") and NOT_PAYING in line and "×" not in line
    assert line.endswith("context 40/1024")


def test_json_stats_carry_the_estimate_and_its_basis():
    d = stats(passes=20, plain=0, drafted=60, accepted=40, emitted=60, draft_s=0.2,
              verify_s=0.4, plain_pass=0.020).to_dict()
    assert d["speedup_estimate"] == pytest.approx(2.0)
    assert d["plain_pass_seconds"] == 0.020 and d["decoding_plainly"] is False


# ---------------------------------------------------------------------------------------------
# In a real terminal, with a draft that cannot pay


def status_of(text: str):
    """The first status line (speed … context) in ``text``, or None."""
    return next((ln for ln in text.splitlines() if "tok/s" in ln and "context " in ln), None)


@pytest.mark.real
@pytest.mark.slow
def test_chat_with_a_draft_that_cannot_pay_says_so_and_shows_no_speedup(tmp_path,
                                                                        smollm2_q4_path,
                                                                        smollm2_f32_path):
    from test_tui_terminal import Tmux, after

    # The draft is the target's own model in F32, the target in Q4_1: a draft step costs
    # more than a target pass (memory-bound: 4x the bytes), so no draft length pays even if
    # every draft were accepted, and the cost model never drafts. (The same file on both
    # sides was break-even, which a noisy timing could tip either way.)
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"),
               XDG_CACHE_HOME=str(tmp_path / "cache"), TERM="xterm-256color")
    chat = [sys.executable, "-m", "edgespec", "chat", "--target", str(smollm2_q4_path),
            "--draft", str(smollm2_f32_path), "--drafter", "model", "--temperature", "0",
            "--max-tokens", "24"]
    tmux = Tmux(tmp_path, chat, env)
    try:
        tmux.wait_for("the prompt", lambda s: "Ctrl-D quits" in s and "\n> " in s)
        for question in ("What is the capital of France?", "Name a colour."):
            tmux.type(question)
            tmux.press("Enter")
            screen = tmux.wait_for("the answer's status line",
                                   lambda s, q=question: status_of(after(s, q)) is not None)
            status = status_of(after(screen, question))
            assert NOT_PAYING in status, status
            assert "×" not in status, status
        tmux.type("/stats")
        tmux.press("Enter")
        screen = tmux.wait_for("/stats", lambda s: "speed-up: " in after(s, "/stats"))
        assert "speed-up: none:" in after(screen, "/stats")
        tmux.press("C-d")
        assert tmux.exit_code() == 0
        assert "Traceback" not in tmux.screen()
    finally:
        tmux.close()
