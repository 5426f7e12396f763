"""The ``edgespec`` command line: the command table, ``main()``, and ``edgespec run``.

Each command family registers its own parser (``build_*_parser(subparsers)``) from its own
module; those modules keep their heavy imports (prompt_toolkit, the HTTP stack, llama.cpp)
inside their command functions, so building the parser stays cheap. All of them share
:mod:`edgespec.shell`, never this module.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Optional

from . import config
from .bench.command import build_bench_parser, build_calibrate_parser
from .model_commands import build_models_parsers
from .server.command import build_serve_parser
from .shell import (DRAFT_COLOR, EXIT_USER_ERROR, RESET, LogLines, Parser,
                    add_constraint_args, add_model_args, add_sampling_args, constraint_from_args,
                    error_boundary, load_engine, sampling_from_args, status)
from .engine.request import check_max_tokens
from .tui.command import build_chat_parser
from .worker import build_worker_parser

# ---------------------------------------------------------------------------------------------
# edgespec run


def cmd_run(args) -> int:
    sampling = sampling_from_args(args)         # bad values fail before the models load
    check_max_tokens(args.max_tokens)           # the core's check and message, as the chat's
    constraint = constraint_from_args(args)
    with load_engine(args) as eng:
        prompt = args.prompt
        raw = args.raw
        if not raw and not args.system and eng.template.source is None:
            # No chat template: a base model (Gemma-3-270M). Complete the prompt as-is, as
            # llama-cli and Ollama do with such models (the same text the template's plain
            # fallback would send); --system goes before it, as plain text.
            raw = True
            if not args.quiet:
                status(f"note: {eng.target.path.name} has no chat template, so the prompt is "
                       "completed as-is (--system puts its text before it)")
        if args.system and not raw:
            prompt = [{"role": "system", "content": args.system},
                      {"role": "user", "content": args.prompt}]
        kw = dict(max_tokens=args.max_tokens, sampling=sampling, raw=raw,
                  stop=args.stop or (), constraint=constraint)
        if args.json:
            out = eng.generate(prompt, **kw)
            print(json.dumps(out.to_dict(), ensure_ascii=False))
            return 0
        color = args.color and sys.stdout.isatty()
        from .thinking import Shown
        stream = eng.stream(prompt, **kw)
        shown = Shown()             # a thinking model's reasoning, marked, before its answer
        for ev in stream:
            piece = shown(ev)
            sys.stdout.write(DRAFT_COLOR + piece + RESET if color and ev.from_draft else piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        if not args.quiet:
            res = stream.result
            status(f"[{res.finish_reason}] {res.stats.summary(detail=True)}")
    return 0


def build_run_parser(sub) -> None:
    p = sub.add_parser("run", help="generate a completion for one prompt")
    p.add_argument("prompt", help="the prompt: a user message, or sent as-is with --raw or "
                                  "when the model has no chat template (a base model)")
    p.add_argument("--max-tokens", "-n", type=int, default=config.MAX_TOKENS,
                   metavar="N",
                   help=f"most tokens to generate (default {config.MAX_TOKENS})")
    p.add_argument("--raw", action="store_true", help="send the prompt as-is, no chat template")
    p.add_argument("--system", help="a system prompt (chat mode)")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, "
                                                       "tokens, finish_reason and stats")
    p.add_argument("--color", action="store_true",
                   help="show accepted draft tokens in green (terminal only)")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print the stats line")
    add_constraint_args(p)
    add_model_args(p, auto_draft=True)
    add_sampling_args(p)
    p.set_defaults(func=cmd_run)


# ---------------------------------------------------------------------------------------------
# edgespec info


def cmd_info(args) -> int:
    from .backend import backend_info, cpu_check_info
    info = backend_info()
    info["cpu_extra_buffers"] = cpu_check_info(recheck=args.recheck)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"llama-cpp-python {info['llama_cpp_python']}; backend: {info['backend']}; "
          f"GPU offload: {'yes' if info['gpu_offload'] else 'no'}")
    for d in info["devices"]:
        print(f"  device {d['name']} ({d['type']}): {d['description']}")
    print(f"  {info['system_info']}")
    print(f"  CPU extra buffer types: {info['cpu_extra_buffers']['summary']}")
    return 0


def build_info_parser(sub) -> None:
    p = sub.add_parser("info", help="which llama.cpp backend and devices this install uses")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    p.add_argument("--recheck", action="store_true",
                   help="check again, in child processes, whether llama.cpp's extra CPU "
                        "kernels (AMX, repacked weights) crash on this CPU")
    p.set_defaults(func=cmd_info)


# ---------------------------------------------------------------------------------------------
# entry point

COMMANDS = [build_run_parser, build_chat_parser, build_serve_parser, build_bench_parser,
            build_calibrate_parser, build_models_parsers, build_info_parser,
            build_worker_parser]


def build_parser() -> Parser:
    from . import __version__
    ap = Parser(prog="edgespec",
                description="Lossless speculative decoding for local GGUF models.")
    ap.add_argument("--version", action="version", version=f"edgespec {__version__}")
    sub = ap.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND")
    for build in COMMANDS:
        build(sub)
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, handlers=[LogLines()])
    code = [0]
    with error_boundary(code):
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USER_ERROR
        code[0] = args.func(args)
    return code[0]


if __name__ == "__main__":
    sys.exit(main())
