"""A map between two vocabularies, for a draft that does not share its target's tokenizer.

Two tokens correspond when they stand for the same bytes: llama.cpp's own rendering of a
token (:meth:`~edgespec.backend.vocab.Vocabulary.all_pieces`) already turns byte-level BPE's
``Ġ`` and SentencePiece's ``▁`` into spaces and a byte token ``<0xE2>`` into its byte, so
equal renderings are the normalised exact match. Control tokens match only control tokens of
the same text, and the draft's end of sequence is the target's. Where one vocabulary holds the
same bytes under several ids (a byte token beside a one-character token), the ordinary token
with the lowest id stands for them, so the map is one-to-one both ways.

The map is built once per pair of vocabularies (~2 s for a 262k one) and kept in the cache
folder under both vocabularies' digests (:func:`~edgespec.gguf_file.vocab_hash`), so any file
with the same tokenizer finds it again.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Optional

import llama_cpp.llama_cpp as C
import numpy as np

from .. import paths
from ..errors import IncompatiblePairError
from ..gguf_file import vocab_hash
from .vocab import check_compatible

log = logging.getLogger(__name__)

# Below this share of the draft's tokens mapped, a draft across vocabularies is refused.
MIN_OVERLAP = 0.5


class VocabMap:
    """Draft ids to target ids and back (-1: no counterpart). ``to_draft[to_target[d]] == d``
    for every mapped draft id ``d``."""

    def __init__(self, to_target: np.ndarray, to_draft: np.ndarray):
        self.to_target = to_target.astype(np.int64, copy=False)
        self.to_draft = to_draft.astype(np.int64, copy=False)
        self.keep = self.to_target >= 0       # the draft ids it may propose
        self.n_mapped = int(self.keep.sum())
        self.difference = ""    # what llama.cpp's rule found different (check_pair)

    @property
    def n_draft(self) -> int:
        return len(self.to_target)

    @property
    def n_target(self) -> int:
        return len(self.to_draft)

    @property
    def overlap(self) -> float:
        """The share of the draft's tokens that are also the target's."""
        return self.n_mapped / max(1, self.n_draft)

    @property
    def share(self) -> str:
        """:attr:`overlap` as a percentage, rounded down (a map that misses one token of
        49,152 is not 100%)."""
        return f"{math.floor(self.overlap * 1000) / 10:.1f}%"

    def describe(self) -> str:
        return (f"draft and target use different vocabularies: {self.share} of the "
                f"draft's tokens map to the target's; drafting across them")


def _keys(vocabulary) -> tuple[list[Optional[bytes]], np.ndarray]:
    """Each token's key (its bytes; control tokens their text behind a 0 byte that no plain
    text starts with; None for unused and empty ones) and whether it is a byte token."""
    control, unused = C.LLAMA_TOKEN_ATTR_CONTROL, C.LLAMA_TOKEN_ATTR_UNUSED
    byte = C.LLAMA_TOKEN_ATTR_BYTE
    keys: list[Optional[bytes]] = []
    is_byte = np.zeros(vocabulary.info.n_vocab, dtype=bool)
    for t, (piece, attr) in enumerate(vocabulary.all_pieces()):
        if attr & unused or not piece:
            keys.append(None)
        elif attr & control:
            keys.append(b"\x00" + piece)
        else:
            keys.append(piece)
            is_byte[t] = bool(attr & byte)
    return keys, is_byte


def _canonical(keys: list[Optional[bytes]], is_byte: np.ndarray) -> dict[bytes, int]:
    """key -> the id that stands for it: an ordinary token before a byte token, then the
    lowest id."""
    out: dict[bytes, int] = {}
    for t, k in enumerate(keys):
        if k is None:
            continue
        have = out.get(k)
        if have is None or (is_byte[have] and not is_byte[t]):
            out[k] = t
    return out


def build_map(target_vocabulary, draft_vocabulary) -> VocabMap:
    """The map between two :class:`~edgespec.backend.vocab.Vocabulary` objects."""
    t_keys, t_byte = _keys(target_vocabulary)
    d_keys, d_byte = _keys(draft_vocabulary)
    t_of = _canonical(t_keys, t_byte)
    d_of = _canonical(d_keys, d_byte)
    to_target = np.full(len(d_keys), -1, dtype=np.int64)
    to_draft = np.full(len(t_keys), -1, dtype=np.int64)
    for k, d in d_of.items():
        t = t_of.get(k)
        if t is not None:
            to_target[d], to_draft[t] = t, d
    t_info, d_info = target_vocabulary.info, draft_vocabulary.info
    if 0 <= d_info.eos < len(d_keys) and 0 <= t_info.eos < len(t_keys) \
            and to_target[d_info.eos] < 0 and to_draft[t_info.eos] < 0:
        to_target[d_info.eos], to_draft[t_info.eos] = t_info.eos, d_info.eos
    return VocabMap(to_target, to_draft)


def _map_file(target_hash: str, draft_hash: str) -> Path:
    return paths.cache_dir() / "vocab_maps" / f"{target_hash}-{draft_hash}.npz"


def _load(path: Path, n_target: int, n_draft: int) -> Optional[VocabMap]:
    try:
        with np.load(path) as z:
            to_target, to_draft = z["to_target"], z["to_draft"]
    except (OSError, ValueError, KeyError):
        return None
    if to_target.shape != (n_draft,) or to_draft.shape != (n_target,):
        return None
    return VocabMap(to_target, to_draft)


def _save(path: Path, vmap: VocabMap) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, to_target=vmap.to_target.astype(np.int32),
                 to_draft=vmap.to_draft.astype(np.int32))
        tmp.replace(path)
    except OSError:
        pass    # a read-only cache folder only costs building it again next time


def vocab_map(target, draft) -> VocabMap:
    """The map between two models' vocabularies (anything with ``path`` and ``vocabulary``:
    a loaded model or a :class:`~edgespec.backend.vocab.VocabOnly`), from the cache folder
    when it was built before."""
    path = _map_file(vocab_hash(target.path), vocab_hash(draft.path))
    n_t, n_d = target.vocabulary.info.n_vocab, draft.vocabulary.info.n_vocab
    vmap = _load(path, n_t, n_d)
    if vmap is None:
        vmap = build_map(target.vocabulary, draft.vocabulary)
        _save(path, vmap)
    return vmap


def check_pair(target, draft) -> Optional[VocabMap]:
    """None when the draft shares the target's tokenizer (llama.cpp's rule,
    :func:`~edgespec.backend.vocab.check_compatible`); else the map between their
    vocabularies, when at least :data:`MIN_OVERLAP` of the draft's tokens are the target's.
    Raises :class:`~edgespec.errors.IncompatiblePairError` with the share otherwise."""
    try:
        check_compatible(target, draft)
        return None
    except IncompatiblePairError as e:
        difference = e.difference
    vmap = vocab_map(target, draft)
    if vmap.overlap < MIN_OVERLAP:
        raise IncompatiblePairError(
            f"{difference}, and only {vmap.share} of the draft's tokens map to the "
            f"target's (drafting across vocabularies needs {MIN_OVERLAP:.0%})")
    vmap.difference = difference
    log.info("%s (%s)", vmap.describe(), difference)
    return vmap


def check_pair_files(target: str | os.PathLike, draft: str | os.PathLike) -> Optional[VocabMap]:
    """:func:`check_pair` on two files, reading only their tokenizers."""
    from .vocab import VocabOnly
    with VocabOnly(target) as t, VocabOnly(draft) as d:
        return check_pair(t, d)
