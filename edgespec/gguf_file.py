"""A defensive reader for GGUF headers, run before a file is handed to llama.cpp.

llama.cpp trusts a file's counts and offsets far enough that a truncated or hostile GGUF can
abort or crash the whole process. This reader walks the header with every length checked
against the bytes actually present, checks that each tensor's data lies inside the file, and
keeps the scalar metadata (architecture, name, chat template, …) so that callers can describe
a model without loading it. It never allocates more than the file holds.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InvalidModelError, ModelLoadError

MAGIC = b"GGUF"

# value type -> struct format for fixed-size scalars
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# ggml type id -> (elements per block, bytes per block); from ggml.h / ggml.c type traits.
GGML_BLOCK = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
    14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98),
    19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1),
    25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}

# Architectures llama.cpp loads that are not causal language models: the text-embedding
# encoders (loaded for embeddings, :func:`check_embedding_model`), and the rest.
EMBEDDING_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2",
                             "jina-bert-v3", "neo-bert", "modern-bert", "eurobert"})
_NOT_CAUSAL = EMBEDDING_ARCHS | {"t5encoder", "clip", "wavtokenizer-dec"}
POOLING_NONE, POOLING_MEAN, POOLING_RANK = 0, 1, 4     # llama_pooling_type
_NOT_A_MODEL_TYPES = {"adapter": "a LoRA/control-vector adapter",
                      "mmproj": "a multimodal projector", "clip-vision": "a vision encoder"}

MAX_STRING = 64 << 20  # a chat template or a token text is never this long


class _Truncated(Exception):
    pass


class _TooLong(Exception):
    pass


@dataclass
class GGUFInfo:
    """What the header says about a model file."""

    path: Path
    version: int
    n_tensors: int
    file_size: int
    metadata: dict[str, object] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)
    # array key -> (start, end) byte offsets of its values in the file
    array_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    # name -> (dims, ggml type, absolute offset of its data in the file, size in bytes)
    tensors: dict[str, tuple[tuple[int, ...], int, int, int]] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", self.path.stem))

    @property
    def chat_template(self) -> str | None:
        t = self.metadata.get("tokenizer.chat_template")
        return t if isinstance(t, str) and t else None

    @property
    def n_vocab(self) -> int:
        return self.array_lengths.get("tokenizer.ggml.tokens", 0)


class _Cursor:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Truncated()

    def unpack(self, fmt: str):
        n = struct.calcsize(fmt)
        self.need(n)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def string(self, limit: int = MAX_STRING) -> bytes:
        n = self.unpack("<Q")
        if n > limit:
            raise _TooLong(n)
        self.need(n)
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return bytes(s)


def _bad(path, reason: str) -> InvalidModelError:
    return InvalidModelError(path, reason)


def _read_value(cur: _Cursor, vtype: int, path, key: str):
    if vtype in _SCALAR:
        return cur.unpack(_SCALAR[vtype])
    if vtype == _STRING:
        n = cur.unpack("<Q")
        if n > MAX_STRING:
            raise _bad(path, f"metadata string '{key}' claims {n} bytes")
        cur.need(n)
        raw = bytes(cur.buf[cur.pos:cur.pos + n])
        cur.pos += n
        return raw.decode("utf-8", errors="replace")
    raise _bad(path, f"metadata '{key}' has unknown value type {vtype}")


def _skip_array(cur: _Cursor, path, key: str) -> int:
    etype = cur.unpack("<I")
    count = cur.unpack("<Q")
    if etype in _SCALAR:
        size = struct.calcsize(_SCALAR[etype])
        if count > (cur.size - cur.pos) // size:
            raise _Truncated()
        cur.pos += count * size
    elif etype == _STRING:
        if count > (cur.size - cur.pos) // 8:
            raise _Truncated()
        unpack_from, buf, size = struct.unpack_from, cur.buf, cur.size
        pos = cur.pos
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated()
            pos += 8 + unpack_from("<Q", buf, pos)[0]
        if pos > size:
            raise _Truncated()
        cur.pos = pos
    else:
        raise _bad(path, f"metadata array '{key}' has unsupported element type {etype}")
    return count


def read_gguf(path: str | os.PathLike) -> GGUFInfo:
    """Validate ``path`` as a GGUF file and return its header.

    Raises :class:`ModelLoadError` when the file is missing or unreadable and
    :class:`InvalidModelError` (message ``<path>: not a valid GGUF model (<reason>)``) when
    its contents are not a well-formed GGUF.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(p, "no such file")
    if p.is_dir():
        raise ModelLoadError(p, "is a directory, not a GGUF file")
    try:
        size = p.stat().st_size
        if size < 24:
            raise _bad(p, f"file is {size} bytes, too short for a GGUF header")
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(p, mm, size)
    except PermissionError as e:
        raise ModelLoadError(p, f"cannot read file ({e.strerror})") from None
    except _Truncated:
        raise _bad(p, "file is truncated") from None
    except _TooLong as e:
        raise _bad(p, f"a tensor name claims {e.args[0]} bytes") from None
    except OSError as e:
        raise ModelLoadError(p, f"cannot read file ({e.strerror or e})") from None


