"""Ollama's wire format as plain Python (edgespec/server/ollama/): request bodies parsed into
generation settings or refused with one-line 400s, and reply bodies read back with the official
`ollama` client's own types, so the shapes are the ones the client reads. No server, no model."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from json_paths import mutations, paths, replaced
from ollama._client import _copy_messages, _copy_tools
from ollama._types import (ChatRequest, ChatResponse, GenerateRequest, GenerateResponse,
                           ListResponse, Options, ProcessResponse, ResponseError, ShowResponse)

from edgespec import __version__
from edgespec.config import SamplingParams
from edgespec.results import Generation, GenerationStats, TokenLogprob
from edgespec.server.keep_alive import FOREVER, parse_keep_alive
from edgespec.server.ollama.replies import (OLLAMA_VERSION, OllamaReply, calls_to_ollama,
                                            ollama_error_body, ps_body, show_body, tagged_name,
                                            tags_body, version_body)
from edgespec.server.ollama.request import calls_to_openai, parse_ollama_chat, parse_ollama_generate
from edgespec.server.reply_fields import rfc3339
from edgespec.server.wire import APIError
from edgespec.results import LoopStats
from edgespec.tools import ToolCall

N_CTX = 4096
HI = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def chat(**fields):
    return parse_ollama_chat({"model": "pair", "messages": HI, **fields}, N_CTX)


def generate(**fields):
    return parse_ollama_generate({"model": "pair", "prompt": "Once upon a time", **fields},
                                 N_CTX)


def refused(parse, body, *words):
    """The APIError ``parse(body)`` raises: a 400 whose message holds every word."""
    with pytest.raises(APIError) as e:
        parse(body, N_CTX)
    assert e.value.status == 400
    for w in words:
        assert w in e.value.message, e.value.message
    assert "\n" not in e.value.message
    return e.value


def chat_refused(*words, **fields):
    return refused(parse_ollama_chat, {"model": "pair", "messages": HI, **fields}, *words)


def generate_refused(*words, **fields):
    return refused(parse_ollama_generate, {"model": "pair", "prompt": "x", **fields}, *words)


# ---------------------------------------------------------------------------------------------
# /api/chat


def test_chat_defaults_stream_to_the_context_edge_with_edgespecs_sampling():
    r = chat()
    assert r.model == "pair" and not r.load_only
    g = r.gen
    assert (g.kind, g.generation.prompt, g.model) == ("chat", HI, "pair")
    assert g.stream is True                      # Ollama streams unless told not to
    assert g.generation.max_tokens == N_CTX
    assert g.generation.stop == ()
    assert g.generation.sampling == SamplingParams()
    q = g.generation
    assert (q.constraint, q.tools, q.tool_choice, q.logprobs) == (None, None, None, None)
    assert (r.keep_alive, g.generation.think, r.num_ctx, g.num_ctx) == (None, None, None, None)
    assert chat(stream=False).gen.stream is False
    assert chat(stream=None).gen.stream is True


def test_options_map_to_sampling_params():
    r = chat(options={"temperature": 0.2, "top_k": 7, "top_p": 0.5, "min_p": 0.1,
                      "repeat_penalty": 1.3, "repeat_last_n": 32, "presence_penalty": 0.5,
                      "frequency_penalty": -0.5, "seed": 42, "stop": ["\n", "User:"],
                      "num_predict": 100, "num_ctx": 8192})
    assert r.gen.generation.sampling == \
        SamplingParams(temperature=0.2, top_k=7, top_p=0.5, min_p=0.1,
                                            repeat_penalty=1.3, repeat_last_n=32,
                                            presence_penalty=0.5, frequency_penalty=-0.5,
                                            seed=42)
    assert r.gen.generation.stop == ("\n", "User:") and r.gen.generation.max_tokens == 100
    assert r.num_ctx == r.gen.num_ctx == 8192    # the context to load the model with
    assert chat(options={"stop": "END"}).gen.generation.stop == ("END",)
    assert chat(options={"top_k": 5.0}).gen.generation.sampling.top_k == \
        5      # JSON numbers from JS
    assert chat(options={"temperature": None}).gen.generation.sampling == SamplingParams()


def test_ollamas_special_values():
    assert chat(options={"seed": -1}).gen.generation.sampling.seed is None          # -1: random
    assert chat(options={"seed": -2}).gen.generation.sampling.seed == 2 ** 64 - 2
    assert chat(options={"repeat_last_n": -1}).gen.generation.sampling.repeat_last_n == N_CTX
    for n in (-1, -2, 0):                           # all run to the context's end, as in Ollama
        assert chat(options={"num_predict": n}).gen.generation.max_tokens == N_CTX
    assert chat(options={"num_predict": 10 ** 6}).gen.generation.max_tokens == N_CTX
    chat_refused("options.num_predict=-3 is invalid", options={"num_predict": -3})
    chat_refused("options.num_ctx=0 is invalid", options={"num_ctx": 0})


def test_options_that_do_not_change_the_output_are_accepted_and_ignored():
    options = {"num_keep": 5, "num_batch": 2, "num_gpu": 1, "main_gpu": 0, "num_thread": 8,
               "use_mmap": True, "use_mlock": False, "numa": False, "low_vram": False,
               "f16_kv": True, "logits_all": False, "vocab_only": False,
               "embedding_only": False, "mirostat_tau": 0.8, "mirostat_eta": 0.6,
               "mirostat": 0, "typical_p": 1.0, "tfs_z": 1, "penalize_newline": True}
    assert chat(options=options).gen.generation.sampling == SamplingParams()
    # no penalty in use: whether newlines would be penalized does not matter
    assert chat(options={"penalize_newline": False}).gen.generation.sampling == SamplingParams()


@pytest.mark.parametrize("name,value,words", [
    ("mirostat", 2, ("options.mirostat=2 is invalid", "Mirostat")),
    ("typical_p", 0.7, ("options.typical_p=0.7", "typical-p")),
    ("tfs_z", 0.9, ("options.tfs_z=0.9", "tail-free")),
    ("temperature", -1, ("options.temperature=-1 is invalid: options.temperature must be",)),
    ("top_p", 0, ("options.top_p=0 is invalid",)),
    ("top_k", 1.5, ("options.top_k=1.5", "an integer")),
    ("seed", "x", ("options.seed='x'", "an integer")),
    ("use_mmap", "yes", ("options.use_mmap='yes'", "true or false")),
    ("stop", [""], ("options.stop", "non-empty strings")),
    ("stop", ["s"] * 17, ("options.stop", "at most 16")),
    ("temprature", 0.1, ("unknown option 'temprature'",)),
])
def test_options_edgespec_cannot_honour_are_refused(name, value, words):
    chat_refused(*words, options={name: value})


def test_penalize_newline_false_is_refused_with_a_penalty():
    chat_refused("options.penalize_newline is not supported", "newlines",
                 options={"penalize_newline": False, "repeat_penalty": 1.1})


def test_format():
    assert chat(format="json").gen.generation.constraint.kind == "json"
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    c = chat(format=schema).gen.generation.constraint
    assert c.kind == "json_schema" and c.schema == schema
    assert chat(format="").gen.generation.constraint is None
    chat_refused("format='yaml' is invalid", "'json' or a JSON schema", format="yaml")
    chat_refused("format:", "invalid", format={"type": "objekt"})
    chat_refused("format.$schema", format={"$schema": [1]})


def test_tools_are_parsed_and_several_calls_allowed():
    g = chat(tools=[WEATHER]).gen
    assert [t.name for t in g.generation.tools] == ["get_weather"]
    assert g.generation.tool_choice == "auto" and g.generation.parallel_tool_calls is True
    assert chat(tools=[]).gen.generation.tools is None
    chat_refused("tools[0].function.name", tools=[{"type": "function", "function": {}}])
    chat_refused("tools[0].function.parameters.$schema",
                 tools=[{"type": "function", "function": {"name": "f",
                                                          "parameters": {"$schema": 5}}}])
    chat_refused("format and tools", tools=[WEATHER], format="json")


def test_messages():
    msgs = [{"role": "System", "content": "Be brief."}, {"role": "user", "content": None},
            {"role": "assistant", "content": "ok", "thinking": "hmm"}]
    assert chat(messages=msgs).gen.generation.prompt == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": ""},
        {"role": "assistant", "content": "ok"}]
    chat_refused("messages[0].images is not supported: edgespec serves text models",
                 messages=[{"role": "user", "content": "what is this?", "images": ["iVBO"]}])
    assert chat(messages=[{"role": "user", "content": "x", "images": []}]).gen.generation.prompt
    chat_refused("messages[0].role='wizard' is invalid", "system, user, assistant, tool",
                 messages=[{"role": "wizard", "content": "x"}])
    chat_refused("messages[0].content=5 is invalid", messages=[{"role": "user", "content": 5}])
    chat_refused("messages[1]=", messages=[HI[0], "hello"])
    chat_refused("messages", messages={"role": "user"})
    chat_refused("only assistant messages carry tool calls",
                 messages=[{"role": "user", "content": "x",
                            "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}])
    with pytest.raises(APIError, match="context of 16 tokens"):
        parse_ollama_chat({"model": "pair", "messages": [{"role": "user", "content": "x" * 2000}]},
                          16)


def test_tool_calls_in_the_history_become_openais_shape():
    msgs = [HI[0],
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "call_7", "function": {"index": 1, "name": "get_time",
                                              "arguments": {"zone": "CET"}}}]},
            {"role": "tool", "content": "12:00", "tool_name": "get_time"},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            {"role": "tool", "content": "late", "tool_name": "get_weather",
             "tool_call_id": "mine"}]
    prompt = chat(messages=msgs).gen.generation.prompt
    calls = prompt[1]["tool_calls"]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert calls[1] == {"id": "call_7", "type": "function",
                        "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}
    # each result answers the call with its tool's name, whatever the order
    assert prompt[2] == {"role": "tool", "content": "12:00", "tool_call_id": "call_7",
                         "name": "get_time"}
    assert prompt[3] == {"role": "tool", "content": "sunny", "tool_call_id": calls[0]["id"],
                         "name": "get_weather"}
    assert prompt[4]["tool_call_id"] == "mine"
    with pytest.raises(APIError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"):
        calls_to_openai([{"function": {"name": "f", "arguments": [1]}}], "messages[1].tool_calls")
    with pytest.raises(APIError, match=r"messages\[1\]\.tool_calls\[0\]="):
        calls_to_openai([{"function": {"arguments": {}}}], "messages[1].tool_calls")


def test_tool_calls_round_trip():
    made = [ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
            ToolCall("call_2", "get_time", '{}')]
    ollama = calls_to_ollama(made)
    assert ollama[0] == {"id": "call_1", "function": {"index": 0, "name": "get_weather",
                                                      "arguments": {"city": "Paris"}}}
    back = calls_to_openai(ollama, "tool_calls")
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in back] == [("call_1", "get_weather", {"city": "Paris"}),
                               ("call_2", "get_time", {})]


def test_load_and_unload_requests():
    for body in ({"model": "pair"}, {"model": "pair", "messages": []}):
        r = parse_ollama_chat(body, N_CTX)
        assert r.load_only and r.gen is None and r.model == "pair"
    r = parse_ollama_generate({"model": "pair", "keep_alive": 0}, N_CTX)
    assert r.load_only and r.gen is None and r.keep_alive == 0
    assert parse_ollama_generate({"model": "pair", "prompt": ""}, N_CTX).load_only


def test_think_goes_to_the_generation_truncate_and_shift_are_accepted_and_ignored():
    assert chat().gen.generation.think is None
    for value in (True, False, "high", "medium", "low"):
        assert chat(think=value).gen.generation.think == value
        assert generate(think=value).gen.generation.think == value
    chat_refused("think='max' is invalid", think="max")
    assert chat(truncate=True, shift=False).gen
    chat_refused("truncate='yes'", truncate="yes")


def test_logprobs():
    assert chat(logprobs=True).gen.generation.logprobs == 0
    assert chat(logprobs=True, top_logprobs=5).gen.generation.logprobs == 5
    assert chat(top_logprobs=5).gen.generation.logprobs is None   # only with logprobs (Ollama)
    chat_refused("top_logprobs=21 is invalid", logprobs=True, top_logprobs=21)


def test_request_level_refusals():
    refused(parse_ollama_chat, [], "must be a JSON object")
    refused(parse_ollama_chat, {"messages": HI}, "model is required")
    refused(parse_ollama_chat, {"model": "", "messages": HI}, "model is required")
    chat_refused("model=5 is invalid", model=5)
    chat_refused("unknown parameter 'temperature'", temperature=0)
    chat_refused("_debug_render_only is not supported", _debug_render_only=True)
    generate_refused("width is not supported", "text models", width=512)
    chat_refused("stream='no'", stream="no")


# ---------------------------------------------------------------------------------------------
# /api/generate


def test_generate_wraps_the_prompt_as_a_user_message():
    g = generate().gen
    assert g.kind == "chat"
    assert g.generation.prompt == [{"role": "user", "content": "Once upon a time"}]
    assert g.stream is True and g.generation.max_tokens == N_CTX
    assert generate(system="Be brief.").gen.generation.prompt == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Once upon a time"}]
    assert generate(format="json").gen.generation.constraint.kind == "json"


def test_generate_raw_sends_the_prompt_as_is():
    g = generate(raw=True, format="json").gen
    assert (g.kind, g.generation.prompt, g.generation.raw) == \
        ("completion", "Once upon a time", True)
    assert g.generation.constraint.kind == "json"
    generate_refused("system is not supported", "put it in the prompt", raw=True, system="S")


def test_generate_refusals():
    generate_refused("template is not supported", "/api/chat", template="{{ .Prompt }}")
    filled = generate(suffix="    return result").gen        # fill in the middle: no template
    assert (filled.kind, filled.generation.prompt, filled.generation.suffix) == \
        ("completion", "Once upon a time", "    return result")
    generate_refused("system is not supported", "no template", suffix="x", system="S")
    generate_refused("context is not supported", "deprecated", "/api/chat", context=[1, 2, 3])
    generate_refused("images is not supported: edgespec serves text models", images=["iVBO"])
    generate_refused("prompt=[1] is invalid", prompt=[1])
    generate_refused("unknown parameter 'messages'", messages=HI)
    # what the official client sends for fields left alone: empty strings and lists
    assert generate(template="", suffix="", context=[], images=[], system="").gen


def test_what_the_official_client_sends_is_understood():
    def weather(city: str) -> str:
        """The weather in a city.

        Args:
          city: The city
        """
        return "sunny"

    body = ChatRequest(
        model="pair", stream=False, think=True, format="json", keep_alive="5m",
        messages=list(_copy_messages([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny", "tool_name": "weather"}])),
        tools=list(_copy_tools([weather])),
        options=Options(temperature=0, num_predict=64, stop=["\n\n"], num_ctx=2048),
    ).model_dump(exclude_none=True)
    body.pop("format")                  # format and tools together are refused: tested above
    r = parse_ollama_chat(json.loads(json.dumps(body)), N_CTX)
    assert r.gen.stream is False
    assert r.gen.generation.max_tokens == 64
    assert r.gen.generation.sampling.greedy
    assert [t.name for t in r.gen.generation.tools] == ["weather"]
    assert r.gen.generation.prompt[2]["tool_call_id"] == \
        r.gen.generation.prompt[1]["tool_calls"][0]["id"]
    assert (r.keep_alive, r.gen.generation.think, r.num_ctx) == (300.0, True, 2048)

    body = GenerateRequest(model="pair", prompt="Hi", suffix="", system="", template="",
                           raw=False, stream=True, format="", images=None,
                           options={"seed": 1}).model_dump(exclude_none=True)
    r = parse_ollama_generate(json.loads(json.dumps(body)), N_CTX)
    assert r.gen.generation.prompt == [{"role": "user", "content": "Hi"}]
    assert r.gen.generation.sampling.seed == 1


# ---------------------------------------------------------------------------------------------
# keep_alive


@pytest.mark.parametrize("value,seconds", [
    (None, None), (0, 0.0), (300, 300.0), (2.5, 2.5), (-1, FOREVER), (-0.5, FOREVER),
    ("5m", 300.0), ("1h30m", 5400.0), ("300ms", 0.3), ("1.5h", 5400.0), ("0", 0.0),
    ("-1m", FOREVER), ("-1", FOREVER), ("90", 90.0), ("2h45m30s", 9930.0),
    pytest.param(10 ** 400, FOREVER, id="huge"), ("1e999", FOREVER),
])
def test_keep_alive(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["", "5 minutes", "m", "5x", "1h-2m", "nan", True, [5], {}])
def test_keep_alive_refusals(value):
    with pytest.raises(APIError, match="keep_alive") as e:
        parse_keep_alive(value)
    assert e.value.status == 400
    chat_refused("keep_alive", keep_alive=value)


# ---------------------------------------------------------------------------------------------
# Errors


def test_error_body_is_what_the_client_raises():
    err = chat_refused("unknown parameter", temperature=0)
    body = ollama_error_body(err)
    assert body == {"error": err.message}
    raised = ResponseError(json.dumps(body), 400)
    assert raised.error == err.message and raised.status_code == 400


# ---------------------------------------------------------------------------------------------
# Replies

RFC3339_NANO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z")


def result(text="Paris.", finish="stop", tool_calls=(), logprobs=None) -> Generation:
    loop = LoopStats()
    loop.drafted, loop.accepted, loop.target_passes = 10, 8, 4
    stats = GenerationStats(prompt_tokens=30, prompt_tokens_evaluated=12, completion_tokens=9,
                            prompt_seconds=0.25, first_token_seconds=0.3, decode_seconds=1.5,
                            speculative=True, target_threads=4, draft_threads=4, loop=loop)
    return Generation(text, list(range(9)), finish, stats, list(tool_calls), logprobs)


def spell(token: int) -> bytes:
    return f"<{token}>".encode()


def test_created_at_is_rfc3339_in_utc_with_nanoseconds():
    assert rfc3339(1_721_680_408_123_648_000) == "2024-07-22T20:33:28.123648000Z"
    assert RFC3339_NANO.fullmatch(OllamaReply("chat", "pair").chunk("x")["created_at"])


def test_chat_stream_chunks_and_final():
    reply = OllamaReply("chat", "pair:latest")
    chunk = reply.chunk("The")
    assert chunk["message"] == {"role": "assistant", "content": "The"} and not chunk["done"]
    parsed = ChatResponse.model_validate(chunk)
    assert parsed.message.content == "The" and parsed.model == "pair:latest"

    final = reply.final(result(), total_seconds=2.0, load_seconds=0.001, streamed=True)
    parsed = ChatResponse.model_validate(final)
    assert parsed.done and parsed.done_reason == "stop" and parsed.message.content == ""
    assert (parsed.total_duration, parsed.load_duration) == (2_000_000_000, 1_000_000)
    assert (parsed.prompt_eval_count, parsed.prompt_eval_duration) == (30, 250_000_000)
    assert (parsed.eval_count, parsed.eval_duration) == (9, 1_500_000_000)
    assert final["prompt_eval_cached_count"] == 18
    assert final["edgespec"]["drafted"] == 10 and final["edgespec"]["accepted"] == 8
    assert final["edgespec"]["first_token_seconds"] == 0.3
    assert final["edgespec"]["prompt_tokens_per_second"] == 48.0        # 12 tokens in 0.25 s
    for value in final.values():
        assert not isinstance(value, float)


def test_whole_chat_reply_with_tool_calls():
    calls = [ToolCall("call_1", "get_weather", '{"city": "Paris"}')]
    final = OllamaReply("chat", "pair").final(result("", "tool_calls", calls),
                                              total_seconds=1, streamed=False)
    parsed = ChatResponse.model_validate(final)
    assert parsed.done_reason == "stop"             # as Ollama reports an answer with calls
    call = parsed.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    chunk = OllamaReply("chat", "pair").chunk("", tool_calls=calls)
    assert ChatResponse.model_validate(chunk).message.tool_calls[0].function.name == \
        "get_weather"
    # streamed, the calls went in a chunk: the final object has none
    streamed = OllamaReply("chat", "pair").final(result("", "tool_calls", calls),
                                                 total_seconds=1, streamed=True)
    assert "tool_calls" not in streamed["message"]


@pytest.mark.parametrize("finish,reason", [("stop", "stop"), ("length", "length"),
                                           ("tool_calls", "stop")])
def test_done_reason(finish, reason):
    body = OllamaReply("generate", "pair").final(result(finish=finish), total_seconds=1,
                                                 streamed=False)
    assert body["done_reason"] == reason


def test_generate_chunks_and_final():
    reply = OllamaReply("generate", "pair")
    chunk = reply.chunk("Once")
    assert chunk["response"] == "Once" and GenerateResponse.model_validate(chunk).response == \
        "Once"
    final = reply.final(result("Once upon a time", "length"), total_seconds=3, streamed=False)
    parsed = GenerateResponse.model_validate(final)
    assert parsed.response == "Once upon a time" and parsed.done_reason == "length"
    assert "context" not in final and "message" not in final
    assert reply.final(result(), total_seconds=3, streamed=True)["response"] == ""


def test_logprobs_in_chunks_and_whole_replies():
    lps = [TokenLogprob(5, -0.1, [(5, -0.1), (6, -2.5)])]
    reply = OllamaReply("chat", "pair", token_bytes=spell)
    chunk = reply.chunk("<5>", logprobs=lps)
    assert chunk["logprobs"] == [{"token": "<5>", "logprob": -0.1, "bytes": list(b"<5>"),
                                  "top_logprobs": [
                                      {"token": "<5>", "logprob": -0.1, "bytes": list(b"<5>")},
                                      {"token": "<6>", "logprob": -2.5, "bytes": list(b"<6>")}]}]
    parsed = ChatResponse.model_validate(chunk)
    assert parsed.logprobs[0].top_logprobs[1].token == "<6>"
    whole = OllamaReply("generate", "pair", token_bytes=spell).final(
        result(logprobs=lps), total_seconds=1, streamed=False)
    assert GenerateResponse.model_validate(whole).logprobs[0].logprob == -0.1
    assert "logprobs" not in reply.chunk("x")


def test_load_replies():
    for kind, model in (("chat", ChatResponse), ("generate", GenerateResponse)):
        loaded = model.model_validate(OllamaReply(kind, "pair").loaded())
        assert loaded.done and loaded.done_reason == "load"
        assert OllamaReply(kind, "pair").loaded(unloaded=True)["done_reason"] == "unload"


# ---------------------------------------------------------------------------------------------
# /api/tags, /api/ps, /api/show, /api/version

DETAILS = {"format": "gguf", "family": "llama", "families": ["llama"],
           "parameter_size": "135M", "quantization_level": "Q4_K_M"}


def entry(name="smollm2", draft=True):
    return SimpleNamespace(name=name, target=Path("/m/target.gguf"),
                           draft=Path("/m/draft.gguf") if draft else None,
                           kind="pair" if draft else "gguf", size=123_456_789,
                           modified=1_721_680_408.5, details=dict(DETAILS), digest="ab" * 32,
                           n_ctx_train=0)


def test_names_carry_a_tag():
    assert tagged_name("smollm2") == "smollm2:latest"
    assert tagged_name("smollm2:q4") == "smollm2:q4"
    assert tagged_name("host:5000/team/model") == "host:5000/team/model:latest"


def test_tags_body():
    body = tags_body([entry(), entry("plain", draft=False)])
    parsed = ListResponse.model_validate(body)
    first = parsed.models[0]
    assert first.model == "smollm2:latest" and body["models"][0]["name"] == "smollm2:latest"
    assert first.size == 123_456_789 and first.digest == "ab" * 32
    assert first.modified_at.year == 2024
    assert first.details.family == "llama" and first.details.quantization_level == "Q4_K_M"
    assert body["models"][0]["details"]["parent_model"] == ""
    assert body["models"][0]["edgespec"] == {"kind": "pair", "draft": "draft.gguf"}
    assert body["models"][1]["edgespec"] == {"kind": "gguf", "draft": None}
    assert ListResponse.model_validate(tags_body([])).models == []


def test_ps_body():
    now = 1_721_680_408.0
    loaded = [SimpleNamespace(name="smollm2", entry=entry(), size=200_000_000,
                              expires_at=now + 300, n_ctx=4096),
              SimpleNamespace(name="plain", entry=entry("plain", False), size=1,
                              expires_at=None, n_ctx=None)]
    body = ps_body(loaded)
    parsed = ProcessResponse.model_validate(body)
    first, second = parsed.models
    assert first.name == "smollm2:latest" and first.size_vram == 0
    assert first.context_length == 4096 and first.expires_at.timestamp() == now + 300
    assert second.expires_at.year > 2300 and second.context_length is None   # forever


def test_show_body():
    info = {"target": {"architecture": "llama", "n_params": 134_515_008, "n_ctx": 4096,
                       "n_ctx_train": 8192, "n_vocab": 49152, "path": "/m/target.gguf"},
            "draft": {"architecture": "llama"}, "drafter": "hybrid", "chat_template": "model"}
    body = show_body(entry(), info, "{{ messages }}", (4096, 4096), False)
    parsed = ShowResponse.model_validate(body)
    assert parsed.modelinfo["general.architecture"] == "llama"
    assert parsed.modelinfo["llama.context_length"] == 4096
    assert parsed.modelinfo["general.parameter_count"] == 134_515_008
    assert "tools" in parsed.capabilities and "completion" in parsed.capabilities
    assert "thinking" not in parsed.capabilities
    assert parsed.template == "{{ messages }}" and parsed.details.family == "llama"
    assert "FROM /m/target.gguf" in parsed.modelfile and "num_ctx" in parsed.parameters
    assert body["edgespec"]["context_length_trained"] == 8192
    assert body["edgespec"]["draft"] == "/m/draft.gguf" and body["edgespec"]["pair"] == info
    assert body["edgespec"]["draft_context_length"] == 4096
    # an entry that is not loaded: the catalog's details only; a template that thinks
    bare = ShowResponse.model_validate(show_body(entry(draft=False), {}, "", (2048, None),
                                                 True))
    assert bare.modelinfo == {"general.architecture": "llama", "llama.context_length": 2048}
    assert "thinking" in bare.capabilities


def test_version_body():
    body = version_body()
    assert body == {"version": OLLAMA_VERSION, "edgespec": __version__}
    assert tuple(int(p) for p in body["version"].split(".")) >= (0, 12, 0)


# ---------------------------------------------------------------------------------------------
# Fuzz: whatever a client sends, only an APIError comes out

JUNK = [None, True, False, 0, -1, 1.5, -2.0, 10 ** 400, "", "x", "json", "5m", [], [1], ["x"],
        [None], {}, {"a": 1}, {"type": "object"}, {"$schema": [1]}, [[{"role": []}]],
        {"function": {"name": 5}}, {"role": "user", "content": []}, [{"function": None}],
        float("inf"), {"$schema": 5, "type": 7}, [{"type": "function", "function": []}]]


FULL_CHAT = {"model": "pair", "stream": False, "keep_alive": "5m", "think": False,
             "format": {"type": "object"}, "logprobs": True, "top_logprobs": 2,
             "truncate": True, "shift": False,
             "options": {"temperature": 0.5, "top_k": 3, "num_predict": 8, "stop": ["a"],
                         "seed": 3, "mirostat": 0, "num_ctx": 64},
             "messages": [{"role": "system", "content": "s"},
                          {"role": "assistant", "content": "",
                           "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
                          {"role": "tool", "content": "r", "tool_name": "f"}]}
FULL_GENERATE = {"model": "pair", "prompt": "p", "system": "s", "raw": False, "stream": True,
                 "format": "json", "keep_alive": 0, "images": [], "context": [],
                 "template": "", "suffix": "", "options": {"top_p": 0.9, "stop": ["b"]}}
FULL_TOOLS = {"model": "pair", "messages": HI, "tools": [WEATHER]}


@pytest.mark.parametrize("parse,body", [(parse_ollama_chat, FULL_CHAT),
                                        (parse_ollama_chat, FULL_TOOLS),
                                        (parse_ollama_generate, FULL_GENERATE)])
def test_fuzz_only_api_errors(parse, body):
    assert parse(body, N_CTX)                  # the unmutated body is valid
    tried = 0
    for mutated in mutations(body, JUNK, random.Random(7)):
        try:
            parse(mutated, N_CTX)
        except APIError as e:
            assert e.status == 400 and e.message and "\n" not in e.message
        tried += 1
    for junk in JUNK:                          # junk options and fields, a junk body
        for mutated in ({**body, "options": {"temperature": junk}}, {**body, "extra": junk},
                        junk):
            try:
                parse(mutated, N_CTX)
            except APIError as e:
                assert e.status == 400
    assert tried > 50


def random_json(rng: random.Random, depth: int = 3):
    kind = rng.randrange(8 if depth else 5)
    if kind < 5:
        return rng.choice([None, True, 0, -7, 2.5, 10 ** 30, "", "user", "json", "-5m"])
    if kind < 7:
        return [random_json(rng, depth - 1) for _ in range(rng.randrange(3))]
    keys = ["role", "content", "function", "name", "arguments", "type", "tool_calls",
            "properties", "$schema", "images", "x"]
    return {rng.choice(keys): random_json(rng, depth - 1) for _ in range(rng.randrange(3))}


@pytest.mark.parametrize("parse,body", [(parse_ollama_chat, FULL_CHAT),
                                        (parse_ollama_chat, FULL_TOOLS),
                                        (parse_ollama_generate, FULL_GENERATE)])
def test_fuzz_nested_junk(parse, body):
    rng = random.Random(11)
    where = list(paths(body))
    for _ in range(300):
        try:
            parse(replaced(body, rng.choice(where), random_json(rng)), N_CTX)
        except APIError as e:
            assert e.status == 400 and e.message
