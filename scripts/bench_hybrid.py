#!/usr/bin/env python3
"""Speculation on hybrid models at Qwen3.5-0.8B's and 2B's real dimensions, against attention-
only twins of the same size (edgespec/bench/synthetic.py; random weights: what a pass, a
checkpoint or a restore costs does not depend on the weights' values).

    python scripts/bench_hybrid.py --make [--dir DIR]      # write the models (~15 min, 7 GB)
    python scripts/bench_hybrid.py [--dir DIR] [-n 64] [--repeats 2] [--json OUT.json]
    python scripts/bench_hybrid.py --tiny                 # a quick sanity run, small models

The models (``--make``): each shape of ``SHAPES`` (qwen3.5-0.8b, qwen3.5-2b and their
``-attention`` twins: Qwen3 layers, same width, depth, MLP and vocabulary) written at F16 with
Qwen2.5-Coder-0.5B's tokenizer (padded to Qwen3.5's 248,320 entries), then quantised to
Q4_K_M (as users run them) and Q2_K (a self-draft). Their output head is sharp (``sharpness``
2), so that the low-bit copy agrees with the model on most tokens, as a trained model's does.

Part 1, costs, per model (one context, a 256-token prompt): a pass of one token and of five
(a verify pass of K = 4), a checkpoint of the recurrent state (``Checkpoints.save``) and its
restore, and the state's size. Median of ``--reps`` timings each.

Part 2, decoding, per pair (the 2B drafted by the 0.8B; each by its own Q2_K; each by
``qwen3.5-draft``, a draft-sized model of the same vocabulary and chain of favourite tokens: a
cheap draft that agrees on most tokens), hybrid and twin: ``plain`` (the target alone),
``default`` (the draft model, the cost model choosing K, rollback by checkpoints), ``K=3`` (the
length pinned) and, on the hybrids, ``snapshots`` (the default with llama.cpp's per-token
snapshots; an Engine of its own on the same files). The chat prompts (edgespec/bench/
prompts.py) are sent as user messages, greedy, ``-n`` tokens each; the configurations of a pair
run back to back per prompt, their order rotating. Times are the generations' own decode
seconds. Every speculative answer must equal plain's (greedy is lossless); a mismatch prints
loudly and makes the exit status 1.

Part 3, the same drafts (``--agreement``): the random-weight hybrid and its twin write
different text, and their drafts agree with them differently (a twin's text falls into loops
the n-gram drafts copy whole), so part 2 does not compare like with like. Here each target
is drafted by a replay of its own plain answer in which each position is wrong with
probability 1 − agreement, decided by a seeded hash of (prompt, position): the same accept
and reject pattern on both. A draft step costs what the ``qwen3.5-draft`` model's step costs
(the twin's draft, measured by the engine's calibration; the replay sleeps that long, on
both), and the cost model
chooses K over the engine's calibrated costs, as with any model draft. ``--fold-ab`` adds,
on the hybrids, the same runs without folding the tokens to evaluate again into the next pass
(each redo a pass of its own), interleaved with the others.

Printed: tokens/s, the ratio to plain, acceptance, tokens per target pass, the rollback's
share of decode time (checkpoints saved and restored, tokens evaluated again:
``stats.rollback_seconds`` over ``decode_seconds``), and per pair the hybrid's speed-up beside
its twin's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp.llama_cpp as C
import numpy as np

from edgespec import Engine, SamplingParams
from edgespec.backend import LlamaModel, quantize
from edgespec.backend.rollback import PARTIAL
from edgespec.bench.prompts import PROMPT_SETS
from edgespec.bench.synthetic import SHAPES, TINY, write_model
from edgespec.backend import sequence
from edgespec.config import REDO_FOLD, ModelConfig
from edgespec.drafting import costs as costs_module
from edgespec.drafting.base import Draft
from edgespec.drafting.policy import AdaptiveLength
from edgespec.sampling import Dist
from edgespec.results import LoopStats
from edgespec.speculative import decode
from edgespec.registry import model_path

GREEDY = SamplingParams(temperature=0.0)
TOKENIZER = "qwen2.5-coder-0.5b-instruct-q4_k_m"
SHARPNESS = 2.0
PINNED = 3          # the pinned draft length of the K= configuration


def shapes(tiny: bool) -> dict:
    if tiny:
        from dataclasses import replace
        return {"tiny-hybrid": replace(TINY["qwen35"], sharpness=SHARPNESS),
                "tiny-hybrid-attention": replace(TINY["qwen3"], sharpness=SHARPNESS)}
    return {name: s for name, s in SHAPES.items()}


def make(root: Path, tiny: bool) -> None:
    from dataclasses import replace
    tok = model_path(TOKENIZER)
    for name, shape in shapes(tiny).items():
        t0 = time.perf_counter()
        src = write_model(replace(shape, sharpness=SHARPNESS), root / f"{name}.F16.gguf", tok,
                          seed=7, dtype="F16")
        for q in ("Q4_K_M", "Q2_K"):
            quantize(src, root / f"{name}.{q}.gguf", q)
        src.unlink()
        print(f"{name}: written in {time.perf_counter() - t0:.0f} s", flush=True)


def file(root: Path, name: str, q: str) -> Path:
    p = root / f"{name}.{q}.gguf"
    if not p.is_file():
        sys.exit(f"{p} is missing: run `python scripts/bench_hybrid.py --make --dir {root}`")
    return p


# -- part 1: costs ------------------------------------------------------------------------

def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def costs(path: Path, reps: int) -> dict:
    m = LlamaModel(ModelConfig(path, n_ctx=1024, n_outputs_max=8))
    try:
        seq = m.sequences[0]
        prompt = [(i * 7919) % 30000 + 100 for i in range(256)]
        m.eval(prompt, 1)
        n = len(m.tokens)

        def run(k):
            def f():
                m.checkpoint()
                m.eval(prompt[:k], k)
                m.truncate(n)           # (on a hybrid: restores the checkpoint)
            return f
        out = {"pass_1_ms": None, "pass_5_ms": None}
        # the passes alone: the checkpoint and restore around them timed apart below
        for k in (1, 5):
            times = []
            for _ in range(reps):
                m.checkpoint()
                t0 = time.perf_counter()
                m.eval(prompt[:k], k)
                times.append(time.perf_counter() - t0)
                m.truncate(n)
            out[f"pass_{k}_ms"] = 1e3 * statistics.median(times)
        if seq.checkpoints is not None:
            out["state_mb"] = C.llama_state_seq_get_size_ext(m.context, 0, PARTIAL) / 2**20
            out["checkpoint_ms"] = median_ms(lambda: seq.checkpoints.save(n), reps)
            out["restore_ms"] = median_ms(lambda: seq.checkpoints.restore_at_or_below(n), reps)
            out["round_trip_ms"] = median_ms(run(1), reps)
        return out
    finally:
        m.close()


# -- part 2: decoding ---------------------------------------------------------------------

def pairs(tiny: bool) -> list[tuple[str, str, str, str, str]]:
    """(label, target name, target quant, draft name, draft quant), hybrid names."""
    if tiny:
        return [("tiny ← own Q2_K", "tiny-hybrid", "Q4_K_M", "tiny-hybrid", "Q2_K")]
    return [("2B ← 0.8B", "qwen3.5-2b", "Q4_K_M", "qwen3.5-0.8b", "Q4_K_M"),
            ("2B ← own Q2_K", "qwen3.5-2b", "Q4_K_M", "qwen3.5-2b", "Q2_K"),
            ("0.8B ← own Q2_K", "qwen3.5-0.8b", "Q4_K_M", "qwen3.5-0.8b", "Q2_K"),
            ("2B ← small", "qwen3.5-2b", "Q4_K_M", "qwen3.5-draft", "Q4_K_M"),
            ("0.8B ← small", "qwen3.5-0.8b", "Q4_K_M", "qwen3.5-draft", "Q4_K_M")]


def decode_pair(root: Path, label: str, t: tuple, d: tuple, hybrid: bool, n: int,
                repeats: int, prompts: list[str]) -> dict:
    suffix = "" if hybrid else "-attention"
    tp, dp = file(root, t[0] + suffix, t[1]), file(root, d[0] + suffix, d[1])
    engines = {"default": Engine.load(tp, dp, n_ctx=2048, cache_ram=0, suffix=False),
               f"K={PINNED}": Engine.load(tp, dp, n_ctx=2048, cache_ram=0, suffix=False,
                                          draft_max=PINNED)}
    if hybrid:
        engines["snapshots"] = Engine.load(tp, dp, n_ctx=2048, cache_ram=0, suffix=False,
                                           rollback="snapshots")
    configs = ["plain", *engines]
    res = {c: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "passes": 0,
               "rollback": 0.0} for c in configs}
    mismatches = 0
    try:
        for e in engines.values():      # calibration (once per pair, cached) and warm-up
            e.generate(prompts[0], max_tokens=8, sampling=GREEDY)
        seqs = {c: e.target.sequences[0] for c, e in engines.items()}
        rb0 = {c: (s.rollbacks, s.reevaluated) for c, s in seqs.items()}   # not calibration's
        order = 0
        for _ in range(repeats):
            for p in prompts:
                msgs = [{"role": "user", "content": p}]
                answers = {}
                for i in range(len(configs)):
                    c = configs[(order + i) % len(configs)]
                    eng = engines["default"] if c == "plain" else engines[c]
                    g = eng.generate(msgs, max_tokens=n, sampling=GREEDY,
                                     speculative=c != "plain")
                    s, r = g.stats, res[c]
                    r["tokens"] += len(g.tokens)
                    r["seconds"] += s.decode_seconds
                    r["drafted"] += s.drafted
                    r["accepted"] += s.accepted
                    r["passes"] += s.target_passes
                    r["rollback"] += s.rollback_seconds
                    answers[c] = g.tokens
                order += 1
                for c in engines:
                    if answers[c] != answers["plain"]:
                        mismatches += 1
                        print(f"!!! MISMATCH {label} {c} on {p!r}", flush=True)
        out = {"configs": res, "mismatches": mismatches,
               "target_rollbacks": {c: [s.rollbacks - rb0[c][0], s.reevaluated - rb0[c][1]]
                                    for c, s in seqs.items()}}
        return out
    finally:
        for e in engines.values():
            e.close()


class Replay:
    """A drafter proposing the target's own plain answer ``ref`` (after ``start`` prompt
    tokens), each position wrong with probability ``1 - agreement`` (seeded per prompt and
    position), sleeping ``step`` seconds per drafted token, its length chosen by ``policy``."""

    def __init__(self, ref, start, agreement, key, policy, step, n_vocab):
        self.ref, self.start, self.agreement, self.key = ref, start, agreement, key
        self.policy, self.step, self.n_vocab = policy, step, n_vocab
        self._planned = 0

    def _token(self, i: int) -> int:
        right = np.random.default_rng([self.key, i]).random() < self.agreement
        return self.ref[i] if right else (self.ref[i] + 1) % self.n_vocab

    def begin(self, context, limit):
        pass

    def plan(self) -> int:
        self._planned = self.policy.plan()
        return self._planned

    def draft(self, context, k_max, params, rng, should_stop, constraint=None):
        t0, i0, x = time.perf_counter(), len(context) - self.start, []
        for i in range(min(k_max, self._planned, len(self.ref) - i0)):
            if should_stop() or not self.policy.keep_drafting(i, 0.9):
                break
            time.sleep(self.step)
            x.append(self._token(i0 + i))
        return Draft(x, [Dist.one_hot(t) for t in x], [0.9] * len(x),
                     step_seconds=[self.step] * len(x), source="model",
                     seconds=time.perf_counter() - t0)

    def observe(self, draft, n_accepted, verify_seconds):
        k, n, conf = draft.own(n_accepted)
        self.policy.observe(k, n, conf, draft.step_seconds, verify_seconds,
                            k_verified=len(draft.x))

    def rollback(self, n_keep):
        pass


def _decode(model, prompt, n, drafter) -> tuple[list[int], float, LoopStats, float]:
    """One greedy generation on ``model`` (its sequence emptied first): tokens, decode
    seconds, the loop's counters and the rollback seconds it caused."""
    model.truncate(0)
    model.eval(prompt[:-1], 0)
    seq = model.sequences[0]
    before = seq.rollback_seconds
    context, stats = list(prompt), LoopStats()
    t0 = time.perf_counter()
    out = [s.token for s in decode(model, context, params=GREEDY, rng=np.random.default_rng(0),
                                    max_tokens=n, drafter=drafter, stats=stats)]
    return out, time.perf_counter() - t0, stats, seq.rollback_seconds - before


