#!/usr/bin/env python3
"""What the draft loses by seeing only a window of a long prompt: acceptance by window size.

    python scripts/bench_draft_window.py [--pair gemma3-270m] [--lengths 1500,3000]
        [--windows 64,128,256,512,1024] [--prompts 3] [--answer 64]

For each prompt (passages of Python's own documentation, ``pydoc_data``, continued as raw
text), the target writes its greedy answer once. The draft then reads the prompt through a
window — its first ``--head`` tokens and its last N — or whole, and is teacher-forced along the
target's answer: at every position the draft's greedy choice is compared with the target's
(greedy acceptance, α) and, at T = 0.8, the overlap Σ min(p, q) of the two warped
distributions is measured (the acceptance of a sampled draft token). Printed per window: α,
the overlap, both relative to the whole prompt, the expected tokens per target pass of a
4-token draft at that α, and what reading the window cost the draft (seconds). The draft's
context affects speed only: whichever window, the output is the target's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgespec import Engine, SamplingParams
from edgespec.registry import resolve_pair
from edgespec.sampling import warp

GREEDY = SamplingParams(temperature=0.0)
WARM = SamplingParams(temperature=0.8)


def passages() -> list[str]:
    """The Python documentation's topics, longest first (natural prose, on every machine)."""
    from pydoc_data.topics import topics
    return sorted(topics.values(), key=len, reverse=True)


def prompt_of(engine: Engine, texts: list[str], start: int, n_tokens: int) -> str:
    """About ``n_tokens`` tokens of documentation, from passage ``start`` on."""
    text, i = "", start
    while len(engine.tokenize(text)) < n_tokens:
        text += texts[i % len(texts)] + "\n\n"
        i += 1
    cut = len(text)
    for _ in range(4):          # the length in characters that gives n_tokens
        cut = int(cut * n_tokens / len(engine.tokenize(text[:cut])))
    return text[:cut]


def rows(model, tokens: list[int]) -> np.ndarray:
    """Logit rows after each of ``tokens`` (the model's cache is extended by them)."""
    step = max(1, min(model.n_outputs_max, model.n_batch))
    out = [model.eval(tokens[i:i + step], len(tokens[i:i + step])).copy()   # (a view of
           for i in range(0, len(tokens), step)]                              # llama's rows)
    return np.concatenate(out)


def overlap(p_row: np.ndarray, q_row: np.ndarray) -> float:
    p, q = warp(p_row, WARM), warp(q_row, WARM)
    dp = np.zeros(p_row.shape[0])
    dq = np.zeros(p_row.shape[0])
    dp[p.ids if p.ids is not None else slice(None)] = p.probs
    dq[q.ids if q.ids is not None else slice(None)] = q.probs
    return float(np.minimum(dp, dq).sum())


def tokens_per_pass(alpha: float, k: int = 4) -> float:
    return float(sum(alpha ** i for i in range(k + 1)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="gemma3-270m")
    ap.add_argument("--lengths", default="1500,3000")
    ap.add_argument("--windows", default="64,128,256,512,1024")
    ap.add_argument("--head", type=int, default=32, help="first tokens always kept")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--answer", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    windows = [int(x) for x in args.windows.split(",")] + [0]      # 0: the whole prompt
    target_path, draft_path = resolve_pair(args.pair)
    eng = Engine.load(target_path, draft_path, n_ctx=max(lengths) + args.answer + 64,
                      n_threads=args.threads, cache_ram=0)
    tgt, dft = eng.target, eng.draft
    texts = passages()
    print(f"{args.pair}: target {tgt.path.name}, draft {dft.path.name}; head {args.head} "
          f"tokens; answers of {args.answer} tokens (the target's greedy)")
    for n in lengths:
        results = {w: {"alpha": [], "overlap": [], "seconds": []} for w in windows}
        for j in range(args.prompts):
            text = prompt_of(eng, texts, 7 * j + n, n)
            prompt = eng.prompt_tokens(text, raw=True)
            out = eng.generate(text, max_tokens=args.answer, sampling=GREEDY, raw=True,
                               speculative=False)
            answer = out.tokens
            if len(answer) < 8:
                continue
            size = len(prompt)
            tgt.truncate(0)
            p_rows = rows(tgt, prompt + answer)[len(prompt) - 1:-1]
            for w in windows:
                view = prompt if not w or w + args.head >= size else \
                    prompt[:args.head] + prompt[size - w:]
                dft.truncate(0)
                t0 = time.perf_counter()
                for i in range(0, len(view) - 1, dft.n_batch):
                    dft.eval(view[i:min(i + dft.n_batch, len(view) - 1)], 0)
                seconds = time.perf_counter() - t0
                q_rows = rows(dft, [view[-1]] + answer[:-1])
                agree = np.argmax(q_rows, axis=1) == np.asarray(answer)
                results[w]["alpha"].append(float(agree.mean()))
                results[w]["overlap"].append(statistics.fmean(
                    overlap(p, q) for p, q in zip(p_rows, q_rows)))
                results[w]["seconds"].append(seconds)
        full = results[0]
        a_full = statistics.fmean(full["alpha"])
        o_full = statistics.fmean(full["overlap"])
        print(f"\nprompt {n} tokens ({len(full['alpha'])} prompts)")
        print(f"{'window':>8} {'α greedy':>9} {'÷ whole':>8} {'Σmin T=.8':>10} {'÷ whole':>8} "
              f"{'tok/pass K=4':>13} {'draft reads':>12}")
        for w in windows:
            r = results[w]
            a, o = statistics.fmean(r["alpha"]), statistics.fmean(r["overlap"])
            name = "whole" if not w else f"{args.head}+{w}"
            print(f"{name:>8} {a:9.3f} {a / a_full:8.3f} {o:10.3f} {o / o_full:8.3f} "
                  f"{tokens_per_pass(a):13.2f} {statistics.fmean(r['seconds']):11.2f}s")
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
