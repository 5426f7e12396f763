#!/usr/bin/env python3
"""Two models named in turn on one `edgespec serve --max-loaded 1`: load times, answers, and
the server's memory against its budget.

    python scripts/bench_models_on_demand.py [--models A.gguf B.gguf] [--turns 6]

Starts the server on a temporary models folder holding (links to) the two GGUF files, sends
requests that alternate between them with the official `ollama` client, and after each prints
the model the reply names, `/api/ps`, the load time (Ollama's `load_duration`) and the server
process's resident memory (from /proc), next to what the manager counts against --max-ram
(`/api/ps` sizes: the files and KV caches, or the load's measured growth when larger).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MODELS = Path(os.environ.get("EDGESPEC_MODELS", Path.home() / ".cache/edgespec/models"))


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs=2, type=Path,
                    default=[MODELS / "SmolLM2-135M-Instruct.F16.gguf",
                             MODELS / "gemma-3-270m.Q4_K_M.gguf"])
    ap.add_argument("--turns", type=int, default=6)
    args = ap.parse_args()
    import ollama

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from edgespec.catalogue import entry_for

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "models"
        folder.mkdir()
        names = []
        for m in args.models:
            (folder / m.name).symlink_to(m.resolve())
            names.append(m.name.removesuffix(".gguf"))
        env = {**os.environ, "EDGESPEC_MODELS": str(folder), "HF_HUB_CACHE": str(Path(tmp) /
                                                                                 "hub")}
        proc = subprocess.Popen([sys.executable, "-m", "edgespec", "serve", "--port", "0",
                                 "--target", str(folder / args.models[0].name),
                                 "--max-loaded", "1", "--ctx-size", "2048"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        port = None
        lines: list[str] = []

        def read() -> None:
            nonlocal port
            for line in proc.stderr:
                lines.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    port = int(m.group(1))
        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 180
        while port is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("the server did not start:\n" + "".join(lines))
            time.sleep(0.1)
        try:
            client = ollama.Client(host=f"http://127.0.0.1:{port}")
            budget = {n: entry_for(n, folder / m.name).memory(2048) / 2**20
                      for n, m in zip(names, args.models)}
            print(f"server pid {proc.pid}; estimate per loaded model: "
                  + ", ".join(f"{n} {mib:.0f} MiB" for n, mib in budget.items()))
            print(f"{'turn':>4} {'asked':<32} {'answered by':<32} {'loaded (ps)':<32} "
                  f"{'load s':>7} {'counted MiB':>12} {'RSS MiB':>8}")
            for turn in range(args.turns):
                name = names[turn % 2]
                r = client.generate(model=name, prompt="Say hello.",
                                    options={"temperature": 0, "num_predict": 8})
                loaded = client.ps().models
                ps = [m.model for m in loaded]
                counted = sum(m.size for m in loaded) / 2**20
                print(f"{turn:>4} {name:<32} {r.model:<32} {','.join(ps):<32} "
                      f"{(r.load_duration or 0) / 1e9:7.2f} {counted:12.0f} "
                      f"{rss_mib(proc.pid):8.0f}")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
