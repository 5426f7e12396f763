"""The preflight for CPU code paths that fault (edgespec/backend/preflight.py): children that
really die by a signal give a fault verdict, the parent survives, the verdict is kept per CPU
and build, one note says so, and models then load without the faulting path."""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from edgespec import paths
from edgespec.backend import preflight
from edgespec.backend.probe import write_probe_model
from edgespec.errors import BackendError

# A child that executes an illegal instruction (x86's ud2) from an executable page: a real
# SIGILL, as llama.cpp's AMX kernel raises on a CPU whose OS has not enabled the tile unit.
SIGILL_CHILD = textwrap.dedent("""
    import ctypes, mmap, os, signal, sys
    print("step a batch of 8 tokens", flush=True)
    if __import__("platform").machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        os.kill(os.getpid(), signal.SIGILL)
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(b"\\x0f\\x0b")                       # ud2
    addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
    ctypes.CFUNCTYPE(None)(addr)()
""")
FINE_CHILD = "print('step fine'); print('ok')"

QUANTISED = {"blk.0.ffn_up.weight": ((256, 512), 12, 0, 0)}       # Q4_K
PLAIN = {"blk.0.ffn_up.weight": ((256, 512), 0, 0, 0)}            # F32


def command(on_crashes: bool = True, off_crashes: bool = False, repack_crashes: bool = False):
    def cmd(mode: str) -> list:
        crash = {"on": on_crashes, "off": off_crashes, "repack": repack_crashes}[mode]
        return [sys.executable, "-c", SIGILL_CHILD if crash else FINE_CHILD]
    return cmd


def must_not_run(mode: str):
    raise AssertionError("the preflight ran a child although a verdict was kept")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A cache folder of its own and no verdict in this process (restored afterwards)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    saved = preflight._STATE.verdict, preflight._STATE.noted
    preflight.forget()
    yield tmp_path
    preflight._STATE.verdict, preflight._STATE.noted = saved


def test_a_child_that_dies_by_sigill_is_a_fault_and_the_parent_survives(fresh):
    v = preflight.run_check(command())
    assert v.faults and not v.fallback_faults
    assert v.cause == "SIGILL on a batch of 8 tokens"
    assert not v.use_extra_buffers
    assert v.seconds > 0
    # the negative control: the same check with children that finish is no fault
    ok = preflight.run_check(command(on_crashes=False))
    assert not ok.faults and not ok.fallback_faults and ok.cause == ""


def test_the_verdict_is_kept_per_cpu_and_build_and_read_back_without_a_child(fresh):
    v = preflight.verdict(refresh=True, command=command())
    assert v.faults and not v.cached
    key, parts = preflight.cache_key()
    kept = json.loads(paths.cpu_check_file().read_text())
    assert kept[key]["verdict"]["faults"] is True
    assert kept[key]["of"]["kernel"].startswith(platform.system())
    assert set(parts) == {"cpu", "cpu_flags", "kernel", "llama_cpp_python", "build", "check"}
    assert preflight.verdict(command=must_not_run) is v        # this process: memo
    preflight.forget()
    again = preflight.verdict(command=must_not_run)             # another process: the file
    assert again.cached and again.faults and again.cause == v.cause
    # another build (or CPU, or kernel) is another key: checked again
    kept[key + "x"] = kept.pop(key)
    paths.cpu_check_file().write_text(json.dumps(kept))
    preflight.forget()
    assert not preflight.verdict(command=command(on_crashes=False)).faults


def test_a_hung_child_is_not_kept(fresh, monkeypatch):
    monkeypatch.setattr(preflight, "CHECK_TIMEOUT", 1.0)
    def slow(mode: str) -> list:
        return [sys.executable, "-c", "import time; time.sleep(30)" if mode == "on"
                else FINE_CHILD]
    t0 = time.monotonic()
    v = preflight.verdict(refresh=True, command=slow)
    assert time.monotonic() - t0 < 10
    assert v.faults and v.timed_out and "no answer within 1 s" in v.cause
    assert not paths.cpu_check_file().exists() or \
        preflight.cache_key()[0] not in json.loads(paths.cpu_check_file().read_text())


