"""Speculation across a network: the target on two RPC workers behind a latency relay.

    python scripts/bench_rpc.py [--delays 0,1,5] [--pair gemma3-270m] [-n 64] [--ks 4]

For each one-way delay it starts two `edgespec worker` processes on 127.0.0.1, a relay in
front of each (tests/relay.py: the delay added in each direction), runs
`edgespec bench --rpc RELAY1,RELAY2 --no-peers --json`, and ends them all by their process
ids. It prints plain and speculative (adaptive, the default) tokens/s, their ratio, and the
bench cost model's predicted speed for each (from the target's calibrated per-pass costs,
which include the network, and the run's observed drafts per pass), with the prediction's
error. Every target pass crosses the network; a verify pass of K+1 tokens crosses it once,
so the ratio grows with the delay.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from rpc_helpers import Relay, Worker


def run(delay: float, args) -> dict:
    workers = [Worker(threads=args.worker_threads) for _ in range(2)]
    relays = []
    try:
        for w in workers:
            w.start()
        relays = [Relay(w.endpoint, delay) for w in workers]
        cmd = [sys.executable, "-m", "edgespec", "bench", "--rpc",
               ",".join(r.endpoint for r in relays), "--no-peers", "--json", "--ks", args.ks,
               "-n", str(args.max_tokens), "--prompts", args.prompts, "--recalibrate"]
        cmd += ["--pair", args.pair] if args.pair else []
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"bench failed at {delay} ms: {out.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.stdout)
    finally:
        for r in relays:
            r.stop()
        for w in workers:
            w.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delays", default="0,1,5", help="one-way delays in ms")
    ap.add_argument("--pair", default="gemma3-270m")
    ap.add_argument("--prompts", default="default")
    ap.add_argument("--max-tokens", "-n", type=int, default=64)
    ap.add_argument("--ks", default="4")
    ap.add_argument("--worker-threads", type=int, default=1,
                    help="threads per worker (two workers share this machine)")
    args = ap.parse_args()
    rows = []
    for delay in [float(d) for d in args.delays.split(",")]:
        res = run(delay, args)
        cfg, t1 = res["configs"], res["costs"]["target_seconds_by_batch"]
        t1 = t1.get(1, t1.get("1"))
        plain, spec = cfg["plain"], cfg["adaptive"]
        pred_plain = 1 / t1
        pred_spec = (spec["predicted_speedup"] or 0) / t1
        rows.append((delay, plain["tokens_per_second"], spec["tokens_per_second"],
                     spec["tokens_per_second"] / plain["tokens_per_second"], pred_plain,
                     pred_spec, spec["tokens_per_pass"], t1 * 1000))
        print(f"{delay:g} ms done", file=sys.stderr, flush=True)
    print(f"{'delay':>6} {'plain':>7} {'spec':>7} {'ratio':>6} {'pred plain':>11} "
          f"{'pred spec':>10} {'err plain':>10} {'err spec':>9} {'tok/pass':>9} {'t(1) ms':>8}")
    for d, p, s, r, pp, ps, tpp, t1ms in rows:
        print(f"{d:>4g}ms {p:7.1f} {s:7.1f} {r:5.2f}x {pp:11.1f} {ps:10.1f} "
              f"{(pp - p) / p:+9.0%} {(ps - s) / s:+9.0%} {tpp:9.2f} {t1ms:8.1f}")


if __name__ == "__main__":
    main()
