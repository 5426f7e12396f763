"""Vocabularies: one class over llama.cpp's vocabulary handle (tokenizing, token bytes and
texts, the tokenizer facts) that serves a loaded model, a remote model and the grammar
engine's tokenizer alike, and the pair compatibility check.

The check follows llama.cpp's ``common_speculative_are_compatible``: same tokenizer type,
same BOS/EOS and their add flags, vocabulary sizes within 128, identical token text from id 5
on. A file's vocabulary can be read without its weights (:class:`VocabOnly`), so a pair is
checked in a fraction of a second before anything large is loaded.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import llama_cpp.llama_cpp as C

from ..errors import BackendError, IncompatiblePairError, ModelLoadError
from ..gguf_file import check_causal_lm, read_gguf
from ..lm import VocabInfo
from .runtime import ensure_init

VOCAB_SIZE_TOLERANCE = 128
VOCAB_CHECK_START = 5


def read_vocab(vocab_p) -> VocabInfo:
    """The tokenizer facts of a llama.cpp vocabulary."""
    n = C.llama_vocab_n_tokens(vocab_p)
    is_eog = C.llama_vocab_is_eog
    # llama.cpp marks end-of-generation tokens by id and by text; asking it for every id is
    # the only exact answer and costs ~0.1 s for a 262k vocabulary, once.
    eog = frozenset(i for i in range(n) if is_eog(vocab_p, i))
    # llama.cpp finds the fill-in-the-middle tokens by their texts (<|fim_prefix|> …)
    fim = (C.llama_vocab_fim_pre(vocab_p), C.llama_vocab_fim_suf(vocab_p),
           C.llama_vocab_fim_mid(vocab_p))
    return VocabInfo(n_vocab=n, vocab_type=C.llama_vocab_type(vocab_p),
                     bos=C.llama_vocab_bos(vocab_p), eos=C.llama_vocab_eos(vocab_p),
                     add_bos=bool(C.llama_vocab_get_add_bos(vocab_p)),
                     add_eos=bool(C.llama_vocab_get_add_eos(vocab_p)), eog=eog,
                     fim=fim if min(fim) >= 0 else None)


class Vocabulary:
    """A llama.cpp vocabulary (``llama_vocab *``, owned by the model that gave it, which must
    outlive this object): text to tokens and back, and its facts (:attr:`info`)."""

    def __init__(self, vocab_p, path: object = "this model") -> None:
        # llama.cpp aborts the process on any text look-up in a model without a vocabulary
        if C.llama_vocab_type(vocab_p) == C.LLAMA_VOCAB_TYPE_NONE:
            raise ModelLoadError(path, "has no tokenizer (tokenizer.ggml.model is 'none'): "
                                       "edgespec needs a model that turns text into tokens")
        self._p = vocab_p
        self.info: VocabInfo = read_vocab(vocab_p)
        self._piece_cache: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)

    def check_token(self, token: int) -> int:
        """``token`` if it is an id of this vocabulary; llama.cpp's own look-ups of an id out
        of range throw through C and abort the process."""
        if not 0 <= token < self.info.n_vocab:
            raise BackendError(f"token id {token} is not in this model's vocabulary "
                               f"(0-{self.info.n_vocab - 1})")
        return token

    def tokenize(self, text: str | bytes, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        """Tokens of ``text``; ``add_special`` adds BOS/EOS as the model asks,
        ``parse_special`` reads control-token texts as those tokens."""
        raw = text.encode("utf-8") if isinstance(text, str) else text
        cap = len(raw) + 16
        for _ in range(2):
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self._p, raw, len(raw), buf, cap, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            cap = -n
        raise BackendError(f"tokenization failed for a text of {len(raw)} bytes")

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of ``token`` as llama.cpp renders it (``special``: control tokens too)."""
        return self._piece(self.check_token(token), special)

    def _piece(self, token: int, special: bool) -> bytes:        # token: checked
        n = C.llama_token_to_piece(self._p, token, self._piece_buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self._p, token, buf, -n, 0, special)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token contributes to the output (control tokens contribute none)."""
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self.piece(token)
        return piece

    def token_text(self, token: int) -> bytes:
        """The raw vocabulary entry (as stored in the GGUF)."""
        return C.llama_vocab_get_text(self._p, self.check_token(token)) or b""

    def attr(self, token: int) -> int:
        return C.llama_vocab_get_attr(self._p, self.check_token(token))

    def all_pieces(self) -> Iterator[tuple[bytes, int]]:
        """(bytes with control tokens rendered, attributes) of every id in order: ids of the
        vocabulary by construction, so without :meth:`check_token`'s cost (Gemma's 262,144
        ids: 0.44 s of a 1.0 s walk)."""
        for t in range(self.info.n_vocab):
            yield self._piece(t, True), C.llama_vocab_get_attr(self._p, t)


class HasVocabulary:
    """``tokenize``, ``token_bytes`` and ``token_text`` of a model, from its ``vocabulary``
    (a :class:`Vocabulary`): the part of :class:`~edgespec.lm.LanguageModel` that text
    needs, the same for a model loaded here and one that runs in a child process."""

    vocabulary: Vocabulary

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        return self.vocabulary.tokenize(text, add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self.vocabulary.token_bytes(token)

    def token_text(self, token: int) -> bytes:
        return self.vocabulary.token_text(token)


class VocabOnly:
    """A GGUF's tokenizer, loaded without weights or a context (llama.cpp ``vocab_only``)."""

    def __init__(self, path: str | os.PathLike):
        ensure_init()
        self.path = Path(path).expanduser()
        check_causal_lm(read_gguf(self.path))
        params = C.llama_model_default_params()
        params.vocab_only = True
        self._model = C.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise ModelLoadError(self.path, "llama.cpp could not read this model's tokenizer")
        try:
            self.vocabulary = Vocabulary(C.llama_model_get_vocab(self._model), self.path)
        except BaseException:
            self.close()
            raise
        self.vocab = self.vocabulary.info

    def token_text(self, token: int) -> bytes:
        return self.vocabulary.token_text(token)

    def close(self) -> None:
        if self._model:
            C.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "VocabOnly":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_compatible_files(target: str | os.PathLike, draft: str | os.PathLike) -> None:
    """The pair check on two files, reading only their tokenizers (fast, little memory)."""
    with VocabOnly(target) as t, VocabOnly(draft) as d:
        check_compatible(t, d)


