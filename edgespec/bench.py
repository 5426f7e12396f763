"""Side-by-side measurements: plain target decoding vs speculative decoding, interleaved.

Absolute speeds on a shared machine drift by tens of percent between minutes, so every figure
that matters is a ratio measured in one run: each prompt is decoded plain and speculatively
back to back, alternating which goes first, and the speedup is the ratio of the summed times.

The cost model predicts the speedup from component costs measured in isolation at the start
(the target's time for a batch of n tokens, the draft's time per token) and the acceptance the
run observed. A measured speedup well below the prediction means time lost outside llama.cpp.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import SamplingParams

PROMPT_SETS = {
    "default": [
        "The history of the Roman Empire",
        "def quicksort(arr):",
        "Once upon a time, in a small village by the sea,",
        "The three laws of thermodynamics are",
        "A recipe for a simple tomato soup:",
        "In computer science, a hash table is",
    ],
    "chat": [
        "Explain how a rainbow forms, in a short paragraph.",
        "Write a Python function that checks whether a string is a palindrome.",
        "Give me three tips for learning a new language.",
        "What is the difference between a list and a tuple in Python?",
    ],
}


@dataclass
class Totals:
    tokens: int = 0
    seconds: float = 0.0
    llama_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    per_prompt: list = field(default_factory=list)
    tested_at: list = field(default_factory=list)
    accepted_at: list = field(default_factory=list)

    def add(self, s) -> None:
        for mine, theirs in ((self.tested_at, s.tested_at), (self.accepted_at, s.accepted_at)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, c in enumerate(theirs):
                mine[i] += c
        self.tokens += s.completion_tokens
        self.seconds += s.decode_seconds
        self.llama_seconds += s.llama_seconds
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.passes += s.target_passes
        self.draft_seconds += s.draft_seconds
        self.verify_seconds += s.verify_seconds
        self.per_prompt.append(s.tokens_per_second)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def outside_share(self) -> float:
        return 1 - self.llama_seconds / self.seconds if self.seconds else 0.0


def _time_eval(model, tokens: list[int], n: int, reps: int) -> float:
    """Median seconds for one ``llama_decode`` of ``n`` tokens with logits on all rows."""
    base = len(model.tokens)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.eval((tokens * n)[:n], min(n, model.n_outputs_max))
        times.append(time.perf_counter() - t0)
        model.truncate(base)
    return statistics.median(times)


def calibrate(engine, prompt_tokens: list[int], ks: list[int], reps: int = 5) -> dict:
    """Isolated costs: target per batch size, draft per token (seconds)."""
    t, d = engine.target, engine.draft
    ctx = prompt_tokens[:-1]
    t.truncate(0)
    t.eval(ctx, 0)
    costs = {"target": {n: _time_eval(t, prompt_tokens[-1:], n, reps)
                        for n in sorted({1, *[k + 1 for k in ks]})}}
    if d is not None:
        d.truncate(0)
        d.eval(ctx, 0)
        costs["draft"] = _time_eval(d, prompt_tokens[-1:], 1, reps)
    return costs


def position_acceptance(tested_at: list, accepted_at: list) -> list[float]:
    """P(draft i accepted | drafts before it accepted), per position, from a run's counts.

    Acceptance is bursty (long fully accepted runs, then a miss), so this conditional profile
    predicts tokens per round far better than one i.i.d. rate.
    """
    out = []
    for tested, accepted in zip(tested_at, accepted_at + [0] * len(tested_at)):
        if tested == 0:
            break
        out.append(accepted / tested)
    return out


def expected_tokens(profile: list[float], k: int) -> float:
    """Expected tokens per round with K drafts: 1 + sum over i of P(first i all accepted)."""
    total, run = 1.0, 1.0
    for i in range(k):
        run *= profile[i] if i < len(profile) else (profile[-1] if profile else 0.0)
        total += run
    return total


def predict_speedup(costs: dict, profile: list[float], k: int) -> float:
    t1 = costs["target"][1]
    tk = _interp(costs["target"], k + 1)
    return expected_tokens(profile, k) * t1 / (k * costs["draft"] + tk)


def _interp(table: dict, n: int) -> float:
    keys = sorted(table)
    if n in table:
        return table[n]
    lo = max([k for k in keys if k <= n], default=keys[0])
    hi = min([k for k in keys if k >= n], default=keys[-1])
    if hi == lo:
        return table[lo] * n / lo
    return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)


def run_bench(engine, prompts: list[str], *, max_tokens: int, sampling: SamplingParams,
              raw: bool, repeats: int = 1, log=print) -> dict:
    K = engine.spec.draft_max
    first = engine.prompt_tokens(prompts[0], raw=raw)
    costs = calibrate(engine, first, [K, 4, 8, 16, 32]) if engine.draft else None
    plain, spec = Totals(), Totals()
    for r in range(repeats):
        for i, prompt in enumerate(prompts):
            order = [("plain", False), ("spec", True)]
            if (i + r) % 2:
                order.reverse()
            for name, speculative in order:
                out = engine.generate(prompt, max_tokens=max_tokens, sampling=sampling,
                                      raw=raw, speculative=speculative)
                (spec if speculative else plain).add(out.stats)
            log(f"  prompt {i + 1}/{len(prompts)}: plain {plain.per_prompt[-1]:.1f} tok/s, "
                f"speculative {spec.per_prompt[-1]:.1f} tok/s")
    result = {
        "plain": {"tokens_per_second": plain.tps, "tokens": plain.tokens,
                  "outside_llama_share": plain.outside_share},
        "speculative": {"tokens_per_second": spec.tps, "tokens": spec.tokens,
                        "acceptance_rate": spec.accepted / spec.drafted if spec.drafted else 0,
                        "tokens_per_pass": spec.tokens / spec.passes if spec.passes else 0,
                        "drafts_per_pass": spec.drafted / spec.passes if spec.passes else 0,
                        "outside_llama_share": spec.outside_share,
                        "draft_seconds": spec.draft_seconds,
                        "verify_seconds": spec.verify_seconds},
        "speedup": spec.tps / plain.tps if plain.tps else 0.0,
        "draft_max": K,
        "max_tokens": max_tokens,
        "prompts": len(prompts) * repeats,
    }
    if costs:
        profile = position_acceptance(spec.tested_at, spec.accepted_at)
        result["speculative"]["acceptance_by_position"] = profile
        k_eff = result["speculative"]["drafts_per_pass"]
        t1 = costs["target"][1]
        # Prediction for this run: its mean draft length and tokens per pass, isolated costs.
        per_token = (k_eff * costs["draft"] + _interp(costs["target"], round(k_eff) + 1)) \
            / max(result["speculative"]["tokens_per_pass"], 1e-9)
        result["cost_model"] = {
            "target_seconds_by_batch": costs["target"], "draft_seconds_per_token":
                costs["draft"], "draft_to_target_cost": costs["draft"] / t1,
            "predicted_speedup": t1 / per_token,
            "predicted_speedup_by_k": {k: predict_speedup(costs, profile, k)
                                       for k in (4, 8, 16, 32) if k <= max(len(profile), 1)},
        }
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["model_files_mib"] = sum(Path(m.path).stat().st_size for m in
                                    (engine.target, engine.draft) if m) / 2**20
    return result


def format_report(res: dict) -> str:
    p, s = res["plain"], res["speculative"]
    lines = [
        f"{'':14}{'tok/s':>8}{'accept':>8}{'tok/pass':>10}{'outside llama.cpp':>19}",
        f"{'plain':14}{p['tokens_per_second']:8.1f}{'':>8}{1.0:10.2f}"
        f"{p['outside_llama_share']:19.1%}",
        f"{'speculative':14}{s['tokens_per_second']:8.1f}{s['acceptance_rate']:8.0%}"
        f"{s['tokens_per_pass']:10.2f}{s['outside_llama_share']:19.1%}",
        f"speedup {res['speedup']:.2f}x  (draft_max {res['draft_max']}, "
        f"{s['drafts_per_pass']:.1f} drafts/pass, {res['prompts']} prompts × "
        f"{res['max_tokens']} tokens)",
    ]
    cm = res.get("cost_model")
    if cm:
        tb = ", ".join(f"n={n}: {1000 * v:.1f}" for n, v in cm["target_seconds_by_batch"].items())
        lines += [
            f"cost model: target ms per pass [{tb}]; draft {1000 * cm['draft_seconds_per_token']:.1f}"
            f" ms/token ({cm['draft_to_target_cost']:.2f} of a target token)",
            f"  predicted speedup for this run {cm['predicted_speedup']:.2f}x (measured "
            f"{res['speedup']:.2f}x); with this run's acceptance profile: " +
            ", ".join(f"K={k} {v:.2f}x" for k, v in cm["predicted_speedup_by_k"].items()),
        ]
    lines.append(f"peak RSS {res['peak_rss_mib']:.0f} MiB (model files "
                 f"{res['model_files_mib']:.0f} MiB, overhead "
                 f"{res['peak_rss_mib'] - res['model_files_mib']:.0f} MiB)")
    return "\n".join(lines)


def cmd_bench(args) -> int:
    from .cli import _status, load_engine
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    with load_engine(args, _status) as eng:
        raw = args.raw or eng.template.is_fallback
        prompts = PROMPT_SETS[args.prompts]
        log = (lambda s: None) if args.json else _status
        log(f"target {eng.target.path.name}, draft "
            f"{eng.draft.path.name if eng.draft else '-'}, {len(prompts)} prompts, "
            f"{'raw' if raw else 'chat'} mode, temperature {args.temperature}")
        res = run_bench(eng, prompts, max_tokens=args.max_tokens, sampling=sampling, raw=raw,
                        repeats=args.repeats, log=log)
    if args.json:
        print(json.dumps(res))
    else:
        print(format_report(res))
    return 0


def build_bench_parser(sub) -> None:
    from .cli import add_model_args
    p = sub.add_parser("bench", help="measure plain vs speculative decoding side by side")
    p.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="default")
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--raw", action="store_true", help="no chat template")
    p.add_argument("--json", action="store_true")
    add_model_args(p)
    p.set_defaults(func=cmd_bench)


if __name__ == "__main__":  # pragma: no cover
    from .cli import main
    sys.exit(main(["bench", *sys.argv[1:]]))
