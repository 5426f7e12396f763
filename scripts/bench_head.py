"""The draft's reduced output layer: BLAS on one thread against einsum, side by side.

    python scripts/bench_head.py [--pair gemma3-270m] [--temperature 0.8] [-n 96] [--rounds 2]

One Engine (model drafter), the bench's default prompts, each generated once with each way of
computing the subset's logits, the order alternating from round to round. Prints tokens per
second, milliseconds of head per drafted token and the head's share of decoding for each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="gemma3-270m")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    from edgespec import Engine, SamplingParams
    from edgespec.bench.prompts import PROMPT_SETS
    from edgespec.drafting import reduced_head as rh

    eng = Engine.load(pair=args.pair, drafter="model")
    head = eng.draft_head
    if head is None:
        sys.exit("this pair's draft has no reduced head (a small vocabulary, or a GPU)")
    libs = rh.OneThreadBlas.libraries()
    if not libs:
        sys.exit("numpy's BLAS thread count cannot be set here: only einsum is available")
    sampling = SamplingParams(temperature=args.temperature)
    totals = {"blas": [0, 0.0, 0.0, 0], "einsum": [0, 0.0, 0.0, 0]}
    try:
        for r in range(args.rounds):
            for prompt in PROMPT_SETS["default"]:
                for mode in (("blas", "einsum") if r % 2 == 0 else ("einsum", "blas")):
                    rh.OneThreadBlas._libs = libs if mode == "blas" else []
                    before = head.seconds
                    s = eng.generate(prompt, max_tokens=args.max_tokens, sampling=sampling,
                                     raw=True).stats
                    t = totals[mode]
                    t[0] += s.completion_tokens
                    t[1] += s.decode_seconds
                    t[2] += head.seconds - before
                    t[3] += s.drafted
    finally:
        rh.OneThreadBlas._libs = libs
        eng.close()
    for mode, (tokens, seconds, head_s, drafted) in totals.items():
        per_token = 1000 * head_s / max(drafted, 1)
        print(f"{mode:7} {tokens / seconds:6.1f} tok/s   head {per_token:5.2f} "
              f"ms per drafted token   {100 * head_s / seconds:4.1f}% of decoding")
    b, e = totals["blas"], totals["einsum"]
    print(f"blas / einsum: {(b[0] / b[1]) / (e[0] / e[1]):.3f}x tok/s")


if __name__ == "__main__":
    main()
