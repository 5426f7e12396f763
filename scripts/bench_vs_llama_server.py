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
import http.client
import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from edgespec.bench.prompts import PROMPT_SETS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, cmd: list[str], port: int):
        self.name, self.port = name, port
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.log: list[str] = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{name} exited:\n" + "".join(self.log[-30:]))
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        sys.exit(f"{name} did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def ask(port: int, prompt: str, n: int) -> tuple[int, float, float]:
    """(tokens, seconds to the first token, seconds in all) of one streamed completion."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"port {port}: {resp.status} {resp.read()[:300]!r}")
    first, tokens = None, 0
    for line in resp:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if first is None and event.get("choices") and event["choices"][0].get("text"):
            first = time.perf_counter() - t0
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    conn.close()
    return tokens, first or 0.0, time.perf_counter() - t0


def at_once(port: int, prompts: list[str], n: int) -> tuple[float, float]:
    """(aggregate tokens per second, slowest first token)."""
    out: list = [None] * len(prompts)
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, ask(port, prompts[i], n)))
               for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sum(o[0] for o in out) / wall, max(o[1] for o in out)


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
                    results[(s.name, c)].append(at_once(s.port, prompts, args.n))
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
