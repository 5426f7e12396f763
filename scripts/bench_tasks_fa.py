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

import statistics

from task_ab import answer, interleaved, task_args

from edgespec import Engine


def main() -> None:
    args = task_args(__doc__, "smollm2-135m")
    engines = {fa: Engine.load(pair=args.pair, n_ctx=4096, flash_attn=fa) for fa in ("off", "on")}

    def run(prompt, variant: tuple):
        fa, speculative = variant
        return answer(engines[fa], prompt, args, speculative)[0]

    variants = [(fa, spec) for fa in ("off", "on") for spec in (False, True)]
    times: dict = {}
    try:
        for task, outs in interleaved(args, variants, run):
            for out in outs:
                for fa, spec in variants:
                    times.setdefault((task, fa, spec), []).append(out[fa, spec])
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
