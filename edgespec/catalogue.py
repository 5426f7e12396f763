"""What models are on this disk, by the name a user or a request gives them.

One module for every place that lists, finds or removes model files: ``edgespec serve`` (its
models on demand), ``edgespec pairs`` (the files of your own beside the registry's), ``edgespec
pull`` (the name a pulled model is served under) and ``edgespec rm`` (a file of your own).

:func:`scan_catalog` lists what a request may name: each registry pair whose two files are
here (by the pair's name), each registry embedding model that is here (by its name),
each ``*.gguf`` file in the models folder (by its file name without
``.gguf``), each registry model pulled alone into the hub cache (by its registry name), each model
of another app's store (Ollama, LM Studio, llama.cpp's cache, the Hugging Face cache, the
``EDGESPEC_MODEL_DIRS`` folders: :mod:`edgespec.stores`, by the name that app shows), and
the models the server was started with (:func:`entry_for`). Reading a file's header is cached
by path, size and modification time, so a re-scan costs a directory listing and a few
``stat`` calls. :func:`find_entry` is how a name finds its entry (Ollama's ``:latest`` tag,
a registry model's file, a case-insensitive match); :class:`ModelNotFound` says what to do
when nothing matches.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
from enum import Enum
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from . import paths
from .errors import EdgespecError, ModelLoadError, ModelNotFoundError
from .gguf_file import (check_causal_lm, check_embedding_model, has_kv_cache,
                        is_embedding_model, read_gguf)
from .registry import model_path, registry
from .registry.draft_choice import chosen_files
from .registry.store import is_present, pair_draft_path
from .stores import StoreFile, real_path, store_files
from .thinking import thinking_mode

log = logging.getLogger(__name__)

KV_BYTES_PER_VALUE = 2       # llama.cpp's KV cache holds f16 values by default
MAX_NAMES_SHOWN = 20         # in a ModelNotFound message
MAX_HEADERS_KEPT = 256       # GGUF headers cached between scans

# llama.cpp's llama_ftype (general.file_type) -> the name Ollama shows as quantization_level
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}


class ModelKind(str, Enum):
    """What a catalog entry is: a registry ``pair`` (target and draft), one ``gguf`` file (a
    draft only when the server was started with one), or an ``embedding`` model (it embeds,
    and cannot generate)."""

    PAIR = "pair"
    GGUF = "gguf"
    EMBEDDING = "embedding"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CatalogEntry:
    """One model a request may name.

    ``kind``: a :class:`ModelKind`. ``size``: bytes on disk, target
    and draft. ``modified``: the target file's mtime (epoch seconds). ``details``: Ollama's
    ``details`` object (``format``, ``family``, ``families``, ``parameter_size``,
    ``quantization_level``), read from the target's GGUF header. ``digest``: a sha256 of the
    name, paths, size and mtime, stable while the files are unchanged; it is NOT a hash of the
    files' bytes (hashing gigabytes on every listing would take minutes).
    ``kv_bytes_per_token``: what one token of context costs in the KV caches of the target and
    the draft (0 when the headers do not say). ``n_ctx_train``: the context the target was
    trained with (0: not said); ``has_template``: its file carries a chat template;
    ``thinks``: that template has a thinking mode (:func:`edgespec.thinking.thinking_mode`).
    ``store``: the app whose store holds the file (``ollama``, ``lmstudio``, ``llama.cpp``,
    ``huggingface``, ``folder``; "" for edgespec's own), ``target`` being where in it;
    ``aliases``: other names that find it (:func:`find_entry`).
    """

    name: str
    target: Path
    draft: Optional[Path]
    kind: ModelKind
    size: int
    modified: float
    details: dict
    digest: str
    kv_bytes_per_token: int = 0
    n_ctx_train: int = 0
    has_template: bool = True
    thinks: bool = False
    store: str = ""
    aliases: tuple = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ModelKind(self.kind))     # a name said as text too

    def memory(self, n_ctx: int) -> int:
        """The memory this model takes loaded with a context of ``n_ctx`` tokens: its files
        (mapped whole) plus the KV caches at f16. An upper bound: it counts every layer's
        cache at full length, including sliding-window layers."""
        return self.size + self.kv_bytes_per_token * n_ctx


@dataclass(frozen=True)
class _Header:
    """What a catalog needs from one GGUF header."""

    family: str
    parameter_size: str
    quantization_level: str
    kv_bytes_per_token: int
    n_ctx_train: int
    has_template: bool
    thinks: bool
    embedding: bool              # an embedding model (gguf_file.is_embedding_model)


def _count(n: float) -> str:
    """``134_515_008`` -> ``'135M'``, ``1.71e9`` -> ``'1.7B'`` (as Ollama shows sizes)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}" if unit == "B" else f"{n / scale:.0f}{unit}"
    return str(int(n))


