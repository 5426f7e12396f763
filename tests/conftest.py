"""Shared fixtures. Real models come from scripts/fetch_models.py (the README's test command
runs it first); a test that needs a missing model fails and says how to fetch it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from edgespec.pairs import model_path  # noqa: E402


def _real(name: str) -> Path:
    path = model_path(name)
    if not path.is_file():
        pytest.fail(f"model {name} is missing at {path}: run `python scripts/fetch_models.py`",
                    pytrace=False)
    return path


@pytest.fixture(scope="session")
def smollm2_q4_path() -> Path:
    return _real("smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="session")
def smollm2_f32_path() -> Path:
    return _real("smollm2-135m-instruct-f32")


@pytest.fixture(scope="session")
def smollm2_f16_path() -> Path:
    return _real("smollm2-135m-instruct-f16")


@pytest.fixture(scope="session")
def smollm2_q2k_path() -> Path:
    return _real("smollm2-135m-instruct-q2_k")


@pytest.fixture(scope="session")
def gemma_q4_path() -> Path:
    return _real("gemma-3-270m-q4_k_m")


@pytest.fixture(scope="session")
def gemma_f32_path() -> Path:
    return _real("gemma-3-270m-f32")
