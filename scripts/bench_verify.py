#!/usr/bin/env python3
"""Verification in arrays (issue 45): the verify step's Python cost, before and after, side by side.

    python scripts/bench_verify.py [--pairs smollm2,gemma] [-n 128] [--prompts 3]
        [--repeats 3] [--threads 2] [--k 6] [--modes before,after] [--micro-only | --loop-only]

``before`` is the acceptance code of commit ``REF_COMMIT`` (edgespec/verify.py read from git,
its rules asking for the target's rows one at a time, each warped by :func:`~edgespec.sampling.
warp` on demand, as the loop did); ``after`` is the code in the tree. Both run in one process
on the same models, interleaved, so their ratio does not depend on what else the machine does.

1. Micro: one verify step alone on synthetic rows (vocabularies of 49,152 and 262,144
   entries: SmolLM2's and Gemma-3's; K = 0 (a plain round), 4 and 8; a peaked target, and a
   draft that is the target plus noise, as a quantised copy of it is): block verification and
   token-wise rejection sampling (unseeded, T 0.7 with llama.cpp's default cut-offs), the keyed
   rule (seeded) and block verification on dense rows (no cut-offs). Microseconds per step, the
   minimum over ``--repeats``, and n̄ the mean number of drafts accepted (a rule that stops at
   a rejection warped only the rows up to it before); both modes must make the same choices
   ("OUTCOMES DIFFER" if not).
2. Loop: real generations on both toy pairs (SmolLM2-135M F32 drafted by its Q4_1; Gemma-3-270M
   F32 drafted by its Q4_K_M; the draft length pinned to ``--k``, 0 for the adaptive policy,
   which on a small busy machine may hardly draft): ``-n`` tokens after each of ``--prompts``
   prompts at T 0.7 (block verification), T 0.7 seeded (the keyed rule) and T 0 (greedy).
   Per token: the loop's Python time (decode wall time minus llama.cpp's and the draft head's,
   GenerationStats.python_seconds) and the time inside the verify rule (the warps of the
   target's rows included). Each (mode, prompt, setting) runs ``--repeats`` times, the modes
   alternating; the minimum is kept.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec import SamplingParams, verify  # noqa: E402
from edgespec.sampling import warp  # noqa: E402

REF_COMMIT = "b75db4a"      # the last commit before the verify step worked in arrays
PAIRS = {"smollm2": ("SmolLM2-135M-Instruct.F32.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"),
         "gemma": ("gemma-3-270m.F32.gguf", "gemma-3-270m.Q4_K_M.gguf")}
SETTINGS = {"T0.7": SamplingParams(temperature=0.7),
            "T0.7 seeded": SamplingParams(temperature=0.7, seed=1234),
            "T0": SamplingParams(temperature=0.0)}


def reference_rules() -> types.ModuleType:
    """edgespec/verify.py as it was at REF_COMMIT, as a module of the edgespec package."""
    src = subprocess.run(["git", "show", f"{REF_COMMIT}:edgespec/verify.py"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    mod = types.ModuleType("edgespec._verify_before")
    mod.__package__ = "edgespec"
    exec(compile(src, f"edgespec/verify.py@{REF_COMMIT}", "exec"), mod.__dict__)
    return mod


class Rules:
    """One mode's verify step: ``step(rule, x, q, rows, params, rng, start)`` as the loop
    calls it (the rows' warps included)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.mod = reference_rules() if mode == "before" else verify

    def rows(self, logits: np.ndarray, params: SamplingParams, x: list):
        if self.mode == "before":
            return lambda i: warp(logits[i], params)
        return verify.TargetRows(logits, params, [], x, None)

    def step(self, rule: str, x, q, logits, params, rng, start: int):
        p = self.rows(logits, params, x)
        if rule == "block":
            return self.mod.verify_block(x, q, p, rng, logits.shape[1])
        if rule == "token":
            return self.mod.speculative_sampling(x, q, p, rng, logits.shape[1])
        return self.keyed(x, p, params.seed, start)

    def keyed(self, x, p, seed: int, start: int):
        if self.mode == "before":
            return self.mod.verify_keyed(x, p, lambda d, i: d.sample_keyed(seed, start + i))
        return self.mod.verify_keyed(x, p, seed, start)


# --- 1. micro --------------------------------------------------------------------------------

def synthetic_round(rng, n_vocab: int, K: int, params: SamplingParams):
    """Target logits (K+1 rows, a few dozen plausible tokens above a long tail), a draft's
    (the target's first K rows plus noise), its q and the K tokens drawn from them."""
    logits = rng.normal(0.0, 2.0, (K + 1, n_vocab)).astype(np.float32)
    for row in logits:
        row[rng.choice(n_vocab, 30, replace=False)] += rng.normal(9.0, 2.0, 30).astype(np.float32)
    draft = (logits[:K] + rng.normal(0.0, 0.2, (K, n_vocab))).astype(np.float32)
    q = [warp(draft[i], params) for i in range(K)]
    x = [qi.sample(rng) for qi in q]
    return logits, q, x


def micro(modes: list, repeats: int) -> None:
    print(f"\n1. one verify step alone, synthetic rows (µs per step, min over {repeats} "
          f"repeats of 30 rounds)")
    rules = {m: Rules(m) for m in modes}
    cases = [("block", SamplingParams(temperature=0.7)),
             ("token", SamplingParams(temperature=0.7)),
             ("keyed", SamplingParams(temperature=0.7, seed=7)),
             ("block dense", SamplingParams.neutral(0.7))]
    print(f"{'vocabulary':>10} {'K':>2} {'rule':12} {'n̄':>4}" + "".join(f"{m:>10}" for m in modes) +
          ("   after ÷ before" if {"before", "after"} <= set(modes) else ""))
    for n_vocab in (49_152, 262_144):
        for K in (0, 4, 8):
            for name, params in cases:
                rng = np.random.default_rng(K)
                rounds = [synthetic_round(rng, n_vocab, K, params) for _ in range(30)]
                if params.seed is not None:     # the draft drew with the noise keyed as p's
                    rounds = [(lg, q, [d.sample_keyed(params.seed, 100 + i)
                                       for i, d in enumerate(q)]) for lg, q, _ in rounds]
                best = {m: float("inf") for m in modes}
                outcomes = {}
                for _ in range(repeats):
                    for m in modes:
                        r = np.random.default_rng(1)
                        t0 = time.perf_counter()
                        out = [rules[m].step(name.split()[0], x, q, lg, params, r, 100)
                               for lg, q, x in rounds]
                        best[m] = min(best[m], (time.perf_counter() - t0) / len(rounds))
                        outcomes[m] = out
                same = len({tuple(o) for o in outcomes.values()}) == 1
                mean_n = statistics.fmean(n for n, _ in outcomes[modes[0]])
                line = f"{n_vocab:>10,} {K:>2} {name:12} {mean_n:4.1f}" + "".join(
                    f"{1e6 * best[m]:10.0f}" for m in modes)
                if "before" in best and "after" in best:
                    line += f"   {best['after'] / best['before']:.2f}"
                print(line + ("" if same else "   OUTCOMES DIFFER"), flush=True)


# --- 2. loop ---------------------------------------------------------------------------------

def one_by_one(p: "verify.TargetRows"):
    """The loop's ``p`` as it was before: a lambda warping row ``i`` when called."""
    return lambda i: warp(p.logits[i], p.params, p.history + p.x[:i],
                          p.masks[i] if p.masks is not None else None)


class Timed:
    """The loop's verify rules, timed, for one mode (``before``: the reference rules)."""

    def __init__(self, rules: Rules):
        import edgespec.speculative as spec
        self.spec, self.seconds = spec, 0.0
        self.real = {name: getattr(spec, name) for name in
                     ("verify_block", "speculative_sampling", "verify_keyed", "verify_greedy")}
        self.use = dict(self.real)
        if rules.mode == "before":      # the loop's TargetRows turned back into its lambda
            ref = rules.mod
            self.use.update(
                verify_block=lambda x, q, p, rng, n: ref.verify_block(x, q, one_by_one(p), rng,
                                                                      n),
                speculative_sampling=lambda x, q, p, rng, n: ref.speculative_sampling(
                    x, q, one_by_one(p), rng, n),
                verify_keyed=lambda x, p, seed, start: rules.keyed(x, one_by_one(p), seed,
                                                                   start))

    def __enter__(self):
        for name, fn in self.use.items():
            setattr(self.spec, name, self.timed(fn))
        return self

    def __exit__(self, *exc):
        for name, fn in self.real.items():
            setattr(self.spec, name, fn)

    def timed(self, fn):
        def run(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - t0
        return run


def loop(pairs: list, modes: list, args) -> None:
    from edgespec import Engine
    from edgespec.bench.prompts import PROMPT_SETS
    from edgespec.paths import models_dir
    prompts = PROMPT_SETS["default"][:args.prompts]
    rules = {m: Rules(m) for m in modes}
    print(f"\n2. the loop: {len(prompts)} prompts × {args.max_tokens} tokens, "
          f"K {args.k or 'adaptive'}, min over "
          f"{args.repeats} repeats (ms per token; 'python': decode minus llama.cpp and the draft "
          f"head; 'verify': inside the rule, the target rows' warps included)")
    for pair in pairs:
        target, draft = (str(models_dir() / f) for f in PAIRS[pair])
        with Engine.load(target, draft, drafter="model", draft_max=args.k or None,
                         n_threads=args.threads, cache_ram=0, suffix=False, n_ctx=1024) as eng:
            raw = eng.template.is_fallback
            for setting, params in SETTINGS.items():
                # (mode, prompt) -> [(python s, verify s, tokens, tokens per pass)] per repeat
                runs: dict = {}
                for rep in range(args.repeats):
                    for i, prompt in enumerate(prompts):
                        order = modes if (rep + i) % 2 == 0 else modes[::-1]
                        for m in order:
                            with Timed(rules[m]) as timer:
                                g = eng.generate(prompt, max_tokens=args.max_tokens,
                                                 sampling=params, raw=raw)
                            s = g.stats
                            runs.setdefault((m, i), []).append(
                                (s.python_seconds, timer.seconds, s.completion_tokens,
                                 s.tokens_per_pass))
                report_loop(pair, setting, runs, modes, len(prompts))


def report_loop(pair: str, setting: str, runs: dict, modes: list, n_prompts: int) -> None:
    figures = {}
    for m in modes:
        py = vf = toks = 0.0
        tpp = []
        for i in range(n_prompts):
            rs = runs[(m, i)]
            tokens = rs[0][2]
            py += min(r[0] for r in rs)
            vf += min(r[1] for r in rs)
            toks += tokens
            tpp += [r[3] for r in rs]
        figures[m] = (1e3 * py / toks, 1e3 * vf / toks, statistics.fmean(tpp))
    line = f"  {pair:8} {setting:12}" + "".join(
        f"  {m}: python {p:6.3f} verify {v:6.3f} ({t:.2f} tok/pass)"
        for m, (p, v, t) in figures.items())
    if "before" in figures and "after" in figures:
        b, a = figures["before"], figures["after"]
        line += f"  after ÷ before: python {a[0] / b[0]:.2f}, verify {a[1] / b[1]:.2f}"
    print(line, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", default="smollm2,gemma")
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=6, help="draft length (0: the adaptive policy)")
    ap.add_argument("--modes", default="before,after")
    ap.add_argument("--micro-only", action="store_true")
    ap.add_argument("--loop-only", action="store_true")
    args = ap.parse_args()
    modes = args.modes.split(",")
    t0 = time.perf_counter()
    if not args.loop_only:
        micro(modes, args.repeats)
    if not args.micro_only:
        loop(args.pairs.split(","), modes, args)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
