"""What the interleaved task-bench scripts share (bench_tasks_kv.py, bench_tasks_fa.py,
bench_long_context_costs.py): their command line, the prompts' loop with the variants
interleaved, and one answer timed whole from cold caches.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgespec import SamplingParams
from edgespec.bench.long_prompts import cold
from edgespec.bench.tasks import task_prompts
from edgespec.engine.request import GenerationRequest

TASKS = "chat,translation,summarisation,qa,math,long_passage"
_keys = itertools.count()


def task_args(doc: str, pair: str) -> argparse.Namespace:
    """--pair, --tasks and -n; ``raw`` is set for a pair without a chat template (Gemma-3)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--pair", default=pair)
    ap.add_argument("--tasks", default=TASKS)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    args = ap.parse_args()
    args.raw = args.pair.startswith("gemma")     # (Gemma-3-270M has no chat template)
    return args


def interleaved(args: argparse.Namespace, names: list, run):
    """Each task of ``args.tasks`` in turn, with one ``{name: run(prompt, name)}`` per prompt of
    its set: every variant on every prompt, back to back, the order reversed from one prompt to
    the next."""
    prompts = task_prompts()
    for task in args.tasks.split(","):
        yield task, [{name: run(prompt, name) for name in (names if i % 2 == 0 else names[::-1])}
                     for i, prompt in enumerate(prompts[task])]


def answer(engine, prompt, args: argparse.Namespace, speculative: bool):
    """One greedy answer of ``prompt`` from cold caches with a suffix index of its own:
    (whole seconds, the stream's result)."""
    cold(engine)
    req = GenerationRequest(prompt, max_tokens=args.max_tokens,
                            sampling=SamplingParams(temperature=0.0), raw=args.raw,
                            speculative=speculative, index_key=f"task-ab-{next(_keys)}")
    t0 = time.perf_counter()
    stream = engine.submit(req)
    for _ in stream:
        pass
    return time.perf_counter() - t0, stream.result