def test_a_fault_turns_the_extra_buffers_off_with_one_note(fresh, monkeypatch, caplog):
    monkeypatch.setattr(preflight, "extra_buffer_types", lambda: ("AMX", "CPU_REPACK"))
    preflight.verdict(refresh=True, command=command())
    with caplog.at_level(logging.WARNING, logger="edgespec.backend.preflight"):
        assert preflight.use_extra_buffers(QUANTISED, "auto") is False
        assert preflight.use_extra_buffers(QUANTISED, "auto") is False
    notes = [r for r in caplog.records if getattr(r, "note", False)]
    assert len(notes) == 1
    msg = notes[0].getMessage()
    assert "AMX unit faults" in msg and "llama.cpp #26954" in msg and "SIGILL" in msg
    assert notes[0].options == ("cpu_extra_buffers",)
    # another process reads the kept verdict: the extra buffers stay off, and it is quiet
    preflight.forget()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgespec.backend.preflight"):
        assert preflight.use_extra_buffers(QUANTISED, "auto") is False
    assert preflight.verdict().cached and not caplog.records
    # explicit settings and plain weights decide without the verdict
    assert preflight.use_extra_buffers(QUANTISED, "on") is True
    assert preflight.use_extra_buffers(PLAIN, "auto") is True
    preflight.forget()
    monkeypatch.setattr(preflight, "verdict", lambda *a, **k: pytest.fail("checked"))
    assert preflight.use_extra_buffers(QUANTISED, "off") is False
    assert preflight.use_extra_buffers(PLAIN, "auto") is True


def test_no_note_where_nothing_faults(fresh, monkeypatch, caplog):
    monkeypatch.setattr(preflight, "extra_buffer_types", lambda: ("CPU_REPACK",))
    preflight.verdict(refresh=True, command=command(on_crashes=False))
    with caplog.at_level(logging.WARNING, logger="edgespec.backend.preflight"):
        assert preflight.use_extra_buffers(QUANTISED, "auto") is True
    assert not caplog.records


def test_a_cpu_that_faults_even_without_them_is_a_clear_error(fresh, monkeypatch):
    monkeypatch.setattr(preflight, "extra_buffer_types", lambda: ("AMX",))
    preflight.verdict(refresh=True, command=command(on_crashes=True, off_crashes=True))
    with pytest.raises(BackendError, match="even without its extra CPU kernels .*SIGILL.*"
                                           "rebuild it for this machine"):
        preflight.use_extra_buffers(QUANTISED, "auto")


def test_the_repacked_kernels_alone_are_checked_beside_the_others(fresh, monkeypatch, caplog):
    monkeypatch.setattr(preflight, "extra_buffer_types", lambda: ("AMX", "CPU_REPACK"))
    v = preflight.verdict(refresh=True, command=command())
    assert v.faults and v.repack and v.repack_alone and not v.use_extra_buffers
    assert "AMX faults on this CPU" in v.describe() and v.describe().endswith(
        "AMX off, CPU_REPACK on")
    with caplog.at_level(logging.WARNING, logger="edgespec.backend.preflight"):
        assert preflight.use_extra_buffers(QUANTISED, "auto") is False
    assert "(llama.cpp's repacked kernels kept)" in caplog.records[0].getMessage()
    # kept, and read back by another process
    preflight.forget()
    assert preflight.verdict(command=must_not_run).repack_alone
    # the negative control: where the repacked kernels alone fault too, they are not kept
    alone_faults = preflight.verdict(refresh=True, command=command(repack_crashes=True))
    assert alone_faults.faults and not alone_faults.repack and not alone_faults.repack_alone
    assert preflight.repack_alone(QUANTISED, "auto") is None
    assert "repacked kernels kept" not in alone_faults.note()
    assert alone_faults.describe().endswith(": off")


def test_a_build_with_the_repacked_kernels_only_runs_two_children(fresh, monkeypatch):
    monkeypatch.setattr(preflight, "extra_buffer_types", lambda: ("CPU_REPACK",))
    ran = []

    def cmd(mode: str) -> list:
        ran.append(mode)
        return command(on_crashes=False)(mode)
    v = preflight.verdict(refresh=True, command=cmd)
    assert sorted(ran) == ["off", "on"] and not v.faults and not v.repack_alone


