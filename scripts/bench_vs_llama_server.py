#!/usr/bin/env python3
"""`edgespec serve` against llama.cpp's own `llama-server` from the same llama.cpp, the same
target and draft: every llama-server configuration that could be the best one (no draft, a
draft model at two draft lengths, and its n-gram drafting where the binary has it).

    bash scripts/build_llama_speculative.sh .cache/llama.cpp-build llama-server
    python scripts/bench_vs_llama_server.py --binary .cache/llama.cpp-build/bin/llama-server \\
        --target T.gguf --draft D.gguf [--prompts short|tasks] [--clients 1,4] [-n 96]
        [--repeats 2] [--sequential] [--first-token TOKENS]

Each configuration is a server started once; per repeat, every configuration is asked in turn
(the order rotating) to answer ``S`` distinct prompts at once for each client count S, greedy,
streamed, each prompt new to every server's cache (a tag at its start):
- ``--prompts short``: the built-in sets on OpenAI's completions route, ``-n`` tokens each;
- ``--prompts tasks``: held-out work as apps send it, on the chat route (the model's chat
  template): whole-file code edits and multi-turn chats (``edgespec bench``'s ``code_edit``
  and ``chat`` tasks), clients taking edits and chats in turn, each answer up to ``-n`` tokens
  (an edit ends by itself: give ``-n`` room for the whole file).
``--sequential`` also asks edgespec the same prompts one after another (one client).
Printed per client count: aggregate tokens per second (all answers' tokens over the wall time
of the batch), the slowest first token, and the ratio of edgespec to the best llama-server.

``--first-token TOKENS`` measures instead a long prompt's time to first token: a passage of
Python's documentation of about TOKENS tokens as the system prompt (a different passage every
request), 8 tokens asked, one client, on edgespec's default, edgespec ``--no-spec`` and each
llama-server configuration.
Threads: 2 for every model unless --threads says otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from edgespec.bench.long_prompts import Passages
from edgespec.bench.prompts import PROMPT_SETS
from edgespec.bench.serving import Server, ask, at_once, free_port, one_after_another
from edgespec.bench.tasks import task_prompts


def edgespec_server(args, ctx: int, name: str = "edgespec", *extra: str) -> Server:
    port = free_port()
    return Server(name, [sys.executable, "-m", "edgespec", "serve", "--port", str(port),
                         "--target", args.target, "--draft", args.draft, "--parallel",
                         str(args.parallel), "--ctx-size", str(ctx), "--threads",
                         str(args.threads), "--cache-ram", "0", *extra], port)


def llama_servers(args, ctx: int) -> list[Server]:
    t = str(args.threads)
    common = ["-m", args.target, "-np", str(args.parallel), "-c", str(ctx * args.parallel),
              "-t", t, "-tb", t, "--host", "127.0.0.1", "--no-webui", "-cram", "0"]
    configs = [("llama-server", [])]
    for k in filter(None, args.n_max.split(",")):
        configs.append((f"llama-server draft n-max {k}",
                        ["--spec-type", "draft-simple", "-md", args.draft, "-td", t, "-tbd", t,
                         "--spec-draft-n-max", k,
                         "--spec-draft-p-min", "0.75"]))
    helptext = subprocess.run([args.binary, "--help"], capture_output=True, text=True).stdout
    if "ngram-mod" in helptext:
        configs.append(("llama-server ngram-mod", ["--spec-type", "ngram-mod"]))
    out = []
    for name, extra in configs:
        port = free_port()
        out.append(Server(name, [args.binary, *common, "--port", str(port), *extra], port))
    return out


def tagged(prompt, tag: str):
    """``prompt`` made new to every cache: ``tag`` at the start of its text or first message."""
    if isinstance(prompt, str):
        return f"({tag}) {prompt}"
    first = dict(prompt[0], content=f"({tag}) {prompt[0]['content']}")
    return [first, *prompt[1:]]


def pool(kind: str) -> list:
    if kind == "short":
        return [p for name in ("default", "chat", "code") for p in PROMPT_SETS[name]]
    tasks = task_prompts()
    edits = [[{"role": "user", "content": p}] for p in tasks["code_edit"]]
    chats = tasks["chat"]
    return [p for pair in zip(edits, chats) for p in pair]     # an edit, a chat, …


def throughput(args, servers: list[Server]) -> None:
    counts = [int(c) for c in args.clients.split(",")]
    prompts = pool(args.prompts)
    results: dict = {}
    for rep in range(args.repeats):
        for c in counts:
            order = servers[rep % len(servers):] + servers[:rep % len(servers)]
            batch = [prompts[(rep * 3 + i) % len(prompts)] for i in range(c)]
            for j, s in enumerate(order):
                asked = [tagged(p, f"{rep}.{c}.{j}.{i}") for i, p in enumerate(batch)]
                b = at_once(s.port, asked, args.n)
                results.setdefault((s.name, c), []).append((b.rate, b.slowest_first))
                if args.sequential and s.name == "edgespec" and c > 1:
                    asked = [tagged(p, f"{rep}.{c}.{j}.{i}s") for i, p in enumerate(batch)]
                    b = one_after_another(s.port, asked, args.n)
                    results.setdefault(("edgespec one after another", c), []).append(
                        (b.rate, b.slowest_first))
    print(f"{args.target} + {args.draft}: prompts {args.prompts}, up to {args.n} tokens, greedy, "
          f"{args.repeats} repeats (medians), --parallel/-np {args.parallel}, "
          f"{args.threads} threads")
    for c in counts:
        print(f"clients {c}")
        agg = {}
        for (name, cc), rows in results.items():
            if cc != c:
                continue
            agg[name] = statistics.median(r[0] for r in rows)
            print(f"  {name:28} {agg[name]:6.1f} tok/s  slowest first token "
                  f"{statistics.median(r[1] for r in rows):.3f} s  (each repeat: "
                  + ", ".join(f"{r[0]:.1f}" for r in rows) + ")")
        best = max(v for k, v in agg.items() if k.startswith("llama-server"))
        print(f"  edgespec / the best llama-server: {agg['edgespec'] / best:.2f}x")
        if "edgespec one after another" in agg:
            print(f"  edgespec, {c} at once / one after another: "
                  f"{agg['edgespec'] / agg['edgespec one after another']:.2f}x")


def first_token(args, servers: list[Server]) -> None:
    from llama_cpp import Llama          # only to count the passages' tokens
    vocab = Llama(args.target, vocab_only=True, verbose=False)

    def count(prompt) -> int:
        text = "".join(m["content"] for m in prompt)
        return len(vocab.tokenize(text.encode(), add_bos=False)) + 20    # + the template
    passages = Passages()
    firsts: dict = {s.name: [] for s in servers}
    for rep in range(args.repeats):
        order = servers[rep % len(servers):] + servers[:rep % len(servers)]
        for s in order:
            prompt, _ = passages.take(count, args.first_token, raw=False)
            firsts[s.name].append(ask(s.port, prompt, 8).first)
    print(f"{args.target} + {args.draft}: a ~{args.first_token}-token prompt's first token, "
          f"{args.repeats} repeats (medians), {args.threads} threads")
    med = {k: statistics.median(v) for k, v in firsts.items()}
    for k, v in med.items():
        print(f"  {k:28} {v:7.2f} s  ({', '.join(f'{x:.2f}' for x in firsts[k])})")
    best = min(v for k, v in med.items() if k.startswith("llama-server"))
    print(f"  edgespec / edgespec --no-spec: {med['edgespec'] / med['edgespec --no-spec']:.3f}x"
          f"   edgespec / the best llama-server: {med['edgespec'] / best:.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True, help="llama-server")
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", choices=("short", "tasks"), default="short")
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=None,
                    help="tokens per stream (default 1024; 4096 with --prompts tasks)")
    ap.add_argument("--n-max", default="3,8", help="llama-server's draft lengths to run "
                    "('': no draft-model configuration)")
    ap.add_argument("--sequential", action="store_true")
    ap.add_argument("--first-token", type=int, default=0, metavar="TOKENS")
    args = ap.parse_args()
    if args.first_token:
        args.parallel = 1
        ctx = args.ctx_size or args.first_token + 256
    else:
        ctx = args.ctx_size or (4096 if args.prompts == "tasks" else 1024)
    servers = [edgespec_server(args, ctx)]
    if args.first_token:
        servers.append(edgespec_server(args, ctx, "edgespec --no-spec", "--no-spec"))
    servers += llama_servers(args, ctx)
    try:
        for s in servers:                                   # warm up
            ask(s.port, "Warm up.", 8)
        (first_token if args.first_token else throughput)(args, servers)
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
