#!/usr/bin/env python3
"""What a verify pass of n rows costs on this machine: n copies of one token (what calibration
measured until issue 55) against n tokens of real text, after an empty context and after a
prompt, side by side in one run.

    python scripts/bench_rows.py --model T.gguf [--sizes 1,2,4,8,12,16] [--context 400]
                                 [--reps 5] [--threads 2]

Every configuration is timed once per round, the rounds interleaving them (a slow spell of the
machine lands on all alike); the median of ``--reps`` rounds is printed, in milliseconds and
as a multiple of the one-row pass of the same kind. The context's and the rows' text is a
Python file of the standard library (held out: no prompt set of the benchmarks).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

from edgespec.backend import LlamaModel
from edgespec.config import ModelConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--sizes", default="1,2,4,8,12,16")
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    import json.decoder as source
    text = inspect.getsource(source)
    m = LlamaModel(ModelConfig(args.model, n_ctx=2048, n_threads=args.threads,
                               n_outputs_max=max(sizes)))
    real = m.vocabulary.tokenize(text, add_special=False)
    assert len(real) >= args.context + 2 * max(sizes), "the text is too short"
    prefix, rows = real[:args.context], real[args.context:]
    bos = m.vocab.bos if m.vocab.bos >= 0 else real[0]
    kinds = {"copies": ([], lambda n: [bos] * n), "text": ([], lambda n: rows[:n]),
             f"text after {args.context}": (prefix, lambda n: rows[:n])}
    m.eval(real[:max(sizes)], max(sizes))       # warm-up: the weights paged in
    m.truncate(0)
    got = {(k, n): [] for k in kinds for n in sizes}
    for r in range(args.reps):
        for name, (context, tokens) in kinds.items():
            m.truncate(0)
            if context:
                m.eval(context, 0)
            for n in sizes if r % 2 == 0 else sizes[::-1]:
                t0 = time.perf_counter()
                m.eval(tokens(n), n)
                got[name, n].append(time.perf_counter() - t0)
                m.truncate(len(context))
    print(f"{args.model}: median of {args.reps} rounds, ms (× its kind's one-row pass)")
    print(f"{'rows':>5} " + " ".join(f"{k:>22}" for k in kinds))
    for n in sizes:
        cells = []
        for k in kinds:
            ms = statistics.median(got[k, n]) * 1e3
            one = statistics.median(got[k, sizes[0]]) * 1e3
            cells.append(f"{ms:9.1f} ({ms / one:5.2f}×)")
        print(f"{n:>5} " + " ".join(f"{c:>22}" for c in cells))
    ratio = [statistics.median(got["text", n]) / statistics.median(got["copies", n])
             for n in sizes]
    print("text / copies per size: " + ", ".join(f"{n}: {x:.2f}" for n, x in zip(sizes, ratio)))
    m.close()


if __name__ == "__main__":
    main()
