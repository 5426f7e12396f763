"""Anthropic's Messages API wire format as plain Python (edgespec/server/anthropic_*.py):
request bodies parsed into generation settings or refused with one-line 400s naming the
field, and replies read back with the official `anthropic` client's own types, so the shapes
are the ones the client reads. No server, no model."""

from __future__ import annotations

import json
import random

import pytest
from anthropic.types import Message, MessageDeltaEvent, MessageStartEvent
from json_paths import mutations

from edgespec.constraints import Constraint
from edgespec.results import Generation, GenerationStats
from edgespec.server.anthropic.routes import AnthropicFraming
from edgespec.server.anthropic.replies import MessageReply, anthropic_error, matched_stop
from edgespec.server.anthropic.request import parse_count, parse_messages
from edgespec.server.wire import APIError
from edgespec.tools import ToolCall

N_CTX = 4096
HI = [{"role": "user", "content": "hi"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
CLOCK = {"name": "clock", "input_schema": {"type": "object", "properties": {}}}


def messages(**fields):
    return parse_messages({"model": "pair", "max_tokens": 8, "messages": HI, **fields}, N_CTX)


def refused(*words, parse=parse_messages, **fields):
    """The 400 a body refused raises: one line holding every word; its param."""
    body = {"model": "pair", "max_tokens": 8, "messages": HI, **fields}
    with pytest.raises(APIError) as e:
        parse({k: v for k, v in body.items() if v is not ...}, N_CTX)
    assert e.value.status == 400 and "\n" not in e.value.message
    for w in words:
        assert w in e.value.message, e.value.message
    return e.value


# ---------------------------------------------------------------------------------------------
# Requests


def test_a_conversation_with_calls_and_results_becomes_the_engines_messages():
    req = messages(
        system=[{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Use tools.",
                                                         "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Weather in Paris and the time?"},
                  {"role": "assistant", "content": [
                      {"type": "text", "text": "Let me look."},
                      {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                       "input": {"city": "Paris"}},
                      {"type": "tool_use", "id": "toolu_2", "name": "clock", "input": {}}]},
                  {"role": "user", "content": [
                      {"type": "tool_result", "tool_use_id": "toolu_1",
                       "content": [{"type": "text", "text": "21 C"}]},
                      {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no clock",
                       "is_error": True},
                      {"type": "text", "text": "Thanks!"}]}],
        tools=[WEATHER, CLOCK], stop_sequences=["\n\n", "END"], temperature=0.5, top_k=7,
        top_p=0.9, metadata={"user_id": "u1"}, service_tier="auto", speed="fast",
        thinking={"type": "disabled"}, tool_choice={"type": "auto"})
    assert req.kind == "chat" and req.model == "pair" and not req.stream
    assert req.generation.prompt == [
        {"role": "system", "content": "Be brief. Use tools."},
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "toolu_2", "type": "function",
             "function": {"name": "clock", "arguments": "{}"}}]},
        {"role": "tool", "content": "21 C", "tool_call_id": "toolu_1", "name": "get_weather"},
        {"role": "tool", "content": "error: no clock", "tool_call_id": "toolu_2",
         "name": "clock"},
        {"role": "user", "content": "Thanks!"}]
    assert req.generation.stop == ("\n\n", "END") and req.generation.max_tokens == 8
    s = req.generation.sampling
    assert (s.temperature, s.top_k, s.top_p) == (0.5, 7, 0.9)
    assert [t.name for t in req.generation.tools] == ["get_weather", "clock"]
    assert req.generation.tools[0].parameters == WEATHER["input_schema"]
    assert req.generation.tool_choice == "auto"
    assert req.generation.parallel_tool_calls
    assert req.holds_answer


@pytest.mark.parametrize("choice,expect,parallel", [
    ({"type": "auto"}, "auto", True), ({"type": "any"}, "required", True),
    ({"type": "tool", "name": "clock"}, "clock", True), ({"type": "none"}, "none", True),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
])
def test_tool_choice(choice, expect, parallel):
    req = messages(tools=[WEATHER, CLOCK], tool_choice=choice)
    assert (req.generation.tool_choice, req.generation.parallel_tool_calls) == (expect, parallel)
    assert req.holds_answer == (expect != "none")


