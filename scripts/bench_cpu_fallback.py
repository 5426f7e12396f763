#!/usr/bin/env python3
"""The preflight's fallback against a llama.cpp build without AMX, side by side on one pair.

    python scripts/bench_cpu_fallback.py --other-python OTHER_VENV/bin/python \\
        [--pair gemma3-270m] [--rounds 3] [-n 48] [--ks 8]

On a CPU whose AMX unit faults, a native build of llama-cpp-python runs with llama.cpp's extra
CPU buffer types off (edgespec/backend/preflight.py). This runs `edgespec bench` (greedy,
no peers) alternately with this environment's build and with another environment's build
(one made without AMX, e.g. CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON …", which keeps the
repacked weights), rounds interleaved, and prints each configuration's tokens/s per build and
their ratio (sums of tokens over sums of seconds, over all rounds). Each bench loads, measures
and decodes in its own process, so a slow stretch of the machine spoils one cell, not a side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def bench(python: str, args, extra: str) -> dict:
    cmd = [python, "-m", "edgespec", "bench", "--pair", args.pair, "-n", str(args.max_tokens),
           "--ks", args.ks, "--no-peers", "--json", "--cpu-extra-buffers", extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["configs"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--other-python", required=True,
                    help="the Python of an environment with another llama-cpp-python build")
    ap.add_argument("--pair", default="gemma3-270m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", "-n", type=int, default=48)
    ap.add_argument("--ks", default="8")
    ap.add_argument("--this-extra", default="auto",
                    help="--cpu-extra-buffers for this build (default auto: the preflight)")
    ap.add_argument("--other-extra", default="on",
                    help="--cpu-extra-buffers for the other build (default on)")
    args = ap.parse_args()
    sides = {"this build": (sys.executable, args.this_extra),
             "other build": (args.other_python, args.other_extra)}
    totals: dict = {}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            python, extra = sides[side]
            for name, c in bench(python, args, extra).items():
                tok, sec = totals.setdefault((side, name), [0, 0.0])[:2]
                totals[(side, name)] = [tok + c["tokens"],
                                        sec + c["tokens"] / c["tokens_per_second"]]
            print(f"round {r + 1}: {side} done", file=sys.stderr, flush=True)
    names = dict.fromkeys(n for _, n in totals)
    print(f"{args.pair}, greedy, {args.rounds} rounds interleaved, -n {args.max_tokens}")
    print(f"{'config':<10} {'this build':>12} {'other build':>12} {'this/other':>11}")
    for name in names:
        a = totals[("this build", name)]
        b = totals[("other build", name)]
        ta, tb = a[0] / a[1], b[0] / b[1]
        print(f"{name:<10} {ta:>8.1f} t/s {tb:>8.1f} t/s {ta / tb:>10.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