def check_compatible(target, draft) -> None:
    """Raise :class:`IncompatiblePairError` naming the first difference between vocabularies.

    ``target``/``draft``: anything with ``vocab`` (:class:`VocabInfo`) and ``token_text(i)``
    (a loaded model or a :class:`VocabOnly`).
    """
    t, d = target.vocab, draft.vocab
    if t.vocab_type != d.vocab_type:
        raise IncompatiblePairError(f"tokenizer types differ (target {t.type_name}, draft "
                                    f"{d.type_name})")
    if t.add_bos != d.add_bos or (t.add_bos and t.bos != d.bos):
        raise IncompatiblePairError(f"BOS differs (target add_bos={t.add_bos} id={t.bos}, draft "
                                    f"add_bos={d.add_bos} id={d.bos})")
    if t.add_eos != d.add_eos or t.eos != d.eos:
        raise IncompatiblePairError(f"EOS differs (target add_eos={t.add_eos} id={t.eos}, draft "
                                    f"add_eos={d.add_eos} id={d.eos})")
    if abs(t.n_vocab - d.n_vocab) > VOCAB_SIZE_TOLERANCE:
        raise IncompatiblePairError(f"vocabulary sizes differ by more than "
                                    f"{VOCAB_SIZE_TOLERANCE} (target {t.n_vocab}, draft "
                                    f"{d.n_vocab})")
    for i in range(VOCAB_CHECK_START, min(t.n_vocab, d.n_vocab)):
        a, b = target.token_text(i), draft.token_text(i)
        if a != b:
            raise IncompatiblePairError(
                f"token {i} differs (target {a.decode('utf-8', 'replace')!r}, draft "
                f"{b.decode('utf-8', 'replace')!r})")


_FIM: dict[tuple[str, int, int], Optional[tuple[int, int, int]]] = {}


def file_fim(path: str | os.PathLike) -> Optional[tuple[int, int, int]]:
    """The fill-in-the-middle token ids of the model file at ``path`` (None: it has none),
    from its vocabulary alone (read once per file, by path, size and mtime)."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _FIM:
        with VocabOnly(path) as v:
            _FIM[key] = v.vocab.fim
    return _FIM[key]


class GrammarVocab:
    """A model file's vocabulary as a grammar engine reads it: each token's bytes (control
    tokens, and user-defined ones that look like ``<…>``, prefixed with 0xff: llguidance's
    convention), the end-of-generation ids, BOS, and :meth:`tokenize`, which stays valid as
    long as this object lives (it owns a vocabulary-only load of the file, not a model that
    an Engine may close)."""

    def __init__(self, path: str | os.PathLike):
        self._vocab = VocabOnly(path)
        vocabulary = self._vocab.vocabulary
        info = vocabulary.info
        self.eog, self.bos = info.eog, info.bos
        control = C.LLAMA_TOKEN_ATTR_CONTROL
        user = C.LLAMA_TOKEN_ATTR_USER_DEFINED
        self.pieces: list[bytes] = []
        self.special: list[int] = []
        for t, (piece, attr) in enumerate(vocabulary.all_pieces()):
            if attr & control or (attr & user and piece.startswith(b"<")
                                  and piece.endswith(b">")):
                piece = b"\xff" + piece
                self.special.append(t)
            self.pieces.append(piece)
        self._special = frozenset(self.special)

    def tokenize(self, text: bytes) -> list[int]:
        """Tokens of ``text`` as the model's tokenizer splits it: no BOS, special tokens not
        parsed. llama.cpp matches user-defined tokens (Qwen's ``<tool_call>``) in any text;
        to the grammar engine those are special (their bytes are not the text), so where one
        matched, its text is split again around it: plain text never tokenizes to a special
        token here (the grammar writes those by id)."""
        out = []
        for t in self._vocab.vocabulary.tokenize(text, add_special=False, parse_special=False):
            piece = self.pieces[t][1:]
            if t in self._special and len(piece) > 1:
                out += self.tokenize(piece[:1]) + self.tokenize(piece[1:])
            else:
                out.append(t)
        return out
