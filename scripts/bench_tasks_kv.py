"""The draft taking the target's KV cells against reading the prompt itself, side by side.

    python scripts/bench_tasks_kv.py [--pair gemma3-270m] [--tasks chat,summarisation] [-n 64]

One Engine; for every prompt of the task bench's sets (edgespec/bench/tasks.py): plain
decoding, the default drafter with the cells copied, and the default drafter reading the
prompt, the order alternating from prompt to prompt; cold caches and a new suffix index for
every generation; whole-answer time. Prints each task's speed-up over plain (geomean of its
prompts) both ways, and where a near tie of the target's logits parted an answer.
"""

from __future__ import annotations

import statistics

from task_ab import answer, interleaved, task_args

from edgespec import Engine

# name: (speculative, the draft takes the target's cells)
VARIANTS = {"plain": (False, True), "copied": (True, True), "read": (True, False)}


def main() -> None:
    args = task_args(__doc__, "gemma3-270m")
    eng = Engine.load(pair=args.pair, n_ctx=4096)
    if not eng._drafting.shares_kv:
        raise SystemExit("this pair's draft is not the target's network: nothing to compare")

    def run(prompt, name: str):
        speculative, share = VARIANTS[name]
        eng._drafting.share_target_cells(share)      # (the drafters are built again with it)
        seconds, result = answer(eng, prompt, args, speculative)
        return seconds, result.tokens

    tasks = args.tasks.split(",")
    ratios: dict = {}
    try:
        for task, outs in interleaved(args, list(VARIANTS), run):
            for i, out in enumerate(outs):
                if not out["copied"][1] == out["plain"][1] == out["read"][1]:
                    print(f"  {task} {i}: a near tie of the target's logits parted an answer")
                for name in ("copied", "read"):
                    ratios.setdefault((task, name), []).append(out["plain"][0] / out[name][0])
            print(f"{task:14} copied {statistics.geometric_mean(ratios[task, 'copied']):.2f}x"
                  f"   read {statistics.geometric_mean(ratios[task, 'read']):.2f}x", flush=True)
    finally:
        eng.close()
    for name in ("copied", "read"):
        overall = statistics.geometric_mean(
            [statistics.geometric_mean(ratios[t, name]) for t in tasks])
        print(f"geomean {name}: {overall:.2f}x plain")


if __name__ == "__main__":
    main()
