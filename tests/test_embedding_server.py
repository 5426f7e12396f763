"""Embeddings over HTTP, as retrieval apps reach them: a real `edgespec serve` (chat model
SmolLM2-135M-Instruct) with an embedding model on disk (all-MiniLM-L6-v2, loaded on demand),
driven by the official `ollama` and `openai` clients and by LangChain's OllamaEmbeddings and
ChatOllama; bad bodies on the new routes never get a 5xx."""

from __future__ import annotations

import base64
import itertools
import json
import random
import re

import numpy as np
import ollama
import openai
import pytest

from server_helpers import ServerProcess, assert_openai_error, post, request

CHAT_MODEL = "SmolLM2-135M-Instruct.Q4_1"
EMBED_MODEL = "all-minilm"
N_EMBD = 384
DOCS = ["Paris is the capital of France.",
        "Photosynthesis turns light into chemical energy in plants.",
        "The Pacific is the largest ocean on Earth."]


@pytest.fixture(scope="module")
def server(smollm2_q4_path, minilm_path):
    s = ServerProcess("--target", smollm2_q4_path, "--drafter", "none", "--ctx-size", 1024,
                      "--threads", 2, "--metrics")
    yield s
    rc = s.stop()
    assert rc in (0, 130), s.log()
    log = s.log()
    assert "Traceback" not in log and not re.search(r'HTTP/1\.1" 5\d\d', log), log


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=f"http://127.0.0.1:{server.port}", timeout=300)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def close(a, b) -> bool:
    """Equal within float tolerance (a pass of several texts sums in another order)."""
    return np.allclose(a, b, atol=5e-4)


def test_ollama_embed(client):
    r = client.embed(model=EMBED_MODEL, input=[DOCS[0], DOCS[1], DOCS[0]])
    v = np.array(r.embeddings)
    assert v.shape == (3, N_EMBD) and r.model == EMBED_MODEL
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert close(v[0], v[2]) and not close(v[0], v[1])
    assert r.prompt_eval_count > 3 and r.total_duration > 0
    one = client.embed(model=EMBED_MODEL, input=DOCS[0])
    assert close(one.embeddings[0], v[0])
    cut = client.embed(model=EMBED_MODEL, input=DOCS[0], dimensions=32).embeddings[0]
    assert len(cut) == 32 and np.isclose(np.linalg.norm(cut), 1, atol=1e-5)
    assert len(client.embed(model=EMBED_MODEL, input=DOCS[0], dimensions=10_000)
               .embeddings[0]) == N_EMBD            # Ollama's: the whole vector
    assert client.embed(model=EMBED_MODEL, input="").embeddings == []     # a load
    legacy = client.embeddings(model=EMBED_MODEL, prompt=DOCS[0]).embedding
    assert len(legacy) == N_EMBD and close(np.array(legacy) / np.linalg.norm(legacy), v[0])


def test_ollama_embed_long_inputs(client):
    long = "the cat sat on the mat " * 200
    assert client.embed(model=EMBED_MODEL, input=long).prompt_eval_count == 512
    with pytest.raises(ollama.ResponseError, match="embeds at most 512") as e:
        client.embed(model=EMBED_MODEL, input=long, truncate=False)
    assert e.value.status_code == 400


def test_a_chat_model_embeds_too(client):
    v = client.embed(model=CHAT_MODEL, input=[DOCS[0], DOCS[0]]).embeddings
    assert len(v[0]) == 576 and close(v[0], v[1])


