"""The target's layers on llama.cpp RPC workers (`edgespec worker`), the draft local.

Real workers on 127.0.0.1 free ports, started by the tests and ended by their process ids
(always, through fixtures). Greedy output through two workers equals local output token for
token; sampled output through a worker has the target's own distribution; unreachable,
silent and foreign endpoints are one-line errors in bounded time; a worker killed during an
answer is an error of its own, and the Engine answers again once the worker is back.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

import llama_cpp.llama_cpp as C

from edgespec import Engine, SamplingParams
from edgespec.backend import rpc
from edgespec.errors import InvalidParameterError, RPCError
from edgespec.sampling import warp

from rpc_helpers import Worker, free_port
from goodness import noise_bound, tv

# CI (EDGESPEC_TEST_ALL=1) builds llama.cpp with RPC: there a build without it fails the tests.
pytestmark = pytest.mark.skipif(
    not rpc.available() and os.environ.get("EDGESPEC_TEST_ALL") != "1",
    reason="llama.cpp built without RPC (scripts/test.sh builds it)")

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]


@pytest.fixture
def workers():
    started: list[Worker] = []

    def start(n: int = 1) -> list[Worker]:
        new = [Worker().start() for _ in range(n)]
        started.extend(new)
        return new
    yield start
    for w in started:
        w.stop()


def test_greedy_through_two_workers_equals_local(workers, gemma_f32_path, gemma_q4_path):
    greedy = SamplingParams(temperature=0.0)
    with Engine.load(gemma_f32_path, gemma_q4_path, n_ctx=512) as eng:
        local = [eng.generate(p, max_tokens=48, sampling=greedy, raw=True).tokens
                 for p in PROMPTS]
        local_draft_taps = eng.draft.can_tap
    w = workers(2)
    eps = ",".join(x.endpoint for x in w)
    with Engine.load(gemma_f32_path, gemma_q4_path, n_ctx=512, rpc=eps) as eng:
        info = eng.info()
        assert info["target"]["rpc"] == [x.endpoint for x in w]
        assert f"target RPC {eps}" in info["backend"] and "draft local" in info["backend"]
        # the draft stays local, with its reduced output layer where it had one
        assert "rpc" not in info["draft"] and eng.draft.can_tap == local_draft_taps
        remote = [eng.generate(p, max_tokens=48, sampling=greedy, raw=True) for p in PROMPTS]
    assert [r.tokens for r in remote] == local
    assert sum(r.stats.accepted for r in remote) > 0


def test_conversations_switch_through_the_prompt_cache_on_a_worker(workers, gemma_q4_path):
    """The RPC child copies its cache out and back: two conversations in turn restore their
    states, and the answers equal those of a local Engine without a cache that serves each
    conversation alone (tests/test_prompt_cache.py says why alone)."""
    greedy = SamplingParams(temperature=0.0)
    talks = [p * 20 for p in PROMPTS[:2]]
    turns = [talks[0], talks[1], talks[0] + " Then", talks[1] + " Then"]
    local = {}
    # The worker runs its weights on the plain CPU kernels (an RPC buffer is no extra buffer
    # type): the local reference must too, or greedy may part at a near tie between kernels
    with Engine.load(gemma_q4_path, drafter="none", n_ctx=1024, cache_ram=0,
                     cpu_extra_buffers="off") as eng:
        for i in (0, 2, 1, 3):          # A, A then; B, B then
            if i in (0, 1):
                eng.target.truncate(0)
            local[i] = eng.generate(turns[i], max_tokens=12, sampling=greedy, raw=True).tokens
    local = [local[i] for i in range(4)]
    w = workers(1)
    with Engine.load(gemma_q4_path, drafter="none", n_ctx=1024, rpc=w[0].endpoint) as eng:
        remote = [eng.generate(p, max_tokens=12, sampling=greedy, raw=True) for p in turns]
    assert [r.tokens for r in remote] == local
    assert all(r.stats.prompt_tokens_restored > 50 for r in remote[2:])
    assert all(r.stats.prompt_tokens_evaluated < 8 for r in remote[2:])


def test_a_worker_serves_quantised_weights_on_any_cpu(workers, gemma_q4_path):
    """ggml-rpc's server keeps every tensor in the CPU's default buffer type, so the extra CPU
    kernels that fault on some CPUs (AMX: backend/preflight.py) never run in a worker: a
    quantised model through one decodes as it does locally without them."""
    greedy = SamplingParams(temperature=0.0)
    with Engine.load(gemma_q4_path, n_ctx=512, cpu_extra_buffers="off") as eng:
        local = eng.generate(PROMPTS[0], max_tokens=24, sampling=greedy, raw=True).tokens
    ep = workers(1)[0].endpoint
    with Engine.load(gemma_q4_path, n_ctx=512, rpc=ep, cpu_extra_buffers="off") as eng:
        remote = eng.generate(PROMPTS[0], max_tokens=24, sampling=greedy, raw=True).tokens
    assert remote == local


def test_sampled_output_through_a_worker_has_the_targets_distribution(
        workers, smollm2_f32_path, smollm2_q2k_path):
    """The joint of the first two sampled tokens through RPC, with the local draft drafting
    the second (the first round is the target's alone: the first token never waits for the
    draft), against the exact joint computed from the target's logits (top-k 4, T = 1.5 so
    that the draft is often rejected)."""
    params = SamplingParams(temperature=1.5, top_k=4, top_p=1.0, min_p=0.0)
    prompt = "Once upon a time"
    n = 400
    (w,) = workers(1)
    with Engine.load(smollm2_f32_path, smollm2_q2k_path, n_ctx=256, drafter="model",
                     draft_max=2, rpc=w.endpoint) as eng:
        toks = eng.prompt_tokens(prompt, raw=True)
        target = eng.target
        target.truncate(0)
        first = warp(target.eval(toks, 1)[0].copy(), params, toks)
        joint = {}
        for x1, p1 in zip(first.ids, first.probs):
            target.truncate(len(toks))
            second = warp(target.eval([int(x1)], 1)[0].copy(), params, toks + [int(x1)])
            for x2, p2 in zip(second.ids, second.probs):
                joint[(int(x1), int(x2))] = p1 * p2
        target.truncate(0)
        counts = dict.fromkeys(joint, 0)
        drafted = rejected = 0
        for seed in range(n):
            out = eng.generate(prompt, max_tokens=3, sampling=replace(params, seed=seed),
                               raw=True)
            assert len(out.tokens) >= 2
            counts[tuple(out.tokens[:2])] += 1
            drafted += out.stats.drafted
            rejected += out.stats.drafted - out.stats.accepted
    keys = sorted(joint)
    p = np.array([joint[k] for k in keys])
    c = np.array([counts[k] for k in keys], dtype=float)
    assert drafted >= n and rejected > n // 20     # the rejection path was exercised
    print(f"TV {tv(c, p):.4f}, noise bound {noise_bound(p, n):.4f}, {len(keys)} cells, "
          f"{rejected}/{drafted} drafts rejected")
    assert tv(c, p) < noise_bound(p, n)


def test_endpoint_errors_are_one_line_and_bounded(gemma_f32_path):
    # a closed port
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(RPCError, match=f"cannot reach RPC worker 127.0.0.1:{port}.*edgespec "
                                        f"worker --host 127.0.0.1 --port {port}"):
        Engine.load(gemma_f32_path, rpc=f"127.0.0.1:{port}")
    # a port that accepts connections but never answers
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    ep = f"127.0.0.1:{silent.getsockname()[1]}"
    with pytest.raises(RPCError, match=f"{ep} accepted the connection but did not answer"):
        rpc.probe(ep, timeout=1.0)
    silent.close()
    # a server of another protocol: answers HELLO with an HTTP error page
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(4)
    ep = f"127.0.0.1:{other.getsockname()[1]}"

    def answer():
        conn, _ = other.accept()
        conn.recv(64)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()
    threading.Thread(target=answer, daemon=True).start()
    with pytest.raises(RPCError, match=f"{ep} does not speak llama.cpp's RPC protocol"):
        rpc.probe(ep, timeout=2.0)
    other.close()
    assert time.monotonic() - t0 < 30
    for bad in ("localhost", "host:0", "host:99999", "a b:1", ""):
        with pytest.raises(InvalidParameterError, match="HOST:PORT"):
            rpc.parse_endpoints(bad or ",")


def test_cli_error_for_an_unreachable_worker(gemma_f32_path, gemma_q4_path):
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "edgespec", "run", "hi", "--raw", "-n", "4",
                           "--target", str(gemma_f32_path), "--draft", str(gemma_q4_path),
                           "--rpc", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: cannot reach RPC worker 127.0.0.1:{port}"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_build_without_rpc_says_how_to_rebuild(monkeypatch):
    monkeypatch.setattr(rpc, "_LIB", [])
    monkeypatch.setattr(C, "llama_supports_rpc", lambda: False)
    with pytest.raises(RPCError, match='rebuild llama-cpp-python with CMAKE_ARGS="-DGGML_RPC=on"'):
        Engine.load("unused.gguf", rpc="127.0.0.1:50052")


def test_a_worker_killed_mid_answer_is_an_error_and_the_engine_recovers(
        workers, smollm2_f32_path, smollm2_q4_path):
    greedy = SamplingParams(temperature=0.0)
    (w,) = workers(1)
    prompt = "Write a long story about a lighthouse keeper."
    with Engine.load(smollm2_f32_path, smollm2_q4_path, n_ctx=1024, rpc=w.endpoint) as eng:
        reference = eng.generate(prompt, max_tokens=24, sampling=greedy).tokens
        stream = eng.stream(prompt, max_tokens=600, sampling=greedy)
        got = 0
        with pytest.raises(RPCError, match=f"{w.endpoint} stopped answering") as err:
            for _ in stream:
                got += 1
                if got == 40:
                    w.kill()
        assert "retry when the worker is back" in str(err.value)
        assert "\n" not in str(err.value)
        # still down: the next request says so at once
        with pytest.raises(RPCError, match=f"cannot reach RPC worker {w.endpoint}"):
            eng.generate(prompt, max_tokens=4, sampling=greedy)
        w.start()
        again = eng.generate(prompt, max_tokens=24, sampling=greedy)
        assert again.tokens == reference


def test_a_stopped_worker_is_an_error_after_the_pass_timeout(
        workers, smollm2_f32_path, smollm2_q4_path, monkeypatch):
    # A worker that stops without closing its connection (SIGSTOP here; a pulled cable) would
    # leave ggml-rpc waiting forever: the pass gives up after its timeout instead.
    from edgespec.backend import remote
    monkeypatch.setattr(remote, "PASS_TIMEOUT", 8.0)
    greedy = SamplingParams(temperature=0.0)
    (w,) = workers(1)
    prompt = "Write a long story about a lighthouse keeper."
    with Engine.load(smollm2_f32_path, smollm2_q4_path, n_ctx=1024, rpc=w.endpoint) as eng:
        reference = eng.generate(prompt, max_tokens=16, sampling=greedy).tokens
        got = 0
        try:
            with pytest.raises(RPCError, match="did not answer a pass within") as err:
                for _ in eng.stream(prompt, max_tokens=600, sampling=greedy):
                    got += 1
                    if got == 20:
                        os.kill(w.proc.pid, signal.SIGSTOP)
                        stopped = time.monotonic()
            assert time.monotonic() - stopped < 8.0 + 10.0
            assert "\n" not in str(err.value)
        finally:
            os.kill(w.proc.pid, signal.SIGCONT)
        again = eng.generate(prompt, max_tokens=16, sampling=greedy)
        assert again.tokens == reference


def test_worker_command_warns_and_stops_on_sigterm():
    w = Worker().start()
    try:
        assert rpc.probe(w.endpoint)[0] == rpc.PROTO_MAJOR
    finally:
        w.stop()
    assert w.proc.returncode == 0
    out = w.output()
    assert "no authentication and no encryption" in out and "trusted LAN only" in out
    assert "worker stopped" in out
