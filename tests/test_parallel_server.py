"""`edgespec serve --parallel N` against real clients: requests decode together, the ones
beyond N wait in the queue and are counted, and clients that come and go (streams read to the
end, streams dropped after a few tokens, whole answers) get no 5xx while every answer that
completes is the one the model gives alone (greedy)."""

from __future__ import annotations

import json
import random
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import ServerProcess, health, request, stop_checked, wait_until

PROMPTS = ["Name a colour.", "What is 2 + 2?", "Say hello in French.", "Name a fruit.",
           "What is the capital of Spain?", "Count to three."]
N = 24
MODEL = "SmolLM2-135M-Instruct.F32"        # the target the server starts with


@pytest.fixture(scope="module")
def server(smollm2_f32_path, smollm2_q4_path):
    # An F32 target: a quantised one's kernels round differently by batch size, so its greedy
    # answers may differ batched and alone (docs/decisions.md)
    s = ServerProcess("--target", smollm2_f32_path, "--draft", smollm2_q4_path, "--parallel", 2,
                      "--ctx-size", 1024, "--metrics")
    yield s
    stop_checked(s)


@pytest.fixture(scope="module")
def alone(server):
    """Each prompt's greedy answer, asked alone."""
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    return {p: ask(client, p) for p in PROMPTS}


def ask(client, prompt: str) -> str:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                       max_tokens=N, temperature=0)
    return r.choices[0].message.content


def metric(port: int, name: str) -> float:
    _, _, data = request(port, "GET", "/metrics")
    for family in text_string_to_metric_families(data.decode()):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"{name} not in /metrics")


def test_requests_decode_together_beyond_the_whole_contexts(server, alone):
    assert health(server.port)["parallel"] == 2
    deferred = metric(server.port, "edgespec_requests_deferred_total")
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    out, errors = {}, []

    def run(p: str) -> None:
        try:
            out[p] = ask(client, p)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS[:4]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert out == {p: alone[p] for p in PROMPTS[:4]}
    # four at once on two whole contexts (--parallel 2; --streams 4, its default): short
    # answers share the cells, none waited
    assert metric(server.port, "edgespec_requests_deferred_total") == deferred
    assert metric(server.port, "edgespec_streams_parallel") == 2
    assert metric(server.port, "edgespec_streams_max") == health(server.port)["streams"] == 4
    assert metric(server.port, "edgespec_batch_rows") >= 1


def test_clients_that_come_and_go(server, alone):
    """Eight clients, three requests each, in a random mix: a stream read to the end, a stream
    dropped after its first chunks (the client disconnects), a whole answer."""
    rng = random.Random(5)
    plan = [[(rng.choice(PROMPTS), rng.choice(["stream", "drop", "whole"])) for _ in range(3)]
            for _ in range(8)]
    results, errors = [], []

    def client_run(steps) -> None:
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=120) as c:
                for prompt, how in steps:
                    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": N, "temperature": 0, "stream": how != "whole"}
                    if how == "whole":
                        r = c.post("/v1/chat/completions", json=body)
                        assert r.status_code == 200, r.text
                        results.append((prompt, r.json()["choices"][0]["message"]["content"]))
                        continue
                    with c.stream("POST", "/v1/chat/completions", json=body) as r:
                        assert r.status_code == 200
                        text = []
                        for i, line in enumerate(r.iter_lines()):
                            if how == "drop" and i >= 3:
                                break           # the client goes away mid-answer
                            if line.startswith("data: {"):
                                delta = json.loads(line[6:])["choices"]
                                if delta and delta[0]["delta"].get("content"):
                                    text.append(delta[0]["delta"]["content"])
                    if how == "stream":
                        results.append((prompt, "".join(text)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=client_run, args=(steps,)) for steps in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results and all(text == alone[prompt] for prompt, text in results)
    # A dropped stream's generation ends at its next step once the server sees the client
    # gone: the lanes empty soon after the clients, not necessarily before they finish.
    wait_until(lambda: health(server.port)["running"] == 0, timeout=30)
    h = health(server.port)
    assert h["status"] == "ok" and h["running"] == 0 and h["waiting"] == 0
