#!/usr/bin/env python3
"""Drafting across vocabularies: Gemma-3-270m drafted by its own Q4_K_M and by SmolLM2-135M.

    python scripts/bench_cross_vocab.py [--prompts default chat ...] [-n 96]
        [--temperatures 0,0.8] [--repeats 1] [--seed S] [--threads N] [--json OUT.json]

    (a short sanity run: -n 16 --prompts default --temperatures 0 --repeats 1;
     long runs on a shared machine: flock /work/heavy.lock python scripts/bench_cross_vocab.py)

The Gemma F32 target is loaded once (``Engine.load(target, own_draft, drafter="model")``, which
also loads Gemma's own Q4_K_M draft with the draft settings Engine.load gives a draft). The
SmolLM2 draft is opened with exactly that draft's settings (its ``ModelConfig`` with the path
changed: ``n_outputs_max=1``, same context, batch and threads, ``tap_min_vocab=HEAD_MIN_VOCAB``)
and checked against the target (``check_pair``: a VocabMap, token-level intersection). Four
Engines share the one target, each with its own prompt cache off (``cache_ram=0``):

- ``plain``      the target alone (drafter ``none``, ``speculative=False``)
- ``own``        Gemma's Q4_K_M draft, drafter ``model``, adaptive (the cost model picks K)
- ``cross``      SmolLM2's draft across vocabularies, drafter ``model``, adaptive: the cost
                 model decides whether and how far drafting pays
- ``cross K=4``  the same with K pinned to 4: the raw acceptance of the cross-family draft

Prompts are the bench's prompt sets (edgespec/bench/prompts.py), sent raw (Gemma-3-270m has no
chat template). For each temperature, set and prompt the four configurations run back to back,
their order rotating from prompt to prompt (no configuration always runs first). Times are the
generations' own ``stats.decode_seconds`` (prompt processing excluded), not wall time around
``generate``. At T = 0 every speculative output must equal plain's token for token (greedy
speculation is lossless); a mismatch is printed loudly and makes the exit status 1. At T > 0 the
timed runs sample unseeded; ``--seed S`` adds, per prompt, an untimed seeded run of each
configuration (seed S + the prompt's index) whose tokens must equal plain's seeded ones
(keyed sampling is exact too).

Printed per temperature × prompt set × configuration: acceptance (accepted / drafted), tokens
per target pass (emitted / target passes), the share of rounds that were plain (plain passes /
rounds: what the cost model chose; the prompt row's round counts as a round, not as plain),
mean drafted tokens per drafting round, the speed-up over plain (summed tokens over summed
decode seconds, ÷ plain's: at T = 0 the outputs are equal, so it is the ratio of total decode
time) and the least and the median per-prompt speed-up (a short spell of load from elsewhere
on a shared machine shows in the least one first), and for the cross configurations the
translation overhead: the seconds spent translating (the context to the draft's tokens, and
each draft step's q masked, restricted to the shared tokens and mapped to the target's ids:
``Translation.seconds + q_seconds``) over the draft's seconds, in percent. The Translation's
clock also runs outside the draft's (the prompt pass, rollbacks, the catch-up check before a
draft step), so the share is an upper bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgespec import Engine, SamplingParams
from edgespec.backend import check_pair, open_model
from edgespec.bench.prompts import PROMPT_SETS
from edgespec.config import SpecConfig, default_threads
from edgespec.drafting import HEAD_MIN_VOCAB
from edgespec.paths import models_dir

TARGET = "gemma-3-270m.F32.gguf"
OWN_DRAFT = "gemma-3-270m.Q4_K_M.gguf"
CROSS_DRAFT = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONFIGS = ["plain", "own", "cross", "cross K=4"]
CROSS_K = 4


def text_sets() -> list[str]:
    """The prompt sets that are plain lists of text prompts (all of them, today)."""
    return [name for name, ps in PROMPT_SETS.items()
            if isinstance(ps, list) and ps and all(isinstance(p, str) for p in ps)]


@dataclass
class Tally:
    """One configuration's generations on one prompt set at one temperature."""

    generations: int = 0
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    passes: int = 0
    plain_passes: int = 0
    drafting_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    draft_seconds: float = 0.0
    translate_seconds: float = 0.0
    # prompt index -> [tokens, decode seconds] summed over repeats
    per_prompt: dict = field(default_factory=dict)

    def add(self, i: int, s, translate_seconds: float) -> None:
        lp = s.loop
        self.generations += 1
        self.tokens += s.completion_tokens
        self.seconds += s.decode_seconds
        self.rounds += lp.rounds
        self.passes += lp.target_passes
        self.plain_passes += lp.plain_passes
        self.drafting_rounds += lp.tested_at[0] if lp.tested_at else 0  # rounds with K >= 1
        self.drafted += lp.drafted
        self.accepted += lp.accepted
        self.emitted += lp.emitted
        self.draft_seconds += lp.draft_seconds
        self.translate_seconds += translate_seconds
        mine = self.per_prompt.setdefault(i, [0, 0.0])
        mine[0] += s.completion_tokens
        mine[1] += s.decode_seconds

    def merge(self, other: "Tally", offset: int) -> None:
        for name in ("generations", "tokens", "seconds", "rounds", "passes", "plain_passes",
                     "drafting_rounds", "drafted", "accepted", "emitted", "draft_seconds",
                     "translate_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for i, (n, s) in other.per_prompt.items():
            self.per_prompt[offset + i] = [n, s]

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def row(t: Tally, plain: Tally, name: str) -> dict:
    per = [ratio(n / s if s else 0.0, plain.per_prompt[i][0] / plain.per_prompt[i][1])
           for i, (n, s) in t.per_prompt.items() if i in plain.per_prompt
           and plain.per_prompt[i][1] > 0]
    per = [x for x in per if x is not None]
    return {
        "generations": t.generations, "tokens": t.tokens, "decode_seconds": t.seconds,
        "tokens_per_second": t.tps,
        "acceptance": ratio(t.accepted, t.drafted),
        "tokens_per_pass": ratio(t.emitted, t.passes),
        "plain_round_share": ratio(t.plain_passes, t.rounds),
        "drafts_per_drafting_round": ratio(t.drafted, t.drafting_rounds),
        "speedup": ratio(t.tps, plain.tps) if name != "plain" else 1.0,
        "min_prompt_speedup": min(per) if per and name != "plain" else None,
        "median_prompt_speedup": statistics.median(per) if per and name != "plain" else None,
        "translation_share_of_draft": (ratio(t.translate_seconds, t.draft_seconds)
                                       if name.startswith("cross") else None),
        "translate_seconds": t.translate_seconds, "draft_seconds": t.draft_seconds,
        "drafted": t.drafted, "accepted": t.accepted, "rounds": t.rounds,
        "target_passes": t.passes, "plain_passes": t.plain_passes,
    }


def fmt(x: float | None, width: int, digits: int, scale: float = 1.0, unit: str = "") -> str:
    """``x`` in ``width`` characters (its unit included), or a dash."""
    text = "-" if x is None else f"{x * scale:.{digits}f}{unit}"
    return f"{text:>{width}}"


def print_table(title: str, rows: dict) -> None:
    print(f"\n{title}")
    print(f"{'config':10} {'gens':>4} {'tokens':>6} {'tok/s':>7} {'accept':>7} {'tok/pass':>8} "
          f"{'plain%':>7} {'K/round':>7} {'× plain':>8} {'min ×':>6} {'med ×':>6} "
          f"{'transl%':>8}")
    for name, r in rows.items():
        print(f"{name:10} {r['generations']:4d} {r['tokens']:6d} {r['tokens_per_second']:7.1f} "
              f"{fmt(r['acceptance'], 7, 3)} {fmt(r['tokens_per_pass'], 8, 2)} "
              f"{fmt(r['plain_round_share'], 7, 1, 100, '%')} "
              f"{fmt(r['drafts_per_drafting_round'], 7, 2)} {fmt(r['speedup'], 8, 3)} "
              f"{fmt(r['min_prompt_speedup'], 6, 2)} {fmt(r['median_prompt_speedup'], 6, 2)} "
              f"{fmt(r['translation_share_of_draft'], 8, 1, 100, '%')}")


def first_difference(a: list[int], b: list[int]) -> int:
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return min(len(a), len(b))


def translation(eng: Engine):
    cross = eng._drafting.translations.of(eng.lanes.lanes[0])
    return cross[0] if cross is not None else None


def run(engines: dict, speculative: dict, prompts: list[str], T: float, set_name: str,
        args, counter: list, mismatches: list) -> dict:
    """The configurations over one set at one temperature, interleaved; their tallies."""
    sampling = SamplingParams(temperature=T)
    tallies = {c: Tally() for c in CONFIGS}
    for r in range(args.repeats):
        for i, prompt in enumerate(prompts):
            shift = counter[0] % len(CONFIGS)
            counter[0] += 1
            outs = {}
            for c in CONFIGS[shift:] + CONFIGS[:shift]:
                eng, tr = engines[c], translation(engines[c])
                tr0 = tr.seconds + tr.q_seconds if tr is not None else 0.0
                g = eng.generate(prompt, max_tokens=args.max_tokens, sampling=sampling,
                                 raw=True, speculative=speculative[c])
                tallies[c].add(i, g.stats, (tr.seconds + tr.q_seconds - tr0)
                               if tr is not None else 0.0)
                outs[c] = list(g.tokens)
            if sampling.greedy:
                check(outs, f"T=0 {set_name}[{i}] repeat {r + 1}", mismatches)
            elif args.seed is not None and r == 0:
                seeded = sampling.replace(seed=args.seed + i)
                check({c: list(engines[c].generate(prompt, max_tokens=args.max_tokens,
                                                   sampling=seeded, raw=True,
                                                   speculative=speculative[c]).tokens)
                       for c in CONFIGS}, f"T={T:g} seed {seeded.seed} {set_name}[{i}]",
                      mismatches)
            print(f"  T={T:g} {set_name} {i + 1}/{len(prompts)}"
                  + (f" (repeat {r + 1})" if args.repeats > 1 else "") + ": "
                  + ", ".join(f"{c} {tallies[c].per_prompt[i][0] / tallies[c].per_prompt[i][1]:.1f}"
                              if tallies[c].per_prompt[i][1] else f"{c} -" for c in CONFIGS)
                  + " tok/s", flush=True)
    return tallies


def check(outs: dict, where: str, mismatches: list) -> None:
    base = outs["plain"]
    for c, toks in outs.items():
        if c != "plain" and toks != base:
            j = first_difference(base, toks)
            msg = (f"!!! MISMATCH {where}, {c}: differs from plain at token {j} "
                   f"(plain {base[j:j + 4]}, {c} {toks[j:j + 4]}; lengths {len(base)} vs "
                   f"{len(toks)}) — speculation must be lossless")
            print(msg, flush=True)
            mismatches.append(msg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", nargs="+", default=text_sets(), choices=text_sets(),
                    metavar="SET", help=f"prompt sets (default: all: {' '.join(text_sets())})")
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--temperatures", type=lambda s: [float(v) for v in s.split(",")],
                    default=[0.0, 0.8])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--configs", type=lambda s: s.split(","), default=list(CONFIGS),
                    help="which configurations to run, comma-separated (plain always runs)")
    ap.add_argument("--seed", type=int, default=None,
                    help="at T > 0 also check seeded outputs against plain (untimed)")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--models", type=Path, default=models_dir(),
                    help="folder of the three GGUF files")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    CONFIGS[:] = [c for c in CONFIGS if c == "plain" or c in args.configs]
    t_start = time.perf_counter()

    target_path, own_path, cross_path = (args.models / f for f in (TARGET, OWN_DRAFT,
                                                                   CROSS_DRAFT))
    # One target: Engine.load opens it with Gemma's own draft; the cross draft is opened with
    # that draft's very settings (n_outputs_max=1 ...), only the path changed.
    own = Engine.load(target_path, own_path, drafter="model", n_ctx=args.n_ctx,
                      n_threads=args.threads, cache_ram=0)
    assert own.vocab_map is None, "Gemma's own draft should share the target's vocabulary"
    smol = open_model(replace(own.draft.config, path=cross_path),
                      tap_min_vocab=HEAD_MIN_VOCAB)
    vmap = check_pair(own.target, smol)
    if vmap is None:
        print(f"{cross_path.name} shares the target's vocabulary: nothing to cross")
        return 2
    tgt = own.target
    engines = {
        "plain": Engine(tgt, None, SpecConfig("none"), cache_ram=0),
        "own": own,
        "cross": Engine(tgt, smol, SpecConfig("model"), vocab_map=vmap, cache_ram=0),
    }
    engines["cross K=4"] = Engine(tgt, smol, SpecConfig("model", draft_max=CROSS_K),
                                  vocab_map=vmap, draft_head=engines["cross"].draft_head,
                                  cache_ram=0)
    speculative = {c: c != "plain" for c in CONFIGS}
    print(f"target {tgt.path.name} (vocabulary {tgt.n_vocab:,}); own draft "
          f"{own.draft.path.name} (shared vocabulary, reduced head "
          f"{'on' if own.draft_head is not None else 'off'}); cross draft {smol.path.name} "
          f"(vocabulary {smol.n_vocab:,}, reduced head "
          f"{'on' if engines['cross'].draft_head is not None else 'off'})")
    print(f"{vmap.describe()} ({vmap.n_mapped:,} of {vmap.n_draft:,})")
    print(f"prompts {' '.join(args.prompts)} (raw), {args.max_tokens} new tokens, T "
          f"{', '.join(f'{t:g}' for t in args.temperatures)}, {args.repeats} repeat(s), "
          f"threads {args.threads}; times: stats.decode_seconds", flush=True)

    mismatches: list = []
    results: dict = {}
    counter = [0]
    for T in args.temperatures:
        results[f"{T:g}"] = by_set = {}
        everything = {c: Tally() for c in CONFIGS}
        offset = 0
        for set_name in args.prompts:
            prompts = PROMPT_SETS[set_name]
            tallies = run(engines, speculative, prompts, T, set_name, args, counter,
                          mismatches)
            by_set[set_name] = {c: row(tallies[c], tallies["plain"], c) for c in CONFIGS}
            for c in CONFIGS:
                everything[c].merge(tallies[c], offset)
            offset += len(prompts)
        if len(args.prompts) > 1:
            by_set["all"] = {c: row(everything[c], everything["plain"], c) for c in CONFIGS}
    for T, by_set in results.items():
        for set_name, rows in by_set.items():
            print_table(f"T = {T}, {set_name}" + (
                f" ({len(PROMPT_SETS[set_name])} prompts × {args.repeats})"
                if set_name in PROMPT_SETS else " sets together"), rows)
    print("\naccept: accepted/drafted; tok/pass: emitted/target passes; plain%: plain "
          "passes/rounds; K/round: drafted per drafting round; × plain: tok/s ÷ plain's "
          "(summed); min ×, med ×: least and median per-prompt ratio; transl%: translation "
          "s / draft s")
    if mismatches:
        print(f"\n!!! {len(mismatches)} MISMATCH(ES) against plain decoding:")
        for m in mismatches:
            print(f"  {m}")
    else:
        print("\nall checked speculative outputs equal plain's "
              f"({'T=0' if 0.0 in args.temperatures else 'none at T=0'}"
              f"{', seeded' if args.seed is not None else ''})")
    elapsed = time.perf_counter() - t_start
    print(f"({elapsed:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "target": tgt.path.name, "own_draft": own.draft.path.name,
            "cross_draft": smol.path.name, "overlap": vmap.overlap,
            "max_tokens": args.max_tokens, "repeats": args.repeats, "threads": args.threads,
            "seed": args.seed, "prompt_sets": args.prompts, "results": results,
            "mismatches": mismatches, "seconds": elapsed}, indent=2))
        print(f"wrote {args.json}")
    own.close()        # frees the target and Gemma's draft, which the other Engines share
    smol.close()
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
