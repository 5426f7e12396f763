"""Does a calibration taken on a busy machine heal? The measurement behind issue 16's bar.

    python scripts/calibration_healing.py [--pair smollm2-135m] [--busy 2] [--answers 20]
                                          [--max-tokens 128]

Three processes, each with its own calibration cache (a temporary XDG_CACHE_HOME; the models
are read from the usual models folder), run one after the other:

1. busy-start: loads the pair and calibrates while N busy processes spin (they are ended
   right after loading), then answers ``--answers`` prompts on the now quiet machine and
   closes the Engine (which keeps the refined costs unless its threads backed off);
2. fresh: loads with a fresh calibration on the quiet machine (its own cache) and answers the
   same prompts: the speed to return to;
3. second: a new process on process 1's cache: the costs it starts with, and its speed.

Run it on a quiet machine (nothing else busy apart from the N processes it starts itself).
It prints each answer's speed, the costs each process started and ended with, and the bar's
figures: process 1's speed over its last answers against process 2's over the same answers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TAIL = 5        # the bar compares the speed over the last TAIL answers of each process


def prompts(n: int) -> list[str]:
    from edgespec.bench.prompts import PROMPT_SETS
    pool = PROMPT_SETS["chat"] + PROMPT_SETS["code"]
    return [pool[i % len(pool)] for i in range(n)]


def cost_view(costs) -> dict:
    """Milliseconds: a one-token target pass, an 8-token pass, a draft token, and the ratio
    that decides whether drafting pays."""
    t1 = costs.pass_seconds(1)
    return {"t1_ms": 1000 * t1, "t8_ms": 1000 * costs.pass_seconds(8),
            "draft_ms": 1000 * costs.draft, "draft_over_t1": costs.draft / t1,
            "busy": costs.busy}


def phase(args) -> None:
    """One process: load (busy or not), answer, close; print one JSON object per event."""
    from edgespec import Engine, SamplingParams
    from edgespec.bench.load import BusyProcesses
    from edgespec.paths import calibration_file

    def say(**kw):
        print(json.dumps(kw), flush=True)

    before = json.loads(calibration_file().read_text()) if calibration_file().is_file() else {}
    say(event="cache_at_start", entries={k.split("|")[0].rsplit("/", 1)[-1]: {
        "source": v.get("source"), "t1_ms": 1000 * v["target"]["1"],
        "draft_ms": 1000 * v["draft"]} for k, v in before.items()})
    t0 = time.perf_counter()
    with BusyProcesses(args.busy if args.phase == "busy-start" else 0):
        eng = Engine.load(pair=args.pair, recalibrate=args.phase != "second")
    kept = calibration_file().is_file()
    say(event="loaded", seconds=time.perf_counter() - t0, calibration_kept=kept,
        costs=cost_view(eng.costs))
    greedy = SamplingParams(temperature=0.0)
    try:
        for i, p in enumerate(prompts(args.answers)):
            s = eng.generate(p, max_tokens=args.max_tokens, sampling=greedy).stats
            say(event="answer", i=i + 1, tokens=s.completion_tokens, seconds=s.decode_seconds,
                tok_s=s.tokens_per_second, tokens_per_pass=s.tokens_per_pass,
                drafted=s.drafted, speedup=s.speedup_estimate,
                plainly=s.decoding_plainly, threads=eng.threads,
                costs=cost_view(eng.costs))
    finally:
        backed_off = eng.threads["backed_off"]
        eng.close()
    after = json.loads(calibration_file().read_text()) if calibration_file().is_file() else {}
    say(event="closed", threads_backed_off=backed_off,
        saved=[v.get("source") for v in after.values()])


def run_phase(name: str, cache: Path, args) -> list[dict]:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), EDGESPEC_MODELS=args.models)
    cmd = [sys.executable, __file__, "--phase", name, "--pair", args.pair, "--busy",
           str(args.busy), "--answers", str(args.answers), "--max-tokens", str(args.max_tokens)]
    print(f"\n## {name}: {' '.join(cmd[1:])}  (XDG_CACHE_HOME={cache})", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"phase {name} failed:\n{proc.stderr}")
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for e in events:
        if e["event"] == "answer":
            c = e["costs"]
            print(f"  answer {e['i']:2}: {e['tok_s']:6.1f} tok/s  {e['tokens_per_pass']:5.2f} "
                  f"tokens/pass  drafted {e['drafted']:4}  threads {e['threads']['target']}/"
                  f"{e['threads']['draft']}  costs: t1 {c['t1_ms']:.1f} ms, draft "
                  f"{c['draft_ms']:.1f} ms ({c['draft_over_t1']:.2f} of t1)"
                  + ("  [busy calibration, to be measured again]" if c["busy"] else ""))
        elif e["event"] == "loaded":
            c = e["costs"]
            print(f"  loaded in {e['seconds']:.1f} s; calibration kept: "
                  f"{e['calibration_kept']}; starting costs: t1 {c['t1_ms']:.1f} ms, t8 "
                  f"{c['t8_ms']:.1f} ms, draft {c['draft_ms']:.1f} ms "
                  f"({c['draft_over_t1']:.2f} of t1)")
        else:
            print(f"  {e}")
    return events


def speed(events: list[dict], last: int) -> float:
    answers = [e for e in events if e["event"] == "answer"][-last:]
    return sum(e["tokens"] for e in answers) / sum(e["seconds"] for e in answers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--busy", type=int, default=2, help="busy processes while calibrating")
    ap.add_argument("--answers", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--phase", choices=["busy-start", "fresh", "second"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        phase(args)
        return
    from edgespec.paths import models_dir
    args.models = str(models_dir())
    with tempfile.TemporaryDirectory(prefix="edgespec-heal-") as tmp:
        healed, fresh = Path(tmp) / "healed", Path(tmp) / "fresh"
        busy = run_phase("busy-start", healed, args)
        ref = run_phase("fresh", fresh, args)
        second = run_phase("second", healed, args)
    n = min(TAIL, args.answers)
    s_busy, s_ref, s_second = speed(busy, n), speed(ref, n), speed(second, n)
    print(f"\nlast {n} of {args.answers} answers, greedy, {args.max_tokens} tokens at most:")
    print(f"  busy-start process (calibrated under {args.busy} busy processes): "
          f"{s_busy:.1f} tok/s")
    print(f"  fresh calibration on the quiet machine:                  {s_ref:.1f} tok/s")
    print(f"  second process, on the first one's kept costs:           {s_second:.1f} tok/s")
    print(f"  busy-start / fresh = {s_busy / s_ref:.3f} (bar: >= 0.90); second / fresh = "
          f"{s_second / s_ref:.3f}")
    start = next(e for e in second if e["event"] == "loaded")["costs"]
    end = [e for e in busy if e["event"] == "answer"][-1]["costs"]
    cache = next(e for e in second if e["event"] == "cache_at_start")["entries"]
    print(f"  the second process found {[v['source'] for v in cache.values()]} in its cache and "
          f"started with t1 {start['t1_ms']:.1f} ms, draft {start['draft_ms']:.1f} ms; the "
          f"first ended with t1 {end['t1_ms']:.1f} ms, draft {end['draft_ms']:.1f} ms "
          "(equal when it began with the healed costs)")


if __name__ == "__main__":
    main()
