"""One request from every edge to the loop: whichever way a generation is asked for (the
Python API, ``edgespec run``, the chat, the server's OpenAI, Ollama and Anthropic routes through
their official clients over real HTTP), exactly one GenerationRequest is made for it, and that
same object, with the same SamplingParams object, is what the decoding loop is handed."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from edgespec import Engine, GenerationRequest, SamplingParams
from edgespec.engine import generation as generation_module

pytestmark = pytest.mark.real


class Seen:
    """Every GenerationRequest made, and what each decode was handed, while installed."""

    def __init__(self, monkeypatch):
        self.made: list[GenerationRequest] = []
        self.decoded: list[tuple] = []       # (request, params, max_tokens)
        post_init = GenerationRequest.__post_init__

        def recording_post_init(req, *bounds):      # (its API's bounds: context, logprobs)
            post_init(req, *bounds)
            self.made.append(req)
        monkeypatch.setattr(GenerationRequest, "__post_init__", recording_post_init)
        run_events, loop = generation_module._Run.events, generation_module.decode

        def recording_run_events(run):
            handed = {}

            def recording_loop(*args, **kw):
                handed.update(kw)
                return loop(*args, **kw)
            generation_module.decode = recording_loop
            try:
                steps = run_events(run)
                first = next(steps, None)         # the loop is built before the first step
            finally:
                generation_module.decode = loop
            self.decoded.append((run.prepared.request, handed["params"], handed["max_tokens"]))
            if first is not None:
                yield first
                yield from steps
        monkeypatch.setattr(generation_module._Run, "events", recording_run_events)

    def clear(self):
        self.made.clear()
        self.decoded.clear()

    def one(self) -> GenerationRequest:
        """The one request made since the last clear, checked to be the one decoded."""
        assert len(self.made) == 1, f"{len(self.made)} GenerationRequests for one generation"
        assert len(self.decoded) == 1
        req, params, max_tokens = self.decoded[0]
        assert req is self.made[0], "the loop was handed another request than the edge made"
        assert params is req.sampling and max_tokens == req.max_tokens
        self.clear()
        return req


@pytest.fixture(scope="module")
def engine(smollm2_q4_path):
    with Engine.load(smollm2_q4_path, smollm2_q4_path, n_ctx=1024, draft_max=2) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine):
    """The real app over ``engine``, served by uvicorn on 127.0.0.1 in this process (so that
    the objects the loop is handed can be seen)."""
    import uvicorn

    from edgespec.server.app import create_app
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(engine, model_id="pair"),
                                        log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(30)
    sock.close()


HI = [{"role": "user", "content": "Say hello."}]


def test_the_python_api_hands_its_request_to_the_loop(engine, monkeypatch):
    seen = Seen(monkeypatch)
    sampling = SamplingParams(temperature=0.5, seed=3)
    engine.generate(HI, max_tokens=3, sampling=sampling, stop=["\n\n"])
    req = seen.one()
    assert req.sampling is sampling and req.stop == ("\n\n",)
    made = GenerationRequest(HI, max_tokens=2)         # built beforehand, as a server does
    seen.clear()
    list(engine.submit(made))
    assert seen.decoded[0][0] is made and not seen.made
    seen.clear()


def test_every_server_route_hands_the_loop_the_request_its_body_became(server, monkeypatch):
    import anthropic
    import ollama
    import openai
    seen = Seen(monkeypatch)
    oa = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    oa.chat.completions.create(model="pair", messages=HI, max_tokens=3, temperature=0.25,
                               stop=["END"])
    req = seen.one()
    assert (req.max_tokens, req.sampling.temperature, req.stop) == (3, 0.25, ("END",))
    oa.completions.create(model="pair", prompt="Once", max_tokens=2, temperature=0.0)
    req = seen.one()
    assert (req.prompt, req.raw, req.max_tokens, req.sampling.greedy) == ("Once", True, 2, True)
    list(oa.chat.completions.create(model="pair", messages=HI, max_tokens=2, stream=True))
    assert seen.one().max_tokens == 2

    ol = ollama.Client(host=server)
    ol.chat(model="pair", messages=HI, options={"num_predict": 3, "temperature": 0.5,
                                                 "top_k": 7, "stop": ["END"]})
    req = seen.one()
    assert (req.max_tokens, req.sampling.top_k, req.stop) == (3, 7, ("END",))
    ol.generate(model="pair", prompt="Once", raw=True, options={"num_predict": 2})
    req = seen.one()
    assert (req.prompt, req.raw, req.max_tokens) == ("Once", True, 2)

    an = anthropic.Anthropic(base_url=server, api_key="x", max_retries=0)
    an.messages.create(model="pair", messages=HI, max_tokens=3, stop_sequences=["END"],
                       extra_body={"temperature": 0.75})   # (this client has no argument)
    req = seen.one()
    assert (req.max_tokens, req.sampling.temperature, req.stop) == (3, 0.75, ("END",))


def test_edgespec_run_hands_its_options_to_the_loop(smollm2_q4_path, monkeypatch, capsys):
    from edgespec.cli import main
    seen = Seen(monkeypatch)
    assert main(["run", "Say hello.", "--target", str(smollm2_q4_path), "--no-spec",
                 "--ctx-size", "512", "-n", "3", "--temperature", "0.4", "--top-k", "5",
                 "--stop", "END", "--quiet"]) == 0
    req = seen.one()
    assert (req.max_tokens, req.sampling.temperature, req.sampling.top_k, req.stop) == \
        (3, 0.4, 5, ("END",))
    capsys.readouterr()


def test_the_chat_hands_its_settings_to_the_loop(engine, monkeypatch):
    from edgespec.tui.session import ChatSession
    seen = Seen(monkeypatch)
    sampling = SamplingParams(temperature=0.3)
    session = ChatSession(engine, label="pair", sampling=sampling, max_tokens=4)
    session.ask("Say hello.", lambda piece, from_draft: None)
    req = seen.one()
    assert req.sampling is sampling and req.max_tokens == 4
