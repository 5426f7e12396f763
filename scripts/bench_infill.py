#!/usr/bin/env python3
"""Autocomplete as editors ask for it: llama-server's `/infill` (llama.vscode, llama.vim)
through `edgespec serve`, with its default drafting against `--no-spec`, the same target, side
by side in one run.

    python scripts/bench_infill.py --target T.gguf [--draft D.gguf] [-n 48] [--repeats 2]
                                   [--cuts 6] [--threads 2] [--extra]

Held-out code (modules of Python's standard library, read with ``inspect``): "repetitive"
files that repeat their own patterns (tables of constants, families of near-identical
methods) and "other" files of plain logic. Each file is cut at ``--cuts`` lines spread over
it, part-way into the line (an editor's cursor): the text before is ``input_prefix``, the rest
``input_suffix``; ``--extra`` sends another file of the same kind as an ``input_extra`` chunk
(what llama.vscode sends from the editor's other buffers). Greedy, ``-n`` tokens
(``n_predict``), each request's wall time from sending it to the reply's last byte (prompt
included). The two servers answer each request in turn, the order alternating; the answers
must be the same (greedy is lossless). Printed per kind: plain's mean seconds a request and the
speedup of the default (plain's time over its time, summed over the requests of the kind).
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


def cuts(text: str, k: int) -> list[tuple[str, str]]:
    """``k`` (prefix, suffix) pairs: cut at lines spread over the file's middle, part-way into
    each line (after its indentation and half its remaining characters)."""
    lines = text.splitlines(keepends=True)
    out = []
    for j in range(k):
        i = len(lines) * (j + 1) // (k + 1)
        while i < len(lines) - 1 and len(lines[i].strip()) < 8:     # a line with code on it
            i += 1
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        at = indent + (len(line) - indent) // 2
        out.append(("".join(lines[:i]) + line[:at], line[at:] + "".join(lines[i + 1:])))
    return out


def infill(port: int, prefix: str, suffix: str, extra: list, n: int) -> tuple[float, str]:
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
    return seconds, json.loads(data)["content"]


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
                        prefix, suffix = prefix[-6000:], suffix[:3000]
                        order = list(servers) if (r + f + j) % 2 == 0 else list(servers)[::-1]
                        got = {}
                        for s in order:
                            seconds, content = infill(servers[s].port, prefix, suffix, extra,
                                                      args.n)
                            totals[kind][s] += seconds
                            got[s] = content
                        count[kind] += 1
                        if got["plain"] != got["default"]:
                            mismatches += 1
                            print(f"MISMATCH {name} cut {j}: {got['plain']!r} / "
                                  f"{got['default']!r}", file=sys.stderr)
        for kind, t in totals.items():
            print(f"{kind}: {count[kind]} requests, plain {t['plain'] / count[kind]:.2f} s a "
                  f"request, default {t['plain'] / t['default']:.2f}x plain")
        print(f"-n {args.n}, {args.cuts} cuts a file, {args.repeats} repeats, "
              f"input_extra {'on' if args.extra else 'off'}; answers that differ: {mismatches}")
        sys.exit(1 if mismatches else 0)
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    main()
