"""`edgespec serve` as a client sees it: a real server process on loopback with the real
SmolLM2 pair, driven by the official `openai` client and by plain HTTP."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time

import openai
import pytest

from server_helpers import (ServerProcess, assert_openai_error, health, post, request, sse,
                            wait_until)

KEY = "sk-test-0123456789"
N_CTX = 512
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"


@pytest.fixture(scope="module")
def server(smollm2_f32_path, smollm2_q4_path):
    # A pinned draft length: these tests check that drafting happens and is reported, which
    # the cost model might rightly skip on a busy machine.
    s = ServerProcess("--api-key", KEY, "--target", smollm2_f32_path, "--draft", smollm2_q4_path,
                      "--ctx-size", N_CTX, "--draft-max", 4)
    yield s
    rc = s.stop()
    assert rc in (0, 130), s.log()
    assert "Traceback" not in s.log() and "Exception" not in s.log(), s.log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=300)


SERVED = "SmolLM2-135M-Instruct.F32"     # the pair the server starts with, by its target


@pytest.fixture(scope="module")
def model(client):
    return SERVED


# ---------------------------------------------------------------------------------------------
# The openai client


def test_binds_loopback_by_default(server):
    assert server.host == "127.0.0.1"


def test_models(client, server):
    """Every model on disk is listed (the served pair, loaded, among them); a name that is
    not on disk is a 404 that says how to get models."""
    models = {m.id: m for m in client.models.list().data}
    assert SERVED in models and "SmolLM2-135M-Instruct.Q4_1" in models
    assert models[SERVED].owned_by == "edgespec"
    assert models[SERVED].model_extra["edgespec"]["loaded"] is True
    assert models[SERVED].model_extra["edgespec"]["draft"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert client.models.retrieve(SERVED).id == SERVED
    with pytest.raises(openai.NotFoundError, match="edgespec pull"):
        client.models.retrieve("gpt-4")
    with pytest.raises(openai.NotFoundError, match="not on this machine"):
        client.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=4)


def test_chat(client, model):
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=24,
                                       temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 10 and u.completion_tokens >= 5
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    spec = r.model_extra["edgespec"]
    assert spec["speculative"] is True and spec["drafted"] > 0
    assert 0 <= spec["acceptance_rate"] <= 1 and spec["target_passes"] >= 1
    assert spec["first_token_seconds"] > 0 and spec["prompt_tokens_per_second"] > 0


def test_a_stream_tells_each_tokens_source_and_each_round(client, model):
    """The chunks' edgespec field: each token's source, and each verify round (what was
    drafted, how much accepted, the target's own token after it) add up to the final
    figures; ``speculative: false`` decodes plainly, to the same text at temperature 0."""
    chunks = list(client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=40, temperature=0, stream=True,
        stop=None))
    *content, last = chunks[1:]
    final = last.model_extra["edgespec"]
    events = [c.model_extra["edgespec"] for c in content]
    rounds = [e["round"] for e in events if "round" in e]
    text = "".join(c.choices[0].delta.content or "" for c in content)
    if last.choices[0].finish_reason == "length":     # no round was cut by the end token
        assert sum(r["accepted"] for r in rounds) == final["accepted"]
        assert sum(len(r["drafted"]) for r in rounds) == final["drafted"]
        assert len(rounds) == final["target_passes"]
    assert sum(e["draft"] for e in events) <= final["accepted"] and final["accepted"] > 0
    for r in rounds:
        assert 0 <= r["accepted"] <= len(r["drafted"]) and r["source"] in ("model", "ngram",
                                                                           "none")
        assert isinstance(r["token"], str)
    assert final["tested_at"][0] >= final["accepted_at"][0] > 0
    assert final["draft_length"] is not None and 0 < final["draft_length"] <= 4
    assert final["speedup"] is None or final["speedup"] > 0
    plain = client.chat.completions.create(model=model, messages=CHAT, max_tokens=40,
                                           temperature=0, extra_body={"speculative": False})
    assert plain.model_extra["edgespec"]["speculative"] is False
    assert plain.model_extra["edgespec"]["drafted"] == 0
    assert plain.choices[0].message.content == text


def test_chat_stream_framing_and_equality(client, model, server):
    whole = client.chat.completions.create(model=model, messages=CHAT, max_tokens=24,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    *content, last_choice, usage_chunk = chunks
    assert content[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in content[1:] + [last_choice])
    assert all(c.choices[0].finish_reason is None for c in content)
    assert last_choice.choices[0].finish_reason == whole.choices[0].finish_reason
    assert "".join(c.choices[0].delta.content or "" for c in content) == \
        whole.choices[0].message.content
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert last_choice.model_extra["edgespec"]["drafted"] > 0

    # the raw events: `data: {json}` each, `data: [DONE]` last
    events = sse(server.port, "/v1/chat/completions",
                 {"messages": CHAT, "max_tokens": 24, "temperature": 0, "stream": True},
                 key=KEY)
    assert events[-1] == "[DONE]"
    bodies = [json.loads(e) for e in events[:-1]]
    assert "usage" not in bodies[0]            # no usage fields unless asked for
    assert "".join(b["choices"][0]["delta"].get("content", "") for b in bodies) == \
        whole.choices[0].message.content


def test_completions(client, model):
    whole = client.completions.create(model=model, prompt=COUNTING, max_tokens=12,
                                      temperature=0)
    assert whole.object == "text_completion"
    assert whole.choices[0].text.startswith(" 9, 10")
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    assert whole.model_extra["edgespec"]["accepted"] > 0
    chunks = list(client.completions.create(model=model, prompt=COUNTING, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_stop_and_sampling_fields(client, model):
    r = client.completions.create(model=model, prompt=COUNTING, max_tokens=30, temperature=0,
                                  stop=[" 11"])
    assert r.choices[0].text == " 9, 10," and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=12,
                                       temperature=0.9, top_p=0.9, seed=7, presence_penalty=0.5,
                                       frequency_penalty=0.5, extra_body={"top_k": 20,
                                                                          "min_p": 0.01})
    assert r.choices[0].message.content and r.usage.completion_tokens <= 12


def test_errors_through_the_client(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT, temperature=3)
    assert e.value.status_code == 400 and e.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT, n=2)
    assert e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="word " * 2000)
    assert e.value.code == "context_length_exceeded"
    bad = openai.OpenAI(base_url=client.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.code == "invalid_api_key"


# ---------------------------------------------------------------------------------------------
# The bad-request table (plain HTTP: bodies no client library would send)

CHAT_OK = {"messages": CHAT, "max_tokens": 4}
BAD = [
    # (path, body, expected param, expected code)
    ("/v1/chat/completions", b'{"messages": [', None, "invalid_json"),
    ("/v1/chat/completions", b"[1, 2]", None, "invalid_json"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
                             b'"temperature": NaN}', None, "invalid_json"),
    ("/v1/chat/completions", {}, "messages", "missing_required_parameter"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages", None),
    ("/v1/chat/completions", {"messages": []}, "messages", None),
    ("/v1/chat/completions", {"messages": ["hi"]}, "messages[0]", None),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]},
     "messages[0].role", None),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content", None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     "messages[0].content", None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content[0]", None),
    ("/v1/chat/completions", {**CHAT_OK, "n": 2}, "n", None),
    ("/v1/chat/completions", {**CHAT_OK, "temperature": -1}, "temperature", None),
    ("/v1/chat/completions", {**CHAT_OK, "temperature": 3}, "temperature", None),
    ("/v1/chat/completions", {**CHAT_OK, "temperature": "hot"}, "temperature", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_OK, "top_p": 1.5}, "top_p", None),
    ("/v1/chat/completions", {**CHAT_OK, "top_p": 0}, "top_p", None),
    ("/v1/chat/completions", {**CHAT_OK, "top_k": 2.5}, "top_k", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_OK, "min_p": 2}, "min_p", None),
    ("/v1/chat/completions", {**CHAT_OK, "presence_penalty": 3}, "presence_penalty", None),
    ("/v1/chat/completions", {**CHAT_OK, "frequency_penalty": True}, "frequency_penalty",
     "invalid_type"),
    ("/v1/chat/completions", {**CHAT_OK, "seed": "x"}, "seed", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_OK, "max_tokens": 0}, "max_tokens", None),
    ("/v1/chat/completions", {**CHAT_OK, "max_tokens": 10 ** 9}, "max_tokens", None),
    ("/v1/chat/completions", {**CHAT_OK, "max_tokens": "10"}, "max_tokens", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_OK, "max_completion_tokens": -5},
     "max_completion_tokens", None),
    ("/v1/chat/completions", {**CHAT_OK, "stop": ""}, "stop", None),
    ("/v1/chat/completions", {**CHAT_OK, "stop": ["a", ""]}, "stop", None),
    ("/v1/chat/completions", {**CHAT_OK, "stop": ["a", "b", "c", "d", "e"]}, "stop", None),
    ("/v1/chat/completions", {**CHAT_OK, "stop": 7}, "stop", None),
    ("/v1/chat/completions", {**CHAT_OK, "stream": "yes"}, "stream", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_OK, "stream_options": {"include_usage": True}},
     "stream_options", None),
    ("/v1/chat/completions", {**CHAT_OK, "logprobs": "yes"}, "logprobs", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_OK, "logprobs": True, "top_logprobs": 21},
     "top_logprobs", None),
    ("/v1/chat/completions", {**CHAT_OK, "top_logprobs": 2}, "top_logprobs", None),
    ("/v1/completions", {"prompt": "hi", "logprobs": 6}, "logprobs", None),
    ("/v1/chat/completions", {**CHAT_OK, "tools": [{"type": "function"}]}, "tools", None),
    ("/v1/chat/completions", {**CHAT_OK, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}]},
     "tools", None),
    ("/v1/chat/completions", {**CHAT_OK, "tools": [{"type": "function", "function": {
        "name": "f"}}], "tool_choice": "g"}, "tool_choice", None),
    ("/v1/chat/completions", {**CHAT_OK, "tool_choice": "required"}, "tool_choice", None),
    ("/v1/chat/completions", {**CHAT_OK, "functions": [{"name": "f"}]}, "functions",
     "unsupported_parameter"),
    ("/v1/chat/completions", {**CHAT_OK, "response_format": {"type": "xml"}},
     "response_format", None),
    ("/v1/chat/completions", {**CHAT_OK, "response_format": {"type": "json_schema",
                                                            "json_schema": {"name": "x",
                                                            "schema": {"type": "nope"}}}},
     "response_format", None),
    ("/v1/chat/completions", {**CHAT_OK, "response_format": {"type": "json_object"},
                              "tools": [{"type": "function", "function": {"name": "f"}}]},
     "response_format", None),
    ("/v1/chat/completions", {**CHAT_OK, "logit_bias": {"1": 5}}, "logit_bias", None),
    ("/v1/chat/completions", {**CHAT_OK, "model": 5}, "model", "invalid_type"),
    ("/v1/chat/completions", {**CHAT_OK, "frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ("/v1/completions", {}, "prompt", "missing_required_parameter"),
    ("/v1/completions", {"prompt": ""}, "prompt", None),
    ("/v1/completions", {"prompt": [1, 2, 3]}, "prompt", None),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", None),
    ("/v1/completions", {"prompt": "hi", "echo": True}, "echo", None),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, "best_of", None),
    ("/v1/completions", {"prompt": "hi", "messages": CHAT}, "messages", "unknown_parameter"),
    ("/v1/completions", {"prompt": "word " * 2000}, "prompt", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 2000}]},
     "messages", "context_length_exceeded"),
    # 5 MB of text: refused by size, before the chat template or the tokenizer see it
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 5_000_000}]},
     "messages", "context_length_exceeded"),
    ("/v1/completions", {"prompt": "x" * 5_000_000}, "prompt", "context_length_exceeded"),
]


@pytest.mark.parametrize("path,body,param,code", BAD,
                         ids=[f"{i}-{b if isinstance(b, bytes) else list(b)[-1:]}"[:40]
                              for i, (_, b, _, _) in enumerate(BAD)])
def test_bad_request_table(server, path, body, param, code):
    status, out = post(server.port, path, body, key=KEY)
    assert_openai_error(status, out, 400, param=param, code=code)


def test_transport_errors(server):
    port = server.port
    status, _, data = request(port, "POST", "/v1/chat/completions",
                              json.dumps(CHAT_OK).encode(),
                              {"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
    assert_openai_error(status, json.loads(data), 400, code="invalid_content_type")
    big = json.dumps({"prompt": "x" * (9 * 1024 * 1024)}).encode()
    status, out = post(port, "/v1/completions", big, key=KEY)
    assert_openai_error(status, out, 413, code="request_too_large")
    status, _, data = request(port, "GET", "/v1/nothing-here",
                              headers={"Authorization": f"Bearer {KEY}"})
    assert_openai_error(status, json.loads(data), 404)
    status, _, data = request(port, "GET", "/v1/chat/completions",
                              headers={"Authorization": f"Bearer {KEY}"})
    assert_openai_error(status, json.loads(data), 405)
    assert health(port)["status"] == "ok"


def test_api_key_rules(server):
    port = server.port
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": KEY},
                    {"Authorization": f"Basic {KEY}"}):
        status, h, data = request(port, "GET", "/v1/models", headers=headers)
        assert_openai_error(status, json.loads(data), 401, code="invalid_api_key")
        assert h.get("www-authenticate") == "Bearer"
    status, out = post(port, "/v1/chat/completions", CHAT_OK)      # no key
    assert status == 401
    status, _, _ = request(port, "GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200
    assert health(port)["status"] == "ok"          # /health needs no key


# ---------------------------------------------------------------------------------------------
# Queueing, disconnects, concurrency


def _open_stream(port: int, payload: dict, key=KEY) -> tuple[http.client.HTTPConnection, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions" if "prompt" in payload else "/v1/chat/completions",
                 body=json.dumps(payload), headers={"Content-Type": "application/json",
                                                    "Authorization": f"Bearer {key}"})
    return conn, conn.getresponse()


def _hang_up(conn: http.client.HTTPConnection) -> None:
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


LONG = {"prompt": COUNTING, "max_tokens": 400, "temperature": 0}


def test_streaming_client_disconnect_cancels_its_generation(server):
    conn, resp = _open_stream(server.port, {**LONG, "stream": True})
    assert resp.status == 200
    for _ in range(4):
        assert resp.readline().startswith(b"data: ")
        resp.readline()
    assert health(server.port)["busy"]
    _hang_up(conn)
    took = wait_until(lambda: not health(server.port)["busy"], timeout=20)
    # 400 tokens would take far longer; the engine stopped at its next step
    assert took < 10
    wait_until(lambda: "client disconnected" in server.log(), timeout=5)


def test_waiting_client_disconnect_cancels_its_generation(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps(LONG),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    wait_until(lambda: health(server.port)["busy"], timeout=30)
    time.sleep(0.3)
    _hang_up(conn)
    took = wait_until(lambda: not health(server.port)["busy"], timeout=20)
    assert took < 10


def test_queued_client_disconnect_leaves_the_queue(server):
    # Every lane busy (serve --parallel: 4 by default), then one more client: it queues.
    streams = [_open_stream(server.port, {**LONG, "stream": True})
               for _ in range(health(server.port)["parallel"])]
    for _, resp in streams:
        assert resp.readline().startswith(b"data: ")
    conn_b = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn_b.request("POST", "/v1/completions", body=json.dumps(LONG),
                   headers={"Content-Type": "application/json",
                            "Authorization": f"Bearer {KEY}"})
    wait_until(lambda: health(server.port)["waiting"] == 1, timeout=30)
    _hang_up(conn_b)
    wait_until(lambda: health(server.port)["waiting"] == 0, timeout=10)
    assert health(server.port)["running"] == len(streams)    # the running ones untouched
    for conn, _ in streams:
        _hang_up(conn)
    wait_until(lambda: not health(server.port)["busy"], timeout=20)


def test_concurrent_clients_queue_and_health_stays_responsive(client, model, server):
    prompts = ["The capital of France is", "def fibonacci(n):\n    ",
               "List three colours of the rainbow:"]
    alone = {p: client.completions.create(model=model, prompt=p, max_tokens=16,
                                          temperature=0).choices[0].text for p in prompts}
    together, errors, health_times = {}, [], []

    def ask(p):
        try:
            together[p] = client.completions.create(model=model, prompt=p, max_tokens=16,
                                                    temperature=0).choices[0].text
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        t0 = time.monotonic()
        h = health(server.port)
        health_times.append(time.monotonic() - t0)
        assert h["waiting"] <= len(prompts) - 1
        time.sleep(0.05)
    assert not errors, errors
    assert together == alone
    assert max(health_times) < 2.0, health_times


# ---------------------------------------------------------------------------------------------
# Where it may listen


def serve(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "edgespec", "serve", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for f in fragments:
        assert f in lines[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_other_addresses_need_an_api_key(host, tmp_path):
    t0 = time.monotonic()
    proc = serve("--host", host, "--target", tmp_path / "never-loaded.gguf")
    assert_one_line_error(proc, "refusing to listen", "--api-key")
    assert time.monotonic() - t0 < 30        # refused before any model is loaded


def test_option_errors_are_one_line(server, tmp_path):
    assert_one_line_error(serve("--cors-origin", "*"), "--allow-origin '*'", "any web page")
    assert_one_line_error(serve("--allow-origin", "https://*"), "'https://*'", "any web page")
    assert_one_line_error(serve("--allow-origin", "localhost:3000"), "not an origin",
                          "scheme://host[:port]")
    assert_one_line_error(serve("--api-key", "has space"), "--api-key")
    assert_one_line_error(serve("--port", "70000"), "not a port")
    assert_one_line_error(serve("--port", server.port, "--target", tmp_path / "x.gguf"),
                          f"cannot listen on 127.0.0.1:{server.port}")
    assert_one_line_error(serve("--keep-alive", "soon"), "--keep-alive", "'5m'")
    assert_one_line_error(serve("--model-alias", "gpt-4o"), "--model-alias", "ALIAS=MODEL")
    assert_one_line_error(serve("--max-loaded", "0"), "--max-loaded")
    assert_one_line_error(serve("--max-ram", "-2"), "--max-ram")
    assert_one_line_error(serve("--cache-ram", "-1"), "--cache-ram")
    assert_one_line_error(serve("--parallel", "4", "--streams", "2"), "streams=2 is invalid",
                          "an integer in [4, 64]", "--streams S")


def test_all_addresses_with_a_key(smollm2_q4_path):
    s = ServerProcess("--host", "0.0.0.0", "--api-key", KEY, "--target", smollm2_q4_path,
                      "--drafter", "none", "--ctx-size", 256)        # (plain: no draft chosen)
    try:
        assert s.host == "0.0.0.0"
        status, _, _ = request(s.port, "GET", "/v1/models")
        assert status == 401
        status, out = post(s.port, "/v1/completions", {"prompt": "Hello", "max_tokens": 2},
                           key=KEY)
        assert status == 200 and out["usage"]["completion_tokens"] == 2
        assert out["edgespec"]["speculative"] is False
    finally:
        assert s.stop() in (0, 130), s.log()


# ---------------------------------------------------------------------------------------------
# Structured output, tools, log-probabilities (the openai client)

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_json_schema_and_json_object(client, model):
    r = client.chat.completions.create(
        model=model, temperature=0, max_tokens=60,
        messages=[{"role": "user", "content": "Maria is 34. Give her name and age as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=60, messages=CHAT,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_parse_with_a_pydantic_model(client, model):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        age: int
    r = client.chat.completions.parse(
        model=model, temperature=0, max_tokens=60, response_format=Person,
        messages=[{"role": "user", "content": "Maria is 34. Give her name and age as JSON."}])
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.age, int)


def test_a_tool_call_round_trip(client, model):
    """The model asks for a tool, the app answers with a tool message, the model replies."""
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=80, messages=ASK,
                                       tools=[WEATHER], tool_choice="auto")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id,
                      "content": json.dumps({"temperature_c": 18, "sky": "cloudy"})}]
    r2 = client.chat.completions.create(model=model, temperature=0, max_tokens=40,
                                        messages=history, tools=[WEATHER], tool_choice="none")
    assert r2.choices[0].finish_reason in ("stop", "length")
    assert r2.choices[0].message.content and not r2.choices[0].message.tool_calls


def test_tool_calls_stream_as_deltas(client, model):
    chunks = list(client.chat.completions.create(
        model=model, temperature=0, max_tokens=80, messages=ASK, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert len({c.id for c in chunks}) == 1


def test_logprobs(client, model):
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=6, messages=CHAT,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].token == e.token            # greedy: the best one
    streamed = [c.choices[0].logprobs for c in client.chat.completions.create(
        model=model, temperature=0, max_tokens=6, messages=CHAT, logprobs=True, stream=True)
        if c.choices and c.choices[0].logprobs]
    # (the second time the lane's cache holds the prompt: its first row comes from a pass of
    # one token instead of the whole prompt's, whose kernels round differently: 1.5e-3 apart
    # measured on an AMD EPYC, under 1e-4 on a Xeon)
    assert [e.logprob for lp in streamed for e in lp.content] == \
        pytest.approx([e.logprob for e in content], abs=5e-3)
    c = client.completions.create(model=model, prompt="The capital of France is", temperature=0,
                                  max_tokens=4, logprobs=3)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.top_logprobs[0]) == 3