def test_openai_embeddings(oai):
    floats = oai.embeddings.create(model=EMBED_MODEL, input=DOCS, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.model == EMBED_MODEL
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 3
    # the client asks for base64 by default and decodes it itself
    b64 = oai.embeddings.create(model=EMBED_MODEL, input=DOCS)
    for f, b in zip(floats.data, b64.data):
        assert len(f.embedding) == N_EMBD and np.array_equal(f.embedding, b.embedding)
    raw = oai.embeddings.with_raw_response.create(model=EMBED_MODEL, input=DOCS[0],
                                                  encoding_format="base64")
    text = json.loads(raw.text)["data"][0]["embedding"]
    one = oai.embeddings.create(model=EMBED_MODEL, input=DOCS[0], encoding_format="float")
    assert np.array_equal(np.frombuffer(base64.b64decode(text), "<f4"), one.data[0].embedding)
    cut = oai.embeddings.create(model=EMBED_MODEL, input=DOCS[0], dimensions=64,
                                encoding_format="float").data[0].embedding
    assert len(cut) == 64
    ids = oai.embeddings.create(model=EMBED_MODEL, input=[[101, 3000, 102]],
                                encoding_format="float")
    assert ids.usage.prompt_tokens == 3
    with pytest.raises(openai.BadRequestError, match="embeds at most 512"):
        oai.embeddings.create(model=EMBED_MODEL, input="word " * 600)


def test_an_embedding_model_does_not_generate(client, oai, server):
    with pytest.raises(ollama.ResponseError, match="is an embedding model") as e:
        client.chat(model=EMBED_MODEL, messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="is an embedding model"):
        client.generate(model=EMBED_MODEL, prompt="hi")
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        oai.chat.completions.create(model=EMBED_MODEL, max_tokens=4,
                                    messages=[{"role": "user", "content": "hi"}])
    show = client.show(EMBED_MODEL)
    assert show.capabilities == ["embedding"] and show.details.family == "bert"
    assert EMBED_MODEL in [m.id for m in oai.models.list()]


def test_langchain_retrieval_round_trip(server):
    from langchain_ollama import ChatOllama, OllamaEmbeddings
    url = f"http://127.0.0.1:{server.port}"
    embeddings = OllamaEmbeddings(model=EMBED_MODEL, base_url=url)
    docs = np.array(embeddings.embed_documents(DOCS))
    query = np.array(embeddings.embed_query("Which city is the capital of France?"))
    best = DOCS[int(np.argmax(docs @ query))]
    assert best == DOCS[0]
    chat = ChatOllama(model=CHAT_MODEL, base_url=url, temperature=0, num_predict=24)
    answer = chat.invoke([("system", f"Answer with this context: {best}"),
                          ("human", "What is the capital of France?")])
    assert "Paris" in answer.content, answer.content
    # both stayed loaded: embedding models are counted apart from chat models
    loaded = {m.model for m in ollama.Client(host=url).ps().models}
    assert {f"{EMBED_MODEL}:latest", f"{CHAT_MODEL}:latest"} <= loaded, loaded


def test_metrics_count_embedded_tokens(server, client):
    tokens = client.embed(model=EMBED_MODEL, input=["count these tokens"]).prompt_eval_count
    status, _, body = request(server.port, "GET", "/metrics")
    assert status == 200
    m = re.search(r'edgespec_embedding_tokens_total\{model="all-minilm"\} (\S+)', body.decode())
    assert m and float(m.group(1)) >= tokens


# ---------------------------------------------------------------------------------------------
# Bad bodies: an error in the API's own shape, never a 5xx

JUNK = [None, 0, -1, 1.5, 10**30, True, "", "x", [], [1], [[]], [""], [None], {}, {"a": 1},
        [[-5]], [[10**12]], ["x"] * 3000, "y" * 300_000]
FIELDS = {"/api/embed": ["model", "input", "truncate", "dimensions", "keep_alive", "options",
                         "unknown"],
          "/api/embeddings": ["model", "prompt", "keep_alive", "options", "unknown"],
          "/v1/embeddings": ["model", "input", "encoding_format", "dimensions", "user",
                             "unknown"]}
GOOD = {"/api/embed": {"model": EMBED_MODEL, "input": "fine"},
        "/api/embeddings": {"model": EMBED_MODEL, "prompt": "fine"},
        "/v1/embeddings": {"model": EMBED_MODEL, "input": "fine"}}


def bodies():
    rng = random.Random(36)
    for path, fields in FIELDS.items():
        for raw in (b"", b"not json", b"[1, 2]", b'"text"', b"null", b"{", b"NaN"):
            yield path, raw
        for field, junk in itertools.product(fields, JUNK):
            if rng.random() < 0.35:
                yield path, {**GOOD[path], field: junk}
        for _ in range(10):
            yield path, {f: rng.choice(JUNK) for f in rng.sample(fields, 3)}


def test_bad_bodies_get_api_errors(server):
    for path, body in bodies():
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, _, data = request(server.port, "POST", path, raw,
                                  {"Content-Type": "application/json"})
        assert status < 500, (path, body, data)
        if status != 200:
            answer = json.loads(data)
            if path.startswith("/api/"):
                assert set(answer) == {"error"} and isinstance(answer["error"], str), answer
            else:
                assert_openai_error(status, answer, status)


def test_no_model_named(server):
    status, body = post(server.port, "/api/embed", {"input": "x"})
    assert status == 400 and "model is required" in body["error"]
    status, body = post(server.port, "/api/embed", {"model": "nope", "input": "x"})
    assert status == 404
    status, body = post(server.port, "/v1/embeddings", {"model": "nope", "input": "x"})
    assert_openai_error(status, body, 404, param="model")
