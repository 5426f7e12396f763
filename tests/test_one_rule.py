"""One name and one check per parameter, from every door (as tests/test_one_request.py walks
the request): ``max_tokens``, ``logprobs``, ``num_ctx``, ``seed``, ``parallel`` and
``streams``. A bad value gets the core's one message from the Python API, ``edgespec run``,
the chat and its ``/set``, ``edgespec serve``'s options and the server's OpenAI, Ollama,
Anthropic and ``/infill`` routes, with the bound the door's API states and the field named as
its client sent it (an HTTP 400 on the server; on the command line exit 1 and one line, the
flag added); a good value reaches the loop under the request's name."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from edgespec import Engine, GenerationRequest, SamplingParams
from edgespec.cli import main
from edgespec.errors import InvalidParameterError
from edgespec.server.llamacpp.request import parse_infill
import test_one_request
from test_one_request import HI, Seen

pytestmark = pytest.mark.real

# test_one_request's Engine (SmolLM2, n_ctx 1024, a draft) and its app served in this process
engine, server = test_one_request.engine, test_one_request.server

N_CTX = 1024                    # test_one_request's engine


def message(name: str, value, valid: str) -> str:
    return str(InvalidParameterError(name, value, valid))


MAX_TOKENS = "an integer >= 1"
MAX_TOKENS_CTX = f"an integer in [1, {N_CTX}] (the context size)"
LOGPROBS = "None or an integer in [0, 20]"
SEED = "an integer in [0, 2**64) or None"
NUM_CTX = "an integer >= 1 (tokens of context)"


def refused(url: str, path: str, body: dict) -> str:
    """The message of the 400 ``path`` answers ``body`` with, in any of the APIs' shapes."""
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=60)
    assert info.value.code == 400
    error = json.loads(info.value.read())["error"]
    return error if isinstance(error, str) else error["message"]


def cli_refused(capsys, argv: list, expected: str, flag: str) -> None:
    """``edgespec ARGV`` exits 1 with one line: the core's message and the flag for it."""
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {expected} (on the command line: {flag})"]


def api_refused(call, expected: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        call()
    assert str(info.value) == expected


# ---------------------------------------------------------------------------------------------
# Bad values: the same message from every door


def test_a_bad_max_tokens_is_one_message_from_every_door(engine, server, smollm2_q4_path,
                                                         capsys):
    bad = message("max_tokens", 0, MAX_TOKENS)
    api_refused(lambda: engine.generate(HI, max_tokens=0), bad)
    api_refused(lambda: engine.stream(HI, max_tokens=0), bad)
    api_refused(lambda: GenerationRequest(HI, max_tokens=0), bad)
    cli_refused(capsys, ["run", "hi", "--target", smollm2_q4_path, "-n", 0], bad,
                "--max-tokens N")
    cli_refused(capsys, ["chat", "--target", smollm2_q4_path, "-n", 0], bad, "--max-tokens N")
    assert refused(server, "/v1/messages", {"model": "pair", "messages": HI,
                                            "max_tokens": 0}) == bad
    # The doors that hold it to the context say so, in the same words
    bounded = message("max_tokens", 0, MAX_TOKENS_CTX)
    assert refused(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 0}) == bounded
    assert refused(server, "/v1/completions", {"prompt": "x", "max_tokens": 0}) == bounded
    assert refused(server, "/v1/chat/completions", {"messages": HI,
                                                    "max_completion_tokens": N_CTX + 1}) == \
        message("max_completion_tokens", N_CTX + 1, MAX_TOKENS_CTX)
    from edgespec.tui.session import ChatSession
    session = ChatSession(engine, label="pair")
    api_refused(lambda: session.set("max_tokens", "0"), bounded)
    # Ollama's num_predict and llama-server's n_predict have their own ranges (-1 and -2: to
    # the context's end), translated once into a valid max_tokens
    assert refused(server, "/api/chat", {"model": "pair", "messages": HI,
                                         "options": {"num_predict": -3}}).startswith(
        "options.num_predict=-3 is invalid")
    assert refused(server, "/infill", {"input_prefix": "a", "input_suffix": "b",
                                       "n_predict": -2}).startswith("n_predict=-2 is invalid")