def test_defaults_streaming_counting_and_structured_output():
    req = messages(stream=True, max_tokens=100_000)   # past the context: stops at its edge
    assert req.stream
    assert req.generation.max_tokens == 100_000
    assert req.generation.stop == ()
    assert req.generation.tools is None
    assert req.generation.sampling.temperature == \
        0.8            # edgespec's default, not Anthropic's
    req = messages(output_config={"effort": "low", "format": {
        "type": "json_schema", "schema": {"type": "object"}}})
    assert isinstance(req.generation.constraint, Constraint)
    count = parse_count({"model": "pair", "messages": HI, "system": "s", "tools": [WEATHER],
                         "tool_choice": {"type": "any"}}, N_CTX)
    assert count.generation.prompt[0] == {"role": "system", "content": "s"}
    assert count.generation.tool_choice == "required"
    assert count.generation.tools[0].name == "get_weather"


@pytest.mark.parametrize("fields,words", [
    ({"max_tokens": ...}, ["max_tokens is required"]),
    ({"model": ...}, ["model is required"]),
    ({"messages": ...}, ["messages is required"]),
    ({"messages": []}, ["messages"]),
    ({"max_tokens": 0}, ["max_tokens"]),
    ({"max_tokens": 2.5}, ["max_tokens"]),
    ({"temperature": 1.5}, ["temperature", "[0, 1]"]),
    ({"top_k": "x"}, ["top_k"]),
    ({"stop_sequences": "END"}, ["stop_sequences"]),
    ({"stop_sequences": [""]}, ["stop_sequences"]),
    ({"frequency_penalty": 1}, ["unknown", "frequency_penalty"]),
    ({"container": "c1"}, ["container", "not supported"]),
    ({"mcp_servers": []}, ["mcp_servers"]),
    ({"output_format": {"type": "json_schema"}}, ["output_format", "output_config.format"]),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, ["thinking", "not supported"]),
    ({"metadata": {"user_id": "u", "tags": []}}, ["metadata.tags"]),
    ({"messages": [{"role": "system", "content": "s"}]}, ["messages[0].role"]),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     ["messages[0].content[0]", "image", "not supported"]),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     ["messages[0].content[0]", "document"]),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "."}]}]},
     ["messages[0].content[0]", "thinking"]),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
     ["messages[0].content[0].x"]),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                  "input": {}}]}]},
     ["messages[0].content[0].type"]),
    ({"messages": HI + [{"role": "assistant", "content": "The answer is"}]},
     ["messages[1]", "prefill"]),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     ["tools[0].type", "server tools"]),
    ({"tools": [{"name": "f"}]}, ["tools[0].input_schema is required"]),
    ({"tools": [{"name": "f g", "input_schema": {}}]}, ["tools[0].name"]),
    ({"tools": [{"name": "f", "input_schema": {"type": 7}}]}, ["tools[0].input_schema"]),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     ["tool_choice.name", "get_weather"]),
    ({"tool_choice": {"type": "any"}}, ["tool_choice.type", "no tools"]),
    ({"tools": [WEATHER], "tool_choice": {"type": "sometimes"}}, ["tool_choice.type"]),
    ({"tools": [WEATHER], "output_config": {"format": {"type": "json_schema",
                                                        "schema": {"type": "object"}}}},
     ["output_config.format and tools"]),
    ({"output_config": {"effort": "extreme"}}, ["output_config.effort"]),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": 5}}}},
     ["output_config.format.schema"]),
])
def test_refusals_name_the_field(fields, words):
    refused(*words, **fields)


def test_count_refuses_what_only_generation_reads():
    body = {"model": "pair", "messages": HI, "max_tokens": 8}
    with pytest.raises(APIError) as e:
        parse_count(body, N_CTX)
    assert e.value.status == 400 and "max_tokens" in e.value.message


# ---------------------------------------------------------------------------------------------
# Replies, read back with the client's types


def gen(text="", finish="stop", tokens=(), calls=()):
    stats = GenerationStats(prompt_tokens=12, completion_tokens=len(tokens))
    return Generation(text, list(tokens), finish, stats, tool_calls=list(calls))


SPELL = {1: b"Hello", 2: b" wor", 3: b"ld", 4: b"END", 5: b"\xc3"}.__getitem__


def test_matched_stop_is_the_first_found():
    assert matched_stop("Hello worldEND", ["END", "wor"]) == "wor"
    assert matched_stop("Hello", ["END"]) is None


@pytest.mark.parametrize("finish,tokens,stops,reason,sequence", [
    ("stop", [1, 2, 3], (), "end_turn", None),
    ("stop", [1, 2, 3], ("END",), "end_turn", None),          # an end-of-generation token
    ("stop", [1, 2, 3, 4], ("END", "zz"), "stop_sequence", "END"),
    ("length", [1, 2], ("END",), "max_tokens", None),
    ("tool_calls", [1], (), "tool_use", None),
])
def test_stop_reasons(finish, tokens, stops, reason, sequence):
    reply = MessageReply("pair", stops, SPELL)
    body = reply.message(gen("Hello world", finish, tokens))
    msg = Message.model_validate(body)
    assert (msg.stop_reason, msg.stop_sequence) == (reason, sequence)
    assert msg.usage.input_tokens == 12 and msg.usage.output_tokens == len(tokens)
    assert msg.id.startswith("msg_") and msg.model == "pair" and "edgespec" in body


