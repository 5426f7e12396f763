"""What real clients send, through a real `edgespec serve` started with no --ctx-size, with
the official openai, ollama and anthropic clients.

- Tools: a cut answer never shows the tool format's wrapper on any route (OpenAI, Ollama,
  Anthropic; whole and streamed), and a forced choice (Anthropic's ``tool``/``any``, OpenAI's
  named function/``required``) always calls, ``none`` never does, on a model whose template
  has no tool tags (SmolLM2: the generic JSON format) and on one whose tags are special
  tokens (Qwen2.5-Coder: ``<tool_call>``).
- Contexts: each model's default is its trained context as far as memory allows, said at
  start-up and in /api/ps; aider's num_ctx (1.25 × prompt + 8192) is clamped, not refused.
- Fill-in-the-middle: ``suffix`` on /api/generate and /v1/completions for a model with FIM
  tokens (Ollama's ``insert`` capability), a one-line 400 for one without."""

from __future__ import annotations

import json
import re

import anthropic
import jsonschema
import ollama
import openai
import pytest

from server_helpers import ServerProcess, stop_checked, wait_until

SMOL = "SmolLM2-135M-Instruct.F32"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 30}},
        "required": ["tz"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
OPENAI_TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": s}}
                for n, d, s in (("get_weather", "The current weather in a city", WEATHER),
                                ("get_time", "The current time in a time zone", TIME))]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in OPENAI_TOOLS]
HELLO = [{"role": "user", "content": "Say hello"}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WRAPPER = ('{"', '"response"', '"tool_call', "<tool_call>")


@pytest.fixture(scope="module")
def server(smollm2_f32_path, smollm2_q4_path, qwen_draft_path):
    s = ServerProcess("--target", smollm2_f32_path, "--draft", smollm2_q4_path,
                      "--max-loaded", 2)
    yield s
    stop_checked(s)


@pytest.fixture(scope="module")
def qwen(qwen_draft_path) -> str:
    return qwen_draft_path.stem            # served by name, as any model on disk


@pytest.fixture(scope="module")
def clients(server):
    url = f"http://127.0.0.1:{server.port}"
    return (openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300),
            ollama.Client(host=url, timeout=300),
            anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=300))


def answers(clients, model: str, messages, max_tokens: int) -> dict:
    """route -> (text, tool calls, finish, completion tokens) of one greedy request offering
    the tools with the choice left to the model, on every route whole and streamed."""
    oa, ol, an = clients
    out = {}
    r = oa.chat.completions.create(model=model, messages=messages, tools=OPENAI_TOOLS,
                                   max_tokens=max_tokens, temperature=0)
    m = r.choices[0]
    out["openai"] = (m.message.content or "", m.message.tool_calls or [], m.finish_reason,
                     r.usage.completion_tokens)
    text, calls, finish = "", [], None
    for chunk in oa.chat.completions.create(model=model, messages=messages, tools=OPENAI_TOOLS,
                                            max_tokens=max_tokens, temperature=0, stream=True):
        if chunk.choices:
            d = chunk.choices[0]
            text += d.delta.content or ""
            calls += d.delta.tool_calls or []
            finish = d.finish_reason or finish
    out["openai stream"] = (text, calls, finish, None)
    opts = {"num_predict": max_tokens, "temperature": 0}
    r = ol.chat(model=model, messages=messages, tools=OPENAI_TOOLS, options=opts)
    out["ollama"] = (r.message.content, r.message.tool_calls or [], r.done_reason, r.eval_count)
    text, calls = "", []
    for part in ol.chat(model=model, messages=messages, tools=OPENAI_TOOLS, options=opts,
                        stream=True):
        text += part.message.content or ""
        calls += part.message.tool_calls or []
        if part.done:
            finish = part.done_reason
    out["ollama stream"] = (text, calls, finish, None)
    r = an.messages.create(model=model, max_tokens=max_tokens, messages=messages,
                           tools=ANTHROPIC_TOOLS, extra_body={"temperature": 0})
    out["anthropic"] = ("".join(b.text for b in r.content if b.type == "text"),
                        [b for b in r.content if b.type == "tool_use"], r.stop_reason,
                        r.usage.output_tokens)
    with an.messages.stream(model=model, max_tokens=max_tokens, messages=messages,
                            tools=ANTHROPIC_TOOLS, extra_body={"temperature": 0}) as s:
        r = s.get_final_message()
    out["anthropic stream"] = ("".join(b.text for b in r.content if b.type == "text"),
                               [b for b in r.content if b.type == "tool_use"], r.stop_reason,
                               None)
    return out


@pytest.mark.parametrize("messages", [HELLO, ASK], ids=["answers", "calls"])
def test_a_cut_answer_never_shows_the_wrapper_on_any_route(clients, messages):
    """The generic format wraps an answer as {"response": "…"}: cut by max_tokens, every route
    gives the text inside it so far (a prefix of the whole answer) or, for a cut call,
    nothing; the finish says the length, and the tokens counted are those generated."""
    whole = answers(clients, SMOL, messages, 200)["openai"]
    assert whole[2] in ("stop", "tool_calls"), whole
    for max_tokens in (4, 9):
        for route, (text, calls, finish, n) in answers(clients, SMOL, messages,
                                                       max_tokens).items():
            assert not any(w in text for w in WRAPPER), (route, text)
            assert not calls, (route, calls)
            if whole[2] == "stop":
                assert whole[0].startswith(text), (route, text, whole[0])
            else:
                assert text == "", (route, text)
            assert finish in ("length", "max_tokens"), (route, finish)
            assert n in (None, max_tokens), (route, n)


