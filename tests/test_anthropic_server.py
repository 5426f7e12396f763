"""`edgespec serve` as Anthropic's clients see it: a real server process on loopback with the
real SmolLM2 models (and an API key, which the official `anthropic` client sends as
`x-api-key`), driven by that client: messages whole and streamed, stop sequences, a tool
round trip, token counting, and errors in Anthropic's shape for bad bodies."""

from __future__ import annotations

import json
import random

import anthropic
import openai
import pytest

from json_paths import replaced
from server_helpers import ServerProcess, health, request, stop_checked

KEY = "sk-ant-test-0123456789"
N_CTX = 1024
SERVED = "SmolLM2-135M-Instruct.F32"
GREEDY = {"temperature": 0}       # the client has no temperature argument: sent as extra_body
SYSTEM = "Answer in one short sentence."
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object",
                            "properties": {"city": {"type": "string", "maxLength": 30}},
                            "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def server(smollm2_f32_path, smollm2_q4_path):
    s = ServerProcess("--target", smollm2_f32_path, "--draft", smollm2_q4_path,
                      "--ctx-size", N_CTX, "--api-key", KEY)
    yield s
    stop_checked(s)


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key=KEY,
                               max_retries=0, timeout=300)


def post(server, path: str, body, headers: dict | None = None):
    """(status, parsed body) of a POST with the key as Anthropic's clients send it."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, out = request(server.port, "POST", path, data,
                             {"Content-Type": "application/json", "x-api-key": KEY,
                              "anthropic-version": "2023-06-01", **(headers or {})})
    return status, json.loads(out)


def events(server, body: dict) -> list[tuple[str, dict]]:
    """The (event, data) pairs of a streamed reply; every frame checked."""
    status, headers, data = request(server.port, "POST", "/v1/messages",
                                    json.dumps({**body, "stream": True}).encode(),
                                    {"Content-Type": "application/json", "x-api-key": KEY})
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), data
    out = []
    for frame in data.decode().split("\n\n")[:-1]:
        name, payload = frame.split("\n")
        body = json.loads(payload.removeprefix("data: "))
        assert name == f"event: {body['type']}", frame
        out.append((body["type"], body))
    return out


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_whole_and_streamed(client, server):
    whole = client.messages.create(model=SERVED, max_tokens=24, system=SYSTEM, messages=CHAT,
                                   extra_body=GREEDY)
    assert whole.id.startswith("msg_") and whole.model == SERVED and whole.role == "assistant"
    (block,) = whole.content
    assert block.type == "text" and "Paris" in block.text
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.stop_sequence is None
    assert whole.usage.input_tokens > 10 and 0 < whole.usage.output_tokens <= 24
    assert whole.model_extra["edgespec"]["speculative"] is True

    with client.messages.stream(model=SERVED, max_tokens=24, system=SYSTEM, messages=CHAT,
                                extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == block.text
    assert text_of(final) == block.text and final.stop_reason == whole.stop_reason
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens

    # the events themselves, in Anthropic's order
    got = events(server, {"model": SERVED, "max_tokens": 24, "system": SYSTEM,
                          "messages": CHAT, **GREEDY})
    names = [n for n, _ in got]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert got[0][1]["message"]["usage"]["input_tokens"] == whole.usage.input_tokens
    assert "".join(d["delta"]["text"] for n, d in got if n == "content_block_delta") \
        == block.text
    delta = got[-2][1]
    assert delta["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole.usage.output_tokens
    assert delta["edgespec"]["drafted"] >= 0

    # OpenAI's endpoint gives the same greedy answer from the same prompt
    oa = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=300)
    r = oa.chat.completions.create(model=SERVED, max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, *CHAT])
    assert r.choices[0].message.content == block.text
    assert r.usage.prompt_tokens == whole.usage.input_tokens

    # a second turn: the history is rendered
    again = client.messages.create(
        model=SERVED, max_tokens=16, system=SYSTEM, extra_body=GREEDY,
        messages=CHAT + [{"role": "assistant", "content": whole.content},
                         {"role": "user", "content": [{"type": "text",
                                                       "text": "And of Italy?"}]}])
    assert again.usage.input_tokens > whole.usage.input_tokens + 5 and text_of(again)


def test_stop_sequences_and_max_tokens(client):
    whole = text_of(client.messages.create(model=SERVED, max_tokens=24, system=SYSTEM,
                                           messages=CHAT, extra_body=GREEDY))
    stop = " " + whole.split()[2]            # a word inside the answer
    r = client.messages.create(model=SERVED, max_tokens=24, system=SYSTEM, messages=CHAT,
                               stop_sequences=["no such text", stop], extra_body=GREEDY)
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    assert text_of(r) == whole[:whole.index(stop)]
    with client.messages.stream(model=SERVED, max_tokens=24, system=SYSTEM, messages=CHAT,
                                stop_sequences=[stop], extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence, text_of(final)) == \
        ("stop_sequence", stop, text_of(r))

    r = client.messages.create(model=SERVED, max_tokens=3, messages=CHAT, extra_body=GREEDY)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3


def test_a_tool_round_trip(client, server):
    r = client.messages.create(model=SERVED, max_tokens=60, messages=ASK, tools=[WEATHER],
                               tool_choice={"type": "any"}, extra_body=GREEDY)
    assert r.stop_reason == "tool_use", r
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    assert set(use.input) == {"city"} and use.input["city"]

    history = ASK + [{"role": "assistant", "content": r.content},
                     {"role": "user", "content": [{"type": "tool_result",
                                                   "tool_use_id": use.id,
                                                   "content": "21 degrees and sunny"}]}]
    answer = client.messages.create(model=SERVED, max_tokens=30, messages=history,
                                    tools=[WEATHER], tool_choice={"type": "none"},
                                    extra_body=GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens") and text_of(answer)
    assert [b.type for b in answer.content] == ["text"]
    assert answer.usage.input_tokens > r.usage.input_tokens // 4

    # streamed: the call comes whole (a tool_use block, its input as one JSON delta)
    got = events(server, {"model": SERVED, "max_tokens": 60, "messages": ASK,
                          "tools": [WEATHER], "tool_choice": {"type": "any"}, **GREEDY})
    names = [n for n, _ in got]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert got[2][1]["content_block"]["type"] == "tool_use"
    assert got[2][1]["content_block"]["name"] == "get_weather"
    assert json.loads(got[3][1]["delta"]["partial_json"]) == use.input
    assert got[5][1]["delta"]["stop_reason"] == "tool_use"


def test_count_tokens_is_what_the_model_is_sent(client):
    for fields in ({"system": SYSTEM, "messages": CHAT},
                   {"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "any"}}):
        counted = client.messages.count_tokens(model=SERVED, **fields).input_tokens
        sent = client.messages.create(model=SERVED, max_tokens=1, extra_body=GREEDY, **fields)
        assert counted == sent.usage.input_tokens > 10


def test_errors_in_anthropics_shape(client, server):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", max_tokens=4, messages=CHAT)
    assert e.value.body["error"]["type"] == "not_found_error"
    assert "edgespec pull" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=SERVED, max_tokens=4, messages=CHAT,
                               extra_body={"temperature": 3})
    assert e.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "temperature=3 is invalid: temperature must be a number in [0, 1] "
                   "(0 = greedy)"}}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=SERVED, max_tokens=4, messages=[{"role": "user",
            "content": [{"type": "image", "source": {"type": "base64", "media_type":
                                                      "image/png", "data": "AAAA"}}]}])
    assert "messages[0].content[0]" in e.value.body["error"]["message"]
    bad = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="wrong",
                              max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=SERVED, max_tokens=4, messages=CHAT)
    assert e.value.body["error"]["type"] == "authentication_error"

    # the key as a bearer token works too; none at all is refused in Anthropic's shape
    status, body = post(server, "/v1/messages/count_tokens",
                        {"model": SERVED, "messages": CHAT},
                        {"x-api-key": "", "Authorization": f"Bearer {KEY}"})
    assert status == 200 and body["input_tokens"] > 5, body
    status, _, data = request(server.port, "POST", "/v1/messages", b"{}",
                              {"Content-Type": "application/json"})
    assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error"
    for path, want in (("/v1/messages/batches", 404), ("/v1/messages", 400)):
        status, body = post(server, path, b'{"model": [')
        assert status == want and body["type"] == "error", body


BASE = {"model": SERVED, "max_tokens": 1, "system": SYSTEM, "messages": [
    {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "tools": [WEATHER],
    "tool_choice": {"type": "none"}, "stop_sequences": ["x"], "temperature": 0}
JUNK = [None, True, -1, 2.5, "", "x", [], {}, [1], {"type": "image"}, {"type": "text"},
        [{"type": "thinking"}], {"role": "user"}]


def test_a_fuzz_of_bad_bodies_gets_only_anthropic_errors(server):
    """Each field of a valid body (cheap: one token) replaced by junk: a 400 in Anthropic's
    shape naming what is wrong, or (where the junk is valid) an answer; never a 5xx."""
    rng = random.Random(3)
    where = [("model",), ("max_tokens",), ("system",), ("messages",), ("messages", 0),
             ("messages", 0, "role"), ("messages", 0, "content"),
             ("messages", 0, "content", 0), ("messages", 0, "content", 0, "type"),
             ("tools",), ("tools", 0), ("tools", 0, "input_schema"), ("tool_choice",),
             ("tool_choice", "type"), ("stop_sequences",), ("temperature",), ("nonsense",)]
    answered = refused = 0
    for path in where:
        for junk in rng.sample(JUNK, 3):
            status, out = post(server, "/v1/messages", replaced(BASE, path, junk))
            assert status in (200, 400, 404), (path, junk, out)
            if status == 200:
                answered += 1
                assert out["type"] == "message"
            else:
                refused += 1
                assert out["type"] == "error" and set(out["error"]) == {"type", "message"}
                assert out["error"]["type"] in ("invalid_request_error", "not_found_error")
                assert out["error"]["message"] and "\n" not in out["error"]["message"]
    assert refused > 30
    assert health(server.port)["status"] == "ok"


def test_the_models_list_is_in_anthropics_shape_for_its_client(client):
    page = client.models.list()
    served = [m for m in page.data if m.id == SERVED]
    assert served and served[0].type == "model" and served[0].display_name == SERVED
    assert served[0].created_at.year >= 2024
    assert page.first_id == page.data[0].id and page.has_more is False
    assert client.models.retrieve(SERVED).display_name == SERVED
