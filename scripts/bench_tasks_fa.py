"""llama.cpp's flash attention on and off, side by side on the task bench's prompts.

    python scripts/bench_tasks_fa.py [--pair smollm2-135m] [--tasks chat,long_passage] [-n 64]

Two Engines of one pair in one process, one with flash attention off (edgespec's default where
llama.cpp has no GPU) and one with it on (llama.cpp's own default); for every prompt of the
task bench's sets (edgespec/bench/tasks.py): plain and default-speculative decoding on each,
the order alternating from prompt to prompt, cold caches and a new suffix index for every
generation, whole-answer time. Prints each task's plain time both ways and the speculative
speed-up over the plain decoding of the same Engine (geomean of the task's prompts), and the
speculative speed-up with flash attention off over plain with it on (what a user of llama.cpp's
default gains).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgespec import Engine, SamplingParams
from edgespec.bench.long_prompts import cold
from edgespec.bench.tasks import task_prompts
from edgespec.request import GenerationRequest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--tasks", default="chat,translation,summarisation,qa,math,long_passage")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    args = ap.parse_args()
    raw = args.pair.startswith("gemma")         # (Gemma-3-270M has no chat template)
    engines = {fa: Engine.load(pair=args.pair, n_ctx=4096, flash_attn=fa) for fa in ("off", "on")}
    keys = itertools.count()
    greedy = SamplingParams(temperature=0.0)

    def run(prompt, fa: str, speculative: bool):
        eng = engines[fa]
        cold(eng)
        req = GenerationRequest(prompt, max_tokens=args.max_tokens, sampling=greedy, raw=raw,
                                speculative=speculative, index_key=f"fa-bench-{next(keys)}")
        t0 = time.perf_counter()
        stream = eng.submit(req)
        for _ in stream:
            pass
        return time.perf_counter() - t0

    tasks = args.tasks.split(",")
    prompts = task_prompts()
    times: dict = {}
    try:
        for task in tasks:
            for i, prompt in enumerate(prompts[task]):
                order = [(fa, spec) for fa in ("off", "on") for spec in (False, True)]
                for fa, spec in (order if i % 2 == 0 else order[::-1]):
                    times.setdefault((task, fa, spec), []).append(run(prompt, fa, spec))
            row = {}
            for fa in ("off", "on"):
                plain, spec = times[task, fa, False], times[task, fa, True]
                row[fa] = statistics.geometric_mean([p / s for p, s in zip(plain, spec)])
            cross = statistics.geometric_mean(
                [p / s for p, s in zip(times[task, "on", False], times[task, "off", True])])
            print(f"{task:14} plain s off {statistics.mean(times[task, 'off', False]):.2f} "
                  f"on {statistics.mean(times[task, 'on', False]):.2f}   speculative/plain: "
                  f"off {row['off']:.2f}x  on {row['on']:.2f}x   off-spec/on-plain "
                  f"{cross:.2f}x", flush=True)
    finally:
        for eng in engines.values():
            eng.close()


if __name__ == "__main__":
    main()
