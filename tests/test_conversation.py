"""Conversation state: turns, interrupted answers, making room, and the JSON file format."""

import json

import pytest

from edgespec import Engine
from edgespec.conversation import Conversation
from edgespec.errors import ConversationFileError
from edgespec.errors import ContextOverflowError


def chat_of(n_turns: int, system: str | None = "Be brief.") -> Conversation:
    c = Conversation(system)
    for i in range(n_turns):
        c.add_turn(f"question {i}", f"answer {i}")
    return c


def test_for_model_puts_system_first_and_the_pending_message_last():
    c = chat_of(1)
    c.add_turn("stop here", "Sure, I", interrupted=True)
    msgs = c.for_model("next")
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[-1] == {"role": "user", "content": "next"}
    assert msgs[-2] == {"role": "assistant", "content": "Sure, I"}   # the model sees the text
    assert all(set(m) == {"role", "content"} for m in msgs)          # and no UI markers
    assert c.messages[-1]["interrupted"] is True
    assert "interrupted" not in c.messages[1]


def test_reset_keeps_the_system_prompt():
    c = chat_of(3)
    c.reset()
    assert c.messages == [] and c.system == "Be brief."
    assert c.for_model() == [{"role": "system", "content": "Be brief."}]


def test_drop_oldest_turn_removes_whole_turns_even_irregular_ones():
    c = Conversation(None, [{"role": "assistant", "content": "greeting"},
                            {"role": "user", "content": "a"},
                            {"role": "assistant", "content": "b"},
                            {"role": "assistant", "content": "c"},
                            {"role": "user", "content": "d"}])
    c.drop_oldest_turn()
    assert [m["content"] for m in c.messages] == ["a", "b", "c", "d"]
    c.drop_oldest_turn()
    assert [m["content"] for m in c.messages] == ["d"]


@pytest.fixture(scope="module")
def engine(smollm2_f32_path):
    with Engine.load(target=smollm2_f32_path, n_ctx=256) as eng:
        yield eng


def count_with(engine):
    return lambda messages: len(engine.prompt_tokens(messages))


def test_make_room_drops_oldest_turns_and_keeps_the_system_prompt(engine):
    c = chat_of(12)
    count = count_with(engine)
    before = count(c.for_model("the new question"))
    assert before > 150
    dropped = c.make_room("the new question", count, budget=150, limit=engine.n_ctx)
    assert dropped > 0 and c.n_turns == 12 - dropped
    assert c.system == "Be brief."
    assert c.messages[0]["content"] == f"question {dropped}"     # the oldest went first
    assert count(c.for_model("the new question")) <= 150
    fewer = chat_of(12)                 # dropping one turn fewer would not have been enough
    for _ in range(dropped - 1):
        fewer.drop_oldest_turn()
    assert count(fewer.for_model("the new question")) > 150


def test_make_room_does_nothing_when_it_fits(engine):
    c = chat_of(2)
    assert c.make_room("hi", count_with(engine), budget=200, limit=engine.n_ctx) == 0
    assert c.n_turns == 2


def test_a_message_too_long_for_the_context_is_refused_and_nothing_is_dropped(engine):
    c = chat_of(3)
    huge = "word " * 400
    with pytest.raises(ContextOverflowError, match="context holds 256"):
        c.make_room(huge, count_with(engine), budget=200, limit=engine.n_ctx)
    assert c.n_turns == 3


def test_save_load_round_trip(tmp_path):
    c = chat_of(2, system="Sei breve. 🙂")
    c.add_turn("tell me a story", "Once upon", interrupted=True)
    path = tmp_path / "chat.json"
    c.save(path)
    data = json.loads(path.read_text("utf-8"))
    assert data["format"] == "edgespec-conversation" and data["system"] == "Sei breve. 🙂"
    assert data["messages"][-1] == {"role": "assistant", "content": "Once upon",
                                    "interrupted": True}
    back = Conversation.load(path)
    assert back.to_dict() == c.to_dict()


def test_load_accepts_a_plain_message_list(tmp_path):
    path = tmp_path / "openai.json"
    path.write_text(json.dumps([{"role": "system", "content": "S"},
                                {"role": "user", "content": "U"},
                                {"role": "assistant", "content": "A"}]))
    c = Conversation.load(path)
    assert c.system == "S" and [m["content"] for m in c.messages] == ["U", "A"]


@pytest.mark.parametrize("content, fragment", [
    (None, "cannot read"),
    ("not json {", "not a JSON conversation"),
    ('{"messages": "x"}', "'messages' list"),
    ('{"messages": [{"role": "wizard", "content": "x"}]}', "message 1 needs a role"),
    ('{"messages": [{"role": "user", "content": 3}]}', "message 1 needs a role"),
    ('{"system": 5, "messages": []}', "'system' must be a string"),
])
def test_load_errors_are_one_line(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConversationFileError) as e:
        Conversation.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_save_error_is_one_line(tmp_path):
    with pytest.raises(ConversationFileError, match="cannot write"):
        chat_of(1).save(tmp_path / "no" / "such" / "dir.json")
