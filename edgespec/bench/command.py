"""``edgespec bench``: parse the options, load the pair, run, report."""

from __future__ import annotations

import json

from ..config import SamplingParams
from ..shell import UsageError, add_model_args, load_engine, status
from .prompts import PROMPT_SETS
from .report import format_report, plot, require_pyplot
from .runner import run_bench


def cmd_bench(args) -> int:
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    try:
        ks = [int(k) for k in args.ks.split(",") if k]
    except ValueError:
        raise UsageError(f"--ks must be comma-separated integers, got {args.ks!r}") from None
    if args.plot:
        require_pyplot()  # fail before an hour of benchmarking, not after
    with load_engine(args) as eng:
        raw = args.raw or eng.template.is_fallback
        prompts = PROMPT_SETS[args.prompts]
        log = (lambda s: None) if args.json else status
        log(f"target {eng.target.path.name}, draft "
            f"{eng.draft.path.name if eng.draft else '-'}, backend {eng.info()['backend']}, "
            f"{len(prompts)} '{args.prompts}' prompts, {'raw' if raw else 'chat'} mode")
        res = run_bench(eng, prompts, max_tokens=args.max_tokens, sampling=sampling, raw=raw,
                        ks=ks, repeats=args.repeats, peers=not args.no_peers, log=log)
    if args.plot:
        plot(res, args.plot)
    print(json.dumps(res) if args.json else format_report(res))
    return 0


def build_bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure every decoding configuration side by side")
    p.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="default",
                   help="built-in prompt set (default: default)")
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--ks", default="2,4,8,16", help="pinned draft lengths to compare")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None,
                   help="seed for sampled runs (a seeded sampled request pins the draft length)")
    p.add_argument("--raw", action="store_true", help="no chat template")
    p.add_argument("--no-peers", action="store_true",
                   help="skip llama-cpp-python's own plain and prompt-lookup decoding")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw speedup against draft length")
    add_model_args(p)
    p.set_defaults(func=cmd_bench)
