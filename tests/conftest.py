"""Shared fixtures. Real models come from scripts/fetch_models.py (the README's test command
runs it first); a test that needs a missing model fails and says how to fetch it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from edgespec.registry import model_path


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


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2, an embedding model (BERT), converted from its PyPI wheel."""
    return _real("all-minilm-l6-v2-f16")


@pytest.fixture(scope="session")
def qwen_target_path() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M: the target of the real large/small pair."""
    return _real("qwen2.5-coder-1.5b-instruct-q4_k_m")


@pytest.fixture(scope="session")
def qwen_draft_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M: its draft."""
    return _real("qwen2.5-coder-0.5b-instruct-q4_k_m")


HYBRID_ARCHS = ("qwen35", "lfm2", "mamba2", "granitehybrid")


@pytest.fixture(scope="session")
def hybrid_models(tmp_path_factory, smollm2_q4_path) -> dict:
    """Small random-weight models of the hybrid and recurrent architectures no real GGUF of
    which can be fetched here (edgespec/bench/synthetic.py), with SmolLM2's tokenizer: by
    architecture, its F32 target and two lower-precision copies, ``{"F32": path, "Q8_0":
    path, "Q4_0": path}`` (the Q8_0 agrees with the target on most tokens, the Q4_0 on about
    two thirds: a draft that is often rejected)."""
    from edgespec.backend.quantize import quantize
    from edgespec.bench.synthetic import TINY, write_model
    root = tmp_path_factory.mktemp("hybrid")
    models = {}
    for arch in HYBRID_ARCHS:
        f32 = write_model(TINY[arch], root / f"{arch}.F32.gguf", smollm2_q4_path, seed=1)
        models[arch] = {"F32": f32, **{q: quantize(f32, root / f"{arch}.{q}.gguf", q)
                                       for q in ("Q8_0", "Q4_0")}}
    return models


MODEL_FIXTURES = {"smollm2_q4_path", "smollm2_f32_path", "smollm2_f16_path", "smollm2_q2k_path",
                  "gemma_q4_path", "gemma_f32_path", "minilm_path", "qwen_target_path",
                  "qwen_draft_path", "hybrid_models"}


def pytest_collection_modifyitems(items):
    """A test that asks for a model file is a `real` test: `pytest -m "not real and not slow"`
    (the quick loop) runs the rest in about a minute, without the models; the `slow` ones
    without models (the statistical losslessness tests) take ~8 minutes more."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real)


@pytest.fixture(autouse=True)
def _models_load_only_in_real_tests(request, monkeypatch):
    """Keeps the `real` marker honest: a test without it cannot load a GGUF model."""
    if request.node.get_closest_marker("real") is None:
        from edgespec.backend import embedding, model

        def refuse(self, *args, **kwargs):
            raise AssertionError("this test loads a GGUF model: mark it `real` "
                                 "(or ask for a model fixture)")
        monkeypatch.setattr(model.LlamaModel, "__init__", refuse)
        monkeypatch.setattr(embedding.EmbeddingModel, "__init__", refuse)


@pytest.fixture(autouse=True)
def _no_other_apps_stores(monkeypatch):
    """The tests see only the models they set up: the stores other apps keep on this machine
    (Ollama's, LM Studio's, llama.cpp's, the Hugging Face cache's) are not read, unless a test
    points edgespec at its own (tests/test_stores.py)."""
    monkeypatch.setenv("EDGESPEC_STORES", "none")
    monkeypatch.delenv("EDGESPEC_MODEL_DIRS", raising=False)


def require_tools(*tools: str, packages: str) -> None:
    """Skip a test whose tools (tmux, Xvfb …) are not installed, saying how to install them;
    where every test must run (CI sets EDGESPEC_TEST_ALL=1), fail instead."""
    import os
    import shutil
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        msg = f"{' and '.join(missing)} not installed: apt-get install {packages}"
        if os.environ.get("EDGESPEC_TEST_ALL") == "1":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
