"""What one line of chat input does: a slash command, or a message the model answers.

Every command is one entry of :data:`COMMANDS`; ``/help`` and tab completion are built from
it. A bad command or value prints one line saying what is valid and changes nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..conversation import Conversation
from ..errors import EdgespecError
from .render import Printer, plural, settings_line, stats_text, status_line
from .session import SETTINGS, ChatError, ChatSession

KEYS_HELP = """\
keys: Enter sends · Alt-Enter (or Esc then Enter) starts a new line · pasted text keeps its
      newlines · Tab completes commands · Up/Down and Ctrl-R search the history · Ctrl-C
      stops an answer or clears the line · Ctrl-D or /exit leaves
A message that starts with // is sent as text beginning with /."""


class Exit(Exception):
    """Leave the chat."""


@dataclass(frozen=True)
class Command:
    usage: str
    help: str
    run: Callable[["Repl", str], None]
    takes_argument: bool = False


def _no_argument(name: str, arg: str) -> None:
    if arg:
        raise ChatError(f"/{name} takes no argument (see /help)")


def _help(repl: "Repl", arg: str) -> None:
    width = max(len(c.usage) for c in COMMANDS.values())
    lines = [f"{c.usage:<{width}}  {c.help}" for c in COMMANDS.values()]
    repl.printer.say("\n".join(lines) + "\n" + KEYS_HELP)


def _reset(repl: "Repl", arg: str) -> None:
    repl.session.conversation.reset()
    repl.printer.say("conversation cleared" + (" (the system prompt is kept)"
                                               if repl.session.conversation.system else ""))


def _system(repl: "Repl", arg: str) -> None:
    conv = repl.session.conversation
    if not arg:
        repl.printer.say(f"system prompt: {conv.system}" if conv.system else
                         "no system prompt (set one with /system TEXT)")
    elif arg == "--clear":
        conv.system = None
        repl.printer.say("system prompt removed")
    else:
        conv.system = arg
        repl.printer.say("system prompt set; it applies from the next answer")


def _set(repl: "Repl", arg: str) -> None:
    name, _, value = arg.partition(" ")
    value = value.strip()
    if not name:
        repl.printer.say(settings_line(repl.session))
        return
    if name not in SETTINGS:
        raise ChatError(f"unknown setting '{name}'; settings are {', '.join(SETTINGS)}")
    if not value:
        raise ChatError(f"usage: /set {name} VALUE (now {repl.session.settings()[name]})")
    repl.session.set(name, value)
    repl.printer.say(f"{name} = {repl.session.settings()[name]}")


def _spec(repl: "Repl", arg: str) -> None:
    if arg not in ("on", "off"):
        raise ChatError("usage: /spec on|off")
    repl.session.set_speculative(arg == "on")
    repl.printer.say(f"speculative decoding {arg}")


def _format(repl: "Repl", arg: str) -> None:
    now = repl.session.set_format(arg.strip())
    repl.printer.say(f"answers are now {now}" if now != "text" else "answers are free text")


def _stats(repl: "Repl", arg: str) -> None:
    repl.printer.say(stats_text(repl.session))


def _path(arg: str, name: str) -> Path:
    if not arg:
        raise ChatError(f"usage: /{name} FILE")
    return Path(arg).expanduser()


def _save(repl: "Repl", arg: str) -> None:
    path = _path(arg, "save")
    repl.session.conversation.save(path)
    repl.printer.say(f"saved {plural(repl.session.conversation.n_turns, 'turn')} to {path}")


def _load(repl: "Repl", arg: str) -> None:
    path = _path(arg, "load")
    repl.session.conversation = conv = Conversation.load(path)
    repl.printer.say(f"loaded {plural(conv.n_turns, 'turn')} from {path}"
                     + (" (with a system prompt)" if conv.system else ""))


def _colors(repl: "Repl", arg: str) -> None:
    p = repl.printer
    if not p.can_color:
        raise ChatError("colours are off because of --plain, NO_COLOR or output that is not a "
                        "terminal")
    p.colors = not p.colors
    repl.printer.say("accepted draft tokens are shown in green" if p.colors else
                     "colours off")


def _exit(repl: "Repl", arg: str) -> None:
    raise Exit


