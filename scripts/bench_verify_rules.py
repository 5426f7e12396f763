#!/usr/bin/env python3
"""Block verification against token-wise rejection sampling, on a real pair.

    python scripts/bench_verify_rules.py [--pair gemma3-270m] [-n 96] [--repeats 3]
        [--prompts-per-set 3] [--k 4] [--temperature 0.8] [--threads N]

1. Decoding. The bench prompt sets ``default`` and ``chat`` (edgespec/bench/prompts.py; the
   first ``--prompts-per-set`` of each) are decoded at ``--temperature`` by Engines over the
   same loaded models, interleaved per prompt with the order rotating: plain target decoding,
   and the draft model (drafter ``model``) under the token-wise rule and under block
   verification, each with the adaptive draft length and with K pinned to ``--k`` (the
   adaptive policy's K reacts to acceptance, so a pinned K compares the rules alone).
   Unseeded runs repeat ``--repeats`` times (a fresh generator each time), so the comparison
   has a standard error. Greedy and seeded (keyed) speculative decoding, and their own plain
   baselines, run once per prompt on the same prompts: their rules do not change. Printed per
   configuration: accepted drafts per target pass, tokens per target pass, acceptance rate
   (accepted / drafted), verify milliseconds per pass, and speed ÷ its plain baseline; then
   block ÷ token tokens per pass.
2. The same drafts under both rules, analytically. One more (untimed) pass over the prompts
   under block verification, adaptive and K = ``--k``, computes at every round the expected
   number of accepted drafts of each rule for that very draft (from the thresholds
   :func:`edgespec.verify.block_thresholds` gives, and Algorithm 1's min(1, p/q)): the rules
   compared without the noise of their uniforms.
3. Overlap offline. Along the plain runs' target-sampled texts, the target's and the draft's
   logits at the same positions (full rows; the runtime's draft on Gemma samples from its
   reduced head's subset of them) give the mean Σ_y min(p(y), q(y)) — the probability that
   one draft token is accepted — with the target at ``--temperature`` and the draft warped at
   its own temperature T_d ∈ ``--draft-temperatures``. Any q is lossless as long as the draft
   token is really drawn from it; this says whether a T_d other than T would be accepted
   more often (the runtime's draft warp is not changed).
4. The rules' cost per round on those real rows: K = 8 consecutive positions, x drawn from
   the draft's q, verified by each rule with the rows warped up front (the rule alone) and
   warped on demand as the loop does (block verification needs rows 0..K-1 of every round,
   the token-wise rule only up to its first rejection). ``--synthetic-cost`` measures the same
   on random logits of a 262,144-entry vocabulary instead, without models (a draft far from
   the target: few acceptances, the token-wise rule's best case), with llama.cpp's default
   cut-offs and with none (dense rows).
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
from edgespec.bench.prompts import PROMPT_SETS
from edgespec.config import SpecConfig, default_threads
from edgespec.registry import resolve_pair
from edgespec.sampling import warp
from edgespec.verify import block_thresholds, speculative_sampling, verify_block


def mean_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    m = statistics.fmean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return m, se


class Tally:
    """One configuration's generations."""

    def __init__(self):
        self.tokens = self.passes = self.drafted = self.accepted = 0
        self.seconds = self.verify_seconds = 0.0
        self.per_gen: list[tuple[float, float]] = []     # (tokens / pass, accepted / pass)

    def add(self, s) -> None:
        self.tokens += s.completion_tokens
        self.passes += s.target_passes
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.seconds += s.decode_seconds
        self.verify_seconds += s.verify_seconds
        if s.target_passes:
            self.per_gen.append((s.completion_tokens / s.target_passes,
                                 s.accepted / s.target_passes))

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def decode_bench(engines: dict, prompts: list, raw: bool, args, log) -> dict:
    T = args.temperature
    unseeded = SamplingParams(temperature=T)
    greedy = SamplingParams(temperature=0.0)
    # name -> (engine key, sampling for prompt i, speculative, repeated)
    configs = {
        "plain": ("block/adaptive", lambda i: unseeded, False, True),
        "token/adaptive": ("token/adaptive", lambda i: unseeded, True, True),
        "block/adaptive": ("block/adaptive", lambda i: unseeded, True, True),
        f"token/K={args.k}": (f"token/K={args.k}", lambda i: unseeded, True, True),
        f"block/K={args.k}": (f"block/K={args.k}", lambda i: unseeded, True, True),
        "plain greedy": ("block/adaptive", lambda i: greedy, False, False),
        "greedy/adaptive": ("block/adaptive", lambda i: greedy, True, False),
        f"greedy/K={args.k}": (f"block/K={args.k}", lambda i: greedy, True, False),
        "plain seeded": ("block/adaptive", lambda i: unseeded.replace(seed=1234 + i), False,
                         False),
        "seeded/adaptive": ("block/adaptive", lambda i: unseeded.replace(seed=1234 + i), True,
                            False),
        f"seeded/K={args.k}": (f"block/K={args.k}", lambda i: unseeded.replace(seed=1234 + i),
                               True, False),
    }
    tallies = {name: Tally() for name in configs}
    texts = []          # (prompt tokens, generated tokens) of the plain unseeded runs
    names = list(configs)
    for r in range(args.repeats):
        for i, prompt in enumerate(prompts):
            shift = (i + r * len(prompts)) % len(names)
            for name in names[shift:] + names[:shift]:
                key, sampling, speculative, repeated = configs[name]
                if not repeated and r > 0:
                    continue
                eng = engines[key]
                g = eng.generate(prompt, max_tokens=args.max_tokens, sampling=sampling(i),
                                 raw=raw, speculative=speculative)
                tallies[name].add(g.stats)
                if name == "plain":
                    texts.append((eng.prompt_tokens(prompt, raw=raw), list(g.tokens)))
            log(f"  repeat {r + 1}/{args.repeats}, prompt {i + 1}/{len(prompts)}: " +
                ", ".join(f"{n} {tallies[n].per_gen[-1][0]:.2f}" for n in names
                          if tallies[n].per_gen and "plain" not in n
                          and (r == 0 or configs[n][3])) + " tokens/pass")
    return {"tallies": tallies, "texts": texts}