def set_fold(n: int) -> None:
    """How many tokens to evaluate again may ride in front of the next pass (the backend's
    and the cost model's ``REDO_FOLD``; 0: each redo in a pass of its own, as before)."""
    sequence.REDO_FOLD = costs_module.REDO_FOLD = n


def same_drafts(root: Path, t: tuple, small: tuple, hybrid: bool, n: int, repeats: int,
                prompts: list[str], agreements: list[float], step: float = None,
                fold_ab: bool = False) -> dict:
    """Part 3 for one target: plain, then a :class:`Replay` at each agreement, interleaved;
    a draft step costs ``step`` seconds (None: the ``small`` model's calibrated step)."""
    suffix = "" if hybrid else "-attention"
    eng = Engine.load(file(root, t[0] + suffix, t[1]), file(root, small[0] + suffix, small[1]),
                      n_ctx=2048, cache_ram=0, suffix=False)
    try:
        eng.generate(prompts[0], max_tokens=8, sampling=GREEDY)     # calibration, warm-up
        costs, model = eng.costs, eng.target
        step = costs.draft_step() if step is None else step
        costs.draft = step
        configs = ["plain", *(f"a={a:.2f}" for a in agreements),
                   *(f"a={a:.2f} nofold" for a in agreements if fold_ab)]
        res = {c: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "passes": 0,
                   "rollback": 0.0} for c in configs}
        mismatches, order = 0, 0
        for r in range(repeats):
            for j, p in enumerate(prompts):
                prompt = eng.prompt_tokens([{"role": "user", "content": p}])
                ref, *_ = _decode(model, prompt, n, None)
                for i in range(len(configs)):
                    c = configs[(order + i) % len(configs)]
                    drafter = None if c == "plain" else Replay(
                        ref, len(prompt), float(c[2:6]), 1000 * r + j,
                        AdaptiveLength(costs.snapshot()), step, model.n_vocab)
                    set_fold(0 if c.endswith("nofold") else REDO_FOLD)
                    out, secs, s, rb = _decode(model, prompt, n, drafter)
                    set_fold(REDO_FOLD)
                    mismatches += out != ref
                    v = res[c]
                    v["tokens"] += len(out)
                    v["seconds"] += secs
                    v["drafted"] += s.drafted
                    v["accepted"] += s.accepted
                    v["passes"] += s.target_passes
                    v["rollback"] += rb
                order += 1
        return {"configs": res, "mismatches": mismatches, "step": step}
    finally:
        eng.close()


