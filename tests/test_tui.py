"""The chat loop driven in-process: prompt_toolkit reads keys from a pipe input and renders to a
DummyOutput, the real SmolLM2 pair answers, and the test reads what the chat wrote."""

import json
import ast
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from edgespec import Engine, SamplingParams
from edgespec.tui.app import build_prompt, run_terminal
from edgespec.tui.render import Printer
from edgespec.tui.session import ChatSession
from edgespec.tui.slash import Repl

pytestmark = pytest.mark.real

ENTER, ALT_ENTER, CTRL_C, CTRL_D, CTRL_R, TAB = "\r", "\x1b\r", "\x03", "\x04", "\x12", "\t"


@pytest.fixture(scope="module")
def engine(smollm2_f32_path, smollm2_q4_path):
    # Pinned draft length, so that draft tokens (and their colour) appear whatever the cost
    # model would decide on a busy machine.
    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path, n_ctx=1024,
                     draft_max=4) as eng:
        yield eng


class Chat:
    """A session with a printer that writes into strings."""

    def __init__(self, engine, *, colors=False, **kw):
        kw.setdefault("sampling", SamplingParams(temperature=0.0))
        kw.setdefault("max_tokens", 12)
        self.session = ChatSession(engine, label="smollm2-135m", **kw)
        self.out, self.err = io.StringIO(), io.StringIO()
        self.printer = Printer(self.out, self.err, can_color=colors)
        self.repl = Repl(self.session, self.printer)

    def lines(self, line):
        """Handle one line; return (out, err) written by it."""
        o, e = len(self.out.getvalue()), len(self.err.getvalue())
        assert self.repl.handle(line)
        return self.out.getvalue()[o:], self.err.getvalue()[e:]

    def keys(self, *steps, history=None, timeout=60.0):
        """Run the terminal loop on a pipe input. Each step is text to type, or a predicate
        on the PromptSession to wait for before typing on. Returns the loop's exit code."""
        failed = []
        with create_pipe_input() as inp:
            prompt = build_prompt(self.session, history=history, input=inp,
                                  output=DummyOutput())

            def feed():
                for step in steps:
                    if isinstance(step, str):
                        inp.send_text(step)
                        continue
                    deadline = time.monotonic() + timeout
                    while not step(prompt):
                        if time.monotonic() > deadline:
                            failed.append(step)
                            inp.send_text(CTRL_C + CTRL_D)   # end the loop; the test fails
                            return
                        time.sleep(0.02)

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            rc = run_terminal(self.repl, prompt)
            feeder.join(5)
        assert not failed, "the chat never reached the state the test waited for"
        return rc


@pytest.fixture
def chat(engine):
    draft_max = engine.spec.draft_max
    yield Chat(engine)
    engine.set_draft_max(draft_max)     # /set draft_max changes the engine's setting


def buffer_is(text):
    return lambda prompt: prompt.default_buffer.text == text


# ---------------------------------------------------------------------------------------------
# The terminal loop


def test_answers_stream_with_a_status_line_and_ctrl_d_exits_0(chat):
    assert chat.keys("What is the capital of France?" + ENTER, CTRL_D) == 0
    out = chat.out.getvalue()
    assert "Paris" in out
    status = [ln for ln in chat.err.getvalue().splitlines() if "tok/s" in ln]
    assert len(status) == 1
    for part in ("smollm2-135m", "CPU", "acceptance", "tokens/pass", "context "):
        assert part in status[0]
    assert chat.session.conversation.n_turns == 1
    assert chat.session.conversation.messages[1]["content"] in out


def test_exit_command_leaves_with_0_and_ignores_what_follows(chat):
    assert chat.keys("/exit" + ENTER, "never sent" + ENTER) == 0
    assert chat.session.conversation.n_turns == 0


def test_accepted_draft_tokens_are_coloured_and_colors_toggles(engine):
    chat = Chat(engine, colors=True)
    chat.keys("Hi" + ENTER, "/colors" + ENTER, "Hi again" + ENTER, CTRL_D)
    first, second = chat.out.getvalue().split("colours off")
    assert "\x1b[32m" in first                      # accepted draft tokens, in green
    assert "\x1b[" not in second                    # colours off: plain text only
    assert chat.session.last.generation.stats.accepted > 0


def test_alt_enter_inserts_a_newline_and_paste_keeps_newlines(chat):
    paste = "\x1b[200~first pasted line\nsecond pasted line\x1b[201~"
    chat.keys("line one" + ALT_ENTER + "line two" + ENTER, paste + ENTER, CTRL_D)
    users = [m["content"] for m in chat.session.conversation.messages if m["role"] == "user"]
    assert users == ["line one\nline two", "first pasted line\nsecond pasted line"]


