"""examples/tk_chat.py on a real X server (Xvfb): keystrokes typed with xdotool, the reply read
from the window's own text widget, the Stop button clicked with the mouse."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require_tools

from edgespec import Engine, SamplingParams

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tk_chat.py"
GREEDY = SamplingParams(temperature=0.0)
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def display():
    require_tools("Xvfb", "xdotool", packages="xvfb xdotool python3-tk")
    n = next(n for n in range(90, 200) if not Path(f"/tmp/.X{n}-lock").exists())
    proc = subprocess.Popen(["Xvfb", f":{n}", "-screen", "0", "1024x768x24", "-nolisten",
                             "tcp"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not Path(f"/tmp/.X11-unix/X{n}").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "Xvfb did not start"
        time.sleep(0.05)
    old = os.environ.get("DISPLAY")
    os.environ["DISPLAY"] = f":{n}"
    yield f":{n}"
    if old is None:
        del os.environ["DISPLAY"]
    else:
        os.environ["DISPLAY"] = old
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def tk_chat():
    spec = importlib.util.spec_from_file_location("tk_chat", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def xdotool(*args: str) -> subprocess.Popen:
    return subprocess.Popen(["xdotool", *args])


def pump_until(root, predicate, timeout: float, what: str) -> None:
    """Run the Tk event loop until predicate() holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        root.update()
        time.sleep(0.01)


def test_type_a_message_see_the_reply_stop_and_close(display, tk_chat, smollm2_f32_path,
                                                     smollm2_q4_path):
    import tkinter as tk

    with Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path) as eng:
        expected = eng.generate([{"role": "user", "content": QUESTION}], max_tokens=200,
                                sampling=GREEDY).text
    assert "Paris" in expected

    root = tk.Tk()
    win = tk_chat.ChatWindow(
        root, lambda: Engine.load(target=smollm2_f32_path, draft=smollm2_q4_path),
        sampling=GREEDY, max_tokens=200)
    pump_until(root, lambda: win.ready, 120, "the models to load")
    root.focus_force()
    win.entry.focus_force()
    pump_until(root, lambda: root.focus_get() is win.entry, 10, "keyboard focus")

    # 1. Type a question with real key events and press Return.
    typing = xdotool("type", "--delay", "15", QUESTION)
    pump_until(root, lambda: typing.poll() is not None, 60, "xdotool to type")
    pump_until(root, lambda: win.entry.get() == QUESTION, 10, "the typed text")
    enter = xdotool("key", "Return")
    pump_until(root, lambda: enter.poll() is not None and not win.answering
               and win.history and win.history[-1]["role"] == "assistant", 180, "the reply")
    assert win.transcript_text() == f"You: {QUESTION}\nAssistant: {expected}\n\n"
    assert "tok/s" in win.status.cget("text")
    assert root.title().endswith("ready")

    # 2. Ask for something long and click Stop while it streams.
    win.entry.insert(0, "Count from 1 to 500, one number per line.")
    win.send()
    pump_until(root, lambda: win.transcript_text().count("\n") > 6, 120, "streamed text")
    x = win.stop_button.winfo_rootx() + win.stop_button.winfo_width() // 2
    y = win.stop_button.winfo_rooty() + win.stop_button.winfo_height() // 2
    click = xdotool("mousemove", str(x), str(y), "click", "1")
    pump_until(root, lambda: click.poll() is not None and not win.answering, 60, "the stop")
    assert win.transcript_text().endswith(" [stopped]\n\n")
    assert win.status.cget("text").startswith("stopped")
    assert len(win.history) == 4

    # 3. Closing the window closes the Engine in the worker.
    win.close()
    assert not win.worker.is_alive()


def test_the_script_starts_answers_and_quits_cleanly(display, smollm2_f32_path, smollm2_q4_path):
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--target", str(smollm2_f32_path),
                             "--draft", str(smollm2_q4_path), "--temperature", "0",
                             "--max-tokens", "16"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wid = subprocess.run(["xdotool", "search", "--sync", "--name", "edgespec chat"],
                             capture_output=True, text=True, timeout=60).stdout.split()[0]

        def title() -> str:
            return subprocess.run(["xdotool", "getwindowname", wid], capture_output=True,
                                  text=True, timeout=10).stdout.strip()

        deadline = time.monotonic() + 120
        while not title().endswith("ready"):
            assert time.monotonic() < deadline and proc.poll() is None, title()
            time.sleep(0.1)
        subprocess.run(["xdotool", "windowfocus", "--sync", wid], timeout=10, check=True)
        subprocess.run(["xdotool", "type", "--delay", "15", "Hello!"], timeout=30, check=True)
        subprocess.run(["xdotool", "key", "Return"], timeout=10, check=True)
        seen = set()
        while "answering" not in seen or not title().endswith("ready"):
            seen.add(title().rsplit(" ", 1)[-1])
            assert time.monotonic() < deadline and proc.poll() is None, seen
            time.sleep(0.05)
        subprocess.run(["xdotool", "key", "--window", wid, "ctrl+q"], timeout=10, check=True)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert err == "", err          # nothing printed at exit: no tracebacks, no warnings