def _kv_bytes_per_token(metadata: Mapping[str, object], arch: str) -> int:
    """n_layer × n_head_kv × (key + value head dims) × 2 bytes, from the header; 0 if unknown.
    A per-layer head count (an array) counts as the query head count: an upper bound."""
    def number(key: str) -> int:
        v = metadata.get(f"{arch}.{key}")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0
    n_layer, n_head, n_embd = (number("block_count"), number("attention.head_count"),
                               number("embedding_length"))
    if not (n_layer and n_head and n_embd):
        return 0
    n_head_kv = number("attention.head_count_kv") or n_head
    k = number("attention.key_length") or n_embd // n_head
    v = number("attention.value_length") or n_embd // n_head
    return n_layer * n_head_kv * (k + v) * KV_BYTES_PER_VALUE


def _parse_header(path: Path) -> _Header:
    """What the catalog shows of ``path``; raises :class:`EdgespecError` for a file that is
    not a usable GGUF model."""
    info = read_gguf(path)
    embedding = is_embedding_model(info)
    (check_embedding_model if embedding else check_causal_lm)(info)
    md = info.metadata
    label = md.get("general.size_label")
    if not (isinstance(label, str) and label):
        label = _count(sum(math.prod(dims) for dims, *_ in info.tensors.values()))
    ftype = md.get("general.file_type")
    quant = FILE_TYPES.get(ftype, f"type {ftype}") if isinstance(ftype, int) else "unknown"
    trained = md.get(f"{info.architecture}.context_length")
    template = info.chat_template
    kv = _kv_bytes_per_token(md, info.architecture) if has_kv_cache(info) else 0
    return _Header(info.architecture, label, quant, kv,
                   trained if isinstance(trained, int) and not isinstance(trained, bool) else 0,
                   bool(template), thinking_mode(template) is not None, embedding)


# Headers read, by (path, size, mtime_ns): a re-scan reads only new or changed files.
_HEADERS: dict[tuple[str, int, int], _Header] = {}


