"""llama-server's ``POST /infill`` (edgespec/server/llamacpp/), what editors' autocomplete
plugins call: the prompt's format and its cut on a stand-in tokenizer, the body's checks and
where an answer ends, with no model; then a real `edgespec serve` of Qwen2.5-Coder-0.5B (it
has fill-in-the-middle and repo-level tokens) over real HTTP: the reply's shape, lossless
against plain decoding, streamed as llama-server streams, other files in the prompt, the
refusals, and an editor's abandoned request freeing the model at once."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgespec.engine.prompting import Prompter, fit_infill
from edgespec.engine.request import GenerationRequest
from edgespec.errors import InvalidParameterError
from edgespec.lm import VocabInfo
from edgespec.results import StreamEvent
from edgespec.server.llamacpp.replies import Cutoff, project
from edgespec.server.llamacpp.request import parse_infill
from edgespec.server.wire import APIError

from server_helpers import ServerProcess, health, request, sse, stop_checked, wait_until

# ---------------------------------------------------------------------------------------------
# The prompt, on a stand-in tokenizer: one token per character, special texts one token each


SPECIALS = {"<PRE>": 1001, "<SUF>": 1002, "<MID>": 1003, "<|repo_name|>": 1004,
            "<|file_sep|>": 1005}


class CharModel:
    """What the Prompter reads of a target: a character tokenizer with FIM tokens, and
    repo-level ones unless ``repo`` is false."""

    def __init__(self, repo: bool = True, n_ctx: int = 4096, add_bos: bool = False):
        self.specials = {k: v for k, v in SPECIALS.items() if repo or v < 1004}
        self.n_ctx = n_ctx
        self.info = SimpleNamespace(chat_template=None)
        self.vocab = VocabInfo(n_vocab=2000, vocab_type=2, bos=7, eos=8, add_bos=add_bos,
                               add_eos=False, eog=frozenset({8}), fim=(1001, 1002, 1003))

    def token_text(self, t: int) -> bytes:
        return b"<s>" if t == 7 else b"</s>"

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True):
        if parse_special and text in self.specials:
            return [self.specials[text]]
        return [ord(c) for c in text]

    def spell(self, tokens) -> str:
        names = {v: k for k, v in SPECIALS.items()}
        return "".join(names.get(t, chr(t) if t > 31 or t == 10 else "") for t in tokens)


def infill_prompt(model: CharModel, prefix: str, suffix: str, files=(), max_tokens: int = 16):
    req = GenerationRequest(prefix, max_tokens=max_tokens, raw=True, suffix=suffix,
                            infill_files=files)
    return model.spell(Prompter(model, threading.Lock()).infill(req))


def test_other_files_come_first_in_the_repo_level_format():
    text = infill_prompt(CharModel(), "def f():\n    ", "\n", [("a.py", "A = 1\n")])
    assert text == ("<|repo_name|>myproject\n<|file_sep|>a.py\nA = 1\n<|file_sep|>filename\n"
                    "<PRE>def f():\n    <SUF>\n<MID>")


def test_without_repo_tokens_each_file_follows_a_snippet_line():
    text = infill_prompt(CharModel(repo=False), "x = ", "", [("a.py", "A\n"), ("b.py", "B\n")])
    assert text == "\n\n--- snippet ---\n\nA\n\n\n--- snippet ---\n\nB\n<PRE>x = <SUF><MID>"


def test_the_plain_suffix_prompt_is_unchanged():
    """Ollama's and OpenAI's ``suffix`` (no files given) keep prefix-suffix-middle alone."""
    req = GenerationRequest("a", raw=True, suffix="b")
    assert Prompter(CharModel(add_bos=True), threading.Lock()).infill(req) == \
        [7, 1001, ord("a"), 1002, ord("b"), 1003]


def test_a_long_prompt_is_cut_to_the_context_as_llama_cpp_cuts_it():
    """The prefix's end and the suffix's start are kept (the suffix a quarter at most), then
    the files' end; the answer's room (its max_tokens, at most half the context) is left."""
    before, after, files = fit_infill(list(range(100)), list(range(100, 200)),
                                      list(range(200, 300)), 80)
    assert after == list(range(100, 120)) and before == list(range(40, 100)) and files == []
    before, after, files = fit_infill([1, 2], [3], list(range(10, 30)), 8)
    assert (before, after, files) == ([1, 2], [3], list(range(25, 30)))
    model = CharModel(n_ctx=64)
    text = infill_prompt(model, "p" * 100, "s" * 100, [("f", "x" * 100)], max_tokens=16)
    assert text == "<PRE>" + "p" * 34 + "<SUF>" + "s" * 11 + "<MID>"      # 64 - 16 - 3 = 45
    assert len(Prompter(model, threading.Lock()).infill(GenerationRequest(
        "p", max_tokens=1000, raw=True, suffix="s", infill_files=[("f", "x" * 100)]))) == 32


def test_files_need_a_suffix_and_pairs_of_strings():
    for files, suffix in (([("a", "b")], None), ([("a",)], "s"), ([("a", 1)], "s"), ("ab", "s")):
        with pytest.raises(InvalidParameterError, match="infill_files"):
            GenerationRequest("p", suffix=suffix, infill_files=files)


# ---------------------------------------------------------------------------------------------
# Bodies and where an answer ends, without a server


BASE = {"input_prefix": "def f():\n    ", "input_suffix": "\n"}


def refused(body: dict, *words: str) -> APIError:
    with pytest.raises(APIError) as e:
        parse_infill(body, 1024)
    assert e.value.status == 400 and "\n" not in e.value.message, e.value.message
    assert all(w in e.value.message for w in words), e.value.message
    return e.value


def test_a_body_becomes_the_generation_llama_server_would_run():
    ireq = parse_infill({**BASE, "prompt": "ret", "input_extra": [
        {"filename": "a.py", "text": "A\n", "time": 3}, {"text": "B"}], "n_predict": 5,
        "temperature": 0, "seed": -1, "stop": ["\n\n"], "n_indent": 4, "samplers": ["top_k"],
        "cache_prompt": True, "id_slot": 0, "t_max_prompt_ms": 500, "typical_p": 1.0,
        "response_fields": ["content"], "model": "m"}, 1024)
    gen = ireq.gen.generation
    assert (gen.prompt, gen.suffix, gen.infill_files) == \
        ("def f():\n    ret", "\n", (("a.py", "A\n"), ("tmp", "B")))
    assert (gen.max_tokens, gen.stop, gen.sampling.seed, gen.raw) == (5, ("\n\n",), None, True)
    assert (ireq.gen.model, ireq.gen.stream, ireq.n_indent, ireq.response_fields) == \
        ("m", False, 4, ("content",))
    assert parse_infill(BASE, 1024).gen.generation.max_tokens == 1024     # n_predict -1
    assert parse_infill({**BASE, "n_predict": 0}, 1024).gen.generation.max_tokens == 1
    assert parse_infill({**BASE, "n_predict": 5000}, 1024).gen.generation.max_tokens == 1024


def test_bad_bodies_are_one_line_400s():
    assert refused({**BASE, "n_predict": "5"}, "n_predict").param == "n_predict"
    assert refused({**BASE, "input_extra": {"a": 1}}, "input_extra", "list").code == \
        "invalid_type"
    refused({**BASE, "input_extra": ["text"]}, "input_extra[0]")
    refused({**BASE, "input_extra": [{"filename": "a"}]}, "input_extra[0].text")
    refused({**BASE, "n_predict": -2}, "n_predict")
    refused({"input_prefix": "x"}, "input_suffix is required")
    refused({**BASE, "mirostat": 2}, "mirostat is not supported")
    refused({**BASE, "grammar": "root ::= x"}, "grammar")
    refused({**BASE, "stop": "x"}, "stop")
    assert refused({**BASE, "n_predictt": 5}, "unknown parameter").code == "unknown_parameter"


def event(text: str) -> StreamEvent:
    return StreamEvent(text, 1, False)


def test_n_indent_ends_the_answer_at_the_first_line_indented_less():
    cut = Cutoff(64, n_indent=4)
    ends = [cut.push(event(t)) for t in ("return", " x\n", "    y\n", "  ", "", "z = 1")]
    assert ends == [False, False, False, False, False, True]
    assert cut.text == "return x\n    y\n  " and cut.piece == "" and len(cut.tokens) == 6
    cut = Cutoff(64, n_indent=4)
    assert [cut.push(event(t)) for t in ("a\n", "\nb")] == [False, True]   # a blank line
    assert cut.text == "a\n" and cut.piece == ""


def test_t_max_predict_ms_ends_the_answer_after_a_newline_once_the_time_is_spent():
    now = [0.0]
    cut = Cutoff(64, t_max_ms=100, clock=lambda: now[0])
    assert not cut.push(event("a"))
    now[0] = 0.5
    assert not cut.push(event("b"))                   # no newline yet: the line is finished
    assert cut.push(event("\nc")) and cut.text == "ab\nc"


def test_n_predict_0_asks_for_the_prompt_alone():
    cut = Cutoff(0)
    assert cut.push(event("x")) and cut.text == "" and cut.tokens == []


def test_response_fields_keep_paths_as_keys():
    body = {"content": "x", "timings": {"prompt_n": 3}, "stop": True}
    assert project(body, ("content", "timings/prompt_n", "timings/nope", "")) == \
        {"content": "x", "timings/prompt_n": 3}
    assert project(body, None) is body


def test_the_llama_server_modules_stand_apart_from_the_other_apis():
    server = Path(__file__).resolve().parent.parent / "edgespec" / "server"
    for name in ("routes.py", "request.py", "replies.py"):
        text = (server / "llamacpp" / name).read_text()
        assert "from ..ollama" not in text and "from ..anthropic" not in text, name
        assert len(text.splitlines()) <= 400


# ---------------------------------------------------------------------------------------------
# A real server


N_CTX = 1024
PREFIX = '''class Vector:
    def __init__(self, x, y, z):
        self.x = x
        self.y = y
        self.z = z

    def add(self, other):
        return Vector(self.x + other.x, self.y + other.y, self.z + other.z)

    def sub(self, other):
'''
SUFFIX = '''

    def dot(self, other):
        return self.x * other.x + self.y * other.y + self.z * other.z
'''
COUNTING = "# the numbers from 1 to 1000, one per line\n1\n2\n3\n"     # a long answer
GREEDY = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 40, "temperature": 0}


@pytest.fixture(scope="module")
def server(qwen_draft_path, smollm2_q4_path):
    # One generation at a time (a cancelled one must free the model for the next), n-gram
    # drafts of a pinned length (every request drafts), a second model for the refusal.
    s = ServerProcess("--target", qwen_draft_path, "--draft", "none", "--ctx-size", N_CTX,
                      "--parallel", 1, "--streams", 1, "--draft-max", 4, "--max-loaded", 2)
    yield s
    stop_checked(s)


def infill(server, body: dict, status: int = 200) -> dict:
    code, _, data = request(server.port, "POST", "/infill", json.dumps(body).encode(),
                            {"Content-Type": "application/json"})
    out = json.loads(data)
    assert code == status, out
    return out


def test_an_infill_is_lossless_and_in_llama_servers_shape(server):
    spec = infill(server, GREEDY)
    plain = infill(server, {**GREEDY, "speculative": False})
    assert spec["content"] and spec["content"] == plain["content"]
    assert spec["timings"]["draft_n"] > 0, spec["timings"]         # it was drafted
    assert {"content", "stop", "stop_type", "stopping_word", "tokens_predicted",
            "tokens_evaluated", "tokens_cached", "truncated", "model", "timings",
            "generation_settings", "edgespec"} <= set(spec)
    assert spec["stop"] is True and spec["stop_type"] in ("eos", "limit")
    assert spec["model"] == server_model(server)
    assert spec["tokens_predicted"] == spec["timings"]["predicted_n"] <= 40
    assert spec["tokens_evaluated"] > len(PREFIX + SUFFIX) // 8
    for key in ("prompt_n", "prompt_ms", "predicted_ms", "predicted_per_second", "cache_n"):
        assert spec["timings"][key] >= 0
    worded = infill(server, {**GREEDY, "stop": ["other"], "return_tokens": True})
    assert spec["content"].startswith(worded["content"] + "other")
    assert (worded["stop_type"], worded["stopping_word"]) == ("word", "other")
    assert len(worded["tokens"]) == worded["tokens_predicted"] > 0
    indented = infill(server, {**GREEDY, "n_indent": 4})          # llama-server's n_indent
    assert spec["content"].startswith(indented["content"]) and indented["stop_type"] == "limit"
    fields = infill(server, {**GREEDY, "response_fields": ["content", "timings/predicted_n"]})
    assert fields == {"content": spec["content"],
                      "timings/predicted_n": spec["tokens_predicted"]}


def server_model(server) -> str:
    return health(server.port)["model"]


def test_a_stream_is_llama_servers_events_and_the_same_answer(server):
    whole = infill(server, GREEDY)
    events = [json.loads(e) for e in sse(server.port, "/infill", {**GREEDY, "stream": True})]
    *chunks, last = events
    assert chunks and all(c["stop"] is False and c["content"] for c in chunks)
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert last["stop"] is True and last["content"] == ""
    assert last["tokens_predicted"] == whole["tokens_predicted"]
    assert last["stop_type"] == whole["stop_type"] and "timings" in last


def test_other_files_reach_the_prompt(server):
    prefix = "from constants import API_PORT\n\n# the API listens on port "
    body = {"input_prefix": prefix, "input_suffix": "\n", "n_predict": 8, "temperature": 0}
    alone = infill(server, body)
    extra = [{"filename": "constants.py", "text": "API_PORT = 48213\nDB_PORT = 5432\n"}]
    told = infill(server, {**body, "input_extra": extra})
    assert told["tokens_evaluated"] > alone["tokens_evaluated"] + 10
    assert "48213" in told["content"] and "48213" not in alone["content"]


def test_a_model_without_fim_tokens_and_bad_fields_are_one_line_400s(server, smollm2_q4_path):
    err = infill(server, {**GREEDY, "model": smollm2_q4_path.stem}, status=400)["error"]
    assert err["code"] == "model_not_supported" and "\n" not in err["message"]
    assert "fill-in-the-middle" in err["message"] and "Qwen2.5-Coder" in err["message"]
    err = infill(server, {**GREEDY, "n_predict": "40"}, status=400)["error"]
    assert err["param"] == "n_predict" and "\n" not in err["message"]
    err = infill(server, {**GREEDY, "input_extra": "a.py"}, status=400)["error"]
    assert err["param"] == "input_extra" and "\n" not in err["message"]


def abandon(server, body: dict, first_chunk: bool) -> None:
    """Send ``body`` to /infill as an editor does, then give up on it: after the first
    chunk of a stream, or once a whole answer's generation is running."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/infill", json.dumps(body), {"Content-Type": "application/json"})
    if first_chunk:
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read(6) == b"data: "
    else:
        wait_until(lambda: health(server.port)["running"] == 1, 30)
    conn.sock.close()
    conn.close()


@pytest.mark.parametrize("stream", [True, False])
def test_an_abandoned_request_frees_the_model_at_once(server, stream):
    """llama.vscode aborts the request a newer keystroke supersedes: the generation stops
    and the model's one lane is free for the next request, long before 900 tokens."""
    long = {"input_prefix": COUNTING, "input_suffix": "", "n_predict": 900, "temperature": 0,
            "stream": stream}
    abandon(server, long, first_chunk=stream)
    assert wait_until(lambda: health(server.port)["running"] == 0, 10) < 5
    t0 = time.monotonic()
    assert infill(server, {**GREEDY, "n_predict": 4})["tokens_predicted"] <= 4
    assert time.monotonic() - t0 < 10
    assert "client disconnected" in server.log()
