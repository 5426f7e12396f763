"""`edgespec bench --prompt-lengths`: the prompts it builds, and a tiny real sweep on the SmolLM2
pair in a real process (what it measures is reported, never asserted: the test checks the
report's structure, the prompts' lengths, and that every generation evaluated its whole
prompt, i.e. started from cold caches)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgespec.bench.long_prompts import (INSTRUCTION, SLACK, Passages, PromptLengthError,
                                         format_long_prompt_report)


def words(prompt) -> int:
    """A stand-in tokenizer: one token a word (chat messages: their words, and 5 more)."""
    if isinstance(prompt, str):
        return len(prompt.split())
    return sum(len(m["content"].split()) for m in prompt) + 5


def test_passages_fit_their_lengths_and_never_repeat():
    p = Passages()
    seen = []
    for raw in (True, False):
        for length in (40, 300, 1500):
            prompt, n = p.take(words, length, raw)
            assert length - SLACK <= n <= length and n == words(prompt)
            if raw:
                assert prompt.endswith(f"\n\n{INSTRUCTION}\n\nSummary:")
                passage = prompt[:-len(f"\n\n{INSTRUCTION}\n\nSummary:")]
            else:
                assert [m["role"] for m in prompt] == ["system", "user"]
                assert prompt[1]["content"] == INSTRUCTION
                passage = prompt[0]["content"]
            assert passage and passage in p.text
            seen.append(p.text.index(passage))
    assert seen == sorted(seen) and len(set(seen)) == len(seen)   # each after the one before
    with pytest.raises(PromptLengthError, match="too short"):
        p.take(words, 5, raw=False)


@pytest.mark.real
def test_a_prompt_length_sweep_reports_every_cell_from_cold_caches(smollm2_f32_path,
                                                                   smollm2_q4_path):
    proc = subprocess.run(
        [sys.executable, "-m", "edgespec", "bench", "--target", str(smollm2_f32_path),
         "--draft", str(smollm2_q4_path), "--prompt-lengths", "40,80", "--new-tokens", "8",
         "--ctx-size", "512", "--json"],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["prompt_mode"] == "chat"         # SmolLM2 has a chat template
    assert res["prompt_lengths"] == [40, 80] and res["new_tokens"] == [8]
    assert res["draft"] == smollm2_q4_path.name and res["n_ctx"] == 512
    rows = {(r["prompt_length"], r["new_tokens"]): r for r in res["sweep"]}
    assert set(rows) == {(40, 8), (80, 8)}
    for (length, new), row in rows.items():
        (n,) = row["prompt_tokens"]
        assert length - SLACK <= n <= length
        for mode in ("plain", "speculative"):
            side = row[mode]
            assert side["prompt_tokens_evaluated"] == n      # the whole prompt, each time
            assert 0 < side["completion_tokens"] <= new
            assert 0 < side["first_token_seconds"] <= side["whole_seconds"]
            assert side["tokens_per_second"] > 0 and side["prompt_tokens_per_second"] > 0
        # greedy, lossless: the same answer either way
        assert row["plain"]["completion_tokens"] == row["speculative"]["completion_tokens"]
        assert {"acceptance_rate", "tokens_per_pass", "drafted"} <= set(row["speculative"])
        assert "drafted" not in row["plain"]
        assert row["first_token_ratio"] > 0 and row["whole_ratio"] > 0
        assert row["whole_ratio_median"] == pytest.approx(row["whole_ratio"])   # one prompt
    # Per prompt length, the medians of its runs' times to first token, both modes.
    assert [ft["prompt_length"] for ft in res["first_token"]] == [40, 80]
    for ft in res["first_token"]:
        assert ft["samples"] == 1
        row = rows[(ft["prompt_length"], 8)]
        assert ft["plain_median"] == pytest.approx(row["plain"]["first_token_seconds"])
        assert ft["ratio"] == pytest.approx(row["first_token_ratio"])
    table = format_long_prompt_report(res).splitlines()
    assert sum("time to first token at" in line for line in table) == 2
    assert "TTFT plain" in table[0] and "whole spec" in table[0] and "drafted" in table[0]
    assert [line.split()[:2] for line in table[1:3]] == [
        [str(rows[(length, 8)]["prompt_tokens"][0]), "8"] for length in (40, 80)]
    assert "cold caches" in table[-1]