def test_a_bad_logprobs_is_one_message_from_every_door(engine, server):
    bad = message("logprobs", 21, LOGPROBS)
    api_refused(lambda: engine.generate(HI, max_tokens=1, logprobs=21), bad)
    api_refused(lambda: GenerationRequest(HI, logprobs=21), bad)
    top = message("top_logprobs", 21, LOGPROBS)           # the field the client sent
    assert refused(server, "/v1/chat/completions", {"messages": HI, "logprobs": True,
                                                    "top_logprobs": 21}) == top
    assert refused(server, "/api/chat", {"model": "pair", "messages": HI, "logprobs": True,
                                         "top_logprobs": 21}) == top
    # OpenAI's legacy completions state a lower bound: the same check, with it
    assert refused(server, "/v1/completions", {"prompt": "x", "logprobs": 6}) == \
        message("logprobs", 6, "None or an integer in [0, 5]")


def test_a_bad_num_ctx_is_one_message_on_every_route(server):
    assert refused(server, "/v1/chat/completions", {"messages": HI, "num_ctx": 0}) == \
        message("num_ctx", 0, NUM_CTX)
    assert refused(server, "/api/chat", {"model": "pair", "messages": HI,
                                         "options": {"num_ctx": 0}}) == \
        message("options.num_ctx", 0, NUM_CTX)
    assert refused(server, "/api/generate", {"model": "pair", "prompt": "x",
                                             "options": {"num_ctx": -5}}) == \
        message("options.num_ctx", -5, NUM_CTX)