def report_pair(label: str, kind: str, r: dict) -> dict:
    plain = r["configs"]["plain"]
    base = plain["tokens"] / plain["seconds"]
    ratios = {}
    for c, v in r["configs"].items():
        tps = v["tokens"] / v["seconds"] if v["seconds"] else 0.0
        ratios[c] = tps / base
        acc = f"{v['accepted'] / v['drafted']:.0%}" if v["drafted"] else "-"
        tpp = v["tokens"] / v["passes"] if v["passes"] else 0.0
        share = 100 * v["rollback"] / v["seconds"] if v["seconds"] else 0.0
        print(f"  {label:<16} {kind:<9} {c:<9} {tps:7.2f} tok/s  {ratios[c]:5.2f}x  "
              f"acc {acc:>4}  {tpp:4.2f} tok/pass  rollback {share:4.1f}%", flush=True)
    if r["target_rollbacks"] != "-":
        print(f"  {'':<16} {kind:<9} target rollbacks, tokens redone: "
              f"{r['target_rollbacks']}")
    return ratios


def part3(root: Path, a, prompts: list[str], result: dict) -> int:
    print(f"part 3: the same drafts (a replay of plain's answer, agreement {a.agreement}), "
          f"greedy, {a.n} tokens", flush=True)
    bad = 0
    for label, tn, tq, small in same_draft_pairs(a.tiny):
        both, step = {}, None
        for hybrid in (False, True):        # the twin's draft step is the hybrid's too
            kind = "hybrid" if hybrid else "attention"
            r = same_drafts(root, (tn, tq), small, hybrid, a.n, a.repeats, prompts,
                            a.agreement, step, fold_ab=a.fold_ab and hybrid)
            step = r["step"]
            bad += r["mismatches"]
            print(f"  {label:<16} {kind:<9} a draft step {1e3 * step:.1f} ms")
            r["target_rollbacks"] = "-"
            both[kind] = report_pair(label, kind, r)
            result["pairs"][f"{label} same drafts {kind}"] = r
        for c in both["attention"]:
            if c != "plain":
                h, t = both["hybrid"][c], both["attention"][c]
                print(f"  {label}: {c} {h:.2f}x plain on the hybrid, {t:.2f}x on its twin: "
                      f"{(h - 1) / (t - 1) if t > 1 else float('nan'):.0%} of the twin's "
                      f"gain, {h / t:.0%} of its ratio", flush=True)
        print()
    return bad


