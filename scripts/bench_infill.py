#!/usr/bin/env python3
"""Autocomplete as editors ask for it: llama-server's `/infill` (llama.vscode, llama.vim)
through `edgespec serve`, with its default drafting against `--no-spec`, the same target, side
by side in one run.

    python scripts/bench_infill.py --target T.gguf [--draft D.gguf] [-n 48] [--repeats 2]
                                   [--cuts 6] [--threads 2] [--extra]

Held-out code (modules of Python's standard library, read with ``inspect``): "repetitive"
files that repeat their own patterns (tables of constants, families of near-identical
methods) and "other" files of plain logic. In each file an editor's user types down one
region (:func:`cuts`): ``--cuts`` requests, each with the cursor a few lines further on, so each
prefix extends the last one's (what a server's prompt cache reuses) and the suffix is the
lines below; ``--extra`` sends another file of the same kind as an ``input_extra`` chunk
(what llama.vscode sends from the editor's other buffers). Greedy, ``-n`` tokens
(``n_predict``), each request's wall time from sending it to the reply's last byte (prompt
included) and its decoding time (the reply's ``timings.predicted_ms``). The two servers answer
each request in turn, the order alternating; the answers must be the same (greedy is
lossless). Printed per kind: plain's mean seconds a request and the speedup of the default
(plain's time over its time, summed over the requests of the kind), in all and decoding.
"""

from __future__ import annotations

import argparse
import http.client
import inspect
import json
import sys
import time

from edgespec.bench.serving import Server, free_port

REPETITIVE = ("http", "tkinter.constants", "opcode", "stat", "signal", "token")
OTHER = ("textwrap", "shlex", "fnmatch", "bisect", "colorsys", "heapq")


def source(name: str) -> str:
    import importlib
    return inspect.getsource(importlib.import_module(name))


def cuts(text: str, k: int, before: int = 40, after: int = 20,
         step: int = 6) -> list[tuple[str, str]]:
    """``k`` (prefix, suffix) pairs as an editor sends them while its user types down one
    region of the file: the region starts in the file's middle; cut ``j`` is ``step`` lines
    further on than cut ``j - 1``, part-way into a line with code on it (after its
    indentation and half its remaining characters); the prefix is the ``before`` lines above
    the region's start and everything down to the cut (so each request's prefix extends the
    last one's, as it does while typing: what a server caches), the suffix the rest of the
    line and ``after`` lines below."""
    lines = text.splitlines(keepends=True)
    start = max(before, len(lines) // 3)
    out = []
    for j in range(k):
        i = min(start + (j + 1) * step, len(lines) - 2)
        while i < len(lines) - 1 and len(lines[i].strip()) < 8:     # a line with code on it
            i += 1
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        at = indent + (len(line) - indent) // 2
        out.append(("".join(lines[start - before:i]) + line[:at],
                    line[at:] + "".join(lines[i + 1:i + 1 + after])))
    return out


def infill(port: int, prefix: str, suffix: str, extra: list, n: int) -> tuple[float, str, dict]:
    """One request: its wall time, the completion and llama-server's ``timings``."""
    body = {"input_prefix": prefix, "input_suffix": suffix, "input_extra": extra,
            "n_predict": n, "temperature": 0, "cache_prompt": True}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/infill", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    seconds = time.perf_counter() - t0
    conn.close()
    if resp.status != 200:
        sys.exit(f"port {port}: {resp.status} {data[:300]!r}")
    reply = json.loads(data)
    return seconds, reply["content"], reply.get("timings", {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("-n", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cuts", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=8192)
    ap.add_argument("--extra", action="store_true")
    args = ap.parse_args()
    common = ["--target", args.target, "--threads", str(args.threads), "--ctx-size",
              str(args.ctx_size), "--parallel", "1"]
    servers = {}
    for name, more in (("plain", ["--no-spec"]),
                       ("default", ["--draft", args.draft] if args.draft else [])):
        port = free_port()
        servers[name] = Server(name, [sys.executable, "-m", "edgespec", "serve", "--port",
                                      str(port), *common, *more], port)
    try:
        totals = {kind: {name: 0.0 for name in servers} for kind in ("repetitive", "other")}
        decode = {kind: {name: 0.0 for name in servers} for kind in totals}
        count = dict.fromkeys(totals, 0)
        mismatches = 0
        for r in range(args.repeats):
            for kind, names in (("repetitive", REPETITIVE), ("other", OTHER)):
                for f, name in enumerate(names):
                    text = source(name)
                    other = names[(f + 1) % len(names)]
                    extra = [{"filename": other.replace(".", "/") + ".py",
                              "text": source(other)[:6000]}] if args.extra else []
                    for j, (prefix, suffix) in enumerate(cuts(text, args.cuts)):
                        order = list(servers) if (r + f + j) % 2 == 0 else list(servers)[::-1]
                        got = {}
                        for s in order:
                            seconds, content, timed = infill(servers[s].port, prefix, suffix,
                                                             extra, args.n)
                            totals[kind][s] += seconds
                            decode[kind][s] += timed.get("predicted_ms", 0.0) / 1000
                            got[s] = content
                        count[kind] += 1
                        if got["plain"] != got["default"]:
                            mismatches += 1
                            print(f"MISMATCH {name} cut {j}: {got['plain']!r} / "
                                  f"{got['default']!r}", file=sys.stderr)
        for kind, t in totals.items():
            d = decode[kind]
            print(f"{kind}: {count[kind]} requests, plain {t['plain'] / count[kind]:.2f} s a "
                  f"request ({d['plain'] / count[kind]:.2f} s decoding), default "
                  f"{t['plain'] / t['default']:.2f}x plain in all, "
                  f"{d['plain'] / d['default']:.2f}x decoding")
        print(f"-n {args.n}, {args.cuts} cuts a file, {args.repeats} repeats, "
              f"input_extra {'on' if args.extra else 'off'}; answers that differ: {mismatches}")
        sys.exit(1 if mismatches else 0)
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    main()
