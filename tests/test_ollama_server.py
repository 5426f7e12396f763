"""`edgespec serve` as Ollama's clients see it: a real server process on loopback with the
real SmolLM2 models, driven by the official `ollama` client, by `curl` (NDJSON, bodies sent
without a Content-Type, as Ollama's documentation does) and, beside them, by the `openai`
client: models on demand (two models, one loaded at a time) and `/metrics` checked against
the responses' own figures."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone

import httpx
import ollama
import openai
import pytest

from conftest import require_tools
from server_helpers import (ServerProcess, health, post, request, sse, stop_checked,
                            wait_until)

KEY = "sk-test-0123456789"
N_CTX = 1024
SERVED = "SmolLM2-135M-Instruct.F32"       # the pair the first server starts with, by target
A = "SmolLM2-135M-Instruct.Q4_1"           # the second server's two models
B = "SmolLM2-135M-Instruct.Q2_K"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
DEFAULT_KEEP_ALIVE = 300
ALLOWED = ("app://obsidian.md", "http://localhost:*")   # web pages the first server serves


def greedy(n: int) -> dict:
    return {"temperature": 0, "num_predict": n}


@pytest.fixture(scope="module")
def server(smollm2_f32_path, smollm2_q4_path):
    # A pinned draft length, so that every generation drafts (and the metrics have drafts).
    s = ServerProcess("--target", smollm2_f32_path, "--draft", smollm2_q4_path,
                      "--ctx-size", N_CTX, "--draft-max", 4, "--metrics",
                      "--allow-origin", ALLOWED[0], "--cors-origin", ALLOWED[1])
    yield s
    stop_checked(s)


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=f"http://127.0.0.1:{server.port}", timeout=300)


def post_raw(port: int, path: str, payload: dict, key: str | None = None) -> list[dict]:
    """POST to an Ollama endpoint as its clients do; the NDJSON objects of the answer (one
    when not streamed)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    status, h, data = request(port, "POST", path, json.dumps(payload).encode(), headers)
    assert status == 200, data
    lines = data.decode().splitlines()
    if payload.get("stream", True):
        assert h["content-type"].startswith("application/x-ndjson"), h
        assert data.endswith(b"\n")
    return [json.loads(line) for line in lines]


def streamed_text(chunks, kind: str = "chat") -> str:
    return "".join((c.message.content or "") if kind == "chat" else (c.response or "")
                   for c in chunks)


def check_final(last, max_tokens: int) -> None:
    """The figures of a final object (the client's type)."""
    assert last.done is True and last.done_reason in ("stop", "length")
    assert 0 < last.eval_count <= max_tokens
    assert last.prompt_eval_count > 5
    assert last.total_duration > 0 and last.eval_duration > 0
    assert last.prompt_eval_duration >= 0 and last.load_duration >= 0
    assert last.total_duration >= last.eval_duration
    assert last.created_at.endswith("Z")


# ---------------------------------------------------------------------------------------------
# The catalog endpoints


def test_list_show_ps_version(client, server):
    models = {m.model: m for m in client.list().models}
    assert f"{SERVED}:latest" in models and f"{A}:latest" in models
    m = models[f"{SERVED}:latest"]
    assert m.size > 500e6 and m.digest and m.modified_at.tzinfo is not None
    assert m.details.format == "gguf" and m.details.family == "llama"
    assert m.details.quantization_level == "F32" and m.details.parameter_size == "135M"

    for name in (SERVED, f"{SERVED}:latest"):
        shown = client.show(name)
        assert shown.details.quantization_level == "F32"
        assert shown.modelinfo["general.architecture"] == "llama"
        assert shown.modelinfo["llama.context_length"] == N_CTX
        assert "tools" in shown.capabilities and shown.template
        assert f"num_ctx {N_CTX}" in shown.modelfile.split("PARAMETER ", 1)[1]
    assert client.show(B).details.quantization_level == "Q2_K"      # not loaded: its header

    before = datetime.now(timezone.utc)
    ps = client.ps().models
    assert [p.model for p in ps] == [f"{SERVED}:latest"]
    assert ps[0].context_length == N_CTX and ps[0].size > 500e6 and ps[0].size_vram == 0
    # idle: unloaded after the default keep-alive (5 minutes) from its last use
    assert before - timedelta(seconds=5) < ps[0].expires_at \
        <= before + timedelta(seconds=DEFAULT_KEEP_ALIVE + 5)

    status, headers, data = request(server.port, "GET", "/api/version")
    assert status == 200 and headers["content-type"] == "application/json"
    version = json.loads(data)
    assert re.fullmatch(r"\d+\.\d+\.\d+", version["version"])
    assert tuple(map(int, version["version"].split("."))) >= (0, 12, 0)
    assert version["edgespec"]


