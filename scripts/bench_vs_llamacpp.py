#!/usr/bin/env python3
"""edgespec against llama.cpp's own C++ `llama-speculative-simple`, same pair, same prompts.

    python scripts/bench_vs_llamacpp.py \
        --binary .cache/llama.cpp-build/bin/llama-speculative-simple \
        --target T.gguf --draft D.gguf [--n-max 3,8,16] [-n 128] [--repeats 2]

Build the binary with scripts/build_llama_speculative.sh. Runs are interleaved (edgespec, then
the C++ example at each --spec-draft-n-max, rotating per prompt) and both report decoding
speed only (prompt processing excluded), greedy, 2 threads unless --threads says otherwise.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from edgespec import Engine, SamplingParams
from edgespec.bench.prompts import PROMPT_SETS
from edgespec.config import default_threads

DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")


def cpp_extra_args() -> list:
    """``--no-repack`` where edgespec's preflight found that llama.cpp's extra CPU kernels
    (AMX, repacked weights) kill the process on this CPU: the binary is built from the same
    llama.cpp sources, natively, for the same CPU (it dies the same way, exit 132)."""
    from edgespec.backend.preflight import verdict
    return ["--no-repack"] if verdict().faults else []


def run_cpp(binary, target, draft, prompt, n, n_max, threads):
    proc = subprocess.run(
        [binary, "-m", target, "-md", draft, "-p", prompt, "-n", str(n), "--temp", "0",
         "--spec-type", "draft-simple", "--spec-draft-n-max", str(n_max), "-t", str(threads),
         "-c", "4096", *cpp_extra_args()], capture_output=True, text=True, timeout=900)
    m = DECODED.search(proc.stderr)
    if not m:
        sys.exit(f"error: could not parse {binary} output:\n{proc.stderr[-2000:]}")
    return int(m.group(1)), float(m.group(2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--n-max", default="3,8,16")
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", default="default", choices=sorted(PROMPT_SETS))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=default_threads())
    args = ap.parse_args()
    n_maxes = [int(x) for x in args.n_max.split(",")]
    names = ["edgespec default", "edgespec plain"] + [f"llama.cpp n-max {k}" for k in n_maxes]
    tot = {k: [0, 0.0] for k in names}
    greedy = SamplingParams(temperature=0.0)
    with Engine.load(target=args.target, draft=args.draft, n_threads=args.threads) as eng:
        prompts = PROMPT_SETS[args.prompts]
        for r in range(args.repeats):
            for i, prompt in enumerate(prompts):
                order = names[(i + r) % len(names):] + names[:(i + r) % len(names)]
                for name in order:
                    if name.startswith("edgespec"):
                        out = eng.generate(prompt, max_tokens=args.max_tokens, sampling=greedy,
                                           raw=True, speculative=name.endswith("default"))
                        n, s = out.stats.completion_tokens, out.stats.decode_seconds
                    else:
                        n, s = run_cpp(args.binary, args.target, args.draft, prompt,
                                       args.max_tokens, int(name.split()[-1]), args.threads)
                    tot[name][0] += n
                    tot[name][1] += s
                print(f"after prompt {i + 1}/{len(prompts)} (running totals): " + ", ".join(
                    f"{k} {v[0] / v[1]:.1f}" for k, v in tot.items() if v[1]), file=sys.stderr)
    print(f"{'':22}{'tok/s':>8}")
    for k, (n, s) in tot.items():
        print(f"{k:22}{n / s:8.1f}")
    best_cpp = max(n / s for k, (n, s) in tot.items() if k.startswith("llama.cpp"))
    default = tot["edgespec default"][0] / tot["edgespec default"][1]
    print(f"edgespec default / best llama.cpp: {default / best_cpp:.2f}x")
    mine, plain = (tot[k][0] / tot[k][1] for k in ("edgespec default", "edgespec plain"))
    print(f"edgespec default / edgespec plain: {mine / plain:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