def test_ctrl_c_at_the_prompt_clears_the_line(chat):
    assert chat.keys("half a thought", buffer_is("half a thought"), CTRL_C,
                     "/stats" + ENTER, CTRL_D) == 0
    assert chat.session.conversation.n_turns == 0
    assert "last answer: none yet" in chat.out.getvalue()


def test_tab_completes_commands_and_arguments(chat):
    chat.keys("/sta" + TAB, buffer_is("/stats"), ENTER,
              "/spec of" + TAB, buffer_is("/spec off"), ENTER,
              "/set temp" + TAB, buffer_is("/set temperature"), " 0.5" + ENTER, CTRL_D)
    assert "last answer:" in chat.out.getvalue()
    assert chat.session.speculative is False
    assert chat.session.sampling.temperature == 0.5


def test_history_persists_in_a_file_and_ctrl_r_searches_it(chat, engine, tmp_path):
    history = tmp_path / "chat_history"
    chat.keys("/set temperature 0.3" + ENTER, "/set top_k 5" + ENTER, CTRL_D,
              history=history)
    assert "/set temperature 0.3" in history.read_text()
    again = Chat(engine)           # a new chat, the same history file
    def loaded(prompt):            # the history is read in the background
        return len(prompt.history.get_strings()) == 2

    def searching(prompt):         # the search field
        return prompt.app.current_buffer.text == "temper"
    again.keys(loaded, CTRL_R + "temper", searching, ENTER,   # Enter takes the match ...
               buffer_is("/set temperature 0.3"), ENTER,      # ... and Enter sends it
               CTRL_D, history=history)
    assert again.session.sampling.temperature == 0.3


def test_ctrl_c_during_an_answer_stops_it_and_keeps_it_marked(engine):
    chat = Chat(engine, max_tokens=400)
    seen = {}

    def answer_started(prompt):
        text = chat.out.getvalue()
        if len(text) < 40:
            return False
        seen["text"] = text
        os.kill(os.getpid(), signal.SIGINT)          # what the terminal sends on Ctrl-C
        return True

    rc = chat.keys("Write a long story about a dragon." + ENTER, answer_started,
                   lambda prompt: "tok/s" in chat.err.getvalue(),
                   "/set max_tokens 12" + ENTER, "What was my request?" + ENTER, CTRL_D)
    assert rc == 0
    conv = chat.session.conversation
    assert conv.n_turns == 2
    partial = conv.messages[1]
    assert partial["interrupted"] is True and partial["content"]
    assert len(partial["content"]) - len(seen["text"]) < 32      # stopped within one step
    assert "[interrupted]" in chat.out.getvalue()
    assert "interrupted" not in conv.messages[3]                  # the next answer is whole
    assert chat.session.totals.interrupted == 1


# ---------------------------------------------------------------------------------------------
# Turns, context and KV reuse


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_each_turn_evaluates_only_its_new_tokens_on_both_models(chat, engine):
    chat.lines("Name a colour.")
    first = chat.session.last.generation.stats
    assert first.prompt_tokens_evaluated > 0
    assert 0 < first.first_token_seconds <= first.prompt_seconds + first.decode_seconds
    assert first.prompt_tokens_per_second > 0
    out, _ = chat.lines("/stats")       # the last answer's prompt speed and first token
    (last,) = [ln for ln in out.splitlines() if ln.startswith("last answer: ")]
    assert f"({first.prompt_tokens_evaluated} evaluated at " in last
    assert f"first token after {first.first_token_seconds:.2f} s" in last
    target_cache, draft_cache = list(engine.target.tokens), list(engine.draft.tokens)
    previous_prompt = engine.prompt_tokens(chat.session.conversation.for_model()[:-1])

    chat.lines("Name another one.")
    prompt = engine.prompt_tokens(chat.session.conversation.for_model()[:-1])
    stats = chat.session.last.generation.stats
    assert stats.prompt_tokens == len(prompt)
    kept = common_prefix(target_cache, prompt[:-1])
    assert kept >= len(previous_prompt)                       # the whole last turn was kept
    assert stats.prompt_tokens_evaluated == len(prompt) - kept
    assert stats.prompt_tokens_evaluated < 40                 # just the new message
    # the draft keeps all it holds (a prefix of the last turn, at most its last token short)
    assert len(draft_cache) >= len(previous_prompt) - 1
    assert common_prefix(draft_cache, prompt) == len(draft_cache)