COMMANDS: dict[str, Command] = {
    "help": Command("/help", "this help", _help),
    "reset": Command("/reset", "forget the conversation (the system prompt stays)", _reset),
    "system": Command("/system [TEXT]", "show or set the system prompt (--clear removes it)",
                      _system, True),
    "set": Command("/set [NAME VALUE]", "show the settings, or set one of "
                   + ", ".join(SETTINGS), _set, True),
    "spec": Command("/spec on|off", "speculative decoding on or off", _spec, True),
    "format": Command("/format json|schema FILE|regex R|grammar FILE|off",
                      "make every answer JSON, match a schema, a regex or a grammar", _format,
                      True),
    "stats": Command("/stats", "statistics of the last answer and of the session", _stats),
    "save": Command("/save FILE", "save the conversation as JSON", _save, True),
    "load": Command("/load FILE", "load a conversation saved with /save", _load, True),
    "colors": Command("/colors", "colour accepted draft tokens, or not", _colors),
    "exit": Command("/exit", "leave (Ctrl-D does too)", _exit),
}


class Repl:
    """Handles lines of input for a :class:`ChatSession`, writing through a :class:`Printer`.

    ``terminal``: input comes from a terminal, so typing is not echoed while an answer
    streams (it is kept for the next prompt).
    """

    def __init__(self, session: ChatSession, printer: Printer, *, terminal: bool = False):
        self.session = session
        self.printer = printer
        self.terminal = terminal
        self.debug = os.environ.get("EDGESPEC_DEBUG") == "1"

    def handle(self, line: str) -> bool:
        """Do what ``line`` asks; False when the chat should end. Never raises for a user
        error or an interruption: each becomes one line on the screen."""
        text = line.strip()
        if not text:
            return True
        try:
            if text.startswith("/") and not text.startswith("//"):
                self.command(text)
            else:
                self.answer(text[1:] if text.startswith("//") else text)
        except Exit:
            return False
        except KeyboardInterrupt:
            self.printer.notice("interrupted")
        except EdgespecError as e:
            self.printer.error(str(e))
        except Exception as e:  # the chat must survive anything; one line, never a traceback
            if self.debug:
                raise
            first = (str(e).splitlines() or [""])[0]
            self.printer.error(f"unexpected {type(e).__name__}: {first} (EDGESPEC_DEBUG=1 "
                               "shows the traceback)")
        return True

    def command(self, text: str) -> None:
        name, _, arg = text[1:].partition(" ")
        arg = arg.strip()
        cmd = COMMANDS.get(name)
        if cmd is None:
            raise ChatError(f"unknown command /{name}; commands are "
                            + " ".join(f"/{n}" for n in COMMANDS))
        if not cmd.takes_argument:
            _no_argument(name, arg)
        cmd.run(self, arg)

    def answer(self, text: str) -> None:
        p = self.printer

        def drop(n: int) -> None:
            p.notice(f"context full: dropped the oldest {plural(n, 'turn')} "
                     "(the system prompt is kept)")
        try:
            with _sigint_interrupts(self.session), _no_echo(self.terminal):
                turn = self.session.ask(text, p.piece, on_drop=drop)
        except BaseException:
            p.break_line()
            raise
        p.end_answer(turn.interrupted)
        p.status(status_line(self.session, turn))
        threads = self.session.engine.threads
        if threads["backed_off"] and not self.session.told_busy:
            self.session.told_busy = True
            p.notice(f"the machine is busy: decoding on fewer threads than {threads['max']} "
                     "while it is, so that other programs do not stall edgespec (it goes back "
                     "up when the machine frees)")


@contextmanager
def _sigint_interrupts(session: ChatSession) -> Iterator[None]:
    """While an answer streams, Ctrl-C (SIGINT) stops it instead of raising."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: session.interrupt())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def _no_echo(enabled: bool) -> Iterator[None]:
    """Turn off the terminal's echo (keys typed during an answer wait for the next prompt)."""
    saved = None
    if enabled:
        try:
            import termios
            fd = sys.stdin.fileno()
            saved = termios.tcgetattr(fd)
        except Exception:  # noqa: BLE001 - not a POSIX terminal (Windows, a closed stdin)
            saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)
