"""The command line, run as a user runs it: a real process, real files, real exit codes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import gguf
import pytest


def edgespec(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "edgespec", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def assert_user_error(proc, *fragments):
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[0]


def test_missing_file(tmp_path):
    assert_user_error(edgespec("run", "hi", "--target", tmp_path / "none.gguf"),
                      "none.gguf: no such file")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("these are my notes, not a model " * 10)
    assert_user_error(edgespec("run", "hi", "--target", p), "not a valid GGUF model",
                      "bad magic")


def test_truncated_gguf(tmp_path, smollm2_q4_path):
    p = tmp_path / "cut.gguf"
    with open(smollm2_q4_path, "rb") as f:
        p.write_bytes(f.read(50_000_000))
    assert_user_error(edgespec("run", "hi", "--target", p), "not a valid GGUF model",
                      "past the end")


def test_mismatched_pair_names_the_tokenizer_difference(smollm2_f32_path, gemma_q4_path):
    # Gemma's 262k tokens as a draft for SmolLM2: too few of them are SmolLM2's
    assert_user_error(edgespec("run", "hi", "--target", smollm2_f32_path, "--draft",
                               gemma_q4_path), "not compatible", "tokenizer types differ",
                      "only 17.6% of the draft's tokens map to the target's",
                      "pick a draft that shares the target's tokenizer or most of its tokens")


def test_a_draft_of_another_family_drafts_across_vocabularies(smollm2_q4_path, gemma_f32_path):
    # (an F32 target: a quantised one's batched passes may break near-ties differently)
    proc = edgespec("run", "The capital of France is", "--target", gemma_f32_path, "--draft",
                    smollm2_q4_path, "--raw", "-n", "12", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert ("draft and target use different vocabularies: 93.8% of the draft's tokens map to "
            "the target's; drafting across them") in proc.stderr
    plain = edgespec("run", "The capital of France is", "--target", gemma_f32_path, "--raw",
                     "-n", "12", "--temperature", "0")
    assert plain.returncode == 0, plain.stderr
    assert proc.stdout == plain.stdout and proc.stdout.strip()


def test_a_draft_with_one_token_changed_drafts_across_and_names_it(tmp_path, smollm2_f32_path,
                                                         smollm2_q4_path):
    patched = tmp_path / "patched-draft.gguf"
    shutil.copy(smollm2_q4_path, patched)
    reader = gguf.GGUFReader(str(patched), "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    token = field.parts[field.data[1000]]
    original = bytes(token).decode()
    token[0] = ord("Q") if token[0] != ord("Q") else ord("Z")   # same length, new text
    reader.data.flush()
    del reader
    # One token of 49,152 differs: llama.cpp's rule refuses the pair; edgespec drafts across
    proc = edgespec("run", "hi", "--target", smollm2_f32_path, "--draft", patched, "-n", "4")
    assert proc.returncode == 0, proc.stderr
    assert ("draft and target use different vocabularies: 99.9% of the draft's tokens map to "
            "the target's") in proc.stderr
    assert f"token 1000 differs (target {original!r}" in proc.stderr


def test_bad_sampling_value_is_one_line(smollm2_f32_path):
    assert_user_error(edgespec("run", "hi", "--target", smollm2_f32_path, "--top-p", "1.5"),
                      "top_p=1.5", "(0, 1]")


def test_bad_flag_is_one_line():
    assert_user_error(edgespec("run", "hi", "--no-such-flag"), "unrecognized arguments")


def test_unknown_pair_suggests_close_matches():
    assert_user_error(edgespec("run", "hi", "--pair", "smollm2"), "unknown pair 'smollm2'",
                      "smollm2-135m")


def test_run_json(smollm2_f32_path, smollm2_q4_path):
    proc = edgespec("run", "The capital of France is", "--target", smollm2_f32_path, "--draft",
                    smollm2_q4_path, "--raw", "--temperature", "0", "-n", "16", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"text", "tokens", "finish_reason", "stats"}
    assert len(out["tokens"]) == 16 and out["finish_reason"] == "length"
    assert "Paris" in out["text"]
    s = out["stats"]
    # Whether drafting paid is the cost model's call (a busy machine may rightly decode
    # plainly); what the stats say must hold together either way.
    assert s["speculative"] is True and s["completion_tokens"] == 16
    assert 0 <= s["accepted"] <= s["drafted"] and 0 <= s["acceptance_rate"] <= 1
    assert s["target_passes"] + s["accepted"] == 16 and s["tokens_per_second"] > 0
    # time to first token: from the prompt's processing to the first token, inside the turn
    assert 0 < s["first_token_seconds"] <= s["prompt_seconds"] + s["decode_seconds"]
    assert s["prompt_tokens_evaluated"] > 0 and s["prompt_tokens_per_second"] > 0


def test_run_streams_text_and_stats(smollm2_f32_path, smollm2_q4_path):
    proc = edgespec("run", "The capital of France is", "--target", smollm2_f32_path, "--draft",
                    smollm2_q4_path, "--raw", "--temperature", "0", "-n", "12",
                    "--draft-max", "4")     # pinned: it drafts whatever the machine's load
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "tok/s" in proc.stderr and "acceptance" in proc.stderr
    # the summary line says how fast the prompt went and when the first token came
    assert re.search(r"prompt \d+ tokens \(\d+ evaluated at \d+ tok/s\)", proc.stderr)
    assert re.search(r"first token after \d+\.\d\d s", proc.stderr)


def test_run_completes_as_is_with_a_model_that_has_no_chat_template(gemma_q4_path):
    # Gemma-3-270M is a base model without a chat template: wrapped in ChatML it would
    # continue the markup. `run` completes the prompt as-is (as llama-cli does) and says so;
    # --system goes before it as plain text (the chat template's plain fallback).
    args = ("run", "The history of the Roman Empire", "--target", gemma_q4_path, "--no-spec",
            "--temperature", "0", "-n", "6", "--json")
    auto, raw, system = (edgespec(*args), edgespec(*args, "--raw"),
                         edgespec(*args, "--system", "Answer briefly."))
    for proc in (auto, raw, system):
        assert proc.returncode == 0, proc.stderr
    a, r, s = (json.loads(p.stdout) for p in (auto, raw, system))
    assert a["tokens"] == r["tokens"]
    assert a["stats"]["prompt_tokens"] == r["stats"]["prompt_tokens"] < 10
    assert "completed as-is" in auto.stderr and "completed as-is" not in raw.stderr
    # --system: its text and a blank line before the prompt, no ChatML markup
    assert r["stats"]["prompt_tokens"] < s["stats"]["prompt_tokens"] < \
        r["stats"]["prompt_tokens"] + 10


def test_no_spec_and_ngram_drafter(smollm2_f32_path):
    a = edgespec("run", "a b a b a b a b", "--target", smollm2_f32_path, "--raw",
                 "--temperature", "0", "-n", "8", "--json", "--no-spec")
    b = edgespec("run", "a b a b a b a b", "--target", smollm2_f32_path, "--raw",
                 "--temperature", "0", "-n", "8", "--json", "--drafter", "ngram")
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["tokens"] == jb["tokens"]
    assert ja["stats"]["drafted"] == 0 and jb["stats"]["drafted"] > 0


def test_run_json_schema_output_parses(smollm2_f32_path, smollm2_q4_path):
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}
    proc = edgespec("run", "What is the capital of France? Answer in JSON.", "--target",
                    smollm2_f32_path, "--draft", smollm2_q4_path, "--temperature", "0",
                    "-n", "40", "--json-schema", json.dumps(schema), "--quiet")
    assert proc.returncode == 0, proc.stderr
    value = json.loads(proc.stdout)
    assert set(value) == {"capital"}


def test_run_regex_and_grammar_file(smollm2_f32_path, tmp_path):
    proc = edgespec("run", "Pick a number:", "--target", smollm2_f32_path, "--raw",
                    "--temperature", "0", "-n", "8", "--regex", "[0-9]{3}", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().isdigit() and len(proc.stdout.strip()) == 3
    grammar = tmp_path / "yesno.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    proc = edgespec("run", "Is Paris in France?", "--target", smollm2_f32_path,
                    "--temperature", "0", "-n", "8", "--grammar", str(grammar), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("yes", "no")


@pytest.mark.parametrize("args, fragment", [
    (["--json-schema", '{"type": "nope"}'], "the JSON schema is invalid"),
    (["--json-schema", "no-such-schema.json"], "--json-schema: cannot read no-such-schema.json"),
    (["--regex", "(ab"], "the regular expression is invalid"),
    (["--grammar", "no-such.gbnf"], "--grammar: cannot read no-such.gbnf"),
    (["--regex", "a", "--json-output"], "not allowed with argument"),
])
def test_bad_constraints_fail_before_any_model_loads(args, fragment):
    # The model path does not exist: the constraint is what the error must be about.
    assert_user_error(edgespec("run", "hi", "--target", "/no/such/model.gguf", *args), fragment)


def test_calibrate_measures_and_says_where_it_is_kept(smollm2_f32_path, smollm2_q4_path,
                                                       tmp_path):
    env_home = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "edgespec", "calibrate", "--target",
                           str(smollm2_f32_path), "--draft", str(smollm2_q4_path)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XDG_CACHE_HOME": str(env_home)})
    assert proc.returncode == 0, proc.stderr
    assert "ms per pass by batch size" in proc.stdout and "of a target token" in proc.stdout
    kept = env_home / "edgespec" / "calibration.json"
    if "kept in" in proc.stdout:            # a quiet machine: kept for later sessions
        assert str(kept) in proc.stdout and kept.exists()
    else:                                   # a busy one: said so, and nothing kept
        assert "not kept: the machine looked busy" in proc.stdout and not kept.exists()
