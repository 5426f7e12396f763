"""The terminal loop: one prompt_toolkit ``PromptSession`` built once, then read → handle.

Input editing is prompt_toolkit's (Emacs keys, Ctrl-R history search, bracketed paste); this
module adds the chat's keys, slash-command completion, a bottom toolbar with live status, and
the persistent history file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion, PathCompleter
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.output import ColorDepth
from prompt_toolkit.styles import Style

from .session import SETTINGS, ChatSession
from .slash import COMMANDS, Repl

STYLE = Style.from_dict({
    "prompt": "ansigreen bold",
    "continuation": "ansibrightblack",
})

# Fixed choices for a command's argument; /save and /load complete file names.
ARGUMENT_CHOICES = {"set": SETTINGS, "spec": ("on", "off"), "system": ("--clear",),
                    "format": ("json", "schema", "regex", "grammar", "off")}


def key_bindings() -> KeyBindings:
    """The chat's own keys, on top of prompt_toolkit's Emacs defaults."""
    kb = KeyBindings()

    @kb.add("escape", "enter")
    def _newline(event) -> None:
        """Alt-Enter (or Esc then Enter) starts a new line; Enter alone sends."""
        event.current_buffer.insert_text("\n")

    return kb


class SlashCompleter(Completer):
    """Tab completion for slash commands, their fixed arguments and file names."""

    def __init__(self) -> None:
        self.paths = PathCompleter(expanduser=True)

    def get_completions(self, document: Document,
                        complete_event: CompleteEvent) -> Iterable[Completion]:
        text = document.text_before_cursor
        if not text.startswith("/") or text.startswith("//") or "\n" in text:
            return
        name, space, rest = text[1:].partition(" ")
        if not space:
            for n, cmd in COMMANDS.items():
                if n.startswith(name):
                    yield Completion("/" + n, start_position=-len(text), display_meta=cmd.help)
            return
        word = rest.lstrip()
        if name in ("save", "load"):
            yield from self.paths.get_completions(Document(word), complete_event)
        elif " " not in word:
            for choice in ARGUMENT_CHOICES.get(name, ()):
                if choice.startswith(word):
                    yield Completion(choice, start_position=-len(word))


def build_prompt(session: ChatSession, *, history: Optional[Path], plain: bool = False,
                 input=None, output=None) -> PromptSession:
    """The prompt, built once per chat. ``history``: the file that keeps past inputs (None:
    memory only). ``input``/``output`` default to the terminal; tests pass a pipe input and
    a ``DummyOutput``."""

    def toolbar() -> str:
        spec = "on" if session.speculative else "off"
        return (f" {session.label} · {session.backend} · speculation {spec} · temperature "
                f"{session.sampling.temperature:g} · context {session.context_used}/"
                f"{session.engine.n_ctx} · Alt-Enter new line · /help ")

    def continuation(width: int, line_number: int, wrap_count: int):
        return [("class:continuation", "·".rjust(width - 1) + " ")]

    return PromptSession(
        message=[("class:prompt", "> ")], prompt_continuation=continuation,
        multiline=False, key_bindings=key_bindings(),
        history=FileHistory(str(history)) if history is not None else InMemoryHistory(),
        completer=SlashCompleter(), complete_while_typing=False,
        bottom_toolbar=toolbar, style=STYLE, include_default_pygments_style=False,
        color_depth=ColorDepth.MONOCHROME if plain else None, input=input, output=output)


def run_terminal(repl: Repl, prompt: PromptSession) -> int:
    """Read and handle lines until Ctrl-D or ``/exit``; returns the exit code (0)."""
    while True:
        try:
            line = prompt.prompt()
        except KeyboardInterrupt:  # Ctrl-C at the prompt clears the line
            continue
        except EOFError:           # Ctrl-D on an empty line
            return 0
        if not repl.handle(line):
            return 0
