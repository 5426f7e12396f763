#!/usr/bin/env python3
"""A soak of `edgespec serve --parallel N`: many clients, many requests each, with cancels,
disconnects, mixed sampling settings and long prompts arriving while others stream.

    python scripts/soak_server.py [--clients 16] [--requests 30] [--parallel 4] [-n 40]

Starts the server (the SmolLM2 pair: F32 target, Q4_1 draft, unless --target/--draft say
otherwise), asks each prompt of its pool once alone (greedy: the solo answers), then lets
``--clients`` threads send ``--requests`` requests each on plain HTTP, each request one of:

- greedy, whole or streamed and read to the end: its text must equal the prompt's solo answer;
- greedy, streamed, the connection dropped after a few chunks (a client going away);
- greedy, whole, the connection dropped while it waits or decodes (a cancel);
- sampled (temperature, top-p, top-k, a seed or none) read to the end;
- a long prompt (~700 tokens) whose answer must equal its own solo answer.

The first ``--warmup`` requests of every client run as a phase of their own (the lanes'
first use, the allocator's arenas). The prompt cache keeps other conversations' KV states up
to ``--cache-ram`` by design (+442 MiB in one run at serve's default 1024): the leak bar is
read with ``--cache-ram 0``. It prints the counts by kind, every 5xx or mismatch,
the server's resident memory after the solo answers, after the warm-up and at the end (the
growth after the warm-up is the leak bar: < 100 MiB), and exits 1 when any bar fails: a 5xx,
a finished greedy answer different from its solo answer, the growth over the bar, or a lane
or queue entry left behind once the clients are done.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

MODELS = Path(os.environ.get("EDGESPEC_MODELS", Path.home() / ".cache/edgespec/models"))
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "List three colours:",
           "Once upon a time there was a small robot who", "The three laws of motion are",
           "import numpy as np\n\ndef mean(xs):\n", "Water boils at", "My favourite book is"]
LONG = ("Here is a long report on the history of the town's library, its readers and its "
        "books, written by the librarian over many years. " * 30) + "\nIn short, the library"
RSS_BAR_MIB = 100


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024


class Server:
    def __init__(self, args: argparse.Namespace):
        cmd = [sys.executable, "-m", "edgespec", "serve", "--port", "0", "--parallel",
               str(args.parallel), "--target", args.target, "--draft", args.draft,
               "--ctx-size", "2048", "--cache-ram", str(args.cache_ram)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.log: list[str] = []
        ready = threading.Event()
        self.port = 0

        def read() -> None:
            for line in self.proc.stdout:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"listening on http://\S+?:(\d+)/v1", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300):
            self.proc.kill()
            sys.exit("the server did not start:\n" + "\n".join(self.log[-20:]))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def open_request(port: int, body: dict, timeout: float = 600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    return conn


def hang_up(conn: http.client.HTTPConnection) -> None:
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


def whole(port: int, body: dict) -> tuple[int, str]:
    conn = open_request(port, body)
    try:
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            return resp.status, data.decode(errors="replace")[:200]
        return 200, json.loads(data)["choices"][0]["text"]
    finally:
        conn.close()


def streamed(port: int, body: dict, drop_after: int | None = None) -> tuple[int, str]:
    conn = open_request(port, {**body, "stream": True})
    try:
        resp = conn.getresponse()
        if resp.status != 200:
            return resp.status, resp.read().decode(errors="replace")[:200]
        text, chunks = [], 0
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                break
            event = json.loads(line[6:])
            if "error" in event:
                return 500, json.dumps(event)[:200]      # an error frame mid-stream
            text.append(event["choices"][0]["text"])
            chunks += 1
            if drop_after is not None and chunks >= drop_after:
                hang_up(conn)
                return 200, ""
        return 200, "".join(text)
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=str(MODELS / "SmolLM2-135M-Instruct.F32.gguf"))
    ap.add_argument("--draft", default=str(MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("-n", type=int, default=40, help="tokens per answer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5, help="requests per client before the "
                    "memory baseline")
    ap.add_argument("--cache-ram", type=int, default=0, metavar="MiB",
                    help="the server's prompt cache (default here: 0, off; serve's own: 1024)")
    args = ap.parse_args()

    server = Server(args)
    port = server.port
    greedy = {"max_tokens": args.n, "temperature": 0}
    solo = {p: whole(port, {**greedy, "prompt": p}) for p in PROMPTS + [LONG]}
    bad = [p for p, (status, _) in solo.items() if status != 200]
    if bad:
        server.stop()
        sys.exit(f"solo answers failed: {bad}")
    solo = {p: text for p, (_, text) in solo.items()}
    rss_start = rss_mib(server.proc.pid)
    print(f"server pid {server.proc.pid}, port {port}, --parallel {args.parallel}; "
          f"{len(solo)} solo answers; RSS {rss_start:.0f} MiB")

    counts: Counter = Counter()
    failures: list[str] = []
    lock = threading.Lock()

    rngs = [random.Random(args.seed * 1000 + c) for c in range(args.clients)]

    def client(c: int, first: int, last: int) -> None:
        rng = rngs[c]
        for r in range(first, last):
            roll, prompt = rng.random(), rng.choice(PROMPTS)
            body = {**greedy, "prompt": prompt}
            if roll < 0.30:
                kind, (status, text) = "greedy whole", whole(port, body)
            elif roll < 0.50:
                kind, (status, text) = "greedy streamed", streamed(port, body)
            elif roll < 0.62:
                kind = "stream dropped"
                status, text = streamed(port, body, drop_after=rng.randint(1, 6))
            elif roll < 0.72:
                kind, status, text = "cancelled", 200, ""
                conn = open_request(port, body)
                time.sleep(rng.uniform(0.02, 0.6))
                hang_up(conn)
            elif roll < 0.90:
                kind = "sampled"
                sampled = {**body, "temperature": rng.choice([0.6, 0.8, 1.0]),
                           "top_p": rng.choice([1.0, 0.9]), "top_k": rng.choice([0, 40])}
                if rng.random() < 0.5:
                    sampled["seed"] = rng.randint(0, 2**31)
                status, text = (whole if rng.random() < 0.5 else streamed)(port, sampled)
            else:
                kind, prompt = "long prompt", LONG
                status, text = streamed(port, {**greedy, "prompt": LONG})
            with lock:
                counts[kind] += 1
                if status != 200:                  # a 5xx, or a 4xx this soak never provokes
                    failures.append(f"client {c} request {r} ({kind}): {status} {text}")
                elif kind in ("greedy whole", "greedy streamed", "long prompt") \
                        and text != solo[prompt]:
                    failures.append(f"client {c} request {r} ({kind}): answer differs from "
                                    f"its solo answer: {text!r} vs {solo[prompt]!r}")

    def phase(first: int, last: int) -> None:
        threads = [threading.Thread(target=client, args=(c, first, last))
                   for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    t0 = time.perf_counter()
    warm = min(args.warmup, args.requests)
    phase(0, warm)
    time.sleep(2)
    rss_warm = rss_mib(server.proc.pid)
    phase(warm, args.requests)
    wall = time.perf_counter() - t0
    time.sleep(2)                            # dropped streams' lanes are given back
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/health")
    health = json.loads(conn.getresponse().read())
    conn.close()
    rss_end = rss_mib(server.proc.pid)
    rc = server.stop()
    growth = rss_end - rss_warm
    print(f"{sum(counts.values())} requests from {args.clients} clients in {wall:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"RSS {rss_start:.0f} MiB after the solo answers, {rss_warm:.0f} after the warm-up "
          f"({warm} requests per client), {rss_end:.0f} at the end: growth {growth:+.0f} MiB "
          f"after the warm-up (bar < {RSS_BAR_MIB}); --cache-ram {args.cache_ram}; after the "
          f"clients: running {health.get('running')}, waiting "
          f"{health.get('waiting')}; server exit {rc}")
    tracebacks = [line for line in server.log if "Traceback" in line]
    for f in failures[:20]:
        print("FAIL", f)
    if tracebacks:
        first = next(i for i, line in enumerate(server.log) if "Traceback" in line)
        print("the server's first traceback:", *server.log[first:first + 40], sep="\n")
    ok = (not failures and growth < RSS_BAR_MIB and not tracebacks
          and health.get("running") == 0 and health.get("waiting") == 0)
    print(f"5xx/4xx/mismatches: {len(failures)}; tracebacks in the log: {len(tracebacks)}; "
          + ("PASS" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
