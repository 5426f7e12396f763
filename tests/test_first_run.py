"""The first run as a new user meets it (issue 16): a line that says what loading is doing
while the models load and are measured, arguments refused before anything loads, one clear
note for a model with no chat template, and the README's first command answered by the real
default pair (issue 54)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time

import pytest

EDGESPEC = [sys.executable, "-m", "edgespec"]


def run_with_terminal_stderr(args, env) -> tuple[int, str, bytes]:
    """Run edgespec with stderr on a pseudo-terminal (stdout a pipe): (rc, stdout, the raw
    bytes written to the terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(EDGESPEC + args, stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    raw = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:             # the child closed the terminal
            break
        if not chunk:
            break
        raw += chunk
    out = proc.stdout.read().decode()
    rc = proc.wait(timeout=600)
    os.close(master)
    return rc, out, raw


@pytest.mark.real
def test_loading_and_calibrating_show_a_changing_line(tmp_path, smollm2_f32_path,
                                                      smollm2_q4_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))   # nothing measured yet
    rc, out, raw = run_with_terminal_stderr(
        ["run", "What is the capital of France?", "--target", str(smollm2_f32_path),
         "--draft", str(smollm2_q4_path), "--temperature", "0", "-n", "12"], env)
    assert rc == 0, raw.decode(errors="replace")
    text = raw.decode()
    steps = [s for s in text.split("\r\x1b[K") if s]
    assert steps[0] == f"loading the target {smollm2_f32_path.name}…"
    assert steps[1] == f"loading the draft {smollm2_q4_path.name}…"
    measuring = [s for s in steps if s.startswith("measuring the models' speed")]
    total = measuring[0].rsplit("/", 1)[1].rstrip("…")
    counted = [int(s.rsplit(" ", 1)[1].split("/")[0]) for s in measuring]
    assert measuring[0].endswith(f" 1/{total}…")
    assert all(b - a in (0, 1) for a, b in zip(counted, counted[1:]))   # each one shown
    # one per measurement, counted to the end; on a busy machine the calibration's time budget
    # may end it early, and then it says so
    assert measuring[-1].endswith(f" {total}/{total}…") or \
        "the machine is busy: measuring less" in text
    # The step line is cleared before the summary; the answer itself is on stdout.
    assert steps[-1].lstrip().startswith("[") and "tok/s" in steps[-1]
    assert "Paris" in out


@pytest.mark.parametrize("args, fragment", [
    (["run", "hi", "--max-tokens", "0"], "max_tokens=0 is invalid"),
    (["run", "hi", "--ctx-size", "8"], "--ctx-size 8 is invalid"),
    (["run", "hi", "--threads", "0"], "--threads 0 is invalid"),
    (["run", "hi", "--draft-max", "-1"], "--draft-max -1 is invalid"),
    (["run", "hi", "--draft-p-min", "1.5"], "--draft-p-min 1.5 is invalid"),
    (["run", "hi", "--n-gpu-layers", "-2"], "--n-gpu-layers -2 is invalid"),
    (["run", "hi", "--temperature", "-1"], "temperature=-1.0 is invalid"),
    (["chat", "--max-tokens", "0"], "max_tokens=0 is invalid"),
    (["chat", "--draft-n-gpu-layers", "-3"], "--draft-n-gpu-layers -3 is invalid"),
    (["serve", "--port", "70000"], "--port 70000"),
    (["serve", "--ctx-size", "0"], "--ctx-size 0 is invalid"),
    (["bench", "-n", "0"], "--max-tokens 0 is invalid"),
    (["bench", "--repeats", "0"], "--repeats 0 is invalid"),
    (["bench", "--ks", "2,0"], "--ks 2,0 is invalid"),
    (["bench", "--prompt-lengths", "100,x"], "--prompt-lengths must be comma-separated"),
    (["bench", "--prompt-lengths", "0"], "--prompt-lengths 0 is invalid"),
    (["bench", "--prompt-lengths", "3000", "--new-tokens", "512", "--ctx-size", "2048"],
     "needs a context of 3512 tokens, more than --ctx-size 2048: load with a larger context "
     "(--ctx-size 4096)"),
    (["calibrate", "--threads", "-1"], "--threads -1 is invalid"),
])
def test_bad_numbers_are_refused_before_any_model_loads(tmp_path, args, fragment):
    # A model path that does not exist: had anything tried to load, the error would name it.
    target = tmp_path / "no-such-model.gguf"
    start = time.monotonic()
    proc = subprocess.run(EDGESPEC + args + ["--target", str(target)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert fragment in proc.stderr and "no-such-model" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30


@pytest.mark.real
def test_a_model_without_a_chat_template_gets_one_note_in_the_chat(gemma_f32_path,
                                                                  gemma_q4_path):
    proc = subprocess.run(EDGESPEC + ["chat", "--target", str(gemma_f32_path), "--draft",
                                      str(gemma_q4_path), "--max-tokens", "4"],
                          input="The capital of France is\n", capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    notes = [ln for ln in proc.stderr.splitlines() if "chat template" in ln]
    assert notes == [f"note: {gemma_f32_path.name}: the model has no chat template, so "
                     "messages are sent as plain text (their contents one after another, no "
                     "roles or markup) for the model to continue"]
    assert "plain text" not in proc.stderr.replace(notes[0], "")
    assert "<|im_" not in proc.stdout


@pytest.mark.real
@pytest.mark.slow
def test_the_readme_first_command_answers_with_the_real_pair(tmp_path, qwen_target_path,
                                                              qwen_draft_path):
    """An empty home (nothing measured, no history) whose models folder holds the default
    pair, as the first run leaves it: the README's own first command, its answer cut short."""
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    command = re.search(r"&& (edgespec run .*?)\s+# set up \+ run", readme).group(1)
    args = __import__("shlex").split(command)[1:] + ["-n", "16"]
    home = tmp_path / "home"
    env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_DATA_HOME=str(home / ".local/share"),
               EDGESPEC_MODELS=str(qwen_target_path.parent))
    rc, out, raw = run_with_terminal_stderr(args, env)
    text = raw.decode(errors="replace")
    assert rc == 0, text
    assert f"loading the target {qwen_target_path.name}" in text
    assert f"loading the draft {qwen_draft_path.name}" in text
    assert len(out.split()) >= 5, out       # an answer in words, not a token or two