def report_decoding(tallies: dict, args) -> None:
    base_of = {"plain": "plain", "plain greedy": "plain greedy", "plain seeded": "plain seeded"}
    print(f"\n{'configuration':18} {'n':>3} {'accepted/pass':>16} {'tokens/pass':>16} "
          f"{'acceptance':>10} {'verify ms/pass':>14} {'tok/s':>7} {'÷ plain':>8}")
    for name, t in tallies.items():
        base = tallies[base_of.get(name, "plain greedy" if name.startswith("greedy") else
                                   "plain seeded" if name.startswith("seeded") else "plain")]
        tpp = mean_se([a for a, _ in t.per_gen])
        app = mean_se([b for _, b in t.per_gen])
        acc = t.accepted / t.drafted if t.drafted else 0.0
        vms = 1000 * t.verify_seconds / t.passes if t.passes else 0.0
        print(f"{name:18} {len(t.per_gen):3d} {app[0]:8.3f} ± {app[1]:5.3f} "
              f"{tpp[0]:8.3f} ± {tpp[1]:5.3f} {acc:10.3f} {vms:14.2f} {t.tps:7.1f} "
              f"{t.tps / base.tps if base.tps else 0:8.3f}")
    for k in ("adaptive", f"K={args.k}"):
        tok, blk = tallies[f"token/{k}"], tallies[f"block/{k}"]
        x = [a for a, _ in tok.per_gen]
        y = [a for a, _ in blk.per_gen]
        (mx, sx), (my, sy) = mean_se(x), mean_se(y)
        ratio = my / mx if mx else 0.0
        se = ratio * ((sx / mx) ** 2 + (sy / my) ** 2) ** 0.5 if mx and my else 0.0
        diff = mean_se([b - a for a, b in zip(x, y)])
        print(f"block ÷ token tokens/pass, {k:9}: {ratio:.4f} ± {se:.4f} "
              f"(paired difference {diff[0]:+.4f} ± {diff[1]:.4f} tokens/pass, "
              f"n = {len(x)}); speed block ÷ token {blk.tps / tok.tps:.3f}")