# ---------------------------------------------------------------------------------------------
# /api/chat and /api/generate through the client


def test_chat_whole_and_streamed(client, server):
    whole = client.chat(SERVED, CHAT, options=greedy(24))
    assert whole.model == SERVED and whole.message.role == "assistant"
    assert "Paris" in whole.message.content and not whole.message.tool_calls
    check_final(whole, 24)

    chunks = list(client.chat(SERVED, CHAT, options=greedy(24), stream=True))
    *pieces, last = chunks
    assert all(c.done is False and c.model == SERVED for c in pieces)
    assert all(c.message.role == "assistant" for c in chunks)
    assert streamed_text(chunks) == whole.message.content
    assert last.message.content == ""
    check_final(last, 24)
    assert last.done_reason == whole.done_reason
    assert (last.eval_count, last.prompt_eval_count) == (whole.eval_count,
                                                         whole.prompt_eval_count)

    # eval_count is the number of tokens: one log-probability per token
    chunks = list(client.chat(SERVED, CHAT, options=greedy(24), stream=True, logprobs=True))
    tokens = [lp for c in chunks for lp in (c.logprobs or ())]
    assert len(tokens) == chunks[-1].eval_count == whole.eval_count
    assert "".join(t.token for t in tokens) == whole.message.content
    assert all(t.logprob <= 0 for t in tokens)

    # ... and what OpenAI's endpoint counts for the same greedy request
    oa = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)
    r = oa.chat.completions.create(model=SERVED, messages=CHAT, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == whole.message.content
    assert r.usage.completion_tokens == whole.eval_count
    assert r.usage.prompt_tokens == whole.prompt_eval_count

    # the `edgespec` field, which the client's types drop
    body, = post_raw(server.port, "/api/chat", {"model": SERVED, "messages": CHAT,
                                                "options": greedy(24), "stream": False})
    assert body["message"]["content"] == whole.message.content
    spec = body["edgespec"]
    assert spec["speculative"] is True and spec["drafted"] > 0
    assert 0 <= spec["accepted"] <= spec["drafted"] and spec["target_passes"] >= 1
    # time to first token and prompt speed, within the durations Ollama's figures give
    seconds = (body["prompt_eval_duration"] + body["eval_duration"]) / 1e9
    assert 0 < spec["first_token_seconds"] <= seconds + 1e-4
    assert spec["prompt_tokens_per_second"] > 0
    streamed = post_raw(server.port, "/api/chat", {"model": SERVED, "messages": CHAT,
                                                   "options": greedy(24)})
    assert set(streamed[-1]["edgespec"]) == set(spec)
    assert all("edgespec" not in c for c in streamed[:-1])


def test_generate_whole_streamed_and_raw(client):
    prompt = CHAT[0]["content"]
    whole = client.generate(SERVED, prompt, options=greedy(24))
    assert whole.model == SERVED and "Paris" in whole.response
    check_final(whole, 24)
    chunks = list(client.generate(SERVED, prompt, options=greedy(24), stream=True))
    assert streamed_text(chunks, "generate") == whole.response
    assert chunks[-1].response == "" and chunks[-1].eval_count == whole.eval_count
    # without raw the prompt is a user message in the model's chat template: as in /api/chat
    assert client.chat(SERVED, CHAT, options=greedy(24)).message.content == whole.response

    raw = client.generate(SERVED, COUNTING, raw=True, options=greedy(8))
    assert raw.response.startswith(" 9, 10") and raw.done_reason == "length"
    assert raw.eval_count == 8 and raw.prompt_eval_count <= len(COUNTING)
    templated = client.generate(SERVED, COUNTING, options=greedy(1))
    assert templated.prompt_eval_count > raw.prompt_eval_count + 10   # the template's tokens
    chunks = list(client.generate(SERVED, COUNTING, raw=True, options=greedy(8), stream=True))
    assert streamed_text(chunks, "generate") == raw.response
    assert chunks[-1].done and chunks[-1].eval_count == 8


def test_format_json_schema_and_json(client):
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        age: int

    ask = [{"role": "user", "content": "Maria is 34. Give her name and age as JSON."}]
    r = client.chat(SERVED, ask, format=Person.model_json_schema(), options=greedy(60))
    person = Person.model_validate_json(r.message.content)
    assert isinstance(person.age, int) and r.done_reason == "stop"
    chunks = list(client.chat(SERVED, ask, format=Person.model_json_schema(),
                              options=greedy(60), stream=True))
    assert streamed_text(chunks) == r.message.content

    r = client.chat(SERVED, CHAT, format="json", options=greedy(60))
    assert isinstance(json.loads(r.message.content), (dict, list))
    g = client.generate(SERVED, "Name three colours as a JSON list.", format="json",
                        options=greedy(60))
    json.loads(g.response)


def get_weather(city: str) -> str:
    """The current weather in a city

    Args:
      city: The city's name
    """
    return json.dumps({"city": city, "temperature_c": 18, "sky": "cloudy"})


def test_a_tool_call_round_trip(client):
    """The model calls the tool, the app sends its result back (`tool_name`), the model
    answers in words."""
    r = client.chat(SERVED, ASK, tools=[WEATHER], options=greedy(80))
    assert r.done_reason == "stop", r
    calls = r.message.tool_calls
    assert calls and all(c.function.name == "get_weather" for c in calls), r
    args = calls[0].function.arguments
    assert isinstance(args, dict) and set(args) == {"city"} and args["city"]
    history = ASK + [r.message, {"role": "tool", "content": get_weather(**args),
                                 "tool_name": "get_weather"}]
    # the final answer is asked without tools, as ollama-python's examples/tools.py does
    # (with them SmolLM2-135M calls the tool again)
    r2 = client.chat(SERVED, history, options=greedy(40))
    assert r2.done and r2.message.content and not r2.message.tool_calls, r2
    assert r2.prompt_eval_count > r.prompt_eval_count // 4       # the history was rendered

    # streamed, with the tool given as a Python function (the client writes its schema):
    # the call comes in one chunk, as the whole answer's
    chunks = list(client.chat(SERVED, ASK, tools=[get_weather], options=greedy(80),
                              stream=True))
    with_calls = [c for c in chunks if c.message.tool_calls]
    assert len(with_calls) == 1 and not with_calls[0].done
    call = with_calls[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    assert chunks[-1].done and chunks[-1].done_reason == "stop"


def test_errors_through_the_client(client, server):
    for call in (lambda: client.chat("no-such-model", CHAT),
                 lambda: client.generate("no-such-model", "hi"),
                 lambda: next(iter(client.chat("no-such-model", CHAT, stream=True))),
                 lambda: client.show("no-such-model")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 404 and "edgespec pull" in e.value.error
    for options, named in (({"temperature": "hot"}, "options.temperature"),
                           ({"temperature": -1}, "options.temperature"),
                           ({"mirostat": 2}, "options.mirostat"),
                           ({"frobnicate": 1}, "frobnicate")):
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(SERVED, CHAT, options=options)
        assert e.value.status_code == 400 and named in e.value.error, e.value
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(SERVED, [{"role": "wizard", "content": "hi"}])
    assert e.value.status_code == 400 and "messages[0].role" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(SERVED, [{"role": "user", "content": "word " * 3000}])
    assert e.value.status_code == 400
    for path in ("/api/chat", "/api/generate", "/api/show"):
        status, body = post(server.port, path, b'{"model": [')
        assert status == 400 and set(body) == {"error"} and "JSON" in body["error"], body
    status, _, data = request(server.port, "POST", "/api/push", b"{}")      # not served
    assert status == 404 and set(json.loads(data)) == {"error"}
    status, _, data = request(server.port, "POST", "/api/embed", b"{}")     # served
    assert status == 400 and set(json.loads(data)) == {"error"}
    assert health(server.port)["status"] == "ok"


def test_a_refused_request_is_logged_with_its_message_not_its_prompt(client, server):
    secret = "the vault code is 4417-kestrel"
    said = [{"role": "user", "content": secret}]
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(SERVED, said, options={"num_ctx": -5})
    assert e.value.status_code == 400
    oa = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as o:
        oa.chat.completions.create(model=SERVED, messages=said, max_tokens=-3)
    err = o.value.body
    lines = [re.compile(r"^INFO: +POST /api/chat 400 \w+: " + re.escape(e.value.error) + "$",
                        re.M),
             re.compile(rf"^INFO: +POST /v1/chat/completions 400 {err['code']}: "
                        + re.escape(err["message"]) + "$", re.M)]
    wait_until(lambda: all(r.search(server.log()) for r in lines), timeout=10)
    assert "num_ctx" in e.value.error and "max_tokens" in err["message"]
    assert secret not in server.log() and "kestrel" not in server.log()


# ---------------------------------------------------------------------------------------------
# curl, as Ollama's documentation uses it


def curl(*args: str) -> subprocess.CompletedProcess:
    """curl's output as text (universal newlines: headers end with a blank line "\\n\\n")."""
    return subprocess.run(["curl", "-sS", "--max-time", "120", *args], capture_output=True,
                          text=True, timeout=150)


@pytest.fixture(scope="module")
def has_curl():
    require_tools("curl", packages="curl")


def test_curl_reads_ndjson(server, client, has_curl):
    url = f"http://127.0.0.1:{server.port}/api/chat"
    body = json.dumps({"model": SERVED, "messages": CHAT, "options": greedy(8)})
    out = curl("-N", "-D", "-", url, "-d", body)          # no Content-Type, as the docs
    assert out.returncode == 0, out.stderr
    head, _, text = out.stdout.partition("\n\n")
    assert head.startswith("HTTP/1.1 200")
    assert re.search(r"^content-type: application/x-ndjson", head, re.M | re.I), head
    lines = text.splitlines()
    objs = [json.loads(line) for line in lines]
    assert len(objs) >= 2 and objs[-1]["done"] is True
    assert all(o["done"] is False for o in objs[:-1])
    assert objs[-1]["eval_count"] <= 8 and objs[-1]["edgespec"]["drafted"] >= 0
    whole = client.chat(SERVED, CHAT, options=greedy(8))
    assert "".join(o["message"]["content"] for o in objs) == whole.message.content

    body = json.dumps({"model": SERVED, "messages": CHAT, "stream": False,
                       "options": greedy(8)})
    out = curl(url, "-d", body)
    assert json.loads(out.stdout)["message"]["content"] == whole.message.content

    out = curl("-w", "\n%{http_code}", url, "-d", '{"model": "x", "messages": [')
    text, code = out.stdout.rsplit("\n", 1)
    assert code == "400" and set(json.loads(text)) == {"error"}

    # a web page's request (a browser adds Origin) is refused before anything runs
    busy_before = health(server.port)["busy"]
    out = curl("-i", "-H", "Origin: http://evil.example", url, "-d", body)
    head, _, text = out.stdout.partition("\n\n")
    assert head.startswith("HTTP/1.1 403"), out.stdout
    assert "evil.example" in json.loads(text)["error"]
    assert "access-control-allow-origin" not in head.lower()
    assert not busy_before and not health(server.port)["busy"]
    out = curl("-i", "-H", "Origin: http://evil.example", "-H", "Content-Type: text/plain",
               f"http://127.0.0.1:{server.port}/api/generate", "-d",
               json.dumps({"model": SERVED, "prompt": "hi"}))
    assert out.stdout.startswith("HTTP/1.1 403"), out.stdout


def test_web_pages_are_served_from_allowed_origins_only(server):
    base = f"http://127.0.0.1:{server.port}"
    bodies = {"/v1/chat/completions": {"model": SERVED, "messages": CHAT, "max_tokens": 2},
              "/api/chat": {"model": SERVED, "messages": CHAT, "stream": False,
                            "options": greedy(2)}}
    pre = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "content-type, authorization"}
    with httpx.Client(base_url=base, timeout=120) as h:
        # an exact origin, one a pattern lets in, the server's own page (no CORS needed)
        for origin in ("app://obsidian.md", "http://localhost:5173", base):
            for path, body in bodies.items():
                r = h.post(path, json=body, headers={"Origin": origin})
                assert r.status_code == 200, (origin, path, r.text)
                assert r.headers.get("access-control-allow-origin") == (
                    None if origin == base else origin), r.headers
            if origin != base:
                r = h.options("/v1/chat/completions", headers={"Origin": origin, **pre})
                assert r.status_code == 200 and "POST" in r.headers["access-control-allow-methods"]
                assert r.headers["access-control-allow-origin"] == origin
                assert "access-control-allow-credentials" not in r.headers
        # foreign origins: another site, a look-alike, another port of this host, a sandbox
        for origin in ("http://evil.example", "app://obsidian.md.evil.example",
                       f"http://127.0.0.1:{server.port + 1}", "null"):
            for method, path, body in (*(("POST", p, b) for p, b in bodies.items()),
                                       ("POST", "/v1/messages", {}),
                                       ("DELETE", "/api/delete", {"model": SERVED})):
                r = h.request(method, path, json=body, headers={"Origin": origin})
                assert r.status_code == 403, (origin, path, r.text)
                assert f"--allow-origin {origin}" in r.text
                assert "access-control-allow-origin" not in r.headers
            r = h.options("/v1/chat/completions", headers={"Origin": origin, **pre})
            assert "access-control-allow-origin" not in r.headers
    assert f"{SERVED}:latest" in {m["name"] for m in httpx.get(f"{base}/api/tags").json()["models"]}


# ---------------------------------------------------------------------------------------------
# /metrics against the responses' own figures


def scrape(port: int, key: str | None = None) -> dict:
    """{(sample name, frozenset of labels): value} of GET /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    status, headers, data = request(port, "GET", "/metrics",
                                    headers={"Authorization": f"Bearer {key}"} if key else {})
    assert status == 200, data
    assert headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(data.decode()) for s in f.samples}


def total(samples: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def test_metrics_add_up(server, client):
    port = server.port
    before = scrape(port)
    figures = []      # (completion, prompt, drafted, accepted, first token s) of each
    opt = greedy(12)

    def ollama_figures(obj):
        figures.append((obj["eval_count"], obj["prompt_eval_count"],
                        obj["edgespec"]["drafted"], obj["edgespec"]["accepted"],
                        obj["edgespec"]["first_token_seconds"]))

    def openai_figures(usage, spec):
        figures.append((usage["completion_tokens"], usage["prompt_tokens"], spec["drafted"],
                        spec["accepted"], spec["first_token_seconds"]))

    ollama_figures(post_raw(port, "/api/chat", {"model": SERVED, "messages": CHAT,
                                                "options": opt, "stream": False})[0])
    ollama_figures(post_raw(port, "/api/chat", {"model": SERVED, "messages": CHAT,
                                                "options": opt})[-1])
    ollama_figures(post_raw(port, "/api/generate", {"model": SERVED, "prompt": COUNTING,
                                                    "raw": True, "options": opt,
                                                    "stream": False})[0])
    ollama_figures(post_raw(port, "/api/generate", {"model": SERVED, "prompt": "Hello",
                                                    "options": opt})[-1])
    status, out = post(port, "/v1/chat/completions", {"model": SERVED, "messages": CHAT,
                                                      "max_tokens": 12, "temperature": 0})
    assert status == 200
    openai_figures(out["usage"], out["edgespec"])
    events = [json.loads(e) for e in sse(port, "/v1/chat/completions", {
        "model": SERVED, "messages": CHAT, "max_tokens": 12, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})[:-1]]
    openai_figures(events[-1]["usage"], events[-1]["edgespec"])
    status, out = post(port, "/v1/completions", {"model": SERVED, "prompt": COUNTING,
                                                 "max_tokens": 12, "temperature": 0})
    assert status == 200
    openai_figures(out["usage"], out["edgespec"])
    n = len(figures)
    # refused requests: counted by status, no generation
    for call in (lambda: client.chat("no-such-model", CHAT),
                 lambda: client.chat(SERVED, CHAT, options={"temperature": "hot"})):
        with pytest.raises(ollama.ResponseError):
            call()
    status, _ = post(port, "/v1/chat/completions", {"messages": CHAT, "temperature": 9})
    assert status == 400
    after = scrape(port)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    model = {"model": SERVED}
    assert delta("edgespec_tokens_predicted_total", **model) == sum(f[0] for f in figures)
    assert delta("edgespec_prompt_tokens_total", **model) == sum(f[1] for f in figures)
    assert delta("edgespec_draft_tokens_total", **model) == sum(f[2] for f in figures) > 0
    assert delta("edgespec_draft_tokens_accepted_total", **model) == sum(f[3] for f in figures)
    assert delta("edgespec_generations_total", **model) == n
    assert delta("edgespec_generations_total", endpoint="/api/chat") == 2
    assert delta("edgespec_generations_total", endpoint="/api/generate") == 2
    assert delta("edgespec_generations_total", endpoint="/v1/chat/completions") == 2
    assert delta("edgespec_generations_total", endpoint="/v1/completions") == 1
    assert delta("edgespec_time_to_first_token_seconds_count", **model) == n
    assert delta("edgespec_time_to_first_token_seconds_sum", **model) > 0
    # the histogram's time counts from the request's arrival, the responses' from the turn
    assert all(f[4] > 0 for f in figures)
    assert delta("edgespec_time_to_first_token_seconds_sum", **model) >= \
        sum(f[4] for f in figures) - n * 1e-4
    assert delta("edgespec_prompt_tokens_evaluated_total", **model) <= \
        delta("edgespec_prompt_tokens_total", **model)
    requests = {(ep, st): delta("edgespec_requests_total", endpoint=ep, status=st)
                for ep, st in (("/api/chat", "200"), ("/api/chat", "404"), ("/api/chat", "400"),
                               ("/api/generate", "200"), ("/v1/chat/completions", "200"),
                               ("/v1/chat/completions", "400"), ("/v1/completions", "200"),
                               ("/metrics", "200"))}
    assert requests == {("/api/chat", "200"): 2, ("/api/chat", "404"): 1,
                        ("/api/chat", "400"): 1, ("/api/generate", "200"): 2,
                        ("/v1/chat/completions", "200"): 2,
                        ("/v1/chat/completions", "400"): 1, ("/v1/completions", "200"): 1,
                        ("/metrics", "200"): 1}       # the first scrape (this one is not over)
    assert delta("edgespec_requests_total") == sum(requests.values())
    assert total(after, "edgespec_requests_in_flight", endpoint="/api/chat") == 0
    assert total(after, "edgespec_requests_in_flight", endpoint="/metrics") == 1
    assert total(after, "edgespec_requests_processing", **model) == 0
    assert total(after, "edgespec_draft_length", **model) == 4        # --draft-max 4
    assert total(after, "edgespec_draft_length_adaptive", **model) == 0


# ---------------------------------------------------------------------------------------------
# Two models on demand, one loaded at a time; an API key


@pytest.fixture(scope="module")
def two(tmp_path_factory, smollm2_q4_path, smollm2_q2k_path):
    """A server whose models folder holds SmolLM2 Q4_1 (started with) and Q2_K, one loaded
    at a time, behind an API key."""
    root = tmp_path_factory.mktemp("two-models")
    folder = root / "models"
    folder.mkdir()
    for path in (smollm2_q4_path, smollm2_q2k_path):
        (folder / path.name).symlink_to(path)
    s = ServerProcess("--target", folder / smollm2_q4_path.name, "--max-loaded", 1,
                      "--ctx-size", N_CTX, "--api-key", KEY, "--metrics",
                      "--model-alias", f"gpt-4o-mini={B}",
                      env={"EDGESPEC_MODELS": str(folder), "HF_HUB_CACHE": str(root / "hub")})
    yield s
    stop_checked(s)


def loaded_names(port: int) -> list[str]:
    status, _, data = request(port, "GET", "/api/ps",
                              headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200
    return [m["name"] for m in json.loads(data)["models"]]


@pytest.mark.slow
def test_two_models_by_two_clients(two):
    port = two.port
    oc = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=300,
                       headers={"Authorization": f"Bearer {KEY}"})
    oa = openai.OpenAI(base_url=two.base_url, api_key=KEY, max_retries=0, timeout=300)
    assert {m.model for m in oc.list().models} == {f"{A}:latest", f"{B}:latest"}
    assert {m.id for m in oa.models.list().data} == {A, B}
    assert loaded_names(port) == [f"{A}:latest"]

    # B loads in a worker thread: /health answers meanwhile
    replies, errors, health_times, seen = {}, [], [], []

    def ask_b():
        try:
            replies["B"] = oc.chat(B, CHAT, options=greedy(12))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    t = threading.Thread(target=ask_b)
    t.start()
    while t.is_alive():
        t0 = time.monotonic()
        h = health(port)
        health_times.append(time.monotonic() - t0)
        seen.append([m["name"] for m in h["loaded"]])
        time.sleep(0.02)
    t.join()
    assert not errors, errors
    assert max(health_times) < 2.0, health_times
    assert [] in seen                    # a reply came while A was gone and B not yet loaded
    assert replies["B"].model == B and replies["B"].load_duration > 0
    assert loaded_names(port) == [f"{B}:latest"]

    ollama_a, openai_a, ollama_b = [], [], [replies["B"].message.content]
    for name in (A, B, A, B, A):
        r = oc.chat(name, CHAT, options=greedy(12))
        assert r.model == name and r.done
        (ollama_a if name == A else ollama_b).append(r.message.content)
        assert loaded_names(port) == [f"{name}:latest"]
        if name == A:
            o = oa.chat.completions.create(model=B, messages=CHAT, max_tokens=12,
                                           temperature=0)
            assert o.model == B and loaded_names(port) == [f"{B}:latest"]
            o = oa.chat.completions.create(model=A, messages=CHAT, max_tokens=12,
                                           temperature=0)
            assert o.model == A and loaded_names(port) == [f"{A}:latest"]
            openai_a.append(o.choices[0].message.content)
    assert len(set(ollama_a)) == 1 and len(set(ollama_b)) == 1      # greedy: the same each time
    assert set(openai_a) == set(ollama_a)                           # the same model's answer

    # an alias answers with its model; an unknown name loads nothing
    o = oa.chat.completions.create(model="gpt-4o-mini", messages=CHAT, max_tokens=12,
                                   temperature=0)
    assert o.model == B and o.choices[0].message.content == ollama_b[0]
    with pytest.raises(ollama.ResponseError) as e:
        oc.chat("gpt-5", CHAT)
    assert e.value.status_code == 404 and "edgespec pull" in e.value.error
    with pytest.raises(openai.NotFoundError, match="edgespec pull"):
        oa.chat.completions.create(model="gpt-5", messages=CHAT, max_tokens=4)
    assert loaded_names(port) == [f"{B}:latest"]

    # Ollama's unload (no messages, keep_alive 0), then a load with its load_duration
    r = oc.chat(B, [], keep_alive=0)
    assert r.done and r.done_reason == "unload"
    assert loaded_names(port) == []
    r = oc.chat(A, CHAT, options=greedy(12))
    assert r.load_duration > 0 and r.message.content == ollama_a[0]
    assert loaded_names(port) == [f"{A}:latest"]


def test_the_key_guards_ollama_and_metrics(two):
    port = two.port
    no_key = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=60)
    with pytest.raises(ollama.ResponseError) as e:
        no_key.list()
    assert e.value.status_code == 401
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
        status, h, data = request(port, "GET", "/metrics", headers=headers)
        assert status == 401 and h.get("www-authenticate") == "Bearer", data
    samples = scrape(port, KEY)
    assert total(samples, "edgespec_requests_total", endpoint="/metrics", status="401") >= 2
    assert total(samples, "edgespec_requests_total", endpoint="/api/tags", status="401") >= 1
    assert health(port)["status"] == "ok"          # /health needs no key

