"""``edgespec bench``: parse the options, load the pair, run, report."""

from __future__ import annotations

import json

from ..config import SamplingParams, SpecConfig
from ..shell import (Progress, UsageError, add_model_args, int_option, load_engine,
                     max_tokens_option, status)
from ..constraints import Constraint
from .prompts import EXTRACT_SCHEMA, PROMPT_SETS
from .report import format_report, plot, require_pyplot
from .load import format_load_report, run_load_bench
from .long_prompts import format_long_prompt_report, run_long_prompt_bench
from .runner import run_bench
from .task_bench import format_task_report, run_task_bench
from .tasks import TASKS


# What apps send when their user changed nothing: llama.cpp's defaults; Ollama's (its
# Modelfile defaults); Qwen's recommended for its instruct models; OpenAI clients' (T = 1, no
# cut-off). `edgespec bench --sampler NAME`; --temperature changes only the temperature.
APP_SAMPLERS = {
    "llama.cpp": SamplingParams(),
    "ollama": SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.0,
                             repeat_penalty=1.1, repeat_last_n=64),
    "qwen": SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.0,
                           repeat_penalty=1.05),
    "openai": SamplingParams.neutral(1.0),
}


def bench_sampling(args) -> SamplingParams:
    """The sampler the runs use: ``--sampler``'s, its temperature changed by
    ``--temperature``; without ``--sampler``, llama.cpp's at ``--temperature`` (default 0:
    greedy)."""
    if args.sampler is None:
        return SamplingParams(temperature=args.temperature or 0.0, seed=args.seed)
    params = APP_SAMPLERS[args.sampler].replace(seed=args.seed)
    return params if args.temperature is None else params.replace(
        temperature=args.temperature)


def cmd_bench(args) -> int:
    if args.tasks is not None and args.prompts != "tasks":
        raise UsageError("--tasks goes with --prompts tasks")
    if args.prompt_lengths is not None:
        return cmd_long_prompts(args)
    if args.new_tokens is not None:
        raise UsageError("--new-tokens goes with --prompt-lengths (the other modes take "
                         "--max-tokens)")
    sampling = bench_sampling(args)
    ks = parse_ks(args.ks or ("2,4,8" if args.prompts == "tasks" else "2,4,8,16"))
    if args.prompts == "tasks":
        return cmd_tasks(args, sampling, ks)
    if args.max_tokens is None:
        args.max_tokens = 128
    if args.load < 0:
        raise UsageError(f"--load must be a number of busy processes >= 0, not {args.load}")
    if args.plot:
        require_pyplot()  # fail before an hour of benchmarking, not after
    # The extraction set also runs every output held to its schema, against its own baseline.
    constraint = Constraint.json_schema(EXTRACT_SCHEMA) if args.prompts == "extract" else None
    with load_engine(args) as eng:
        raw = args.raw or eng.template.is_fallback
        prompts = PROMPT_SETS[args.prompts]
        log = (lambda s: None) if args.json else status
        mode = prompt_mode(raw, args.raw)
        log(f"target {eng.target.path.name}, draft "
            f"{eng.draft.path.name if eng.draft else '-'}, backend {eng.info()['backend']}, "
            f"{len(prompts)} '{args.prompts}' prompts, {mode}")
        if args.load:
            res = run_load_bench(eng, prompts, load=args.load, max_tokens=args.max_tokens,
                                 raw=raw, repeats=args.repeats, peers=not args.no_peers,
                                 log=log)
            res.update(prompt_set=args.prompts, prompt_mode="raw" if raw else "chat")
            print(json.dumps(res) if args.json else format_load_report(res) + f"\n{mode}")
            return 0
        res = run_bench(eng, prompts, max_tokens=args.max_tokens, sampling=sampling, raw=raw,
                        ks=ks, repeats=args.repeats, peers=not args.no_peers, log=log,
                        constraint=constraint)
    res.update(prompt_set=args.prompts, prompt_mode="raw" if raw else "chat")
    if args.plot:
        plot(res, args.plot)
    print(json.dumps(res) if args.json else format_report(res) + f"\n'{args.prompts}' "
          f"prompts, {mode}")
    return 0


def parse_ks(value: str) -> list[int]:
    """``--ks``: the pinned draft lengths."""
    try:
        ks = [int(k) for k in value.split(",") if k]
    except ValueError:
        raise UsageError(f"--ks must be comma-separated integers, got {value!r}") from None
    if any(not 1 <= k <= SpecConfig.K_LIMIT for k in ks):
        raise UsageError(f"--ks {value} is invalid: draft lengths must be integers in "
                         f"[1, {SpecConfig.K_LIMIT}]")
    return ks


