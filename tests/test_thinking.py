"""edgespec/thinking.py: a template's thinking mode, ``think`` as template variables, the
reasoning separated from the answer (whole, and streamed in any pieces), and a constraint
that starts where the reasoning ends (on real vocabularies: SmolLM2's, where the tags are
text, and Gemma's, where two special tokens stand in for tags that are tokens)."""

from __future__ import annotations

import random

import pytest

from edgespec.chat_template import ChatTemplate
from edgespec.errors import InvalidParameterError
from edgespec.results import Generation, StreamEvent
from edgespec.thinking import (Shown, Splitter, Thinking, ThinkingMode, separates,
                               template_variables, thinking_mode)

QWEN3_LIKE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
              "{% if enable_thinking is defined and enable_thinking is false %}"
              "<think>\n\n</think>\n\n{% endif %}{% endif %}")
THINK = ThinkingMode("<think>", "</think>")


def test_a_thinking_mode_needs_a_switch_and_the_tags():
    assert thinking_mode(QWEN3_LIKE) == THINK
    assert thinking_mode("{{ reasoning_effort }} <think></think>") == THINK
    assert thinking_mode("{% if thinking %}<think>{% endif %}</think>") == THINK
    assert thinking_mode("{{ messages }} <think></think>") is None         # no switch
    assert thinking_mode("{% if enable_thinking %}{% endif %}") is None     # no tags
    assert thinking_mode("{{ rethinking }} <think></think>") is None        # a word, not it
    assert thinking_mode(None) is None and thinking_mode("") is None
    assert ChatTemplate(QWEN3_LIKE).thinking == THINK
    assert ChatTemplate(None).thinking is None


def test_think_becomes_the_templates_variables():
    assert template_variables(None) == {}
    assert template_variables(False) == {"enable_thinking": False, "thinking": False}
    assert template_variables(True) == {"enable_thinking": True, "thinking": True}
    assert template_variables("low") == {"enable_thinking": True, "thinking": True,
                                         "reasoning_effort": "low"}
    t = ChatTemplate(QWEN3_LIKE)
    hi = [{"role": "user", "content": "Hi"}]
    on, off, default = (t.render(hi, variables=template_variables(v)) for v in (True, False,
                                                                               None))
    assert on == default and off == on + "<think>\n\n</think>\n\n"


def test_which_generations_separate_reasoning():
    assert separates(THINK, None, raw=False) == THINK      # the template's default: it may think
    assert separates(THINK, True, raw=False) == THINK
    assert separates(THINK, "high", raw=False) == THINK
    assert separates(THINK, False, raw=False) is None
    assert separates(THINK, None, raw=True) is None        # no template renders a raw prompt
    assert separates(None, None, raw=False) is None and separates(None, False, raw=False) is None
    with pytest.raises(InvalidParameterError, match="does not support thinking"):
        separates(None, True, raw=False)                    # as Ollama refuses it
    with pytest.raises(InvalidParameterError, match="raw prompt"):
        separates(THINK, True, raw=True)
    with pytest.raises(InvalidParameterError, match="think='max' is invalid"):
        separates(THINK, "max", raw=False)


CASES = [  # (opened, output, reasoning, answer)
    (False, "<think>\nLet me see.\n</think>\n\nParis.", "Let me see.", "Paris."),
    (False, "  <think>a</think>b", "a", "b"),
    (False, "Paris. <think>x</think>", "", "Paris. <think>x</think>"),    # only a leading block
    (False, "<thin", "", "<thin"),                                         # never became a tag
    (False, "", "", ""),
    (False, "<think>cut short by max_tokens  ", "cut short by max_tokens", ""),
    (False, "<think></think>answer", "", "answer"),
    (False, "<think>a</think> b</think>c", "a", "b</think>c"),
    (True, "\nreasoning\n</think>\n\nanswer", "reasoning", "answer"),
    (True, "all reasoning, no end", "all reasoning, no end", ""),
    (True, "a </thi b</think>c", "a </thi b", "c"),
]


@pytest.mark.parametrize("opened,output,reasoning,answer", CASES)
def test_the_reasoning_is_separated_from_the_answer_in_any_pieces(opened, output, reasoning,
                                                                  answer):
    thinking = Thinking(THINK, opened)
    assert thinking.split(output) == (reasoning, answer)
    rng = random.Random(len(output))
    for _ in range(50):                  # streamed in random pieces: the same two texts
        cuts = sorted(rng.sample(range(len(output) + 1), min(len(output), rng.randint(0, 6))))
        pieces = [output[a:b] for a, b in zip([0, *cuts], [*cuts, len(output)])]
        s = Splitter(THINK, opened)
        released = [s.feed(p) for p in pieces] + [s.flush()]
        assert "".join(t for t, _ in released) == reasoning
        assert "".join(a for _, a in released) == answer