def _read_header(path: Path) -> tuple[_Header, int, float]:
    """(header, bytes, mtime) of ``path``; raises :class:`EdgespecError` when unusable."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelLoadError(path, "no such file") from None
    except OSError as e:
        raise ModelLoadError(path, f"cannot read it ({e.strerror or e})") from None
    key = (str(path), st.st_size, st.st_mtime_ns)    # a changed file is read again
    header = _HEADERS.get(key)
    if header is None:
        header = _parse_header(path)
        if len(_HEADERS) >= MAX_HEADERS_KEPT:
            _HEADERS.clear()
        _HEADERS[key] = header
    return header, st.st_size, st.st_mtime


def entry_for(name: str, target: Union[str, Path], draft: Union[str, Path, None] = None,
              kind: Optional[ModelKind] = None) -> CatalogEntry:
    """The catalog entry of ``target`` (and ``draft``) under ``name``: how the server names the
    model it was started with. ``kind`` defaults to a pair with a draft, else an embedding
    model's, else one file's.

    Raises :class:`EdgespecError` (a :class:`~edgespec.errors.ModelLoadError`) when a file is
    missing or not a usable GGUF model."""
    t = Path(target).expanduser()
    d = Path(draft).expanduser() if draft is not None else None
    header, size, mtime = _read_header(t)
    kv = header.kv_bytes_per_token
    if d is not None:
        d_header, d_size, _ = _read_header(d)
        size += d_size
        kv += d_header.kv_bytes_per_token
    details = {"format": "gguf", "family": header.family,
               "families": [header.family] if header.family else None,
               "parameter_size": header.parameter_size,
               "quantization_level": header.quantization_level}
    digest = hashlib.sha256("\0".join((name, str(t), str(d or ""), str(size), repr(mtime))
                                      ).encode()).hexdigest()
    kind = ModelKind(kind) if kind is not None else (
        ModelKind.PAIR if d is not None else ModelKind.EMBEDDING if header.embedding
        else ModelKind.GGUF)
    return CatalogEntry(name, t, d, kind, size, mtime, details, digest, kv, header.n_ctx_train,
                        header.has_template, header.thinks)


@functools.lru_cache(maxsize=256)
def _warn_once(message: str) -> None:
    """Log ``message`` the first time only (a bad file is reported once, not every scan)."""
    log.warning(message)


def _scanned(name: str, target: Path, draft: Optional[Path] = None,
             kind: Optional[ModelKind] = None) -> Optional[CatalogEntry]:
    try:
        return entry_for(name, target, draft, kind)
    except EdgespecError as e:
        _warn_once(f"model {name!r} left out of the list: {e}")
        return None


def other_stores(found: Mapping[str, CatalogEntry]) -> list[tuple[StoreFile,
                                                                    Optional[CatalogEntry]]]:
    """The models of other apps' stores beside ``found`` (edgespec's own entries): each file
    with its entry, or None and why not in its ``problem`` (llama.cpp cannot load it, or its
    name is taken by one of ``found``). A file ``found`` lists already (a registry model in
    the Hugging Face cache) is left out."""
    own = {real_path(p) for e in found.values() for p in (e.target, e.draft) if p is not None}
    out = []
    for f in store_files():
        if real_path(f.path) in own:
            continue
        entry = None
        if not f.problem and f.name in found:
            f = f.but(f"its name is taken by edgespec's own {found[f.name].target} (run this "
                      "one by its path)")
        elif not f.problem:
            try:
                entry = dataclasses.replace(entry_for(f.name, f.path), store=f.store,
                                            aliases=f.short)
            except EdgespecError as e:
                f = f.but(str(e).removeprefix(f"{f.path}: "))
        out.append((f, entry))
    return out


def folder_files(folder: Optional[Path] = None) -> list[Path]:
    """The GGUF files in the models folder (default ``paths.models_dir()``), sorted by name:
    not hidden, not being written (``*.gguf.partial``), plain files."""
    folder = Path(folder) if folder is not None else paths.models_dir()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.gguf") if not p.name.startswith(".") and p.is_file())


def own_files() -> list[Path]:
    """The files in the models folder that no registry entry names: drafts made by
    ``edgespec pair derive``, and anything put there by hand."""
    known = {m.file for m in registry().models.values()} | chosen_files()
    return [p for p in folder_files() if p.name not in known]


def own_file(name: str) -> Optional[Path]:
    """The GGUF file in the models folder that ``name`` names (its file name, with or without
    ``.gguf``, or its path), or None: files elsewhere are the user's own, never removed."""
    folder = paths.models_dir().expanduser().resolve()
    for p in (Path(name), folder / name, folder / f"{name}.gguf"):
        try:     # a name too long for a path, or ~user of no user, names no file
            p = p.expanduser()
            if p.suffix == ".gguf" and p.is_file() and p.resolve().parent == folder:
                return p
        except (OSError, RuntimeError, ValueError):
            continue
    return None