def test_the_answer_of_a_model_with_tool_tags_cut_before_its_call_is_its_text(clients, qwen):
    """Qwen's calls follow its text as <tool_call> blocks: cut inside one, the text before it
    stays and no tag or half call shows."""
    for route, (text, calls, finish, _) in answers(clients, qwen, ASK, 6).items():
        assert "<tool_call>" not in text and not calls, (route, text, calls)
        assert finish in ("length", "max_tokens"), (route, finish)


def anthropic_reply(an, model: str, choice: dict, stream: bool):
    kwargs = dict(model=model, max_tokens=48, messages=ASK, tools=ANTHROPIC_TOOLS,
                  tool_choice=choice, extra_body={"temperature": 0})
    if not stream:
        return an.messages.create(**kwargs)
    with an.messages.stream(**kwargs) as s:
        return s.get_final_message()


def openai_reply(oa, model: str, choice, stream: bool) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(name, arguments)]) of one greedy chat with ``tool_choice``."""
    kwargs = dict(model=model, messages=ASK, tools=OPENAI_TOOLS, tool_choice=choice,
                  max_tokens=48, temperature=0)
    if not stream:
        m = oa.chat.completions.create(**kwargs).choices[0].message
        return m.content or "", [(c.function.name, c.function.arguments)
                                 for c in m.tool_calls or []]
    text, calls = "", {}
    for chunk in oa.chat.completions.create(**kwargs, stream=True):
        for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name, args = calls.get(c.index, ("", ""))
            calls[c.index] = (name + (c.function.name or ""), args + (c.function.arguments or ""))
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    return text, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("model", ["smol", "qwen"])
def test_a_forced_tool_choice_holds_on_every_route(clients, qwen, model):
    """Asked about the weather, a choice naming get_time calls get_time; `any`/`required`
    call one of the tools; `none` calls nothing; whole and streamed, Anthropic and OpenAI.
    Every call's arguments match its tool's schema (the choice is a grammar, as structured
    output is)."""
    oa, _, an = clients
    name = SMOL if model == "smol" else qwen
    for stream in (False, True):
        for choice, want in (({"type": "tool", "name": "get_time"}, {"get_time"}),
                             ({"type": "any"}, set(SCHEMAS)), ({"type": "none"}, set())):
            r = anthropic_reply(an, name, choice, stream)
            uses = [b for b in r.content if b.type == "tool_use"]
            assert {u.name for u in uses} <= want and bool(uses) == bool(want), (choice, r)
            for u in uses:
                jsonschema.validate(u.input, SCHEMAS[u.name])
            if want:
                assert r.stop_reason in ("tool_use", "max_tokens"), r
            else:
                assert r.stop_reason != "tool_use" and not any(
                    w in b.text for b in r.content for w in ("<tool_call>", '"tool_call"')), r
        for choice, want in (({"type": "function", "function": {"name": "get_time"}},
                              {"get_time"}), ("required", set(SCHEMAS)), ("none", set())):
            text, calls = openai_reply(oa, name, choice, stream)
            assert {c for c, _ in calls} <= want and bool(calls) == bool(want), (choice, calls)
            for c, args in calls:
                jsonschema.validate(json.loads(args), SCHEMAS[c])
            if want:
                assert text == "", text


def test_a_forced_call_is_the_targets_own_greedy_call(clients):
    """The forced call goes through the constraint path, drafts verified as any other: with
    speculation on, the greedy call is the one the target alone makes."""
    oa = clients[0]
    for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
        got = [oa.chat.completions.create(
            model=SMOL, messages=ASK, tools=OPENAI_TOOLS, tool_choice=choice, max_tokens=60,
            temperature=0, extra_body={"speculative": spec}).choices[0].message.tool_calls
            for spec in (True, False)]
        assert [(c.function.name, c.function.arguments) for c in got[0]] == \
            [(c.function.name, c.function.arguments) for c in got[1]]


def test_plain_text_never_tokenizes_to_a_special_token_for_the_grammar(qwen_draft_path):
    """llama.cpp matches Qwen's user-defined <tool_call> in any text; the grammar engine's
    tokenizer must not (the token's bytes are not the text), or a grammar that forces the
    text '<tool_call>' would be fed the special token and fail."""
    from edgespec.backend import GrammarVocab
    vocab = GrammarVocab(qwen_draft_path)
    text = b'Sure.\n<tool_call>\n{"name": "f"}\n</tool_call>'
    tokens = vocab.tokenize(text)
    assert not set(tokens) & set(vocab.special)
    assert b"".join(vocab.pieces[t] for t in tokens) == text
    raw = vocab._vocab.vocabulary.tokenize(text, add_special=False, parse_special=False)
    assert set(raw) & set(vocab.special)          # the negative control: llama.cpp's own does


@pytest.mark.parametrize("cut, text", [
    ('{"response": "It is 2', "It is 2"), ('{"response": "a\\"b', 'a"b'),
    ('{"response": "caf\\u00e', "caf"), ('{"response": "end\\', "end"),
    ('{"response": "done"', "done"), ('{ "response" : "x\\ny', "x\ny"),
    ('{"tool_call": {"name": "get_we', ""), ('{"', ""), ("", "")])
def test_a_cut_generic_answer_gives_the_text_inside_its_wrapper(cut, text):
    from edgespec.tools import _cut_response
    assert _cut_response(cut) == text


# ---------------------------------------------------------------------------------------------
# Contexts


def test_each_model_gets_its_trained_context_as_memory_allows_and_says_so(server, clients,
                                                                         qwen):
    """No --ctx-size: the started pair gets its own default (SmolLM2 was trained with 8192),
    said at start-up, in /api/ps and /api/show; a model loaded by name gets its own."""
    from edgespec.catalogue import scan_catalog
    from edgespec.server.contexts import auto_context
    from edgespec.server.slots import Budget
    _, ol, _ = clients
    assert "context: 8192 tokens for each of 4 generation(s) at once, up to 8 while their " \
        "prompts and max_tokens fit (the context it was trained with" in server.log()
    said = re.search(r"memory: about ([\d.]+) GB \(files ([\d.]+) GB, KV cache ([\d.]+) GB "
                     r"a context x 4\)", server.log())
    assert said, server.log()[-2000:]         # the memory of each context, said at start
    total, files, each = map(float, said.groups())
    assert abs(total - (files + 4 * each)) <= 0.02 and each > 0
    [smol] = [m for m in ol.ps().models if m.model.startswith(SMOL)]
    assert smol.context_length == 8192
    assert ol.show(SMOL).modelinfo["llama.context_length"] == 8192
    ol.generate(model=qwen, prompt="1", options={"num_predict": 1})
    [loaded] = [m for m in ol.ps().models if m.model.startswith(qwen)]
    want, _ = auto_context(scan_catalog()[qwen], Budget(2, None, 4))
    assert loaded.context_length == want and want >= 4096


def test_aiders_num_ctx_over_the_trained_context_is_clamped_not_refused(server, clients):
    """aider sends options.num_ctx = 1.25 × its prompt + 8192 on every request (and retried a
    400 seven times before giving up): served with the trained context, said in the log and
    in the response's X-Edgespec-Num-Ctx header."""
    import httpx
    messages = [{"role": "system", "content": "Act as an expert software developer."},
                {"role": "user", "content": "Say hi."}]
    num_ctx = int(1.25 * 40) + 8192                   # aider's rule, for a ~40-token prompt
    r = clients[1].chat(model=SMOL, messages=messages,
                        options={"temperature": 0, "num_ctx": num_ctx, "num_predict": 4})
    assert r.done and r.message.content
    with httpx.stream("POST", f"http://127.0.0.1:{server.port}/api/chat", timeout=120,
                      json={"model": SMOL, "messages": messages, "stream": True,
                            "options": {"temperature": 0, "num_ctx": num_ctx,
                                        "num_predict": 4}}) as s:
        assert s.status_code == 200 and s.headers["x-edgespec-num-ctx"] == "8192"
        assert json.loads(list(s.iter_lines())[-1])["done"]
    assert f"num_ctx {num_ctx} asked for {SMOL} is more than its 8192 tokens (the context " \
        "it was trained with): served with 8192" in server.log()
    assert "reloading" not in server.log()


# ---------------------------------------------------------------------------------------------
# Fill-in-the-middle


def test_a_suffix_fills_in_the_middle_on_a_model_with_fim_tokens(clients, qwen):
    oa, ol, _ = clients
    assert "insert" in ol.show(qwen).capabilities
    assert "insert" not in ol.show(SMOL).capabilities
    before, after = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    r = ol.generate(model=qwen, prompt=before, suffix=after,
                    options={"temperature": 0, "num_predict": 12})
    assert "return a + b" in r.response, r.response
    c = oa.completions.create(model=qwen, prompt=before, suffix=after, max_tokens=12,
                              temperature=0)
    assert c.choices[0].text == r.response
    with pytest.raises(ollama.ResponseError) as e:
        ol.generate(model=SMOL, prompt=before, suffix=after)
    assert e.value.status_code == 400 and "does not fill in the middle" in str(e.value)


def test_keep_alive_0_unloads_the_model_after_its_answer(clients, qwen):
    """Ollama's keep_alive: 0 on a generation unloads the model once it has answered (the
    started pair stays: it was not asked to go)."""
    _, ol, _ = clients
    r = ol.generate(model=qwen, prompt="def f():", options={"num_predict": 2}, keep_alive=0)
    assert r.done
    def names():
        return [m.model for m in ol.ps().models]
    wait_until(lambda: not any(n.startswith(qwen) for n in names()), 10)
    assert any(n.startswith(SMOL) for n in names())