def test_a_streams_events_and_its_result_carry_the_same_split():
    thinking = Thinking.after(THINK, "<|im_start|>assistant\n<think>\n")
    assert thinking.opened and not Thinking.after(THINK, "<|im_start|>assistant\n").opened
    pieces = ["Hmm", ", I see", ".\n</", "think>", "\n\nYes", "."]
    closed = []

    def events():
        try:
            for i, p in enumerate(pieces):
                yield StreamEvent(p, i, i % 2 == 0)
        finally:
            closed.append(True)
    out = list(thinking.events(events()))
    assert "".join(e.thinking for e in out) == "Hmm, I see."
    assert "".join(e.text for e in out) == "Yes."
    assert [e.token for e in out] == list(range(len(pieces)))    # one event per token, kept
    assert closed == [True]
    seen = []
    gen = thinking.finish(lambda g: seen.append(g.text) or g)(
        Generation("".join(pieces), [], "stop"))
    assert (gen.thinking, gen.text, seen) == ("Hmm, I see.", "Yes.", ["Yes."])
    assert gen.to_dict()["thinking"] == "Hmm, I see."
    assert "thinking" not in Generation("x", [], "stop").to_dict()


def test_an_unfinished_tag_is_held_back_then_released_at_the_end():
    out = list(Thinking(THINK, False).events(e for e in [StreamEvent(" <thi", 1, False)]))
    assert [(e.thinking, e.text) for e in out] == [("", ""), ("", " <thi")]
    assert out[-1].token == -1


# ---------------------------------------------------------------------------------------------
# The constraint after the reasoning, on real vocabularies


def grammar_state(path, constraint):
    from edgespec.backend import GrammarVocab
    from edgespec.constraints import GrammarState, tokenizer_for
    vocab = GrammarVocab(path)
    return GrammarState(constraint, tokenizer_for(path, lambda: vocab), len(vocab.pieces)), vocab


def consumed(path, constraint, text: str, special: bool = False) -> tuple[int, int, bool]:
    """(tokens the grammar took, tokens of ``text``, whether it may end there)."""
    state, vocab = grammar_state(path, constraint)
    tokens = vocab._vocab.vocabulary.tokenize(text.encode(), add_special=False,
                                              parse_special=special)
    n = state.consume(tokens)
    return n, len(tokens), any(state.mask()[t] for t in vocab.eog)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


def test_a_constraint_applies_once_the_reasoning_has_ended(smollm2_q4_path):
    from edgespec.constraints import Constraint
    c = Constraint.json_schema(SCHEMA)
    after = c.after_reasoning("<think>", "</think>", opened=False)
    assert (after.kind, after.schema) == ("json_schema", SCHEMA)
    done = '<think>\nanything { goes } here\n</think>\n\n{"a": 1}'
    n, total, end = consumed(smollm2_q4_path, after, done)
    assert n == total and end
    n, total, _ = consumed(smollm2_q4_path, after, '{"a": 1}')     # no reasoning: at once
    assert n == total
    n, total, end = consumed(smollm2_q4_path, after, "<think>unfinished")
    assert n == total and not end                                   # no end inside reasoning
    n, total, _ = consumed(smollm2_q4_path, after, '<think>a</think> b</think>{"a": 1}')
    assert n < total                          # the first closing tag ends it: then the schema
    n, total, _ = consumed(smollm2_q4_path, after, "no reasoning and no JSON")
    assert n == 0
    opened = c.after_reasoning("<think>", "</think>", opened=True)
    n, total, end = consumed(smollm2_q4_path, opened, 'free text</think>{"a": 2}')
    assert n == total and end
    assert consumed(smollm2_q4_path, opened, '{"a": 2}')[2] is False   # still reasoning


def test_tags_that_are_special_tokens_are_named_by_id(gemma_q4_path):
    """Gemma's <start_of_turn>/<end_of_turn> stand in for a thinking model's tag tokens."""
    from edgespec.constraints import Constraint
    from edgespec.constraints import special_tag_id, tokenizer_for
    state, vocab = grammar_state(gemma_q4_path, Constraint.json())
    tokenizer = tokenizer_for(gemma_q4_path, lambda: vocab)

    def special_id(tag):
        return special_tag_id(tokenizer, vocab._vocab.vocabulary.tokenize(
            tag.encode(), add_special=False, parse_special=True))
    ids = Thinking(ThinkingMode("<start_of_turn>", "<end_of_turn>"), False).tag_tokens(
        special_id)
    assert ids == (105, 106)
    assert Thinking(THINK, False).tag_tokens(special_id) is None
    after = Constraint.json().after_reasoning("<start_of_turn>", "<end_of_turn>", False, ids)
    text = '<start_of_turn>reasoning <end_of_turn>\n{"a": 1}'
    n, total, _ = consumed(gemma_q4_path, after, text, special=True)
    assert n == total
    # the tags' text is not the token: written as text it is reasoning, not the end of it
    n, total, _ = consumed(gemma_q4_path, after, text, special=False)
    assert n == 0


def test_a_terminal_shows_the_reasoning_marked_then_the_answer():
    shown = Shown()
    events = [StreamEvent("", 1, False, thinking="Hmm"), StreamEvent("", 2, False,
                                                                      thinking=", yes."),
              StreamEvent("Yes", 3, True), StreamEvent("!", 4, False)]
    assert "".join(shown(e) for e in events) == \
        "Thinking...\nHmm, yes.\n...done thinking.\n\nYes!"
    plain = Shown()
    assert "".join(plain(e) for e in [StreamEvent("Hi", 1, False), StreamEvent("", 2, False)]) \
        == "Hi"
