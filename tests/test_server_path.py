"""The server's one generation path (edgespec/server/generation.py): the core request each API's
body becomes, failures mapped to HTTP errors by their type, and the memory budget's 507 in
either API (a manager whose model is over its budget: nothing here loads or generates)."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from edgespec import GenerationRequest, SamplingParams
from edgespec.errors import (BackendError, ContextOverflowError, EdgespecError,
                             InvalidParameterError, MemoryBudgetError, ModelLoadError)
from edgespec.server.app import create_app
from edgespec.server.generation import api_error
from edgespec.catalogue import CatalogEntry
from edgespec.server.models import ModelManager
from edgespec.server.ollama.request import parse_ollama_generate
from edgespec.server.openai.request import parse_chat, parse_completion
from edgespec.server.wire import APIError

HI = [{"role": "user", "content": "hi"}]


def test_each_api_body_becomes_the_core_request_with_the_engines_defaults():
    chat = parse_chat({"model": "m", "messages": HI, "max_tokens": 5, "temperature": 0,
                       "stream": True}, 512)
    assert chat.generation == GenerationRequest(
        HI, max_tokens=5, sampling=SamplingParams(temperature=0))
    assert (chat.kind, chat.model, chat.stream, chat.include_usage) == ("chat", "m", True,
                                                                        False)
    completion = parse_completion({"prompt": "x", "speculative": False}, 512)
    assert completion.generation == GenerationRequest(
        "x", max_tokens=16, sampling=SamplingParams(), raw=True, speculative=False)
    ollama = parse_ollama_generate({"model": "m", "prompt": "x", "raw": True,
                                    "options": {"num_predict": 5}}, 512).gen
    assert ollama.generation == GenerationRequest("x", max_tokens=5, sampling=SamplingParams(),
                                                  raw=True)
    assert (ollama.kind, ollama.model, ollama.stream) == ("completion", "m", True)


def test_failures_map_to_http_errors_by_type_not_by_message():
    budget = api_error(MemoryBudgetError("the model needs more than this server may use"))
    assert (budget.status, budget.code, budget.type) == (507, "model_too_large", "server_error")
    # an error that only mentions the flag is a load that failed, not the budget
    for e in (EdgespecError("--max-ram"), ModelLoadError("/m.gguf", "bad magic")):
        err = api_error(e)
        assert (err.status, err.code) == (500, "model_load_failed") and str(e) in err.message
    prompt = parse_completion({"prompt": "x"}, 512)
    err = api_error(ContextOverflowError(600, 512), prompt)
    assert (err.status, err.param, err.code) == (400, "prompt", "context_length_exceeded")
    assert api_error(BackendError("llama_decode failed"), prompt) is None   # internal error


@pytest.fixture
def over_budget():
    """The app over a manager whose one model needs more than its memory budget."""
    huge = CatalogEntry("huge", Path("/nowhere/huge.gguf"), None, "gguf", 5000, 0.0,
                        {"format": "gguf"}, "0" * 64, 0)

    def load(entry, n_ctx):
        raise AssertionError("a model over the budget must not be loaded")
    manager = ModelManager(lambda: {"huge": huge}, load, max_ram=1000)
    with TestClient(create_app(manager=manager, n_ctx=512),
                    base_url="http://127.0.0.1:8000") as client:
        yield client


def test_a_model_over_the_memory_budget_is_a_507_in_either_api(over_budget):
    r = over_budget.post("/v1/chat/completions", json={"model": "huge", "messages": HI})
    error = r.json()["error"]
    assert r.status_code == 507 and error["code"] == "model_too_large"
    assert "'huge'" in error["message"] and "--max-ram" in error["message"]
    r = over_budget.post("/api/chat", json={"model": "huge", "messages": HI, "stream": False})
    assert r.status_code == 507 and "--max-ram" in r.json()["error"]


def test_the_context_and_thinking_a_body_asks_for():
    chat = parse_chat({"messages": HI, "num_ctx": 2048, "reasoning_effort": "none"}, 2048)
    assert chat.num_ctx == 2048 and chat.generation.think is False
    assert parse_chat({"messages": HI, "reasoning_effort": "minimal"}, 512).generation.think \
        == "low"
    assert parse_chat({"messages": HI}, 512).generation.think is None
    assert parse_completion({"prompt": "x", "num_ctx": 64}, 512).num_ctx == 64
    # the body is checked against the context it will be served with
    assert parse_chat({"messages": HI, "max_tokens": 2000, "num_ctx": 2048},
                      2048).generation.max_tokens \
        == 2000
    for body, words in [({"num_ctx": 0}, "num_ctx=0 is invalid"),
                        ({"num_ctx": "big"}, "num_ctx='big' is invalid"),
                        ({"reasoning_effort": "max"}, "reasoning_effort='max' is invalid")]:
        with pytest.raises(APIError, match=words):
            parse_chat({"messages": HI, **body}, 512)
    with pytest.raises(APIError, match="unknown parameter 'reasoning_effort'"):
        parse_completion({"prompt": "x", "reasoning_effort": "low"}, 512)
    err = api_error(InvalidParameterError("num_ctx", 9000, "at most 8192"))   # while leasing
    assert (err.status, err.param, err.code) == (400, "num_ctx", "invalid_value")


@pytest.fixture
def small_model():
    """The app over a manager whose one model was trained with 1000 tokens and fits the
    budget up to 400: a request over the budget is refused before anything loads."""
    small = CatalogEntry("small", Path("/nowhere/small.gguf"), None, "gguf", 600, 0.0,
                         {"format": "gguf"}, "0" * 64, 1, 1000)

    def load(entry, n_ctx):
        raise AssertionError("a context over the model's limits must not load it")
    manager = ModelManager(lambda: {"small": small}, load, max_ram=1000, n_ctx=100)
    with TestClient(create_app(manager=manager, n_ctx=100),
                    base_url="http://127.0.0.1:8000") as client:
        yield client


def test_a_context_over_the_memory_budget_is_a_400_in_either_api(small_model):
    """5000 is clamped to the trained 1000, which --max-ram cannot hold either."""
    for n_ctx, words in [(5000, "at 1000 tokens"), (500, "--max-ram")]:
        r = small_model.post("/v1/chat/completions", json={"model": "small", "messages": HI,
                                                           "num_ctx": n_ctx})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "num_ctx", error
        assert words in error["message"] and f"num_ctx={n_ctx} is invalid" in error["message"]
        r = small_model.post("/api/chat", json={"model": "small", "messages": HI,
                                                "options": {"num_ctx": n_ctx}})
        assert r.status_code == 400 and words in r.json()["error"]
    cards = small_model.get("/v1/models").json()["data"]
    assert [(c["id"], c["context_length"], c["max_model_len"]) for c in cards] == \
        [("small", 100, 100)]
    assert cards[0]["edgespec"]["context_length_trained"] == 1000
    assert cards[0]["edgespec"]["draft_context_length"] is None