def test_full_context_drops_the_oldest_turns_with_a_notice(smollm2_f32_path, smollm2_q4_path):
    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path, n_ctx=160) as eng:
        chat = Chat(eng, max_tokens=16, system="You are a helpful assistant.")
        notices = []
        for i in range(10):
            question = f"Question {i}: tell me one fact about the number {i + 1}, please."
            out, err = chat.lines(question)
            assert "error" not in err
            assert chat.session.conversation.messages[-2]["content"] == question   # whole
            assert chat.session.last.context_used <= 160
            notices += [ln for ln in err.splitlines() if "context full" in ln]
            if notices:
                break
        assert notices[0].startswith("context full: dropped the oldest") and \
            notices[0].endswith("turn (the system prompt is kept)")
        conv = chat.session.conversation
        assert conv.system == "You are a helpful assistant."
        assert conv.n_turns < i + 1 and conv.messages[0]["content"] != "Question 0"
        assert chat.session.last.dropped >= 1

        out, err = chat.lines("word " * 300)      # cannot fit even alone
        assert err.count("\n") == 1 and "context holds 160" in err
        assert conv.messages[-2]["content"] == question     # nothing changed


# ---------------------------------------------------------------------------------------------
# Slash commands


def test_settings_reach_the_engine(chat, engine):
    for line in ("/set temperature 0.7", "/set top_k 20", "/set top_p 0.9", "/set min_p 0.1",
                 "/set max_tokens 5", "/set draft_max 3"):
        out, err = chat.lines(line)
        assert err == "" and out.startswith(line.split()[1] + " = ")
    s = chat.session
    assert (s.sampling.temperature, s.sampling.top_k, s.sampling.top_p, s.sampling.min_p) == \
        (0.7, 20, 0.9, 0.1)
    chat.lines("Hello")
    g = s.last.generation
    assert len(g.tokens) <= 5 and g.stats.speculative
    chat.lines("/set max_tokens 40")
    chat.lines("Tell me about Paris.")
    st = s.last.generation.stats
    assert st.drafted > 0 and len(st.tested_at) <= 3    # no draft went past 3 tokens
    chat.lines("/spec off")
    chat.lines("Hello again")
    assert not s.last.generation.stats.speculative
    assert "speculation off" in chat.err.getvalue().splitlines()[-1]


def test_a_seed_makes_an_answer_reproducible_with_speculation_on_or_off(chat):
    s = chat.session
    for line in ("/set temperature 1.0", "/set max_tokens 24", "/set seed 7"):
        out, err = chat.lines(line)
        assert err == "", err
    assert s.settings()["seed"] == 7
    answers = []
    for spec in ("on", "off", "on"):
        chat.lines(f"/spec {spec}")
        chat.lines("/reset")
        chat.lines("Name three colours.")
        answers.append(s.last.generation.tokens)
    assert answers[0] == answers[1] == answers[2]
    chat.lines("/set seed random")
    assert s.settings()["seed"] == "random" and s.sampling.seed is None


def test_system_reset_and_help(chat):
    out, _ = chat.lines("/help")
    for name in ("/reset", "/system", "/set", "/spec", "/stats", "/save", "/load", "/colors",
                 "/exit", "Alt-Enter", "Ctrl-R"):
        assert name in out
    chat.lines("/system Answer in French.")
    assert chat.session.conversation.for_model("x")[0] == {"role": "system",
                                                           "content": "Answer in French."}
    chat.lines("Hi")
    chat.lines("/reset")
    assert chat.session.conversation.n_turns == 0
    assert chat.session.conversation.system == "Answer in French."
    chat.lines("/system --clear")
    assert chat.session.conversation.system is None


def test_save_then_load_restores_the_conversation(chat, engine, tmp_path):
    chat.lines("/system Be brief.")
    chat.lines("What is 2+2?")
    path = tmp_path / "talk.json"
    out, err = chat.lines(f"/save {path}")
    assert err == "" and "saved 1 turn to" in out
    other = Chat(engine)
    out, err = other.lines(f"/load {path}")
    assert err == "" and "loaded 1 turn from" in out
    assert other.session.conversation.to_dict() == chat.session.conversation.to_dict()
    other.lines("And 3+3?")                 # the loaded conversation is what the model sees
    assert other.session.last.generation.stats.prompt_tokens == len(engine.prompt_tokens(
        other.session.conversation.for_model()[:-1]))


