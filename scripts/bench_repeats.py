"""The same prompts asked again in fresh conversations (an app that regenerates, an agent that
repeats a step): whole-answer time against plain decoding, the first ask and the later ones.

No prompt cache (``cache_ram=0``), and the other prompts come in between, so the one lane's
KV cache never holds the prompt asked again: what speeds the later asks is the suffix index
of earlier requests (edgespec/drafting/suffix.py). Plain decoding is measured once per prompt
(it does not change between asks); every answer is compared with plain's.

    python scripts/bench_repeats.py --pair smollm2-135m -n 64 --asks 3
"""

from __future__ import annotations

import argparse
import statistics
import time

from edgespec import Engine, SamplingParams
from edgespec.bench.prompts import PROMPT_SETS

GREEDY = SamplingParams(temperature=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--asks", type=int, default=3)
    ap.add_argument("--raw", action="store_true", help="no chat template")
    ap.add_argument("--no-suffix-index", action="store_true",
                    help="the control: n-gram drafts from the context only")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    prompts = [p for s in ("chat", "code", "summarise") for p in PROMPT_SETS[s]][:6]
    eng = Engine.load(pair=args.pair, n_ctx=2048, cache_ram=0, n_threads=args.threads,
                      suffix=not args.no_suffix_index)

    def timed(p: str, speculative: bool):
        t0 = time.perf_counter()
        g = eng.generate(p, raw=args.raw, max_tokens=args.n, sampling=GREEDY,
                         speculative=speculative)
        return time.perf_counter() - t0, g

    plain, asks = {}, [{} for _ in range(args.asks)]
    for r in range(args.asks):
        for p in prompts:
            if r == 0:
                plain[p] = timed(p, False)
            asks[r][p] = timed(p, True)
    for r, ask in enumerate(asks):
        ratios = [plain[p][0] / ask[p][0] for p in prompts]
        made = sum(len(ask[p][1].tokens) for p in prompts)
        accepted = sum(ask[p][1].stats.accepted for p in prompts)
        same = sum(ask[p][1].tokens == plain[p][1].tokens for p in prompts)
        print(f"ask {r + 1}: speed-up per prompt {' '.join(f'{x:.2f}' for x in ratios)}; "
              f"geomean {statistics.geometric_mean(ratios):.2f}x; accepted drafts per token "
              f"{accepted / made:.2f}; equal to plain {same}/{len(prompts)}", flush=True)
    eng.close()


if __name__ == "__main__":
    main()
