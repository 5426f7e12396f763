"""A sentence-transformers BERT model (safetensors weights, a WordPiece vocabulary) written as
a GGUF embedding model that llama.cpp loads: how an embedding model published on a package
index as safetensors (all-MiniLM-L6-v2) reaches this disk without the hub.

Only numpy and the ``gguf`` writer are used: the safetensors file is read by its own header
(:func:`read_safetensors`), tensors are renamed with ``gguf``'s BERT name map, matrices are
written as F16 and everything else as F32, and the tokenizer is written the way llama.cpp's
WordPiece tokenizer reads it (the word-start mark ``▁`` on whole words, none on ``##``
continuations). The pooling the model was trained with comes from sentence-transformers'
``1_Pooling/config.json`` and is declared in the file (``bert.pooling_type``), so llama.cpp
pools as the model expects.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Union

import numpy as np

from .downloads import ChecksumMismatchError, DownloadError, sha256_file

_DTYPES = {"F32": np.float32, "F16": np.float16}
# sentence-transformers' pooling modes -> llama_pooling_type (gguf.PoolingType)
_POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2,
            "pooling_mode_lasttoken": 3}
_LEFT_OUT = ("pooler.", "embeddings.position_ids")   # not used for embeddings
MAX_HEADER = 100 << 20


class ConversionError(DownloadError):
    """A model folder cannot be converted (not a BERT model, unexpected tensors)."""


def read_safetensors(path: Union[str, os.PathLike], skip: tuple = ()
                     ) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, by name, as arrays over a read-only memory map
    (F32 and F16; BF16 widened to F32), but those whose names start with one of ``skip``."""
    path = Path(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER:
            raise ConversionError(f"{path.name}: not a safetensors file (header of {n} bytes)")
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or name.removeprefix("bert.").startswith(skip):
            continue
        begin, end = t["data_offsets"]
        raw = data[begin:end]
        if t["dtype"] == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] in _DTYPES:
            arr = raw.view(_DTYPES[t["dtype"]])
        else:
            raise ConversionError(f"{path.name}: tensor {name} has type {t['dtype']}, which "
                                  "this converter does not read")
        out[name] = arr.reshape(t["shape"])
    return out


def _pooling(folder: Path) -> int:
    """The pooling sentence-transformers applies (mean when the folder does not say)."""
    conf = folder / "1_Pooling" / "config.json"
    if conf.is_file():
        modes = json.loads(conf.read_text("utf-8"))
        for key, kind in _POOLING.items():
            if modes.get(key):
                return kind
    return 1


def _vocabulary(folder: Path) -> tuple[list[str], list[int]]:
    """The WordPiece pieces as llama.cpp's tokenizer reads them, and their types (special
    tokens: control)."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text("utf-8"))
    vocab = tokenizer["model"]["vocab"]
    pieces = [""] * len(vocab)
    for piece, i in vocab.items():
        pieces[i] = piece
    special = {t["id"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    types = [3 if i in special else 1 for i in range(len(pieces))]
    texts = [p if i in special else p[2:] if p.startswith("##") else "\u2581" + p
             for i, p in enumerate(pieces)]
    return texts, types


def convert_bert(folder: Union[str, os.PathLike], dest: Union[str, os.PathLike],
                 name: str) -> Path:
    """Write the BERT model in ``folder`` (``config.json``, ``model.safetensors``,
    ``tokenizer.json`` and sentence-transformers' pooling config) to ``dest`` as a GGUF
    named ``name``. Raises :class:`ConversionError` for a folder that is not one."""
    import gguf
    folder, dest = Path(folder), Path(dest)
    config = json.loads((folder / "config.json").read_text("utf-8"))
    if config.get("model_type") != "bert":
        raise ConversionError(f"{folder}: model_type {config.get('model_type')!r} is not "
                              "'bert'")
    tensors = read_safetensors(folder / "model.safetensors", skip=_LEFT_OUT)
    n_layer = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
    w = gguf.GGUFWriter(str(dest), "bert")
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_block_count(n_layer)
    w.add_head_count(config["num_attention_heads"])
    w.add_layer_norm_eps(config.get("layer_norm_eps", 1e-12))
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(_pooling(folder)))
    texts, types = _vocabulary(folder)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(texts)
    w.add_token_types(types)
    w.add_token_type_count(config.get("type_vocab_size", 1))
    quiet = logging.getLogger("gguf.vocab")     # it warns of BERT's CLS, which is its BOS
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        gguf.SpecialVocab(folder, n_vocab=len(texts)).add_to_gguf(w, quiet=True)
    finally:
        quiet.setLevel(level)
    for hf_name, arr in tensors.items():
        name_out = names.get_name(hf_name.removeprefix("bert."), try_suffixes=(".weight",
                                                                               ".bias"))
        if name_out is None:
            raise ConversionError(f"{folder}: tensor {hf_name} has no GGUF name")
        matrix = arr.ndim == 2 and name_out.startswith(("blk.", "token_embd.weight"))
        w.add_tensor(name_out, np.ascontiguousarray(arr, np.float16 if matrix else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


def fetch_converted(source: dict, dest: Path, name: str, *, show_progress: bool = False,
                    log=lambda s: None) -> Path:
    """A ``pypi-convert`` registry source made into ``dest``: its wheels downloaded, the
    model folder checked against the registry's sha256 of each file it names
    (``sha256``), converted (:func:`convert_bert`), and moved into place only once
    written whole."""
    import tempfile

    from .wheels import unpack_folder
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".edgespec-convert-", dir=dest.parent) as tmp:
        folder = unpack_folder(source["packages"], source["folder"], Path(tmp) / "model",
                               show_progress=show_progress, log=log)
        for file, expected in source["sha256"].items():
            actual = sha256_file(folder / file) if (folder / file).is_file() else "missing"
            if actual != expected:
                raise ChecksumMismatchError(f"{name}: {file} has sha256 {actual}, expected "
                                            f"{expected}; nothing was written")
        log(f"converting {source['folder']} to {dest.name}")
        partial = dest.with_name(dest.name + ".partial")
        try:
            convert_bert(folder, partial, name)
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    return dest
