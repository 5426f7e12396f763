#!/usr/bin/env python3
"""Several clients at once: `edgespec serve --parallel N` against llama.cpp's own `llama-server
-np N` from the same llama.cpp, with and without its draft, the same target and draft.

    bash scripts/build_llama_speculative.sh .cache/llama.cpp-build llama-server
    python scripts/bench_vs_llama_server.py --binary .cache/llama.cpp-build/bin/llama-server \\
        --target T.gguf --draft D.gguf [--clients 1,4] [-n 96] [--repeats 2]

Each configuration is a server started once; per repeat, every configuration is asked in turn
(the order rotating) to answer ``S`` distinct prompts at once for each client count S: greedy,
``-n`` tokens, streamed on OpenAI's completions route, each prompt new to every server's cache.
Printed per client count: aggregate tokens per second (all answers' tokens over the wall time
of the batch), the slowest first token, and the ratio of edgespec to the better llama-server.
Threads: 2 for every model unless --threads says otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from edgespec.bench.prompts import PROMPT_SETS
from edgespec.bench.serving import Server, ask, at_once, free_port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True, help="llama-server")
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=1024, help="tokens per stream")
    ap.add_argument("--n-max", default="3,8", help="llama-server's draft lengths to run")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    t = str(args.threads)
    servers = []
    port = free_port()
    servers.append(Server("edgespec", [sys.executable, "-m", "edgespec", "serve", "--port",
                                       str(port), "--target", args.target, "--draft",
                                       args.draft, "--parallel", str(args.parallel),
                                       "--ctx-size", str(args.ctx_size), "--threads", t,
                                       "--cache-ram", "0"], port))
    common = ["-m", args.target, "-np", str(args.parallel), "-c",
              str(args.ctx_size * args.parallel), "-t", t, "-tb", t, "--host", "127.0.0.1",
              "--no-webui", "-cram", "0"]
    port = free_port()
    servers.append(Server("llama-server", [args.binary, *common, "--port", str(port)], port))
    for k in args.n_max.split(","):
        port = free_port()
        servers.append(Server(f"llama-server draft n-max {k}",
                              [args.binary, *common, "--port", str(port), "-md", args.draft,
                               "-td", t, "-tbd", t, "--spec-draft-n-max", k,
                               "--spec-draft-p-min", "0.75"], port))
    pool = [p for name in ("default", "chat", "code") for p in PROMPT_SETS[name]]
    results: dict = {(s.name, c): [] for s in servers for c in counts}
    try:
        for s in servers:                                   # warm up
            ask(s.port, "Warm up.", 8)
        for rep in range(args.repeats):
            for c in counts:
                order = servers[rep % len(servers):] + servers[:rep % len(servers)]
                for j, s in enumerate(order):
                    tag = f"{rep}.{c}.{j}"
                    prompts = [f"({tag}.{i}) {pool[(rep * 5 + i) % len(pool)]}"
                               for i in range(c)]
                    b = at_once(s.port, prompts, args.n)
                    results[(s.name, c)].append((b.rate, b.slowest_first))
    finally:
        for s in servers:
            s.stop()
    print(f"{args.target} + {args.draft}: {args.n} tokens, greedy, {args.repeats} repeats "
          f"(medians), --parallel/-np {args.parallel}, {t} threads")
    for c in counts:
        print(f"clients {c}")
        agg = {}
        for s in servers:
            rows = results[(s.name, c)]
            agg[s.name] = statistics.median(r[0] for r in rows)
            print(f"  {s.name:28} {agg[s.name]:6.1f} tok/s  slowest first token "
                  f"{statistics.median(r[1] for r in rows):.3f} s")
        best = max(v for k, v in agg.items() if k != "edgespec")
        print(f"  edgespec / the better llama-server: {agg['edgespec'] / best:.2f}x")


if __name__ == "__main__":
    main()