def test_a_bad_seed_is_one_message_from_every_door(engine, server, smollm2_q4_path, capsys):
    bad = message("seed", -5, SEED)
    api_refused(lambda: SamplingParams(seed=-5), bad)
    api_refused(lambda: engine.generate(HI, max_tokens=1, sampling=SamplingParams(seed=-5)),
                bad)
    assert main(["run", "hi", "--target", str(smollm2_q4_path), "--seed", "-5"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {bad}"]
    from edgespec.tui.session import ChatSession
    api_refused(lambda: ChatSession(engine, label="pair").set("seed", "-5"), bad)
    # llama-server's -1 (and Ollama's) is "pick one"; another negative one is refused
    assert refused(server, "/infill", {"input_prefix": "a", "input_suffix": "b",
                                       "seed": -5}) == bad


def test_bad_parallel_and_streams_are_one_message_from_every_door(smollm2_q4_path, capsys):
    parallel = message("parallel", 100, "an integer in [1, 64] (whole contexts of KV cache: "
                                        "generations at once)")
    api_refused(lambda: Engine.load(smollm2_q4_path, parallel=100), parallel)
    cli_refused(capsys, ["serve", "--target", smollm2_q4_path, "--parallel", 100], parallel,
                "--parallel N")
    streams = message("streams", 2, "an integer in [4, 64] (generations at once: those "
                                    "beyond parallel=4 share its whole contexts)")
    api_refused(lambda: Engine.load(smollm2_q4_path, parallel=4, streams=2), streams)
    cli_refused(capsys, ["serve", "--target", smollm2_q4_path, "--parallel", 4, "--streams", 2],
                streams, "--streams S")
    rpc = message("parallel", 2, "1 with RPC workers (a model on workers serves one "
                                 "generation at a time)")
    cli_refused(capsys, ["serve", "--target", smollm2_q4_path, "--parallel", 2, "--rpc",
                         "127.0.0.1:1"], rpc, "--parallel N")


# ---------------------------------------------------------------------------------------------
# Good values: under the request's name to the loop


def test_good_values_reach_the_loop_under_the_requests_names(engine, server, monkeypatch):
    import ollama
    import openai
    seen = Seen(monkeypatch)
    engine.generate(HI, max_tokens=2, logprobs=3, sampling=SamplingParams(seed=9))
    req = seen.one()
    assert (req.max_tokens, req.logprobs, req.sampling.seed) == (2, 3, 9)
    oa = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    oa.chat.completions.create(model="pair", messages=HI, max_completion_tokens=2,
                               logprobs=True, top_logprobs=4, seed=-1)
    req = seen.one()            # OpenAI's seed is any 64-bit integer: taken modulo 2**64
    assert (req.max_tokens, req.logprobs, req.sampling.seed) == (2, 4, 2**64 - 1)
    oa.completions.create(model="pair", prompt="Once", max_tokens=2, logprobs=5)
    assert seen.one().logprobs == 5
    ol = ollama.Client(host=server)
    ol.chat(model="pair", messages=HI, options={"num_predict": 2, "seed": 11})
    req = seen.one()
    assert (req.max_tokens, req.sampling.seed) == (2, 11)
    ol.generate(model="pair", prompt="Once", raw=True, options={"num_predict": 2, "seed": -1})
    req = seen.one()            # Ollama's -1: a random seed
    assert (req.max_tokens, req.sampling.seed) == (2, None)
    # /infill (a FIM model's route; the translation is the parser's): n_predict, seed
    gen = parse_infill({"input_prefix": "a", "input_suffix": "b", "n_predict": 3, "seed": 5},
                       N_CTX).gen.generation
    assert (gen.max_tokens, gen.sampling.seed) == (3, 5)


def test_the_chat_and_edgespec_run_hand_their_values_on(engine, smollm2_q4_path, monkeypatch,
                                                        capsys):
    from edgespec.tui.session import ChatSession
    seen = Seen(monkeypatch)
    session = ChatSession(engine, label="pair")
    session.set("max_tokens", "3")
    session.set("seed", "7")
    session.ask("Say hello.", lambda piece, from_draft: None)
    req = seen.one()
    assert (req.max_tokens, req.sampling.seed) == (3, 7)
    assert main(["run", "Say hello.", "--target", str(smollm2_q4_path), "--no-spec",
                 "--ctx-size", "512", "-n", "2", "--seed", "4", "--quiet"]) == 0
    req = seen.one()
    assert (req.max_tokens, req.sampling.seed) == (2, 4)
    capsys.readouterr()


def test_parallel_and_streams_reach_the_lanes_under_their_names(smollm2_q4_path):
    with Engine.load(smollm2_q4_path, n_ctx=256, parallel=2, streams=3) as eng:
        assert (eng.lanes.contexts, eng.streams, eng.lanes.n) == (2, 3, 3)
        assert eng.target.config.streams == 3
    from edgespec.cli import build_parser
    from edgespec.server.command import manager_options
    args = build_parser().parse_args(["serve", "--parallel", "2", "--streams", "3"])
    assert manager_options(args)["parallel"] == 2 and args.streams == 3


def test_a_keyed_copy_is_not_checked_again(monkeypatch):
    """The server gives a request its suffix index's key after the API made it: the copy keeps
    the fields as they were checked (with the API's bounds) and runs no check of its own."""
    import dataclasses

    from edgespec import config
    req = GenerationRequest("hi", max_tokens=3, context=8)
    calls = []
    post = GenerationRequest.__post_init__

    def counted(self, *bounds):
        calls.append(bounds)
        post(self, *bounds)
    monkeypatch.setattr(GenerationRequest, "__post_init__", counted)
    keyed = req.keyed("app")
    assert (keyed.index_key, req.index_key, keyed.max_tokens, calls) == ("app", None, 3, [])
    # the control: dataclasses.replace would check again, without the API's bounds
    dataclasses.replace(req, index_key="app")
    assert calls == [(None, config.MAX_LOGPROBS)]