def test_the_patterns_name_exactly_the_weights_given():
    import re
    from edgespec.backend.repack import patterns
    every = [f"blk.{i}.{k}.weight" for i in range(12) for k in ("attn_q", "ffn_down", "ffn_up")]
    every += ["output.weight", "token_embd.weight", "blk.1.attn_q.bias", "blk.11.attn_qx.weight"]
    chosen = [n for n in every if n.endswith("ffn_down.weight") and n != "blk.1.ffn_down.weight"]
    chosen += ["blk.10.attn_q.weight", "output.weight"]
    pats = patterns(chosen)
    assert len(pats) == 3                      # one per kind of weight, not one per weight
    matched = [n for n in every if any(re.search(p, n) for p in pats)]
    assert sorted(matched) == sorted(chosen)


def test_the_probe_model_is_a_gguf_that_every_kernel_takes(tmp_path):
    from edgespec.gguf_file import read_gguf
    path = tmp_path / "probe.gguf"
    write_probe_model(path)
    info = read_gguf(path)
    assert info.architecture == "llama"
    mats = {n: dims for n, (dims, _, _, _) in info.tensors.items() if len(dims) == 2}
    assert len(mats) == 9
    # AMX wants rows in multiples of 32, the K-quants columns in multiples of 256
    assert all(d[1] % 32 == 0 and d[0] % 256 == 0 for d in mats.values())


# -- on this machine's real llama.cpp build and real models -----------------------------------

APP = textwrap.dedent("""
    import sys, threading
    from edgespec import Engine, SamplingParams
    out = []
    def app():
        with Engine.load(target=sys.argv[1], draft=sys.argv[2], n_ctx=512, draft_max=4,
                         cpu_extra_buffers=sys.argv[3]) as eng:
            out.append(eng.generate(sys.argv[4], max_tokens=16, raw=True,
                                    sampling=SamplingParams(temperature=0.0)).text)
    t = threading.Thread(target=app)
    t.start()
    t.join()
    print(out[0] if out else "")
""")


def greedy_plain(path, mode: str, n: int = 24) -> list:
    from edgespec.backend import LlamaModel
    from edgespec.config import ModelConfig
    m = LlamaModel(ModelConfig(path, n_ctx=256, n_threads=2, cpu_extra_buffers=mode))
    try:
        toks = m.tokenize("The quick brown fox jumps over", add_special=True)
        row = m.eval(toks, 1)[0]
        out = []
        for _ in range(n):
            out.append(int(row.argmax()))
            row = m.eval([out[-1]], 1)[0]
        return out, m.extra_buffers, m.repacked
    finally:
        m.close()


def test_the_real_verdict_agrees_with_a_real_decode():
    """The preflight's child on this machine's build: it dies by a signal exactly when the
    verdict says the extra buffer types fault (an AMX Xeon here: SIGILL)."""
    v = preflight.verdict()
    if not v.extra_buffers:
        assert preflight.extra_buffer_types() == ()
        return
    proc = subprocess.run(preflight.child_command("on"), capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode < 0) == v.faults, (proc.returncode, v)
    off = subprocess.run(preflight.child_command("off"), capture_output=True, text=True,
                         timeout=120)
    assert off.returncode == 0 and off.stdout.strip().endswith("ok")
    if "CPU_REPACK" in v.extra_buffers and len(v.extra_buffers) > 1:
        # the repacked kernels alone, named weight by weight: they decode where AMX faults
        alone = subprocess.run(preflight.child_command("repack"), capture_output=True,
                               text=True, timeout=120)
        assert (alone.returncode == 0 and alone.stdout.strip().endswith("ok")) == v.repack


def test_a_quantised_model_through_the_fallback_decodes_as_without_extra_buffers(gemma_q4_path):
    auto, used, kept = greedy_plain(gemma_q4_path, "auto")
    off, _, _ = greedy_plain(gemma_q4_path, "off")
    v = preflight.verdict()
    assert used == v.use_extra_buffers
    assert (kept > 0) == v.repack_alone     # where AMX faults, the repacked kernels stay
    if not used and not kept:
        assert auto == off             # the fallback is the load without extra buffers
    else:                              # repacked weights: other kernels, near-ties may differ
        agree = next((i for i, (a, b) in enumerate(zip(auto, off)) if a != b), len(off))
        assert agree >= 8, (auto, off)


