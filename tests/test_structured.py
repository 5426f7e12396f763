"""Structured output and tool calls on the real pairs: constrained speculative output equals
constrained plain output token for token, outputs always parse and match their schema, tool
calls come back validated in both tool formats (generic JSON and a template's own
``<tool_call>`` tags), and log-probabilities come from the target's rows."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgespec import Engine, SamplingParams
from edgespec.constraints import Constraint, validate_json
from edgespec.errors import ConstraintError, InvalidParameterError
from edgespec.tools import plan_request

from test_real_models import check_greedy_equivalent

GREEDY = SamplingParams(temperature=0.0)

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 130},
                         "city": {"type": "string", "maxLength": 24}},
          "required": ["name", "age", "city"], "additionalProperties": False}
TEXTS = ["Maria Lopez, 34, works as a nurse in Valencia.",
         "Daniel Okafor is 27 and lives in Toronto.",
         "Hannah Berg (61) is a retired pilot from Tromso.",
         "Kenji Sato, aged 45, teaches mathematics in Osaka."]
CASES = {
    "schema": (Constraint.json_schema(PERSON),
               "Give name, age and city as JSON. Text: {t}\nJSON:"),
    "regex": (Constraint.regex(r"[A-Z][a-z]+ [A-Z][a-z]+, \d{1,3}"),
              "Write the person's full name and age. Text: {t}\nAnswer:"),
    "grammar": (Constraint.grammar('root ::= "The person is " [a-zA-Z ]{1,30} "."'),
                "Describe the person in a few words. Text: {t}\nAnswer:"),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def smol(smollm2_f32_path, smollm2_q4_path):
    # Pinned draft length: drafting happens whatever the machine's load.
    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path, n_ctx=1024,
                     draft_max=6) as eng:
        yield eng


def plain_and_speculative(eng, target_path, prompt, constraint, max_tokens):
    """The constrained greedy answer without and with speculation, checked to be the same
    tokens (check_greedy_equivalent); returns both generations."""
    plain = eng.generate(prompt, raw=True, max_tokens=max_tokens, sampling=GREEDY,
                         constraint=constraint, speculative=False)
    spec = eng.generate(prompt, raw=True, max_tokens=max_tokens, sampling=GREEDY,
                        constraint=constraint)
    check_greedy_equivalent(target_path, eng.prompt_tokens(prompt, raw=True), plain.tokens,
                            spec.tokens)
    return plain, spec


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_constrained_speculative_equals_constrained_plain(smol, smollm2_f32_path, case):
    constraint, template = CASES[case]
    drafted = 0
    for t in TEXTS:
        prompt = template.format(t=t)
        plain, spec = plain_and_speculative(smol, smollm2_f32_path, prompt, constraint, 48)
        assert spec.finish_reason == plain.finish_reason
        drafted += spec.stats.drafted
        if spec.finish_reason == "stop" and constraint.kind == "json_schema":
            validate_json(json.loads(spec.text), PERSON)
    assert drafted > 0


def test_gemma_pair_constrained_with_the_reduced_head(gemma_f32_path, gemma_q4_path):
    with Engine.load(target=gemma_f32_path, draft=gemma_q4_path, n_ctx=1024, drafter="model",
                     draft_max=6) as eng:
        assert eng.draft_head is not None
        for case in ("schema", "regex"):
            constraint, template = CASES[case]
            prompt = template.format(t=TEXTS[0])
            plain, spec = plain_and_speculative(eng, gemma_f32_path, prompt, constraint, 40)
            assert spec.stats.drafted > 0 and spec.stats.grammar_seconds > 0


def test_fifty_sampled_objects_all_parse_and_match_the_schema(smol):
    constraint = Constraint.json_schema(PERSON)
    finished = 0
    for seed in range(50):
        t = TEXTS[seed % len(TEXTS)]
        out = smol.generate(f"Give name, age and city as JSON. Text: {t}\nJSON:", raw=True,
                            max_tokens=96, constraint=constraint,
                            sampling=SamplingParams(temperature=0.8, seed=seed))
        assert out.finish_reason == "stop", (seed, out.text)
        validate_json(json.loads(out.text), PERSON)
        finished += 1
    assert finished == 50


def test_a_grammar_that_cannot_finish_ends_with_length_and_the_engine_recovers(smol):
    constraint = Constraint.regex(r"[a-z]{200}")
    out = smol.generate("Type many letters:", raw=True, max_tokens=8, sampling=GREEDY,
                        constraint=constraint)
    assert out.finish_reason == "length" and len(out.tokens) == 8 and out.text.isalpha()
    again = smol.generate("The capital of France is", raw=True, max_tokens=6, sampling=GREEDY)
    plain = smol.generate("The capital of France is", raw=True, max_tokens=6, sampling=GREEDY,
                          speculative=False)
    assert again.tokens == plain.tokens


def test_forced_tokens_are_free_drafts(smol):
    """Inside a JSON object the grammar forces keys and punctuation: they are verified as
    drafts without a draft step, so the output needs fewer target passes than tokens even
    for a plain-decoding drafter choice."""
    out = smol.generate(f"Give name, age and city as JSON. Text: {TEXTS[0]}\nJSON:", raw=True,
                        max_tokens=64, sampling=GREEDY,
                        constraint=Constraint.json_schema(PERSON))
    assert out.finish_reason == "stop"
    assert out.stats.target_passes < out.stats.completion_tokens / 2


def test_bad_arguments_are_refused_at_the_call(smol):
    with pytest.raises(InvalidParameterError, match="constraint"):
        smol.generate("hi", constraint='{"type": "object"}')
    with pytest.raises(InvalidParameterError, match="constraint"):
        smol.generate(ASK, tools=[WEATHER], constraint=Constraint.json())
    with pytest.raises(ConstraintError, match="tools\\[0\\].function.name"):
        smol.generate(ASK, tools=[{"type": "function", "function": {"name": "bad name"}}])
    with pytest.raises(ConstraintError, match="tools\\[0\\].function.parameters"):
        smol.generate(ASK, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}])
    with pytest.raises(InvalidParameterError, match="tool_choice"):
        smol.generate(ASK, tools=[WEATHER], tool_choice="get_time")
    with pytest.raises(InvalidParameterError, match="logprobs"):
        smol.generate("hi", logprobs=99)


# --- tool calls, generic format -----------------------------------------------------------------

@pytest.mark.parametrize("choice", ["required", "auto", "get_weather"])
def test_a_tool_call_comes_back_validated(smol, choice):
    out = smol.generate(ASK, tools=[WEATHER, TIME], tool_choice=choice, sampling=GREEDY,
                        max_tokens=80)
    assert out.finish_reason == "tool_calls" and len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call.name in ("get_weather", "get_time") and call.id.startswith("call_")
    validate_json(call.parsed_arguments, WEATHER["function"]["parameters"])
    if choice == "get_weather":
        assert call.name == "get_weather"


def test_tool_choice_none_answers_in_text(smol):
    out = smol.generate(ASK, tools=[WEATHER], tool_choice="none", sampling=GREEDY,
                        max_tokens=24)
    assert out.tool_calls == [] and out.finish_reason in ("stop", "length") and out.text


def test_the_conversation_takes_tool_results_back(smol):
    first = smol.generate(ASK, tools=[WEATHER], tool_choice="required", sampling=GREEDY,
                          max_tokens=80)
    call = first.tool_calls[0]
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.to_openai()]},
                     {"role": "tool", "tool_call_id": call.id,
                      "content": json.dumps({"temperature_c": 18, "sky": "cloudy"})}]
    reply = smol.generate(history, tools=[WEATHER], tool_choice="none", sampling=GREEDY,
                          max_tokens=40)
    assert reply.tool_calls == [] and reply.text.strip()
    # the history reached the prompt: the result's numbers are in it
    plan = plan_request(history, [WEATHER], "none", native_template=False)
    assert "returned: " in smol.template.render(plan.messages, validate=False)


# --- tool calls, a template's own format --------------------------------------------------------

HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}You may call functions. Their signatures are within <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Write each call as <tool_call>
{"name": NAME, "arguments": ARGUMENTS}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def hermes(tmp_path_factory, smollm2_q4_path):
    """SmolLM2 Q4_1 with a chat template that declares tools (written with gguf's own
    metadata tool)."""
    out = tmp_path_factory.mktemp("hermes") / "smollm2-hermes.gguf"
    proc = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                           str(smollm2_q4_path), str(out), "--chat-template", HERMES,
                           "--force"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with Engine.load(target=out, n_ctx=1024) as eng:
        yield eng


def test_a_template_that_declares_tools_renders_them_and_its_call_format(hermes):
    assert hermes.template.writes_tool_call_tags
    prompt = hermes.template.render(ASK, tools=[WEATHER])
    assert "<tools>" in prompt and '"get_weather"' in prompt
    out = hermes.generate(ASK, tools=[WEATHER], tool_choice="required", sampling=GREEDY,
                          max_tokens=60)
    assert out.finish_reason == "tool_calls" and out.tool_calls[0].name == "get_weather"
    validate_json(out.tool_calls[0].parsed_arguments, WEATHER["function"]["parameters"])
    history = ASK + [{"role": "assistant", "content": None,
                      "tool_calls": [out.tool_calls[0].to_openai()]},
                     {"role": "tool", "tool_call_id": out.tool_calls[0].id, "content": "18 C"}]
    rendered = hermes.template.render(history, tools=[WEATHER])
    assert "<tool_response>\n18 C\n</tool_response>" in rendered
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city":' in rendered


# --- log-probabilities --------------------------------------------------------------------------

def test_logprobs_come_from_the_targets_rows(smol, smollm2_f32_path):
    from edgespec.backend import LlamaModel
    from edgespec.config import ModelConfig
    prompt = "The capital of France is"
    out = smol.generate(prompt, raw=True, max_tokens=8, sampling=GREEDY, logprobs=3)
    assert len(out.logprobs) == len(out.tokens)
    m = LlamaModel(ModelConfig(smollm2_f32_path, n_ctx=256))
    try:
        context = smol.prompt_tokens(prompt, raw=True)
        for lp, token in zip(out.logprobs, out.tokens):
            row = m.eval(context if len(m.tokens) == 0 else [context[-1]], 1)[0].astype(
                np.float64)
            ref = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
            assert lp.token == token and abs(lp.logprob - ref[token]) < 0.05
            assert [t for t, _ in lp.top][0] == token           # greedy: the best one
            assert len(lp.top) == 3 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
            context = context + [token]
    finally:
        m.close()