def cmd_tasks(args, sampling: SamplingParams, ks: list[int]) -> int:
    """``edgespec bench --prompts tasks``: whole answers' times per task, from cold caches."""
    tasks = tuple(dict.fromkeys(t.strip() for t in (args.tasks or ",".join(TASKS)).split(",")
                                if t.strip()))
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise UsageError(f"--tasks {args.tasks} is invalid: name some of "
                         f"{', '.join(TASKS)}, separated by commas")
    for option, used in (("--load", args.load), ("--plot", args.plot)):
        if used:
            raise UsageError(f"{option} does not apply to --prompts tasks")
    with load_engine(args) as eng:
        raw = args.raw or eng.template.is_fallback
        log = (lambda s: None) if args.json else status
        mode = ("chat mode: a conversation as its messages, any other prompt as a user "
                "message, in the model's chat template" if not raw else
                "raw mode: each prompt is continued as-is, a conversation as plain text ("
                + ("--raw" if args.raw else "the model has no chat template") + ")")
        log(f"target {eng.target.path.name}, draft "
            f"{eng.draft.path.name if eng.draft else '-'}, backend {eng.info()['backend']}, "
            f"tasks {', '.join(tasks)}, {mode}")
        # -n: every answer's limit (64 unless given); code_edit's answers have budgets of their
        # own (the whole file back), which -n caps only when given
        res = run_task_bench(eng, tasks=tasks,
                             max_tokens=args.max_tokens or 64, sampling=sampling, raw=raw,
                             ks=ks, repeats=args.repeats, edit_cap=args.max_tokens or None,
                             log=log)
        res.update(prompt_set="tasks", prompt_mode="raw" if raw else "chat",
                   target=eng.target.path.name, draft=eng.draft.path.name,
                   sampler=args.sampler)
    print(json.dumps(res) if args.json else format_task_report(res) + f"\n{mode}")
    return 0


def int_list(value: str, option: str) -> list[int]:
    """``"100,500"`` as ``[100, 500]`` (each once, in order); positive integers only."""
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option} must be comma-separated integers, got {value!r}") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{option} {value} is invalid: it must be integers >= 1")
    return list(dict.fromkeys(values))


def cmd_long_prompts(args) -> int:
    """``edgespec bench --prompt-lengths``: plain against speculative as prompts grow."""
    lengths = int_list(args.prompt_lengths, "--prompt-lengths")
    news = int_list(args.new_tokens or "96,256,512", "--new-tokens")
    for option, used in (("--load", args.load), ("--plot", args.plot),
                         ("--prompts", args.prompts != "default")):
        if used:
            raise UsageError(f"{option} does not apply to --prompt-lengths (it makes its own "
                             "prompts and compares plain with speculative decoding)")
    need = max(lengths) + max(news)
    if need > args.ctx_size:      # refused before any model loads
        raise UsageError(f"--prompt-lengths {max(lengths)} with --new-tokens {max(news)} "
                         f"needs a context of {need} tokens, more than --ctx-size "
                         f"{args.ctx_size}: load with a larger context (--ctx-size "
                         f"{-(-need // 1024) * 1024})")
    sampling = bench_sampling(args)
    with load_engine(args) as eng:
        raw = args.raw or eng.template.is_fallback
        log = (lambda s: None) if args.json else status
        if raw:
            mode = ("raw mode: each prompt is continued as-is ("
                    + ("--raw" if args.raw else "the model has no chat template") + ")")
        else:
            mode = ("chat mode: each passage is the system prompt, the instruction the "
                    "user's message, in the model's chat template")
        log(f"target {eng.target.path.name}, draft "
            f"{eng.draft.path.name if eng.draft else '-'}, backend {eng.info()['backend']}, "
            f"prompts of {', '.join(map(str, lengths))} tokens, answers of "
            f"{', '.join(map(str, news))} tokens, {mode}")
        res = run_long_prompt_bench(eng, prompt_lengths=lengths, new_tokens=news, raw=raw,
                                    sampling=sampling, repeats=args.repeats, log=log)
        res.update(prompt_mode="raw" if raw else "chat", target=eng.target.path.name,
                   draft=eng.draft.path.name if eng.draft else None)
    print(json.dumps(res) if args.json else format_long_prompt_report(res) + f"\n{mode}")
    return 0


