"""Several clients at once on one Engine: aggregate tokens per second and the slowest first
token, against the same requests one after another.

For each stream count S (``--streams 1,2,4,8``) it runs S prompts (greedy, ``-n`` tokens)
three ways, interleaved and in rotating order per repeat: one after another with speculation
(what one-at-a-time serving gives: the reference), all at once without speculation (plain
batched decoding), all at once with speculation (the default). Every run starts on an Engine
loaded with ``--parallel`` lanes; prompts are distinct per stream and per repeat, and each
run's prompts are new to the prompt cache (a prefix of its own).

    python scripts/bench_parallel.py --pair gemma3-270m --streams 1,2,4,8 -n 96 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from edgespec import Engine, SamplingParams
from edgespec.bench.prompts import PROMPT_SETS

GREEDY = SamplingParams(temperature=0.0)


def prompts(k: int, tag: int) -> list[str]:
    pool = [p for name in ("default", "chat", "code") for p in PROMPT_SETS[name]]
    return [f"({tag}.{i}) {pool[(tag * 7 + i) % len(pool)]}" for i in range(k)]


def one_after_another(eng: Engine, ps: list[str], n: int, raw: bool) -> dict:
    t0 = time.perf_counter()
    outs = [eng.generate(p, raw=raw, max_tokens=n, sampling=GREEDY) for p in ps]
    wall = time.perf_counter() - t0
    return {"wall": wall, "tokens": sum(len(o.tokens) for o in outs),
            "ttft": [o.stats.first_token_seconds for o in outs], "outs": outs}


def at_once(eng: Engine, ps: list[str], n: int, raw: bool, speculative: bool) -> dict:
    first, outs = {}, {}
    start = threading.Barrier(len(ps) + 1)

    def run(i: int, p: str) -> None:
        start.wait()
        t = time.perf_counter()
        s = eng.stream(p, raw=raw, max_tokens=n, sampling=GREEDY, speculative=speculative)
        for j, _ in enumerate(s):
            if j == 0:
                first[i] = time.perf_counter() - t
        first.setdefault(i, time.perf_counter() - t)       # an answer that ended at once
        outs[i] = s.result
    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(ps)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"wall": wall, "tokens": sum(len(o.tokens) for o in outs.values()),
            "ttft": list(first.values()), "outs": [outs[i] for i in range(len(ps))]}


def tie_gap(eng: Engine, prompt: str, raw: bool, a: list, b: list) -> float:
    """The target's logit gap between the two answers' tokens where they first differ (a
    fresh one-sequence load, one pass: the reference numerics)."""
    from edgespec.backend.model import LlamaModel
    from edgespec.config import ModelConfig
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if j >= min(len(a), len(b)):
        return float("inf")         # one ended where the other went on: not a tie of logits
    m = LlamaModel(ModelConfig(eng.target.path, n_ctx=2048))
    try:
        row = m.eval(eng.prompt_tokens(prompt, raw=raw) + a[:j], 1)[0]
        return abs(float(row[a[j]]) - float(row[b[j]]))
    finally:
        m.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="gemma3-270m")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ctx-size", type=int, default=1024)
    ap.add_argument("--chat", action="store_true",
                    help="each prompt as a user message in the chat template (default: raw)")
    ap.add_argument("--near-tie", type=float, default=0.02,
                    help="a batched answer that differs from its alone answer where the "
                         "target's logit gap is below this is counted as a near-tie "
                         "(batch numerics), not a mismatch")
    ap.add_argument("--threads", type=int, default=2,
                    help="pinned: a benchmark measures the code, not the thread governor")
    args = ap.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    raw = not args.chat
    kw = dict(target=args.target, draft=args.draft) if args.target else dict(pair=args.pair)
    eng = Engine.load(**kw, n_ctx=args.ctx_size, parallel=max(counts), n_threads=args.threads)
    eng.generate("Warm up.", raw=True, max_tokens=8, sampling=GREEDY)
    print(f"{args.target or args.pair}: {max(counts)} lanes, {args.n} tokens, greedy, "
          f"{args.repeats} repeats (medians)")
    print(f"{'streams':>7} {'one by one':>11} {'plain batch':>12} {'spec batch':>11} "
          f"{'spec/1by1':>10} {'spec/plain':>11} {'ttft lone':>10} {'ttft max':>9} "
          f"{'same':>5}")
    tag = 0
    for k in counts:
        rates = {"seq": [], "plain": [], "spec": []}
        lone, worst, same, ties = [], [], 0, []
        for r in range(args.repeats):
            order = ["seq", "plain", "spec"]
            order = order[r % 3:] + order[:r % 3]
            ref = None
            for how in order:
                tag += 1
                ps = prompts(k, tag)
                res = (one_after_another(eng, ps, args.n, raw) if how == "seq" else
                       at_once(eng, ps, args.n, raw, speculative=how == "spec"))
                rates[how].append(res["tokens"] / res["wall"])
                if how == "seq":
                    lone.append(min(res["ttft"]))
                if how == "spec":
                    worst.append(max(res["ttft"]))
                    # the same prompts again alone: batched greedy answers equal them
                    ref = one_after_another(eng, ps, args.n, raw)["outs"]
                    for p, a, b in zip(ps, ref, res["outs"]):
                        if a.tokens == b.tokens:
                            same += 1
                        else:
                            ties.append(tie_gap(eng, p, raw, a.tokens, b.tokens))
        med = {h: statistics.median(v) for h, v in rates.items()}
        print(f"{k:>7} {med['seq']:>9.1f}/s {med['plain']:>10.1f}/s {med['spec']:>9.1f}/s "
              f"{med['spec'] / med['seq']:>9.2f}x {med['spec'] / med['plain']:>10.2f}x "
              f"{statistics.median(lone):>9.3f}s {statistics.median(worst):>8.3f}s "
              f"{same:>2}/{k * args.repeats}", flush=True)
        if ties:
            near = sum(g < args.near_tie for g in ties)
            print(f"        differing answers: {near} near-ties, {len(ties) - near} "
                  f"mismatches (logit gaps {', '.join(f'{g:.3g}' for g in ties)})",
                  flush=True)
    eng.close()


if __name__ == "__main__":
    main()