def same_draft_pairs(tiny: bool) -> list[tuple[str, str, str, tuple]]:
    """(label, target name, quant, (draft-cost model name, quant)) for part 3."""
    if tiny:
        return [("tiny", "tiny-hybrid", "Q4_K_M", ("tiny-hybrid", "Q2_K"))]
    return [("2B", "qwen3.5-2b", "Q4_K_M", ("qwen3.5-draft", "Q4_K_M")),
            ("0.8B", "qwen3.5-0.8b", "Q4_K_M", ("qwen3.5-draft", "Q4_K_M"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache/edgespec/synthetic")
    ap.add_argument("--make", action="store_true", help="write the models, then stop")
    ap.add_argument("--tiny", action="store_true", help="small shapes: a sanity run")
    ap.add_argument("-n", type=int, default=64, help="tokens per answer")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--reps", type=int, default=15, help="timings per cost (median)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--agreement", type=float, nargs="*", default=[0.9, 0.7],
                    help="part 3's agreements (none: skip part 3)")
    ap.add_argument("--parts", default="123", help="which parts to run (default: all)")
    ap.add_argument("--fold-ab", action="store_true",
                    help="part 3 on the hybrids also without folding redone tokens into the "
                         "next pass (REDO_FOLD = 0), interleaved")
    a = ap.parse_args()
    root = a.dir / "tiny" if a.tiny else a.dir
    if a.make or (a.tiny and not (root / "tiny-hybrid.Q2_K.gguf").is_file()):
        make(root, a.tiny)
        if a.make:
            return 0
    result = {"costs": {}, "pairs": {}}
    print("part 1: costs (median ms; a 256-token context)", flush=True)
    for name in shapes(a.tiny) if "1" in a.parts else ():
        for q in ("Q4_K_M", "Q2_K"):
            c = costs(file(root, name, q), a.reps)
            result["costs"][f"{name}.{q}"] = c
            extra = ""
            if "checkpoint_ms" in c:
                extra = (f"  checkpoint {c['checkpoint_ms']:.2f}  restore {c['restore_ms']:.2f}"
                         f"  state {c['state_mb']:.1f} MiB  pass+checkpoint+restore "
                         f"{c['round_trip_ms']:.1f}")
            print(f"  {name + '.' + q:<32} pass(1) {c['pass_1_ms']:7.1f}  "
                  f"pass(5) {c['pass_5_ms']:7.1f}{extra}", flush=True)
    print(f"\npart 2: decoding, chat prompts as messages, greedy, {a.n} tokens", flush=True)
    prompts = PROMPT_SETS["chat"]
    bad = 0
    for label, tn, tq, dn, dq in pairs(a.tiny) if "2" in a.parts else ():
        both = {}
        for hybrid in (True, False):
            kind = "hybrid" if hybrid else "attention"
            r = decode_pair(root, label, (tn, tq), (dn, dq), hybrid, a.n, a.repeats, prompts)
            bad += r["mismatches"]
            both[kind] = report_pair(label, kind, r)
            result["pairs"][f"{label} {kind}"] = r
        for c in ("default", f"K={PINNED}"):
            h, t = both["hybrid"][c], both["attention"][c]
            print(f"  {label}: {c} {h:.2f}x plain on the hybrid, {t:.2f}x on its twin: "
                  f"{h / t:.0%} of the twin's ratio; gain {h - 1:+.2f} vs {t - 1:+.2f}",
                  flush=True)
        print()
    if "3" in a.parts and a.agreement:
        bad += part3(root, a, prompts, result)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    if bad:
        print(f"!!! {bad} speculative answers differ from plain decoding")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
