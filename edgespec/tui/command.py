"""``edgespec chat``: its options, and the choice between a terminal UI and a pipe.

With a terminal on both ends the prompt_toolkit UI runs; otherwise (``echo hi | edgespec
chat``) each input line is a message or a slash command, answers go to stdout and status lines
to stderr, and the chat ends at the end of the input.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Optional

from .. import paths
from ..config import CHAT_MAX_TOKENS
from ..engine.request import check_max_tokens
from ..shell import (add_model_args, add_sampling_args, chat_format_note, load_engine,
                     model_label, sampling_from_args, status)


def build_chat_parser(sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal, with speculation you can see",
                       description="Chat with a model pair in the terminal. Enter sends, "
                                   "Alt-Enter starts a new line, Ctrl-C stops an answer, "
                                   "Ctrl-D leaves; /help lists the slash commands.")
    p.add_argument("--system", metavar="TEXT", help="a system prompt")
    p.add_argument("--max-tokens", "-n", type=int, default=CHAT_MAX_TOKENS, metavar="N",
                   help=f"most tokens per answer (default {CHAT_MAX_TOKENS})")
    p.add_argument("--plain", action="store_true",
                   help="no colours (accepted draft tokens are not highlighted)")
    add_model_args(p, auto_draft=True)
    add_sampling_args(p)
    p.set_defaults(func=cmd_chat)


def history_path() -> Optional[Path]:
    path = paths.chat_history_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)   # what was typed may be private
    except OSError as e:
        status(f"warning: input history is not kept: cannot write {path} ({e.strerror})")
        return None
    return path


def banner(session, colors: bool) -> str:
    spec = "on" if session.speculative else "unavailable (no draft model)"
    lines = [f"edgespec chat · {session.label} · {session.backend} · context "
             f"{session.engine.n_ctx} tokens · speculative decoding {spec}"]
    if colors and session.can_speculate:
        lines.append("green text: tokens the draft proposed and the target accepted")
    lines.append("Enter sends · Alt-Enter new line · Ctrl-C stops an answer · Ctrl-D quits · "
                 "/help")
    return "\n".join(lines)


def run_lines(repl, lines: Iterable[str]) -> int:
    """The pipe mode: every line is handled in turn; the end of input ends the chat."""
    for line in lines:
        if not repl.handle(line):
            break
    return 0


def cmd_chat(args) -> int:
    from .render import Printer
    from .session import ChatSession
    from .slash import Repl

    sampling = sampling_from_args(args)   # bad values fail before the models load
    check_max_tokens(args.max_tokens)     # the core's check and message, before loading
    terminal = sys.stdin.isatty() and sys.stdout.isatty()
    with load_engine(args) as engine:
        label = model_label(args)               # (with the draft chosen for the target)
        session = ChatSession(engine, label=label, sampling=sampling,
                              max_tokens=args.max_tokens, system=args.system)
        note = chat_format_note(engine)
        if not terminal:
            if note:
                status(note)
            return run_lines(Repl(session, Printer(sys.stdout, sys.stderr, can_color=False)),
                             sys.stdin)
        from .app import build_prompt, run_terminal   # prompt_toolkit loads only here
        printer = Printer(sys.stdout, sys.stdout, terminal=True,
                          can_color=not args.plain and not os.environ.get("NO_COLOR"))
        printer.say(banner(session, printer.colors))
        if note:
            printer.notice(note)
        prompt = build_prompt(session, history=history_path(), plain=args.plain)
        return run_terminal(Repl(session, printer, terminal=True), prompt)
