"""Chat templates: the model's own, a fallback, and hostile templates that must run nothing."""

import time

import pytest

from edgespec.chat_template import ChatTemplate, validate_messages
from edgespec.errors import TemplateRefused
from edgespec.errors import InvalidParameterError
from edgespec.gguf_file import read_gguf

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


def test_smollm2_template_renders_chatml(smollm2_q4_path):
    info = read_gguf(smollm2_q4_path)
    t = ChatTemplate(info.chat_template, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert not t.is_fallback
    out = t.render(MSGS)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                   "<|im_start|>assistant\n")


def test_model_without_template_gets_plain_text_never_chatml():
    t = ChatTemplate(None)
    assert t.is_fallback and "no chat template" in t.fallback_reason
    assert t.label == "none (plain text)" and t.thinking is None
    assert t.render([{"role": "user", "content": "x"}]) == "x"       # as `edgespec run` sends it
    assert t.render(MSGS + [{"role": "assistant", "content": "Hello."},
                            {"role": "user", "content": "Bye"}]) == \
        "Be brief.\n\nHi!\n\nHello.\n\nBye"
    assert ChatTemplate("{% if %}").label == "fallback (ChatML)"     # declared one, broken


HOSTILE = {
    "os_through_globals": "{{ self.__init__.__globals__['os'].system('touch PWNED') }}",
    "cycler_globals": "{{ cycler.__init__.__globals__.os.popen('touch PWNED').read() }}",
    "attr_filter": "{{ ''|attr('__class__')|attr('__mro__') }}",
    "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "namespace_mutation": "{% set x = messages.append({'role': 'user'}) %}",
    "string_bomb": "{{ 'x' * 1000000000 }}",
    "loop_bomb": "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}"
                 "{% endfor %}",
    "silent_loop_bomb": "{% for a in range(100000) %}{% for b in range(100000) %}"
                        "{% set c = a %}{% endfor %}{% endfor %}",
    "doubling": "{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
                "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "huge_template": "{{ 'a' }}" * 100_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_runs_nothing_and_falls_back(name, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    t = ChatTemplate(HOSTILE[name])
    out = t.render([{"role": "user", "content": "hello"}])
    assert time.monotonic() - t0 < 5
    assert not (tmp_path / "PWNED").exists()
    assert t.is_fallback
    assert out == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_template_that_refuses_the_conversation_is_reported():
    t = ChatTemplate("{{ raise_exception('System role not supported') }}")
    with pytest.raises(TemplateRefused, match="System role not supported"):
        t.render(MSGS)


@pytest.mark.parametrize("bad,param", [
    ([], "messages"), ("hi", "messages"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 3}], "messages[0].content"), ([42], "messages[0]"),
])
def test_invalid_messages(bad, param):
    with pytest.raises(InvalidParameterError) as e:
        validate_messages(bad)
    assert e.value.name == param


def test_oversized_conversation_is_a_user_error_and_keeps_the_template(smollm2_q4_path):
    from edgespec.errors import PromptTooLargeError
    from edgespec.errors import EdgespecError
    t = ChatTemplate(read_gguf(smollm2_q4_path).chat_template)
    with pytest.raises(PromptTooLargeError) as e:
        t.render([{"role": "user", "content": "x" * 5_000_000}])
    assert isinstance(e.value, EdgespecError)
    assert not t.is_fallback
    assert t.render(MSGS).startswith("<|im_start|>system")
