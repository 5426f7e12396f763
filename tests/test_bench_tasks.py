"""`edgespec bench --prompts tasks`: the prompt set's shape (seven tasks, conversations that
alternate, long passages that are really long in SmolLM2's tokens and still fit a 4096-token
context with a 64-token answer, code edits of real-sized files in several languages whose whole
answer fits beside them), code_edit's token budget, its options refused before any model loads,
and a small real run on the SmolLM2 pair in a real process (what it measures is reported, never
asserted: the test checks that every task has its row, that the speedups, the oracle and
default/oracle agree with each other, and that every generation started from cold caches)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec import SamplingParams
from edgespec.bench.copies import copy_passes, in_one_row_passes
from edgespec.bench.task_bench import (TaskCell, edit_budget, format_task_report, limits_note,
                                       summarise, task_configs)
from edgespec.bench.tasks import (CODE_EDITS, EDIT_KINDS, LANGUAGES, LAYOUTS, TASKS, CodeEdit,
                                  as_raw, document, task_prompts)

EDGESPEC = [sys.executable, "-m", "edgespec"]


def test_seven_tasks_of_three_or_four_prompts_each():
    prompts = task_prompts()
    assert tuple(prompts) == TASKS == ("chat", "translation", "summarisation", "qa", "math",
                                       "long_passage", "code_edit")
    assert all(3 <= len(ps) <= 4 for ps in prompts.values())
    flat = [json.dumps(p) for ps in prompts.values() for p in ps]
    assert len(set(flat)) == len(flat)                      # no prompt twice
    for task, ps in prompts.items():
        for p in ps:
            if task == "chat":       # earlier exchanges, then the new user turn
                roles = [m["role"] for m in p]
                assert len(roles) >= 7 and len(roles) % 2 == 1
                assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
                assert all(m["content"].strip() for m in p)
                raw = as_raw(p)
                assert raw.startswith("User: ") and raw.endswith("\n\nAssistant:")
                assert all(m["content"] in raw for m in p)
            elif task == "code_edit":   # raw: the answer's code block opened after the prompt
                raw = as_raw(p, task)
                assert raw.startswith(p + "\n\n```") and raw.endswith("\n")
                assert raw[len(p):].strip() in p.splitlines()     # the file's own fence line
                assert as_raw(p) == p
            else:
                assert isinstance(p, str) and p.strip() and as_raw(p) == p
    for i in (1, 2, 3):          # news-style articles of 400-700 words, in every summary prompt
        article = document(f"summarisation-{i}")
        assert 400 <= len(article.split()) <= 700
        assert article in prompts["summarisation"][i - 1]
        assert document(f"long_passage-{i}") in prompts["long_passage"][i - 1]


def test_long_passages_are_1500_to_2500_tokens_and_fit_4096_with_the_answer(smollm2_f32_path):
    from edgespec.backend import VocabOnly
    with VocabOnly(smollm2_f32_path) as v:
        def count(text: str) -> int:
            return len(v.vocabulary.tokenize(text, add_special=True, parse_special=False))
        for i, prompt in enumerate(task_prompts()["long_passage"], 1):
            assert 1500 <= count(document(f"long_passage-{i}")) <= 2500
            # the chat template adds a few dozen tokens (a system message, roles): 200 spare
            assert count(prompt) + 200 + 64 <= 4096


def test_code_edits_are_200_to_1300_tokens_and_fit_4096_with_their_whole_answer(
        smollm2_f32_path):
    from edgespec.backend import VocabOnly
    with VocabOnly(smollm2_f32_path) as v:
        def count(text: str, special: bool = True) -> int:
            return len(v.vocabulary.tokenize(text, add_special=special, parse_special=False))
        for edit, prompt in zip(CODE_EDITS, task_prompts()["code_edit"]):
            file_tokens = count(edit.code(), special=False)
            assert 200 <= file_tokens <= 1300
            assert count(prompt) < 1500
            # the chat template's 200 spare, and the whole budget: never cut by the context
            assert count(prompt) + 200 + edit_budget(file_tokens) <= 4096


def test_code_edits_are_real_sized_files_in_three_languages_with_four_kinds_of_edit():
    prompts = task_prompts()["code_edit"]
    assert len(prompts) == len(CODE_EDITS) >= 4
    for edit, prompt in zip(CODE_EDITS, prompts):
        code = edit.code()
        assert 60 <= len(code.splitlines()) <= 130
        assert edit.kind in EDIT_KINDS and edit.layout in LAYOUTS
        assert edit.language == LANGUAGES[Path(edit.path).suffix]
        # its packaged file is named by its language, stored as text (no linter reads it)
        assert edit.source.endswith(Path(edit.path).suffix)
        # one user message as an editing tool sends it: the file fenced, named, whole
        assert f"```{edit.language}" in prompt and f"\n{code}\n```" in prompt
        assert edit.path in prompt and edit.ask in prompt
        assert prompt.endswith(edit.reply)
    assert len({edit.language for edit in CODE_EDITS}) >= 3
    assert len({edit.kind for edit in CODE_EDITS}) >= 4
    assert len({edit.source for edit in CODE_EDITS}) == len(CODE_EDITS)
    with pytest.raises(ValueError, match="kind 'poetry' must be one of"):
        CodeEdit("code_edit-1.py", "app/cache.py", "poetry", "Make it rhyme.")


@pytest.mark.parametrize("file_tokens, prompt_tokens, n_ctx, cap, budget", [
    (800, 0, None, None, 1264),         # 1.5 × 800 + 64
    (801, 0, None, None, 1266),         # rounded up: 1201.5 -> 1202, + 64
    (800, 1000, 4096, None, 1264),      # the context holds it
    (800, 3000, 4096, None, 1096),      # at most what the context has left after the prompt
    (800, 1000, 4096, 16, 16),          # -n caps it when given
])
def test_a_code_edits_budget_is_one_and_a_half_files_and_64_within_the_context(
        file_tokens, prompt_tokens, n_ctx, cap, budget):
    assert edit_budget(file_tokens, prompt_tokens, n_ctx, cap) == budget


def test_code_edit_budgets_are_reported_beside_the_other_tasks_limit():
    res = {"tasks": {"qa": {}, "code_edit": {"ended": 3, "prompts": 4}}, "max_tokens": 64,
           "max_tokens_by_task": {"qa": [64] * 4, "code_edit": [1264, 900, 1500, 1321]},
           "edit_budget": {"ratio": 1.5, "spare": 64, "cap": None}}
    assert limits_note(res) == (
        "up to 64 new tokens; code_edit the whole file back: up to 1.5 × its file's tokens + "
        "64, within the context (900-1500 new tokens; 3/4 plain answers ended on their own)")
    del res["tasks"]["qa"]
    res["edit_budget"]["cap"] = 8
    res["max_tokens_by_task"]["code_edit"] = [8] * 4
    assert limits_note(res) == (
        "the whole file back: up to 1.5 × its file's tokens + 64, at most -n 8, within the "
        "context (8 new tokens; 3/4 plain answers ended on their own)")


def test_the_oracle_is_the_best_other_configuration_per_task():
    configs, default = task_configs([2, 4])
    names = [c.name for c in configs]
    assert names[0] == "plain" and {"K=2", "K=4", "adaptive", "ngram", default} <= set(names)
    assert default == "hybrid"          # the Engine's default drafter, adaptive

    def cells(seconds: dict, drafted=10, accepted=5) -> dict:
        return {n: TaskCell(runs=2, seconds=seconds.get(n, 2.0), drafted=drafted,
                        accepted=accepted) for n in names}
    res = summarise({"qa": cells({"plain": 2.0, "K=2": 1.0, "K=4": 4.0, default: 0.5}),
                     "math": cells({"plain": 3.0, "K=2": 6.0, "K=4": 2.0, default: 3.0},
                                   drafted=0, accepted=0)}, configs, default)
    qa, math_ = res["tasks"]["qa"], res["tasks"]["math"]
    assert qa["plain_seconds"] == 1.0 and qa["speedups"]["K=2"] == 2.0
    assert qa["oracle"] == {"config": "K=2", "speedup": 2.0}
    assert qa["default_over_oracle"] == 2.0 and qa["default_acceptance"] == 0.5
    assert math_["oracle"] == {"config": "K=4", "speedup": 1.5}
    assert math_["default_over_oracle"] == pytest.approx(1 / 1.5)
    assert math_["default_acceptance"] is None          # it drafted nothing
    g = res["geomean"]
    assert g["oracle"]["speedup"] == pytest.approx(math.sqrt(2.0 * 1.5))
    assert g["default_over_oracle"] == pytest.approx(math.sqrt(2.0 / 1.5))
    assert g["default_acceptance"] == 0.5 and g["prompts"] == 4
    res.update(max_tokens=4, temperature=0.0, cold=True, warm_runs=0)
    table = format_task_report(res).splitlines()
    assert table[0].split()[:3] == ["task", "plain", "s"] and "hybrid*" in table[0]
    assert [line.split()[0] for line in table[1:4]] == ["qa", "math", "geomean"]
    assert "K=2 2.00" in table[1] and table[2].endswith("-")
    assert "cold caches" in table[-1]
    # where the time went: a row per task under its own header
    at = next(i for i, line in enumerate(table) if line.startswith("where the time went"))
    assert "hybrid* tok/s" in table[at + 1]
    assert [line.split()[0] for line in table[at + 2:at + 4]] == ["qa", "math"]


def test_the_copies_bound_drafts_each_match_exactly_as_far_as_the_answer_follows_it():
    file = list(range(100, 160))         # 60 tokens, none repeated
    edit = file[:30] + [999] + file[30:]     # one new token in the middle
    # no match for the answer's first two tokens (the prompt's end is not met earlier), then
    # the file's copy as far as the new token (28 drafts and the new token from the pass's
    # last row), two passes of one row, and the rest of the copy
    assert copy_passes(file, edit, max_rows=64) == [1, 1, 29, 1, 1, 29]
    # at most max_rows - 1 drafts a pass
    assert copy_passes(file, edit, max_rows=16) == [1, 1, 16, 13, 1, 1, 16, 13]
    # a match whose first token is wrong drafts nothing (the answer parts from the file)
    assert copy_passes(file, file[:5] + [7, 8, 9], max_rows=64) == [1, 1, 4, 1, 1]
    # priced by a pass's seconds for n rows, in one-row passes
    assert in_one_row_passes([1, 1, 29], lambda n: 1 + 0.1 * (n - 1)) == pytest.approx(5.8)
    assert in_one_row_passes([], lambda n: n) == 0.0
    # the bench's column: plain's 100 tokens whole in 10 s, 8 of them decoding
    names = [c.name for c in task_configs([2])[0]]
    cells = {n: TaskCell(runs=1, seconds=10.0 if n == "plain" else 5.0, tokens=100,
                         decode=8.0) for n in names}
    cells["plain"].copy_rows = [1] * 20 + [40, 40]      # 100 tokens in 22 passes
    res = summarise({"code_edit": cells}, *task_configs([2]), perfect=(0.1, 64),
                    price=lambda rows: in_one_row_passes(rows, lambda n: 1 + 0.1 * (n - 1)))
    row = res["tasks"]["code_edit"]
    # 20 + 2 × 4.9 = 29.8 one-row passes for 100 tokens: decoding at 0.298 of plain's
    assert row["copies"] == pytest.approx(10.0 / (2.0 + 8.0 * 0.298))
    assert row["bound"] == pytest.approx(10.0 / (2.0 + 0.8))
    assert row["default_over_copies"] == pytest.approx(2.0 / row["copies"])
    assert "copies" in format_task_report({**res, "max_tokens": 4, "temperature": 0.0,
                                           "cold": True, "warm_runs": 0}).splitlines()[0]


def test_where_the_time_went_is_each_parts_share_of_the_whole_answers():
    class S:        # a generation's stats, as the bench reads them
        completion_tokens, drafted, accepted = 50, 40, 30
        prompt_seconds, draft_seconds, verify_seconds = 1.0, 0.5, 2.0
        decode_seconds = 2.8
    c = TaskCell()
    c.add(S, 4.0)
    c.add(S, 4.0)
    b = c.breakdown()
    assert b["tokens_per_second"] == pytest.approx(100 / 5.6)
    assert b["shares"] == pytest.approx({"prompt": 0.25, "draft": 0.125, "verify": 0.5,
                                         "python": 0.075})


@pytest.mark.parametrize("args, fragment", [
    (["--tasks", "qa"], "--tasks goes with --prompts tasks"),
    (["--prompts", "tasks", "--tasks", "qa,poetry"], "--tasks qa,poetry is invalid"),
    (["--prompts", "tasks", "--load", "1"], "--load does not apply to --prompts tasks"),
])
def test_task_options_are_refused_before_any_model_loads(tmp_path, args, fragment):
    target = tmp_path / "no-such-model.gguf"
    proc = subprocess.run(EDGESPEC + ["bench", *args, "--target", str(target)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and fragment in proc.stderr, proc.stderr
    assert "no-such-model" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.real
def test_a_task_run_has_every_tasks_row_from_cold_caches(smollm2_f32_path, smollm2_q4_path):
    proc = subprocess.run(
        EDGESPEC + ["bench", "--target", str(smollm2_f32_path), "--draft", str(smollm2_q4_path),
                    "--prompts", "tasks", "--tasks", "qa,code_edit", "-n", "4", "--ks", "2",
                    "--json"],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["prompt_set"] == "tasks" and res["prompt_mode"] == "chat"
    assert res["configs"] == ["plain", "K=2", "adaptive", "ngram", "hybrid"]
    assert res["default"] == "hybrid" and res["pinned"] == ["K=2", "adaptive", "ngram"]
    assert res["max_tokens"] == 4 and res["cold"] and res["warm_runs"] == 0
    assert list(res["tasks"]) == ["qa", "code_edit"]
    n = len(task_prompts()["qa"]) + len(CODE_EDITS)
    # code_edit's budgets, capped by -n for this test: a quick run of the task, its prompts
    # whole (800-1300 tokens each)
    assert res["max_tokens_by_task"] == {"qa": [4] * 4, "code_edit": [4] * len(CODE_EDITS)}
    assert res["edit_budget"] == {"ratio": 1.5, "spare": 64, "cap": 4}
    assert len(res["file_tokens"]["code_edit"]) == len(CODE_EDITS)
    for size, f in zip(res["prompt_tokens"]["code_edit"], res["file_tokens"]["code_edit"]):
        assert 200 <= f < size < 1500
    for task, row in res["tasks"].items():
        assert row["prompts"] == len(task_prompts()[task]) == len(res["prompt_tokens"][task])
        assert row["plain_seconds"] > 0
        assert set(row["speedups"]) == set(res["configs"][1:])
        assert all(s > 0 for s in row["speedups"].values())
        for name, s in row["speedups"].items():     # plain time / its time
            assert s == pytest.approx(row["plain_seconds"] / row["seconds"][name])
        best = max(res["pinned"], key=lambda name: row["speedups"][name])
        assert row["oracle"] == {"config": best, "speedup": row["speedups"][best]}
        assert row["default_over_oracle"] == pytest.approx(
            row["speedups"]["hybrid"] / row["speedups"][best])
        a = row["default_acceptance"]
        assert a is None or 0 <= a <= 1
        # greedy and lossless: every configuration gave the same answers
        assert len(set(row["completion_tokens"].values())) == 1
        assert 0 < row["completion_tokens"]["plain"] <= 4 * row["prompts"]
        assert 0 <= row["ended"] <= row["prompts"]
        # where the time went, plain and the default: decoding's tokens per second, and the
        # parts' shares of the whole answers' time (the rest was the text and the HTTP-free
        # bookkeeping around them)
        for name in ("plain", "hybrid"):
            t = row["time"][name]
            assert t["tokens_per_second"] > 0
            assert set(t["shares"]) == {"prompt", "draft", "verify", "python"}
            assert all(0 <= v <= 1 for v in t["shares"].values())
            assert 0.5 < sum(t["shares"].values()) <= 1.0 + 1e-9   # disjoint parts
        assert row["time"]["plain"]["shares"]["draft"] == 0
        # the copies' bound: perfect lengths for the context's own matches, no better than
        # perfect drafts of every token
        assert 1.0 <= row["copies"] <= row["bound"] + 1e-9
        assert row["default_over_copies"] == pytest.approx(
            row["speedups"]["hybrid"] / row["copies"])
    g = res["geomean"]
    assert g["prompts"] == n
    for name in res["configs"][1:]:
        assert g["speedups"][name] == pytest.approx(
            math.sqrt(res["tasks"]["qa"]["speedups"][name]
                      * res["tasks"]["code_edit"]["speedups"][name]))
    assert g["default_over_oracle"] == pytest.approx(
        g["speedups"]["hybrid"] / g["oracle"]["speedup"])
    table = format_task_report(res).splitlines()
    assert [line.split()[0] for line in table[1:4]] == ["qa", "code_edit", "geomean"]
    assert "up to 4 new tokens; code_edit the whole file back" in table[-1]
    assert "at most -n 4" in table[-1]


def test_an_apps_sampler_is_what_the_app_sends_and_temperature_changes_only_it():
    import argparse

    from edgespec.bench.command import bench_sampling

    def args(**kw):
        base = dict(sampler=None, temperature=None, seed=None)
        return argparse.Namespace(**{**base, **kw})
    assert bench_sampling(args()).greedy
    assert bench_sampling(args(temperature=0.7)) == SamplingParams(temperature=0.7)
    ollama = bench_sampling(args(sampler="ollama", seed=5))
    assert (ollama.temperature, ollama.top_k, ollama.top_p, ollama.min_p, ollama.repeat_penalty,
            ollama.repeat_last_n, ollama.seed) == (0.8, 40, 0.9, 0.0, 1.1, 64, 5)
    qwen = bench_sampling(args(sampler="qwen", temperature=0.2))
    assert (qwen.temperature, qwen.top_k, qwen.top_p, qwen.repeat_penalty) == (0.2, 20, 0.8, 1.05)
    assert bench_sampling(args(sampler="openai")) == SamplingParams.neutral(1.0)
