"""Ollama's store, read where it is: ``manifests/<registry>/<namespace>/<model>/<tag>`` (a
Docker-style JSON manifest whose layers name blobs by sha256) and ``blobs/sha256-<hex>``.

The model layer (``application/vnd.ollama.image.model``) is a GGUF file that llama.cpp is
handed as it is; a vision projector layer is listed as not a model; a LoRA adapter layer makes
the model one edgespec cannot run as Ollama does. Nothing here writes: manifests are read,
blobs are only ``stat``-ed (their headers are read by the caller).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Optional

from .base import StoreFile

OLLAMA = "ollama"
SERVICE_DIR = Path("/usr/share/ollama/.ollama/models")   # the Linux service's store
DEFAULT_REGISTRY, DEFAULT_NAMESPACE = "registry.ollama.ai", "library"
MODEL = "application/vnd.ollama.image.model"
PROJECTOR = "application/vnd.ollama.image.projector"
ADAPTER = "application/vnd.ollama.image.adapter"
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
PROJECTOR_SUFFIX = " (projector)"    # how a model's projector is listed, never a name
MAX_MANIFEST = 1 << 20          # a manifest is a few hundred bytes; a bigger one is not one

# Manifests read, by (path, size, mtime_ns): a re-scan reads only new or changed ones.
_MANIFESTS: dict[tuple[str, int, int], object] = {}


def ollama_dirs() -> list[Path]:
    """Where Ollama keeps models: ``$OLLAMA_MODELS``, else ``~/.ollama/models``; and the Linux
    service's ``/usr/share/ollama/.ollama/models``."""
    env = os.environ.get("OLLAMA_MODELS")
    dirs = [Path(env).expanduser() if env else Path.home() / ".ollama" / "models"]
    if sys.platform.startswith("linux"):
        dirs.append(SERVICE_DIR)
    return dirs


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """The name Ollama shows: ``model:tag`` in its own library, ``namespace/model:tag``
    elsewhere on its registry, ``registry/namespace/model:tag`` on another (``hf.co/…``);
    the ``:latest`` tag left off, as Ollama accepts it."""
    if registry == DEFAULT_REGISTRY:
        base = model if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}"
    else:
        base = f"{registry}/{namespace}/{model}"
    return base if tag == "latest" else f"{base}:{tag}"


def _manifest(path: Path) -> object:
    """The manifest's JSON (cached by size and mtime), or an error's text."""
    try:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _MANIFESTS:
            if st.st_size > MAX_MANIFEST:
                raise ValueError(f"{st.st_size} bytes")
            with open(path, "rb") as f:
                _MANIFESTS[key] = json.loads(f.read())
        return _MANIFESTS[key]
    except OSError as e:
        return f"its manifest cannot be read ({e.strerror or e})"
    except ValueError:
        return "its manifest is not a JSON manifest"


def _blob(home: Path, digest: object) -> tuple[Optional[Path], str]:
    """(the blob's path, "") or (None, why not) for a layer's ``sha256:<hex>`` digest."""
    m = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        return None, f"its manifest names a blob by {digest!r}, not a sha256 digest"
    for name in (f"sha256-{m[1]}", f"sha256:{m[1]}"):       # (older releases: a colon)
        path = home / "blobs" / name
        if path.is_file():
            return path, ""
    return None, f"its blob sha256-{m[1][:12]}… is missing (a pull not finished?)"


def _entries(name: str, home: Path, manifest: object, where: Path) -> list[StoreFile]:
    """The files one manifest names: its model (usable or why not) and its projectors."""
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers):
        return [StoreFile(name, where, OLLAMA, home, problem="its manifest lists no layers")]
    kinds = [x.get("mediaType") for x in layers]
    models = [x for x in layers if x.get("mediaType") == MODEL]
    if not models:
        return [StoreFile(name, where, OLLAMA, home, problem="its manifest names no model "
                                                             "layer")]
    path, why = _blob(home, models[0].get("digest"))
    out = [StoreFile(name, path or where, OLLAMA, home, problem=why)]
    if path is not None:
        size, said = path.stat().st_size, models[0].get("size")
        if isinstance(said, int) and size < said:
            out[0] = out[0].but(f"its blob is {size} bytes, its manifest says {said} (a pull "
                                "not finished?)")
        elif ADAPTER in kinds:
            out[0] = out[0].but("it applies a LoRA adapter layer, which edgespec does not")
    for layer in layers:
        if layer.get("mediaType") == PROJECTOR:
            blob, why = _blob(home, layer.get("digest"))
            out.append(StoreFile(name + PROJECTOR_SUFFIX, blob or where, OLLAMA, home,
                                 problem=why or f"the vision projector of {name}, not a "
                                                "language model"))
    return out


def ollama_files() -> list[StoreFile]:
    """Every model of every Ollama store here, by its Ollama name, sorted by name within a
    store; a manifest that names no usable file is listed with why."""
    found: list[StoreFile] = []
    for home in ollama_dirs():
        manifests = home / "manifests"
        try:
            paths = sorted(p for p in manifests.glob("*/*/*/*")
                           if not p.name.startswith(".") and p.is_file())
        except OSError:             # (a store this user may not read)
            continue
        for path in paths:
            registry, namespace, model, tag = path.relative_to(manifests).parts
            name = ollama_name(registry, namespace, model, tag)
            manifest = _manifest(path)
            try:
                if isinstance(manifest, str):
                    raise ValueError(manifest)
                found.extend(_entries(name, home, manifest, path))
            except (OSError, ValueError) as e:      # (a blob removed meanwhile)
                why = str(e) if isinstance(e, ValueError) else f"cannot be read ({e})"
                found.append(StoreFile(name, path, OLLAMA, home, problem=why))
    return found