def matched_drafts(engines: dict, prompts: list, raw: bool, args) -> None:
    """Expected accepted drafts of both rules on the drafts of real block-verified rounds."""
    import edgespec.speculative as loop
    real = loop.verify_block
    rounds: list[tuple[int, float, float]] = []

    def recording(x, q, p, rng, n_vocab):
        if x:
            h, _ = block_thresholds(x, q, p)
            e_block = sum(1 - float(np.prod([1 - hj for hj in h[i:]])) for i in range(len(h)))
            a = [min(1.0, p(i).prob(x[i]) / q[i].prob(x[i])) for i in range(len(x))]
            e_token = float(np.cumprod(a).sum())
            rounds.append((len(x), e_token, e_block))
        return real(x, q, p, rng, n_vocab)

    sampling = SamplingParams(temperature=args.temperature)
    print("\nthe same drafts under both rules (expected accepted drafts per drafted round, "
          "analytic over the uniforms):")
    loop.verify_block = recording
    try:
        for name in ("adaptive", f"K={args.k}"):
            rounds.clear()
            for prompt in prompts:
                engines[f"block/{name}"].generate(prompt, max_tokens=args.max_tokens,
                                                  sampling=sampling, raw=raw)
            ks = [k for k, _, _ in rounds]
            tok, blk = mean_se([t for _, t, _ in rounds]), mean_se([b for _, _, b in rounds])
            gain = mean_se([b - t for _, t, b in rounds])
            print(f"  {name:9}: {len(rounds)} rounds, mean K {statistics.fmean(ks):.2f}: token "
                  f"{tok[0]:.3f} ± {tok[1]:.3f}, block {blk[0]:.3f} ± {blk[1]:.3f}, "
                  f"block − token {gain[0]:+.4f} ± {gain[1]:.4f} "
                  f"(ratio {blk[0] / tok[0] if tok[0] else 0:.4f})")
    finally:
        loop.verify_block = real


def rows_along(model, prompt: list, text: list, chunk: int) -> np.ndarray:
    """The model's logits rows predicting each token of ``text`` after ``prompt``."""
    model.truncate(0)
    head = prompt[:-1]
    for s in range(0, len(head), model.n_batch):
        model.eval(head[s:s + model.n_batch], 0)
    feed = [prompt[-1]] + text[:-1]
    out = []
    for s in range(0, len(feed), chunk):
        part = feed[s:s + chunk]
        out.append(np.array(model.eval(part, len(part)), dtype=np.float32))
    model.truncate(0)
    return np.concatenate(out)


def overlap_and_cost(engine, texts: list, args) -> None:
    T = args.temperature
    params = SamplingParams(temperature=T)
    tds = args.draft_temperatures
    target, draft = engine.target, engine.draft
    n_vocab = target.n_vocab
    overlaps = {td: [] for td in tds}
    cost = {"token": ([], [], []), "block": ([], [], [])}
    rng = np.random.default_rng(7)
    K = 8
    for prompt, text in texts:
        if len(text) < 2:
            continue
        P = rows_along(target, prompt, text, min(target.n_outputs_max, target.n_batch))
        Q = rows_along(draft, prompt, text, min(draft.n_outputs_max, draft.n_batch))
        V = min(P.shape[1], Q.shape[1])
        p_dists = [warp(P[j, :V], params) for j in range(len(text))]
        for td in tds:
            dparams = params.replace(temperature=td)
            for j in range(len(text)):
                q = warp(Q[j, :V], dparams)
                overlaps[td].append(float(np.minimum(p_dists[j].dense(V), q.dense(V)).sum()))
        # the rules' cost per round on these rows (x from q; p rows along the text)
        for s in range(0, len(text) - K, K):
            q = [warp(Q[s + i, :V], params) for i in range(K)]
            x = [qi.sample(rng) for qi in q]
            for name, rule in (("token", speculative_sampling), ("block", verify_block)):
                seed = int(rng.integers(1 << 30))
                t0 = time.perf_counter()
                n, _ = rule(x, q, lambda i, s=s, d=p_dists: d[s + i],
                            np.random.default_rng(seed), n_vocab)
                t1 = time.perf_counter()
                rule(x, q, lambda i, s=s, rows=P, V=V: warp(rows[s + i, :V], params),
                     np.random.default_rng(seed), n_vocab)
                t2 = time.perf_counter()
                cost[name][0].append(t1 - t0)
                cost[name][1].append(t2 - t1)
                cost[name][2].append(n)
    n_pos = len(overlaps[tds[0]])
    print(f"\nmean Σ min(p, q) over {n_pos} positions of target-sampled text, target at "
          f"T = {T}, draft at T_d:")
    ref = statistics.fmean(overlaps[T]) if T in overlaps else None
    for td in tds:
        m, se = mean_se(overlaps[td])
        d = mean_se([a - b for a, b in zip(overlaps[td], overlaps[T])]) if ref is not None \
            else (0.0, 0.0)
        print(f"  T_d = {td:.2f}: {m:.4f} ± {se:.4f}" + (
            f"   (paired vs T_d = T: {d[0]:+.4f} ± {d[1]:.4f})" if ref is not None else ""))
    if ref is not None:
        best = max(tds, key=lambda td: statistics.fmean(overlaps[td]))
        print(f"  best T_d: {best:.2f}" + (" (= T)" if best == T else
                                           f" beats T_d = T by "
                                           f"{statistics.fmean(overlaps[best]) - ref:+.4f}"))
    print(f"\nper-round cost, K = {K}, vocabulary {n_vocab:,} (real rows, {len(cost['token'][0])}"
          f" rounds; median ms):")
    for name, (alone, warped, ns) in cost.items():
        if alone:
            print(f"  {name:5}: rule alone {1000 * statistics.median(alone):6.3f}, "
                  f"with the rows warped on demand {1000 * statistics.median(warped):6.2f}  "
                  f"(mean accepted {statistics.fmean(ns):.2f})")