def test_content_blocks_text_and_tool_use():
    call = ToolCall("call_abc", "get_weather", '{"city": "Paris"}')
    msg = Message.model_validate(MessageReply("m", (), SPELL).message(
        gen("", "tool_calls", [1], [call])))
    (use,) = msg.content
    assert (use.type, use.id, use.name, use.input) == ("tool_use", "toolu_abc", "get_weather",
                                                       {"city": "Paris"})
    msg = Message.model_validate(MessageReply("m", (), SPELL).message(gen("", "stop")))
    assert [(b.type, b.text) for b in msg.content] == [("text", "")]


def frames_of(data: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of server-sent events framed as Anthropic's."""
    out = []
    for frame in data.decode().split("\n\n")[:-1]:
        name, payload = frame.split("\n")
        assert name.startswith("event: ") and payload.startswith("data: ")
        body = json.loads(payload[len("data: "):])
        assert body["type"] == name[len("event: "):]
        out.append((body["type"], body))
    return out


def test_a_held_stream_sends_each_block_whole():
    call = ToolCall("call_x", "clock", "{}")
    framing = AnthropicFraming(MessageReply("m", (), SPELL), held=True, input_tokens=12)
    data = b"".join([*framing.opening(), *framing.closing(
        gen("Checking.", "tool_calls", [1, 2], [call]), held=True)])
    events = frames_of(data)
    assert [n for n, _ in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"]
    start = MessageStartEvent.model_validate(events[0][1])
    assert start.message.usage.input_tokens == 12 and start.message.content == []
    assert events[5][1]["content_block"] == {"type": "tool_use", "id": "toolu_x",
                                             "name": "clock", "input": {}}
    assert events[6][1]["delta"] == {"type": "input_json_delta", "partial_json": "{}"}
    delta = MessageDeltaEvent.model_validate(events[8][1])
    assert delta.delta.stop_reason == "tool_use" and delta.usage.output_tokens == 2


@pytest.mark.parametrize("status,kind,sent", [
    (400, "invalid_request_error", 400), (401, "authentication_error", 401),
    (404, "not_found_error", 404), (413, "request_too_large", 413),
    (503, "overloaded_error", 529), (500, "api_error", 500), (507, "api_error", 507)])
def test_errors_in_anthropics_shape(status, kind, sent):
    got, body = anthropic_error(APIError(status, "what went wrong"))
    assert got == sent
    assert body == {"type": "error", "error": {"type": kind, "message": "what went wrong"}}


# ---------------------------------------------------------------------------------------------
# Fuzz: whatever a body holds, a 400 or a request


FULL = {"model": "pair", "max_tokens": 8, "stream": True, "temperature": 0.5, "top_p": 0.9,
        "top_k": 3, "stop_sequences": ["a"], "system": [{"type": "text", "text": "s"}],
        "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"},
        "tools": [WEATHER], "tool_choice": {"type": "auto"},
        "messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": [
                         {"type": "text", "text": "t"},
                         {"type": "tool_use", "id": "u1", "name": "get_weather",
                          "input": {"city": "x"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": "u1", "content": "r",
                          "is_error": False}]}]}
JUNK = [None, True, False, 0, -1, 1.5, 10 ** 400, "", "x", "user", [], [1], ["x"], [None], {},
        {"a": 1}, {"type": "text"}, {"type": "image"}, {"type": "tool_use"},
        {"type": "object"}, [{"type": "text", "text": 5}], float("inf"),
        {"role": "user", "content": []}]


@pytest.mark.parametrize("parse", [parse_messages, parse_count])
def test_fuzz_only_api_errors(parse):
    body = FULL if parse is parse_messages else {
        k: v for k, v in FULL.items() if k in ("model", "messages", "system", "tools",
                                               "tool_choice", "thinking")}
    assert parse(body, N_CTX)                   # the unmutated body is valid
    tried = 0
    extra = [m for junk in JUNK for m in ({**body, "extra": junk}, junk)]
    for mutated in [*mutations(body, JUNK, random.Random(5)), *extra]:
        try:
            parse(mutated, N_CTX)
        except APIError as e:
            assert e.status == 400 and e.message and "\n" not in e.message
        tried += 1
    assert tried > 100
