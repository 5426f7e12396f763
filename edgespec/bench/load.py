"""``edgespec bench --load N``: speed on a busy machine, measured side by side with an idle one.

A desktop assistant shares the machine with a browser, an IDE, a build. This runs the same
prompts idle and with N busy processes (started and ended by the bench, each bounded in time),
for each thread setting — the count a plain load gives (every core, today's default), each
pinned count, and threads that follow the load — plain and speculative, with llama-cpp-python
at every core as the peer under the same conditions.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from ..config import SamplingParams

# A busy process: a pure-Python spin, ended by the bench (by its pid) or after this long.
BUSY_SECONDS_MAX = 1800
_SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


class BusyProcesses:
    """N processes that keep a core each busy while the block runs."""

    def __init__(self, n: int, seconds: int = BUSY_SECONDS_MAX):
        self.n, self.seconds = n, seconds
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "BusyProcesses":
        self.procs = [subprocess.Popen([sys.executable, "-c", _SPIN.format(s=self.seconds)])
                      for _ in range(self.n)]
        time.sleep(0.5)     # let them be scheduled before the first measurement
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


@dataclass
class LoadCell:
    tokens: int = 0
    seconds: float = 0.0
    threads: list = field(default_factory=list)   # threads in use after each generation

    def add(self, n: int, seconds: float, threads: Optional[int] = None) -> None:
        self.tokens += n
        self.seconds += seconds
        if threads is not None:
            self.threads.append(threads)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def run_load_bench(engine, prompts: list[str], *, load: int, max_tokens: int, raw: bool,
                   repeats: int = 1, peers: bool = True, log=print) -> dict:
    """Each condition (idle, then N busy processes) × thread setting × (plain, speculative),
    the settings' order rotating from prompt to prompt.

    The settings share one Engine, but each keeps the costs its own runs refined, as if it
    ran alone: otherwise the seconds-long stalled passes of two pinned threads under load
    would inflate the shared cost model for whichever setting ran next."""
    from ..backend.peer import LlamaCppPythonPeer
    most = engine.target.config.n_threads
    settings: list[tuple[str, Optional[int]]] = [(f"pinned {t}", t) for t in range(1, most + 1)]
    settings.append(("adaptive", None))
    default = f"pinned {most}"          # what a plain load gives: every core
    greedy = SamplingParams(temperature=0.0)
    conditions = ["idle", f"{load} busy"]
    cells = {(c, s, m): LoadCell() for c in conditions for s, _ in settings
             for m in ("plain", "speculative")}
    peer = None
    if peers:
        peer = LlamaCppPythonPeer(engine.target.path, n_ctx=2048, n_threads=most,
                                  cpu_extra_buffers=engine.target.config.cpu_extra_buffers)
        cells.update({(c, "llama-cpp-python", "plain"): LoadCell() for c in conditions})
    token_prompts = [engine.prompt_tokens(p, raw=raw) for p in prompts]
    costs = engine.costs          # None with a pinned draft length
    own_costs: dict = {}
    try:
        for r in range(repeats):
            for cond in conditions:
                with BusyProcesses(load if cond != "idle" else 0) as busy:
                    if busy.pids:
                        log(f"  {len(busy.pids)} busy processes: pids {busy.pids}")
                    for i, prompt in enumerate(prompts):
                        shift = (i + r) % len(settings)
                        for name, n in settings[shift:] + settings[:shift]:
                            engine.set_threads(n)
                            if costs is not None and name in own_costs:
                                costs.adopt(own_costs[name])
                            for mode in ("plain", "speculative"):
                                out = engine.generate(prompt, max_tokens=max_tokens,
                                                      sampling=greedy, raw=raw,
                                                      speculative=mode == "speculative")
                                s = out.stats
                                cells[(cond, name, mode)].add(s.completion_tokens,
                                                              s.decode_seconds,
                                                              s.target_threads)
                            if costs is not None:
                                own_costs[name] = costs.snapshot()
                        if peer is not None:
                            cells[(cond, "llama-cpp-python", "plain")].add(
                                *peer.generate(token_prompts[i], max_tokens))
                        log(f"  {cond}, prompt {i + 1}/{len(prompts)}: " + ", ".join(
                            f"{name} {cells[(cond, name, 'speculative')].tps:.1f}"
                            for name, _ in settings) + " tok/s (speculative, so far)")
    finally:
        engine.set_threads(None)
        if peer is not None:
            peer.close()
    return {"conditions": conditions, "default": default,
            "settings": [s for s, _ in settings],
            "cells": {f"{c}|{s}|{m}": {"tokens_per_second": cell.tps, "tokens": cell.tokens,
                                       "threads_used": cell.threads}
                      for (c, s, m), cell in cells.items()},
            "load": load, "max_tokens": max_tokens, "prompts": len(prompts) * repeats}


def format_load_report(res: dict) -> str:
    cells = res["cells"]

    def tps(c, s, m):
        cell = cells.get(f"{c}|{s}|{m}")
        return cell["tokens_per_second"] if cell else 0.0
    idle, busy = res["conditions"]
    lines = [f"{'':20}{'idle plain':>12}{'idle spec':>11}{'busy plain':>12}{'busy spec':>11}"
             f"{'busy/idle spec':>16}"]
    for s in res["settings"] + (["llama-cpp-python"] if f"{idle}|llama-cpp-python|plain"
                                in cells else []):
        ip, is_, bp, bs = (tps(idle, s, "plain"), tps(idle, s, "speculative"),
                           tps(busy, s, "plain"), tps(busy, s, "speculative"))
        lines.append(f"{s:20}{ip:12.1f}{(f'{is_:.1f}' if is_ else ''):>11}{bp:12.1f}"
                     f"{(f'{bs:.1f}' if bs else ''):>11}"
                     f"{(f'{bs / is_:.0%}' if is_ and bs else ''):>16}")
    d = res["default"]
    best_busy = max(res["settings"][:-1], key=lambda s: tps(busy, s, "speculative"))
    a = "adaptive"
    ratio = lambda cond, s, mode: tps(cond, a, mode) / max(tps(cond, s, mode), 1e-9)  # noqa: E731
    lines.append(
        f"adaptive vs {d} (today's default): idle plain {ratio(idle, d, 'plain'):.2f}x, "
        f"idle speculative {ratio(idle, d, 'speculative'):.2f}x, "
        f"busy speculative {ratio(busy, d, 'speculative'):.2f}x; "
        f"vs the best pinned count under load ({best_busy}): "
        f"{ratio(busy, best_busy, 'speculative'):.2f}x")
    lines.append(f"{res['prompts']} prompts × {res['max_tokens']} tokens, greedy; busy = "
                 f"{res['load']} spinning processes")
    return "\n".join(lines)