def scan_catalog(models_dir: Optional[Path] = None, extra: Sequence[CatalogEntry] = ()
                 ) -> dict[str, CatalogEntry]:
    """Every model on this disk, by the name a request uses (see the module docstring).

    ``models_dir``: the folder whose ``*.gguf`` files are listed (default
    ``paths.models_dir()``); registry models are found where the registry keeps them. Files
    being written (``*.gguf.partial``, hub ``*.incomplete`` blobs) and hidden files are not
    listed; a file that is not a readable GGUF model is left out with one logged warning.
    ``extra`` entries (the model the server was started with) are added last and win a clash.
    """
    folder = Path(models_dir) if models_dir is not None else paths.models_dir()
    found: dict[str, CatalogEntry] = {}
    reg = registry()
    for pair in reg.pairs.values():
        if is_present(pair.target) and is_present(pair.draft):
            entry = _scanned(pair.name, model_path(pair.target), pair_draft_path(pair.name),
                             "pair")
            if entry is not None:
                found[pair.name] = entry
    for emb in reg.embeddings.values():
        if is_present(emb.model):
            entry = _scanned(emb.name, model_path(emb.model))
            if entry is not None:
                found[emb.name] = entry
    for path in folder_files(folder):
        name = path.name[:-len(".gguf")]
        if name not in found:
            entry = _scanned(name, path)
            if entry is not None:
                found[name] = entry
    for model in reg.models.values():   # hub models pulled alone live outside the folder
        if model.kind == "hub" and model.name not in found and is_present(model.name):
            entry = _scanned(model.name, model_path(model.name))
            if entry is not None:
                found[model.name] = entry
    found.update({e.name: e for _, e in other_stores(found) if e is not None})
    for entry in extra:         # (a store's model the server started with keeps its store)
        was = found.get(entry.name)
        found[entry.name] = (dataclasses.replace(entry, store=was.store, aliases=was.aliases)
                             if was is not None and was.target == entry.target else entry)
    return found


def served_as(target: Path, draft: Optional[Path] = None) -> Optional[str]:
    """The name a request gives the model whose files are ``target`` (and ``draft``), or None
    when the catalogue does not list them (a file pulled from the hub by its repository:
    ``edgespec serve --target PATH`` serves it)."""
    want = (Path(target).resolve(), Path(draft).resolve() if draft is not None else None)
    for name, e in scan_catalog().items():
        if (e.target.resolve(), e.draft.resolve() if e.draft is not None else None) == want:
            return name
    return None


def tagless(name: str) -> str:
    """Ollama's ``name:latest`` is ``name``."""
    return name[:-len(":latest")] if name.endswith(":latest") else name


def find_entry(catalog: Mapping[str, CatalogEntry], name: str) -> Optional[CatalogEntry]:
    """The entry ``name`` means, or None: the name itself, or with Ollama's ``:latest`` tag;
    a registry model's name, for its file in the models folder; else one of an entry's
    ``aliases``, or a case-insensitive match, when exactly one entry matches."""
    for n in (name, tagless(name)):
        if n in catalog:
            return catalog[n]
    bare = tagless(name)
    model = registry().models.get(bare)
    if model is not None:
        entry = catalog.get(Path(model.file).stem)
        if entry is not None and entry.target.name == model.file:
            return entry
    aliased = [e for e in catalog.values() if bare in e.aliases]     # a store's short name
    folded = aliased or [e for n, e in catalog.items() if n.lower() == bare.lower()]
    return folded[0] if len(folded) == 1 else None


class ModelNotFound(ModelNotFoundError):
    """A request named a model that is not on this machine (or named none, with no default).
    ``name``: the name asked for ("" when none was)."""

    def __init__(self, name: str, available: Sequence[str], models_folder: Path):
        self.name = name
        shown = ", ".join(available[:MAX_NAMES_SHOWN])
        if len(available) > MAX_NAMES_SHOWN:
            shown += f" (and {len(available) - MAX_NAMES_SHOWN} more)"
        here = (f"the models here are: {shown}" if available
                else "there are no models here yet")
        if not name:
            super().__init__(f"the request names no model and this server has no default: "
                             f"send \"model\"; {here}")
            return
        bare = tagless(name)
        reg = registry()
        if bare in reg.pairs or bare in reg.models or bare in reg.embeddings:
            fix = f"`edgespec pull {bare}` downloads it"
        else:
            fix = (f"put its GGUF file in {models_folder} (Ollama's, LM Studio's, llama.cpp's "
                   "and the Hugging Face cache's models are found where they are), or "
                   "`edgespec pairs` lists the pairs that `edgespec pull NAME` downloads")
        super().__init__(f"the model '{name}' is not on this machine: {fix}; {here}")