BAD = [
    ("/nope", "unknown command /nope; commands are /help"),
    ("/set colour 3", "unknown setting 'colour'; settings are temperature"),
    ("/set temperature", "usage: /set temperature VALUE"),
    ("/set temperature -1", "temperature must be a finite number >= 0"),
    ("/set temperature nan", "temperature must be a finite number >= 0"),
    ("/set top_p 1.5", "top_p must be a number in (0, 1]"),
    ("/set top_k many", "top_k must be an integer >= 0"),
    ("/set top_k 2.5", "top_k must be an integer >= 0"),
    ("/set min_p 2", "min_p must be a number in [0, 1]"),
    ("/set max_tokens 0", "max_tokens must be an integer in [1, 1024]"),
    ("/set seed -1", "seed=-1 is invalid: seed must be an integer in [0, 2**64) or None"),
    ("/set seed 1.5", "seed=1.5 is invalid: seed must be an integer in [0, 2**64) or None"),
    ("/set draft_max -2", "draft_max must be an integer in [0, 256]"),
    ("/set draft_max 200", "draft_max must be at most 63 for this Engine"),
    ("/set draft_max many", "draft_max must be an integer"),
    ("/spec maybe", "usage: /spec on|off"),
    ("/save", "usage: /save FILE"),
    ("/load /no/such/file.json", "cannot read /no/such/file.json"),
    ("/reset everything", "/reset takes no argument"),
    ("/colors", "colours are off because of --plain"),
]


@pytest.mark.parametrize("line, fragment", BAD, ids=[b[0] for b in BAD])
def test_a_bad_command_prints_one_line_and_changes_nothing(chat, line, fragment):
    chat.session.conversation.add_turn("earlier question", "earlier answer")
    before = (chat.session.conversation.to_dict(), chat.session.settings(),
              chat.session.speculative)
    out, err = chat.lines(line)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err
    assert (chat.session.conversation.to_dict(), chat.session.settings(),
            chat.session.speculative) == before


def test_model_output_cannot_drive_the_terminal():
    out = io.StringIO()
    Printer(out, out, can_color=False, terminal=True).piece(
        "a\x1b]0;title\x07b\rc\x9b2Jd\n\te", False)
    assert out.getvalue() == "a]0;titlebc2Jd\n\te"


def test_a_message_starting_with_two_slashes_is_sent_as_text(chat):
    chat.lines("//etc/hosts is a file. Explain.")
    assert chat.session.conversation.messages[0]["content"] == "/etc/hosts is a file. Explain."


# ---------------------------------------------------------------------------------------------
# Layering


def test_only_the_tui_app_imports_prompt_toolkit():
    pkg = Path(__file__).resolve().parent.parent / "edgespec"
    users = set()
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "prompt_toolkit" for n in names):
                users.add(path.relative_to(pkg).as_posix())
    assert users == {"tui/app.py"}
    code = ("import sys, edgespec.cli; edgespec.cli.build_parser(); "
            "import edgespec.tui.command, edgespec.tui.slash; "
            "print('prompt_toolkit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_format_makes_answers_json_and_off_frees_them(chat):
    out, err = chat.lines("/format json")
    assert err == "" and out == "answers are now json\n"
    chat.lines("/set temperature 0")
    chat.lines("/set max_tokens 200")
    chat.lines("What is your name? Answer in JSON.")
    g = chat.session.last.generation
    assert g.finish_reason == "stop" and isinstance(json.loads(g.text), dict)
    assert "format=json" in chat.lines("/set")[0]
    # (open to other keys, as said: a closed object lets SmolLM2 write digits to the budget)
    out, _ = chat.lines('/format schema {"type": "object", "properties": {"n": '
                        '{"type": "integer"}}, "required": ["n"], '
                        '"additionalProperties": true}')
    assert out.startswith("answers are now schema")
    chat.lines("Give me a number.")
    assert set(json.loads(chat.session.last.generation.text)) >= {"n"}
    out, _ = chat.lines("/format off")
    assert out == "answers are free text\n" and chat.session.constraint is None


@pytest.mark.parametrize("line, fragment", [
    ("/format xml", "usage: /format json"),
    ("/format schema {\"type\": \"nope\"}", "the JSON schema is invalid"),
    ("/format regex (ab", "the regular expression is invalid"),
    ("/format grammar /no/such/file", "cannot read /no/such/file"),
])
def test_a_bad_format_is_one_line_and_changes_nothing(chat, line, fragment):
    chat.lines("/format json")
    out, err = chat.lines(line)
    assert out == "" and err.count("\n") == 1 and fragment in err
    assert chat.session.format_label == "json"