def test_the_repacked_kernels_alone_take_a_real_models_multiplied_weights(gemma_q4_path):
    """``cpu_extra_buffers="repack"`` on this build: the Q4_K weights the repacked kernels take
    go to ``CPU_REPACK`` by name (never the token embeddings, read by row), the model loads and
    decodes on any CPU (no AMX there), and its greedy text agrees with the plain load's."""
    from edgespec.backend.repack import repack_weights
    from edgespec.gguf_file import read_gguf
    if "CPU_REPACK" not in preflight.extra_buffer_types():
        pytest.skip("this build has no repacked kernels (not x86 with AVX2 or an ARM CPU)")
    tensors = read_gguf(gemma_q4_path).tensors
    names = repack_weights(tensors)
    assert names and "token_embd.weight" not in names
    assert all(tensors[n][1] not in (0, 1, 30) for n in names)         # quantised only
    repacked, used, kept = greedy_plain(gemma_q4_path, "repack")
    off, _, none = greedy_plain(gemma_q4_path, "off")
    assert used is False and kept == len(names) and none == 0
    agree = next((i for i, (a, b) in enumerate(zip(repacked, off)) if a != b), len(off))
    assert agree >= 8, (repacked, off)


# More than 8 tokens: the target's prompt pass is a batch over quantised weights, where the
# faulting kernels run (a short prompt and a draft that copies the target's cells would never
# send one there: the negative control below would not fault).
APP_PROMPT = ("Question: which city is the capital of France, and why? Answer: The capital of "
              "France is")


def test_an_app_that_loads_the_engine_in_a_thread_does_not_die(gemma_q4_path, tmp_path):
    v = preflight.verdict()

    def run(mode: str, **env) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", APP, str(gemma_q4_path), str(gemma_q4_path), mode,
             APP_PROMPT], capture_output=True, text=True, timeout=600,
            env={**os.environ, **env})
    proc = run("auto", XDG_CACHE_HOME=str(tmp_path / "cache"))     # nothing checked yet
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Paris" in proc.stdout           # Gemma-3-270M Q4_K_M: " Paris. …"
    # the app's log says it once, as a warning of edgespec.backend.preflight
    assert proc.stderr.count("llama.cpp #26954") == (1 if v.faults else 0), proc.stderr
    # the negative control: the faulting path forced on kills the app where it faults
    forced = run("on")
    if v.faults:
        assert forced.returncode < 0 and v.cause.startswith(signal.Signals(-forced.returncode)
                                                            .name), (forced.returncode, v)
    else:
        assert forced.returncode == 0


def test_the_command_line_says_it_when_found_and_info_shows_the_verdict(gemma_q4_path,
                                                                         tmp_path):
    v = preflight.verdict()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}     # nothing checked yet
    cmd = [sys.executable, "-m", "edgespec", "run", "The capital of France is", "--raw",
           "--target", str(gemma_q4_path), "--no-spec", "-n", "8", "--temperature", "0",
           "--ctx-size", "512"]

    def notes(*extra) -> list:
        proc = subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=600,
                              env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        # Eight tokens decoded (their text depends on the kernels: with the extra buffers
        # off, an AMD EPYC continues " the capital of the French Republic").
        assert proc.stdout.strip() and "[length] 8 tokens" in proc.stderr, proc.stderr
        return [ln for ln in proc.stderr.splitlines() if ln.startswith("note: this CPU")]
    first = notes()
    assert len(first) == (1 if v.faults else 0)
    if v.faults:
        assert first[0].endswith("(on the command line: --cpu-extra-buffers on|off)")
    assert notes() == []                          # kept: the next run is quiet
    assert notes("--cpu-extra-buffers", "off") == []
    info = subprocess.run([sys.executable, "-m", "edgespec", "info", "--json"],
                          capture_output=True, text=True, timeout=120)
    facts = json.loads(info.stdout)["cpu_extra_buffers"]
    assert facts["extra_buffers"] == list(v.extra_buffers)
    assert facts["faults"] == v.faults and facts["use"] == v.use_extra_buffers
    text = subprocess.run([sys.executable, "-m", "edgespec", "info"], capture_output=True,
                          text=True, timeout=120).stdout
    assert "CPU extra buffer types: " + v.describe() in text
