"""`edgespec serve` with a thinking model, a base model and the contexts requests ask for, as
the official `ollama` and `openai` clients see it: one real server over a models folder of its
own, holding SmolLM2 with a chat template given a thinking mode (written here with gguf's own
metadata tool; the weights are SmolLM2's) and Gemma-3-270M, a base model without a template.

The thinking template opens the reasoning block in its generation prompt (as DeepSeek-R1's
and Qwen3's thinking templates do) unless ``enable_thinking`` is false, when it writes an empty
block: thinking on and off render different prompts. A few examples in the conversation make
the 135M model close its reasoning and answer, so the reply's reasoning and answer are what
it wrote inside and after the tags."""

from __future__ import annotations

import json
import subprocess
import sys

import ollama
import openai
import pytest

from server_helpers import ServerProcess, post, request

THINKER = "smollm2-think"
BASE = "gemma-3-270m.Q4_K_M"
N_CTX = 512
TEMPLATE = """{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""
SHOTS = [m for q, r, a in [("Say hi.", "The user wants a greeting.", "Hi!"),
                           ("Say yes.", "The user wants a yes.", "Yes!"),
                           ("Say no.", "The user wants a no.", "No!")]
         for m in ({"role": "user", "content": q},
                   {"role": "assistant", "content": f"<think>\n{r}\n</think>\n\n{a}"})]
ASK = SHOTS + [{"role": "user", "content": "Say ok."}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 12}},
          "required": ["answer"], "additionalProperties": False}
GREEDY = {"temperature": 0, "num_predict": 40}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smollm2_q4_path, gemma_q4_path):
    folder = tmp_path_factory.mktemp("models")
    proc = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                           str(smollm2_q4_path), str(folder / f"{THINKER}.gguf"),
                           "--chat-template", TEMPLATE, "--force"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (folder / f"{BASE}.gguf").symlink_to(gemma_q4_path)
    return folder


@pytest.fixture(scope="module")
def server(folder):
    s = ServerProcess("--target", folder / f"{THINKER}.gguf", "--ctx-size", N_CTX,
                      "--max-loaded", 2, env={"EDGESPEC_MODELS": str(folder)})
    yield s
    rc = s.stop()
    assert rc in (0, 130), s.log()
    assert "Traceback" not in s.log(), s.log()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=f"http://127.0.0.1:{server.port}")


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)


def clean(*texts) -> bool:
    return not any("<think>" in t or "</think>" in t for t in texts)


# ---------------------------------------------------------------------------------------------
# Thinking


def test_ollamas_think_turns_the_templates_thinking_on_and_off(client):
    on = client.chat(model=THINKER, messages=ASK, think=True, options=GREEDY)
    default = client.chat(model=THINKER, messages=ASK, options=GREEDY)
    off = client.chat(model=THINKER, messages=ASK, think=False, options=GREEDY)
    # off renders the empty block after the cue; unset is the template's default: on
    assert off.prompt_eval_count > on.prompt_eval_count == default.prompt_eval_count
    assert on.message.thinking == "The user wants a ok." and on.message.content == "Ok!"
    assert (default.message.thinking, default.message.content) == (on.message.thinking,
                                                                   on.message.content)
    assert not off.message.thinking and off.message.content
    assert clean(on.message.content, off.message.content, on.message.thinking)
    shown = client.show(THINKER)
    assert "thinking" in shown.capabilities and "thinking" not in client.show(BASE).capabilities


def test_a_stream_sends_the_reasoning_as_thinking_deltas(client):
    whole = client.chat(model=THINKER, messages=ASK, think=True, options=GREEDY)
    thinking = content = ""
    for chunk in client.chat(model=THINKER, messages=ASK, think=True, options=GREEDY,
                             stream=True):
        thinking += chunk.message.thinking or ""
        content += chunk.message.content or ""
    assert (thinking, content) == (whole.message.thinking, whole.message.content)
    # /api/generate: the reasoning beside the response (here its block never closes: all of
    # the output is reasoning)
    gen = client.generate(model=THINKER, prompt="Say ok.", think=True,
                          options={"temperature": 0, "num_predict": 8})
    assert gen.thinking and gen.response == "" and clean(gen.thinking)


def test_format_shapes_the_answer_with_thinking_on_or_off(client):
    on = client.chat(model=THINKER, messages=ASK, think=True, format=SCHEMA, options=GREEDY)
    assert on.message.thinking == "The user wants a ok."
    assert set(json.loads(on.message.content)) == {"answer"}
    off = client.chat(model=THINKER, messages=ASK, think=False, format=SCHEMA, options=GREEDY)
    assert not off.message.thinking and set(json.loads(off.message.content)) == {"answer"}


def test_openais_reasoning_content_and_reasoning_effort(oai):
    r = oai.chat.completions.create(model=THINKER, messages=ASK, temperature=0, max_tokens=40)
    message = r.choices[0].message
    assert message.reasoning_content == "The user wants a ok." and message.content == "Ok!"
    assert r.model_extra["edgespec"]["chat_template"] == "model"
    off = oai.chat.completions.create(model=THINKER, messages=ASK, temperature=0,
                                      max_tokens=40, reasoning_effort="none")
    assert off.usage.prompt_tokens > r.usage.prompt_tokens
    assert getattr(off.choices[0].message, "reasoning_content", None) is None
    reasoning = content = ""
    for chunk in oai.chat.completions.create(model=THINKER, messages=ASK, temperature=0,
                                             max_tokens=40, reasoning_effort="low",
                                             stream=True):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    assert (reasoning, content) == (message.reasoning_content, message.content)
    shaped = oai.chat.completions.create(
        model=THINKER, messages=ASK, temperature=0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
    assert shaped.choices[0].message.reasoning_content == "The user wants a ok."
    assert set(json.loads(shaped.choices[0].message.content)) == {"answer"}


def test_thinking_asked_of_a_model_without_a_thinking_mode_is_refused(client, oai):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=BASE, messages=ASK[-1:], think=True, options=GREEDY)
    assert e.value.status_code == 400 and "does not support thinking" in e.value.error
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=BASE, messages=ASK[-1:], max_tokens=4,
                                    reasoning_effort="low")
    assert "does not support thinking" in e.value.message
    off = client.chat(model=BASE, messages=ASK[-1:], think=False,
                      options={"temperature": 0, "num_predict": 2})
    assert off.done and not off.message.thinking


# ---------------------------------------------------------------------------------------------
# A model without a chat template


def test_a_base_model_on_the_chat_routes_continues_the_plain_text(client, oai, server):
    prompt = "The capital of France is"
    chat = oai.chat.completions.create(model=BASE, temperature=0, max_tokens=8,
                                       messages=[{"role": "user", "content": prompt}])
    text = oai.completions.create(model=BASE, prompt=prompt, temperature=0, max_tokens=8)
    assert chat.choices[0].message.content == text.choices[0].text          # the same text
    assert chat.usage.prompt_tokens == text.usage.prompt_tokens < 10         # no markup added
    assert "<|im_" not in chat.choices[0].message.content
    assert chat.model_extra["edgespec"]["chat_template"] == "none (plain text)"
    assert "chat_template" not in text.model_extra["edgespec"]               # a raw prompt
    ochat = client.chat(model=BASE, messages=[{"role": "user", "content": prompt}],
                        options={"temperature": 0, "num_predict": 8})
    assert ochat.message.content == chat.choices[0].message.content
    status, body = post(server.port, "/api/chat", {
        "model": BASE, "messages": [{"role": "user", "content": prompt}], "stream": False,
        "options": {"temperature": 0, "num_predict": 2}})     # the client drops extra fields
    assert status == 200 and body["edgespec"]["chat_template"] == "none (plain text)"
    cards = {c.id: c.model_extra for c in oai.models.list().data}
    assert cards[BASE]["edgespec"]["chat_template"] == "none (plain text)"
    assert cards[THINKER]["edgespec"]["chat_template"] == "model"
    assert cards[THINKER]["edgespec"]["thinking"] and not cards[BASE]["edgespec"]["thinking"]


# ---------------------------------------------------------------------------------------------
# The context asked for


def contexts(oai) -> dict:
    return {c.id: c.model_extra["context_length"] for c in oai.models.list().data}


def test_the_context_asked_for_loads_the_model_with_it_and_never_shrinks(client, oai, server):
    before = contexts(oai)[THINKER]
    assert before >= N_CTX
    loaded = client.generate(model=THINKER, options={"num_ctx": 1024})   # a load request
    assert loaded.done_reason == "load"
    [loaded] = [m for m in client.ps().models if m.model.startswith(THINKER)]
    assert loaded.context_length == 1024 and contexts(oai)[THINKER] == 1024
    info = client.show(THINKER).modelinfo
    assert info["llama.context_length"] == 1024
    reloads = server.log().count("reloading")
    for asked in (600, None):          # less than loaded: the loaded model serves it as it is
        client.chat(model=THINKER, messages=ASK[-1:], think=False,
                    options={"temperature": 0, "num_predict": 2,
                             **({"num_ctx": asked} if asked else {})})
    assert server.log().count("reloading") == reloads == 1
    # OpenAI's route: num_ctx beside the body's fields (extra_body in the client)
    oai.chat.completions.create(model=THINKER, messages=ASK[-1:], max_tokens=2,
                                reasoning_effort="none", extra_body={"num_ctx": 1536})
    assert contexts(oai)[THINKER] == 1536
    # More than it was trained with: clamped, as Ollama does (aider asks 1.25 × prompt + 8192
    # on every request), said in the log and in the response's header
    for path, body in (("/v1/chat/completions", {"num_ctx": 9000, "max_tokens": 2}),
                       ("/api/chat", {"options": {"num_ctx": 9000, "num_predict": 2},
                                      "stream": False})):
        status, headers, raw = request(server.port, "POST", path, json.dumps(
            {"model": THINKER, "messages": ASK[-1:], **body}).encode(),
            {"Content-Type": "application/json"})
        assert status == 200 and headers["x-edgespec-num-ctx"] == "8192", raw
    assert contexts(oai)[THINKER] == 8192
    assert f"num_ctx 9000 asked for {THINKER} is more than its 8192 tokens (the context it " \
        "was trained with): served with 8192" in server.log()