def prompt_mode(raw: bool, asked: bool) -> str:
    """How the bench sends its prompts, in words."""
    if not raw:
        return "chat mode: each prompt is a user message in the model's chat template"
    why = "--raw" if asked else "the model has no chat template"
    return f"raw mode: each prompt is continued as-is ({why})"


def build_bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure every decoding configuration side by side")
    p.add_argument("--prompts", choices=sorted([*PROMPT_SETS, "tasks"]), default="default",
                   help="built-in prompt set (default: default); tasks: seven kinds of "
                        "request (chat, translation, summarisation, qa, math, long_passage, "
                        "code_edit), each answer timed whole, prompt included, from cold "
                        "caches")
    p.add_argument("--tasks", metavar="T[,T…]",
                   help="with --prompts tasks: only these tasks (default: all seven)")
    p.add_argument("--max-tokens", "-n", type=max_tokens_option(), default=None,
                   help="tokens per answer (default 128; 64 with --prompts tasks, where "
                        "code_edit's answers, the whole file back, have budgets of their own, "
                        "capped by -n only when it is given)")
    p.add_argument("--repeats", type=int_option("--repeats", 1), default=1)
    p.add_argument("--ks", help="pinned draft lengths to compare (default 2,4,8,16; 2,4,8 with "
                               "--prompts tasks)")
    p.add_argument("--temperature", type=float, default=None,
                   help="the runs' temperature (default 0: greedy; with --sampler, its own)")
    p.add_argument("--sampler", choices=list(APP_SAMPLERS),
                   help="an app's sampler: llama.cpp's defaults, Ollama's (0.8, top_k 40, "
                        "top_p 0.9, repeat penalty 1.1 over 64), Qwen's (0.7, top_k 20, "
                        "top_p 0.8, repetition 1.05) or OpenAI clients' (1.0)")
    p.add_argument("--seed", type=int, default=None,
                   help="with --temperature above 0: the seeded runs' seed (each prompt adds "
                        "its index; default 1234); unseeded runs are measured beside them")
    p.add_argument("--raw", action="store_true", help="no chat template")
    p.add_argument("--no-peers", action="store_true",
                   help="skip llama-cpp-python's own plain and prompt-lookup decoding")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="compare an idle machine with N busy processes (started and ended "
                        "by the bench), for every thread setting, plain and speculative")
    p.add_argument("--prompt-lengths", metavar="L[,L…]",
                   help="sweep prompt length instead: prompts of these many tokens (passages "
                        "of Python's documentation), each decoded plainly and speculatively "
                        "from cold caches; time to first token, decoding speed and the whole "
                        "answer's time, side by side")
    p.add_argument("--new-tokens", metavar="N[,N…]",
                   help="with --prompt-lengths: the answer lengths (default 96,256,512)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw speedup against draft length")
    add_model_args(p)
    p.set_defaults(func=cmd_bench)


# ---------------------------------------------------------------------------------------------
# edgespec calibrate


def cmd_calibrate(args) -> int:
    from .. import paths
    from ..drafting import CostCache, calibrate
    # Loaded with a pinned draft length: nothing is measured while loading.
    with load_engine(args, adaptive=False, recalibrate=False) as eng:
        draft = eng.draft if eng.spec.uses_draft_model else None
        progress = Progress()
        cal = calibrate(eng.target, draft, head=eng.draft_head, progress=progress)
        progress.done()
        costs = cal.costs
        sizes = ", ".join(f"{n}: {1000 * v:.1f}" for n, v in sorted(costs.target.items()))
        print(f"target {eng.target.path.name}, {eng.target.n_threads} threads: ms per pass by "
              f"batch size [{sizes}]")
        if draft is not None:
            print(f"draft {draft.path.name}: {1000 * costs.draft:.1f} ms per token "
                  f"({costs.draft / costs.pass_seconds(1):.2f} of a target token)")
        if cal.quiet:
            CostCache(eng.target, draft, eng.draft_head).save(costs, "calibration")
            print(f"kept in {paths.calibration_file()} (measured again after "
                  "30 days, or with --recalibrate)")
        else:
            print(f"not kept: the machine looked busy while measuring ({cal.seconds:.1f} s); "
                  "run `edgespec calibrate` again when it is quiet")
    return 0


def build_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure the models' speed for the cost model, again",
                       description="Measure what a target pass and a draft step cost on this "
                       "machine (the cost model that picks draft lengths uses it) and keep it "
                       "unless the machine looked busy meanwhile. Runs otherwise happen once "
                       "per model file and setting, on first use.")
    add_model_args(p)
    p.set_defaults(func=cmd_calibrate)
