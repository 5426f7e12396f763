"""``edgespec chat`` as a user runs it: in a real terminal (tmux), and with a pipe for stdin.

The terminal test types into a tmux pane running the real command on the real SmolLM2 pair and
reads the screen back with ``tmux capture-pane``. Its tmux server is private (its own socket).
"""

import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from conftest import require_tools

pytestmark = [pytest.mark.real, pytest.mark.slow]

CHAT = [sys.executable, "-m", "edgespec", "chat", "--pair", "smollm2-135m", "--draft-max", "4"]
STATUS = re.compile(r"smollm2-135m · \w+ · [\d.]+ tok/s")


@pytest.fixture(autouse=True)
def default_pair(smollm2_f32_path, smollm2_q4_path):
    """The default pair must be local: these tests never download."""


class Tmux:
    """A private tmux server running one command in a fixed-size window."""

    def __init__(self, tmp_path, command: list[str], env: dict):
        require_tools("tmux", packages="tmux")
        self.socket = str(tmp_path / "tmux.sock")
        self.rc_file = tmp_path / "exit-code"
        shell = f"{shlex.join(command)}; echo $? > {shlex.quote(str(self.rc_file))}; sleep 600"
        self._tmux("new-session", "-d", "-s", "chat", "-x", "120", "-y", "50", shell, env=env)

    def _tmux(self, *args, env=None) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True, env=env,
                              capture_output=True, text=True, timeout=30).stdout

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", "chat", "-l", text)

    def press(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "chat", *keys)

    def screen(self, escapes: bool = False) -> str:
        """Everything the pane shows, scrollback included (``escapes``: with colour codes)."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "chat",
                          *(["-e"] if escapes else []))

    def wait_for(self, what: str, predicate, timeout: float = 180.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.1)
        pytest.fail(f"timed out waiting for {what}; the screen shows:\n{self.screen()}")

    def exit_code(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.rc_file.is_file() and self.rc_file.read_text().strip():
                return int(self.rc_file.read_text())
            time.sleep(0.1)
        pytest.fail(f"the chat did not exit; the screen shows:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)


def statuses(text: str) -> int:
    return len(STATUS.findall(text))


def after(text: str, marker: str) -> str:
    return text[text.rindex(marker) + len(marker):] if marker in text else ""


def test_chat_in_a_real_terminal(tmp_path):
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    tmux = Tmux(tmp_path, CHAT + ["--temperature", "0", "--max-tokens", "48"], env)
    try:
        tmux.wait_for("the prompt", lambda s: "Ctrl-D quits" in s and "\n> " in s)

        tmux.type("What is the capital of France?")
        tmux.press("Enter")
        screen = tmux.wait_for("the first answer", lambda s: statuses(s) == 1)
        answer = after(screen, "What is the capital of France?")
        assert "Paris" in answer
        for part in ("acceptance", "tokens/pass", "context "):
            assert part in answer
        coloured = after(tmux.screen(escapes=True), "France?").split("smollm2-135m ·")[0]
        assert "\x1b[32m" in coloured                  # accepted draft tokens, in green

        tmux.type("/set max_tokens 800")
        tmux.press("Enter")
        tmux.wait_for("the setting", lambda s: "max_tokens = 800" in s)
        question = "Write a long story about a brave dragon."
        tmux.type(question)
        tmux.press("Enter")
        tmux.wait_for("the long answer to start",
                      lambda s: len(after(s, question).strip()) > 30)
        tmux.press("C-c")
        pressed = time.monotonic()
        screen = tmux.wait_for("the answer to stop", lambda s: "[interrupted]" in s)
        assert time.monotonic() - pressed < 15          # one step, on a very busy machine
        tmux.wait_for("the prompt after the interrupted answer", lambda s: statuses(s) == 2)
        partial = after(screen, question).split("[interrupted]")[0]
        assert len(partial.split()) < 400               # far from the 800-token limit

        tmux.type("What is the capital of Italy?")
        tmux.press("Enter")
        screen = tmux.wait_for("the third answer", lambda s: statuses(s) == 3)
        assert after(screen, "capital of Italy?").strip()

        tmux.press("C-d")
        assert tmux.exit_code() == 0
        screen = tmux.screen()
        assert "Traceback" not in screen and "error:" not in screen
        history = (tmp_path / "data" / "edgespec" / "chat_history").read_text()
        assert question in history and "/set max_tokens 800" in history
    finally:
        tmux.close()


def run_piped(stdin: str, *args: str):
    return subprocess.run(CHAT + list(args), input=stdin, capture_output=True, text=True,
                          timeout=600)


def test_echo_hi_into_chat_answers_and_exits_0():
    proc = subprocess.run(f"echo hi | {shlex.join(CHAT)} --max-tokens 16", shell=True,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "\x1b[" not in proc.stdout                      # no colours into a pipe
    assert STATUS.search(proc.stderr) and "Traceback" not in proc.stderr


def test_piped_lines_are_messages_and_commands():
    proc = run_piped("/set temperature 0\nWhat is 2+2?\n/nope\n\n/stats\n", "--max-tokens", "16")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "temperature = 0"
    assert "4" in out[1]
    (last,) = [line for line in out if line.startswith("last answer: [")]
    assert "evaluated at" in last and "first token after" in last
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: unknown command /nope; commands are /help /reset /system /set "
                      "/spec /format /stats /save /load /colors /exit"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--top-p", "2"], "top_p=2.0 is invalid"),
    (["--max-tokens", "0"], "max_tokens=0 is invalid"),
    (["--pair", "no-such-pair"], "unknown pair 'no-such-pair'"),
])
def test_bad_options_are_one_line_errors(args, fragment):
    proc = subprocess.run([sys.executable, "-m", "edgespec", "chat", *args], input="hi\n",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert fragment in proc.stderr