def _parse(p: Path, mm, size: int) -> GGUFInfo:
    cur = _Cursor(mm, size)
    magic = bytes(mm[:4])
    if magic != MAGIC:
        raise _bad(p, f"bad magic {magic!r}, expected b'GGUF'")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise _bad(p, f"unsupported GGUF version {version}")
    n_tensors = cur.unpack("<Q")
    n_kv = cur.unpack("<Q")
    # Every entry takes at least a few bytes: counts beyond that are lies.
    if n_kv > size // 12 or n_tensors > size // 24:
        raise _bad(p, f"header claims {n_kv} metadata entries and {n_tensors} tensors "
                      f"in a {size}-byte file")
    info = GGUFInfo(p, version, n_tensors, size)
    for _ in range(n_kv):
        klen = cur.unpack("<Q")
        if klen > 65536:
            raise _bad(p, f"metadata key of {klen} bytes")
        cur.need(klen)
        key = bytes(mm[cur.pos:cur.pos + klen]).decode("utf-8", errors="replace")
        cur.pos += klen
        vtype = cur.unpack("<I")
        if vtype == _ARRAY:
            start = cur.pos
            info.array_lengths[key] = _skip_array(cur, p, key)
            info.array_spans[key] = (start, cur.pos)
        else:
            info.metadata[key] = _read_value(cur, vtype, p, key)

    alignment = info.metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _bad(p, f"general.alignment {alignment!r} is not a power of two")

    extents = []
    for _ in range(n_tensors):
        name = cur.string(limit=65536).decode("utf-8", errors="replace")
        n_dims = cur.unpack("<I")
        if n_dims > 8:
            raise _bad(p, f"tensor '{name}' has {n_dims} dimensions")
        n_elems = 1
        dims = []
        for _ in range(n_dims):
            d = cur.unpack("<Q")
            if d > 1 << 40:
                raise _bad(p, f"tensor '{name}' has a dimension of {d}")
            n_elems *= d
            dims.append(d)
        ttype = cur.unpack("<I")
        offset = cur.unpack("<Q")
        if ttype in GGML_BLOCK:
            blck, tsize = GGML_BLOCK[ttype]
            if n_elems % blck:
                raise _bad(p, f"tensor '{name}' has {n_elems} elements, not a multiple of "
                              f"its block size {blck}")
            extents.append((name, tuple(dims), ttype, offset, n_elems // blck * tsize))
        else:
            extents.append((name, tuple(dims), ttype, offset, 0))

    data_start = (cur.pos + alignment - 1) // alignment * alignment
    for name, dims, ttype, offset, nbytes in extents:
        if data_start + offset + nbytes > size:
            raise _bad(p, f"tensor '{name}' data runs past the end of the file "
                          "(file truncated?)")
        info.tensors[name] = (dims, ttype, data_start + offset, nbytes)
    return info


def _check_model_file(info: GGUFInfo) -> str:
    """The architecture of a file that holds a model (not an adapter, a projector, …)."""
    gtype = str(info.metadata.get("general.type", "")).lower()
    if gtype in _NOT_A_MODEL_TYPES:
        raise ModelLoadError(info.path, f"is {_NOT_A_MODEL_TYPES[gtype]}, not a language model")
    arch = info.architecture
    if not arch:
        raise _bad(info.path, "no general.architecture in its metadata")
    if info.n_tensors == 0:
        raise _bad(info.path, "it holds no tensors")
    return arch


def check_causal_lm(info: GGUFInfo) -> None:
    """Refuse files that llama.cpp may load but that cannot generate text."""
    arch = _check_model_file(info)
    if arch in EMBEDDING_ARCHS:
        raise ModelLoadError(info.path, f"architecture '{arch}' is an embedding model, not a "
                                        "text-generation model (edgespec.Embedder loads it)")
    if arch in _NOT_CAUSAL:
        raise ModelLoadError(info.path, f"architecture '{arch}' is an encoder model, not a "
                                        "text-generation model")


def declared_pooling(info: GGUFInfo) -> int | None:
    """The pooling the file declares (``<arch>.pooling_type``, a llama_pooling_type), or
    None."""
    value = info.metadata.get(f"{info.architecture}.pooling_type")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_embedding_model(info: GGUFInfo) -> bool:
    """Whether the file is an embedding model rather than a generative one: a text encoder's
    architecture, or a declared pooling (as Ollama decides a model's capabilities)."""
    return info.architecture in EMBEDDING_ARCHS or declared_pooling(info) not in (
        None, POOLING_NONE)


def has_kv_cache(info: GGUFInfo) -> bool:
    """Whether llama.cpp keeps a KV cache for the model (encoders attend to the whole input
    at once and keep none)."""
    return info.architecture not in _NOT_CAUSAL


def check_embedding_model(info: GGUFInfo) -> None:
    """Refuse files that cannot turn a text into one vector: not models, encoders of other
    things than text, rerankers (whose pooled output is a score)."""
    arch = _check_model_file(info)
    if arch in _NOT_CAUSAL - EMBEDDING_ARCHS:
        raise ModelLoadError(info.path, f"architecture '{arch}' is not a text model")
    if declared_pooling(info) == POOLING_RANK:
        raise ModelLoadError(info.path, "is a reranker (its pooling ranks a pair of texts), "
                                        "not an embedding model")


# What a vocabulary is made of: its pieces, their kinds, the tokenizer and its special ids.
_VOCAB_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
               "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token")
_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")


def vocab_hash(path: str | os.PathLike) -> str:
    """A digest of a model file's vocabulary (its token texts and types, tokenizer and
    special ids) read from the header: equal for two files exactly when the two tokenize
    alike, whatever their weights (~0.1 s for a 262k vocabulary)."""
    info = read_gguf(path)
    h = hashlib.sha256()
    for key in _VOCAB_KEYS:
        h.update(f"{key}={info.metadata.get(key)!r};".encode())
    with open(info.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for key in _VOCAB_ARRAYS:
            start, end = info.array_spans.get(key, (0, 0))
            h.update(key.encode())
            h.update(mm[start:end])
    return h.hexdigest()[:32]