def synthetic_cost(n_vocab: int = 262_144, K: int = 8, rounds: int = 30) -> None:
    rng = np.random.default_rng(0)
    print(f"per-round cost on random logits, vocabulary {n_vocab:,}, K = {K}, {rounds} rounds "
          f"(median ms; the draft's logits are the target's plus N(0, 1) noise):")
    for label, params in (("top-k 40, top-p 0.95, min-p 0.05, T 0.8", SamplingParams()),
                          ("no cut-offs (dense rows), T 0.8", SamplingParams.neutral(0.8))):
        logits = []
        for _ in range(rounds):
            t = (3 * rng.normal(0, 1, (K + 1, n_vocab))).astype(np.float32)
            d = (t[:K] + rng.normal(0, 1, (K, n_vocab))).astype(np.float32)
            logits.append((t, d))
        for name, rule in (("token", speculative_sampling), ("block", verify_block)):
            r = np.random.default_rng(1)
            alone, warped, ns = [], [], []
            for t, d in logits:
                q = [warp(d[i], params) for i in range(K)]
                x = [qi.sample(r) for qi in q]
                P = [warp(t[i], params) for i in range(K + 1)]
                t0 = time.perf_counter()
                n, _ = rule(x, q, lambda i, P=P: P[i], r, n_vocab)
                t1 = time.perf_counter()
                rule(x, q, lambda i, t=t, sp=params: warp(t[i], sp), r, n_vocab)
                alone.append(t1 - t0)
                warped.append(time.perf_counter() - t1)
                ns.append(n)
            print(f"  {label:40} {name}: rule alone {1000 * statistics.median(alone):6.3f}, "
                  f"with the rows warped on demand {1000 * statistics.median(warped):6.2f} "
                  f"(mean accepted {statistics.fmean(ns):.2f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="gemma3-270m")
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts-per-set", type=int, default=3)
    ap.add_argument("--sets", default="default,chat")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--draft-temperatures", type=lambda s: [float(v) for v in s.split(",")],
                    default=[0.6, 0.7, 0.8, 0.9, 1.0])
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--synthetic-cost", action="store_true",
                    help="only the rules' cost on random logits (no models)")
    args = ap.parse_args()
    if args.synthetic_cost:
        synthetic_cost()
        return 0
    t_start = time.perf_counter()
    target, draft = resolve_pair(args.pair)
    base = Engine.load(target, draft, drafter="model", n_threads=args.threads, cache_ram=0)
    engines = {"block/adaptive": base}
    for verifier in ("token", "block"):
        for name, k in (("adaptive", None), (f"K={args.k}", args.k)):
            key = f"{verifier}/{name}"
            if key not in engines:
                engines[key] = Engine(base.target, base.draft,
                                      SpecConfig("model", draft_max=k, verifier=verifier),
                                      draft_head=base.draft_head, cache_ram=0)
    assert {e.spec.verifier for e in engines.values()} == {"token", "block"}
    raw = base.template.is_fallback
    prompts = [p for s in args.sets.split(",") for p in PROMPT_SETS[s][:args.prompts_per_set]]
    print(f"pair {args.pair} ({'raw text' if raw else 'chat messages'}), {len(prompts)} prompts "
          f"({args.sets}), {args.max_tokens} new tokens, T = {args.temperature}, "
          f"{args.repeats} repeats of the unseeded runs, threads {args.threads}, "
          f"vocabulary {base.target.n_vocab:,}")
    out = decode_bench(engines, prompts, raw, args, log=lambda s: print(s, flush=True))
    report_decoding(out["tallies"], args)
    matched_drafts(engines, prompts, raw, args)
    overlap_and_cost(base, out["texts"], args)
    print(f"\n({time.perf_counter() - t_start:.0f} s)")
    base.close()        # frees the models the other Engines share (as edgespec/bench does)
    return 0


if __name__ == "__main__":
    sys.exit(main())
