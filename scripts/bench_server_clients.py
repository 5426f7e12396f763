#!/usr/bin/env python3
"""Several clients through `edgespec serve` against the same requests one after another, and
one client through a `--parallel N` server against the same through `--parallel 1`.

    python scripts/bench_server_clients.py --target T.gguf --draft D.gguf \\
        [--clients 1,2,4,8] [--parallel 4] [-n 96] [--repeats 3]

Two servers are started once (``--parallel N`` and ``--parallel 1``; suffix index and prompt
cache off, so no answer is drafted from an earlier one). Per repeat and client count C, in an
order that rotates: C distinct prompts sent at once to the N-lane server, the same C texts
asked one after another on it, and (C = 1) the same text asked of the one-lane server;
greedy, ``-n`` tokens, streamed on OpenAI's completions route, each prompt new to the server.
Printed per count: aggregate tokens per second both ways and their ratio, the slowest first
token against a lone request's on the same server; and a lone client on N lanes against one
lane. The texts differ by a tag (each new to the server, so no lane's cache holds it), which
moves a 96-token answer's speed by up to ~15%: a count's ratio is as good as its repeats.

Then, the servers stopped, the floor under a count's slowest first token: one pass of the
target, in this process, over each repeat's prompts of that count at once (``--threads``;
the median over the repeats) against one over a single prompt. Whatever the server's order
of passes, the last prompt of C read has its first token no earlier than the compute of all
C.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from edgespec.bench.prompts import PROMPT_SETS
from edgespec.bench.serving import Server, at_once, ask, free_port, one_after_another


def serve(name: str, args, parallel: int) -> Server:
    port = free_port()
    return Server(name, [sys.executable, "-m", "edgespec", "serve", "--port", str(port),
                         "--target", args.target, "--draft", args.draft,
                         "--parallel", str(parallel), "--ctx-size", str(args.ctx_size),
                         "--threads", str(args.threads), "--cache-ram", "0",
                         "--no-suffix-index", "--log-level", "warning"], port)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=1024, help="tokens per stream")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    many = serve(f"--parallel {args.parallel}", args, args.parallel)
    one = serve("--parallel 1", args, 1)
    pool = [p for name in ("default", "chat", "code") for p in PROMPT_SETS[name]]

    def prompts(rep: int, c: int, way: str) -> list[str]:
        # Every way gets the same texts (answers' speeds differ by prompt far more than by
        # way), each made new to the server by its tag.
        first = rep * sum(counts) + sum(counts[:counts.index(c)])
        return [f"({rep}.{c}.{way[:3]}.{i}) {pool[(first + i) % len(pool)]}"
                for i in range(c)]

    ways = {"at once": lambda p: at_once(many.port, p, args.n),
            "one after another": lambda p: one_after_another(many.port, p, args.n),
            "one lane": lambda p: one_after_another(one.port, p, args.n)}
    results: dict = {}
    try:
        for s in (many, one):
            ask(s.port, "Warm up.", 8)
        for rep in range(args.repeats):
            for c in counts:
                # (one client "at once" is one after another: the same schedule, run once)
                names = [w for w in ways if (w != "at once" if c == 1 else w != "one lane")]
                names = names[rep % len(names):] + names[:rep % len(names)]
                for w in names:
                    results.setdefault((w, c), []).append(ways[w](prompts(rep, c, w)))
    finally:
        for s in (many, one):
            s.stop()
    med = statistics.median
    print(f"{args.target} + {args.draft}: {args.n} tokens, greedy, {args.repeats} repeats "
          f"(medians), --parallel {args.parallel}, {args.threads} threads, suffix index off")
    lone_first = med(a.first for b in results[("one after another", counts[0])]
                     for a in b.answers) if counts else 0.0
    for c in counts:
        if c == 1:
            alone = results[("one after another", 1)]
            print(f"clients 1: {med(b.rate for b in alone):6.1f} tok/s, first token "
                  f"{lone_first:.3f} s")
            continue
        together, apart = results[("at once", c)], results[("one after another", c)]
        rate_t, rate_a = med(b.rate for b in together), med(b.rate for b in apart)
        first = med(b.slowest_first for b in together)
        print(f"clients {c}: at once {rate_t:6.1f} tok/s, one after another {rate_a:6.1f}: "
              f"{rate_t / rate_a:.2f}x; slowest first token {first:.3f} s "
              f"({first / lone_first:.1f}x a lone request's {lone_first:.3f} s)")
    floor(args, {c: [prompts(rep, c, "at once") for rep in range(args.repeats)]
                 for c in counts if c > 1}, lone_first)
    if 1 in counts:
        lanes, lane = results[("one after another", 1)], results[("one lane", 1)]
        # (the same text on both servers each repeat: the ratio of each pair, then the median)
        ratio = med(a.rate / b.rate for a, b in zip(lanes, lane))
        print(f"one client: --parallel {args.parallel} {med(b.rate for b in lanes):.1f} tok/s, "
              f"--parallel 1 {med(b.rate for b in lane):.1f}: {ratio:.2f}x (median of the "
              f"repeats' ratios)")


def floor(args, texts: dict[int, list[list[str]]], lone_first: float) -> None:
    """One pass of the target over each repeat's prompts of a count at once, against one over
    its first prompt alone (see the module docstring); medians over the repeats."""
    from edgespec.backend.model import LlamaModel
    from edgespec.backend.sequence import KVSequence
    from edgespec.config import ModelConfig
    if not texts:
        return
    most = max(texts)
    model = LlamaModel(ModelConfig(args.target, n_ctx=args.ctx_size, streams=most,
                                   n_outputs_max=most, n_threads=args.threads))
    try:
        seqs = [KVSequence(model, i) for i in range(most)]

        def one_pass(prompts: list[str]) -> float:
            parts = [(seq, model.tokenize(p), 1) for seq, p in zip(seqs, prompts)]
            t = time.perf_counter()
            model.decode(parts)
            seconds = time.perf_counter() - t
            for seq in seqs:
                seq.truncate(0)
            return seconds

        one_pass(texts[most][0])                                # (warm-up)
        for c, reps in sorted(texts.items()):
            alone = statistics.median(one_pass(ps[:1]) for ps in reps)
            s = statistics.median(one_pass(ps) for ps in reps)
            print(f"floor, clients {c}: one pass over the {c} prompts {s:.3f} s ({s / alone:.1f}x "
                  f"one prompt's {alone:.3f} s): the slowest first token >= {s / lone_first:.1f}x "
                  f"a lone request's")
    finally:
        model.close()


if __name__ == "__main__":
    main()
