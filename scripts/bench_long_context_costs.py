"""The draft step's attention term and the appended-match cap, on and off, side by side.

    python scripts/bench_long_context_costs.py [--pair smollm2-135m] [--tasks long_passage]

One Engine; for every prompt of the task bench's sets (edgespec/bench/tasks.py): plain
decoding and the default drafter three ways: as shipped ("both"), with appended n-gram
continuations capped but the draft's step costed at its empty-context figure ("cap"), and
with neither ("neither": every continuation appended up to the loop's bound), the order
alternating from prompt to prompt, cold caches and a new suffix index for every generation.
Prints each task's speed-up over plain (geomean of its prompts), whole answer and decoding
alone. The variants swap two methods in place (what the code did before, decisions.md
#long-context-drafts), so it measures them on the same models and calibration.
"""

from __future__ import annotations

import statistics

from task_ab import answer, interleaved, task_args

from edgespec import Engine
from edgespec.drafting.costs import Costs
from edgespec.drafting.policy import AdaptiveLength

SHIPPED = Costs.draft_step, AdaptiveLength.extension_for
VARIANTS = {
    "plain": SHIPPED,
    "both": SHIPPED,
    "cap": (lambda self: self.draft, SHIPPED[1]),
    "neither": (lambda self: self.draft, lambda self, confidence, room: room),
}


def main() -> None:
    args = task_args(__doc__, "smollm2-135m")
    eng = Engine.load(pair=args.pair, n_ctx=4096)

    def run(prompt, variant: str):
        Costs.draft_step, AdaptiveLength.extension_for = VARIANTS[variant]
        whole, result = answer(eng, prompt, args, variant != "plain")
        return whole, whole - result.stats.prompt_seconds

    tasks = args.tasks.split(",")
    ratios: dict = {}
    names = ["both", "cap", "neither"]
    try:
        for task, outs in interleaved(args, ["plain"] + names, run):
            for out in outs:
                for v in names:
                    for j, part in enumerate(("whole", "decode")):
                        ratios.setdefault((task, v, part), []).append(
                            out["plain"][j] / out[v][j])
            print(f"{task:14}" + "  ".join(
                f"{v} {statistics.geometric_mean(ratios[task, v, 'whole']):.2f}x "
                f"({statistics.geometric_mean(ratios[task, v, 'decode']):.2f}x)" for v in names),
                flush=True)
    finally:
        Costs.draft_step, AdaptiveLength.extension_for = SHIPPED
        eng.close()
    for v in names:
        whole, decode = (statistics.geometric_mean(
            [statistics.geometric_mean(ratios[t, v, part]) for t in tasks])
            for part in ("whole", "decode"))
        print(f"geomean {v}: {whole:.2f}x plain whole answer ({decode:.2f}x decoding)")


if __name__ == "__main__":
    main()
