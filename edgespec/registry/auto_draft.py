"""A draft chosen for a target that comes without one (``edgespec run|chat|serve --target X``,
``Engine.load(target=X, draft="auto")``): measured among the models on this machine, and
remembered.

The candidates are the models of the catalogue (:func:`~edgespec.catalogue.scan_catalog`:
the models folder, the registry's files, other apps' stores) that share the target's tokenizer
and are smaller than it. The tokenizer is compared cheaply first: the vocabulary's size, then
a digest of its tokens read from the header (:func:`~edgespec.gguf_file.vocab_hash`); two
vocabularies of nearly one size and different digests go to llama.cpp's own rule (reading
their tokenizers alone; the verdict is kept). A target's lower-precision copy made by
``edgespec pair derive`` is such a model; none is derived here (that takes minutes), the reason
line says how to make one. Models of another tokenizer, which a draft across vocabularies could
map, are not measured: their agreement needs the translation of a whole decoding, and they
were measured to run at about plain speed (docs/decisions.md). At most
:data:`MAX_MEASURED` candidates are measured, the smallest first, together no larger than the
target (they are loaded at once).

They are measured against the target (:mod:`.draft_probe`), and the one with the best expected
whole-request speed-up is chosen when that is above :data:`MIN_SPEEDUP`; else none is, and the
Engine drafts n-grams from the context (the baseline always there). The choice is recorded
(``auto-drafts.json`` in the models folder) by the target file (path, size, mtime) and this
CPU (:func:`~.draft_choice.machine_id`), with every candidate's path, size and mtime: the next
start reads it and loads nothing, until a candidate changes or a new one appears. A choice
measured on a busy machine is provisional: it is used, and measured again at a later start (at
most :data:`MAX_TRIES` times). A chosen draft that stops paying while decoding is dropped there
by the cost model, as any draft is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .. import paths
from ..cpuload import LoadWatch
from ..errors import EdgespecError
from ..gguf_file import read_gguf, vocab_hash
from .draft_choice import machine_id
from .draft_probe import PROBE_TOKENS, ROUNDS, Measured, Probe, measure

log = logging.getLogger(__name__)

RECORDS_FILE = "auto-drafts.json"
MAX_MEASURED = 4            # candidates measured (loaded at once, beside the target)
MIN_SPEEDUP = 1.0           # a draft expected at this or less loses to n-gram drafting
MAX_TRIES = 3               # measurements of a choice made on a busy machine, at most
NO_DRAFT = "none"
# File types a lower-precision copy of which is worth deriving (F32, F16, Q8_0, BF16)
DERIVABLE = {0, 1, 7, 32}

_MEASURED_HERE: set[str] = set()    # records this process measured (not measured again)


@dataclass
class DraftChoice:
    """The draft chosen for ``target``: ``path`` (None: n-gram drafting, no draft model), its
    catalogue ``name``, why (``reason``), the whole request's expected ``speedup``; whether it
    was measured on a busy machine (``provisional``) and whether it was read from the record
    (``remembered``: nothing was loaded or measured for it)."""

    target: Path
    path: Optional[Path]
    name: str
    reason: str
    speedup: float = 0.0
    provisional: bool = False
    remembered: bool = False
    measured: dict = field(default_factory=dict)    # name -> figures (draft_probe.Measured)

    def line(self) -> str:
        """The one line a shell says at start."""
        if self.path is not None:
            return (f"draft: {self.name} ({self.reason}) — --draft none for n-gram drafting "
                    "only")
        return (f"draft: none, n-gram drafting ({self.reason}) — --draft PATH|NAME to draft "
                "with a model")

    def describe(self) -> dict:
        """As the server's ``/api/show`` and ``/api/ps`` say it."""
        return {"draft": self.name or None, "path": str(self.path) if self.path else None,
                "reason": self.reason, "expected_speedup": round(self.speedup, 3),
                "provisional": self.provisional, "remembered": self.remembered}


@dataclass(frozen=True)
class Candidate:
    """A model file that could draft for the target: its name, path and identity on disk."""

    name: str
    path: Path
    size: int
    mtime_ns: int

    @property
    def key(self) -> str:
        return str(self.path.resolve())

    @classmethod
    def of(cls, name: str, path: Path) -> "Candidate":
        st = Path(path).stat()
        return cls(name, Path(path), st.st_size, st.st_mtime_ns)


# ---------------------------------------------------------------------------------------------
# The candidates


_READ: dict[tuple[str, int, int, str], object] = {}


def _cached(c: Candidate, what: str, read: Callable[[Path], object]):
    """``read(c.path)``, once per file identity (a changed file is read again)."""
    key = (c.key, c.size, c.mtime_ns, what)
    if key not in _READ:
        _READ[key] = read(c.path)
    return _READ[key]


def same_tokenizer(target: Candidate, c: Candidate, verdicts: dict) -> bool:
    """Whether ``c`` tokenizes as ``target`` does, the cheap checks first: vocabulary sizes
    within llama.cpp's tolerance (the header's count); equal digests of the vocabularies; else
    llama.cpp's own rule on the two tokenizers (its verdict kept in ``verdicts``)."""
    from ..backend.vocab import VOCAB_SIZE_TOLERANCE
    n_t, n_c = (_cached(m, "size", lambda p: read_gguf(p).n_vocab) for m in (target, c))
    if abs(n_t - n_c) > VOCAB_SIZE_TOLERANCE:
        return False
    h_t, h_c = (_cached(m, "digest", vocab_hash) for m in (target, c))
    if h_t == h_c:
        return True
    key = f"{h_t}-{h_c}"
    if key not in verdicts:
        from ..backend.vocab import check_compatible_files
        try:
            check_compatible_files(target.path, c.path)
            verdicts[key] = True
        except EdgespecError:
            verdicts[key] = False
    return bool(verdicts[key])


def catalogue_files(target: Path) -> list[Candidate]:
    """Every generating model file of the catalogue but ``target``, once each, by name."""
    from ..catalogue import ModelKind, scan_catalog
    seen, out = {Path(target).resolve()}, []
    for name, entry in sorted(scan_catalog().items()):
        if entry.kind is ModelKind.EMBEDDING:
            continue
        for path, called in ((entry.target, name),
                             (entry.draft, entry.draft.stem if entry.draft else "")):
            if path is None or path.resolve() in seen:
                continue
            seen.add(path.resolve())
            try:
                out.append(Candidate.of(called, path))
            except OSError:
                continue
    return out


def candidates(target: Candidate, verdicts: dict) -> list[Candidate]:
    """The catalogue's models smaller than ``target`` that share its tokenizer, smallest
    first."""
    found = []
    for c in catalogue_files(target.path):
        if c.size >= target.size:
            continue
        try:
            if same_tokenizer(target, c, verdicts):
                found.append(c)
        except EdgespecError as e:      # (a file gone or changed since the listing)
            log.debug("%s left out of the drafts: %s", c.path, e)
    return sorted(found, key=lambda c: (c.size, c.name))


def to_measure(found: list[Candidate], target_size: int) -> list[Candidate]:
    """The first :data:`MAX_MEASURED` of ``found`` (smallest first) that fit, together, in
    the target's size."""
    out, total = [], 0
    for c in found[:MAX_MEASURED]:
        if out and total + c.size > target_size:
            break
        out.append(c)
        total += c.size
    return out


# ---------------------------------------------------------------------------------------------
# The record


def _records_path() -> Path:
    return paths.models_dir() / RECORDS_FILE


def read_records() -> dict:
    """The records file (``{"choices": {key: record}, "tokenizers": {pair: verdict}}``)."""
    try:
        data = json.loads(_records_path().read_text())
    except (OSError, ValueError):
        return {"choices": {}, "tokenizers": {}}
    if not isinstance(data, dict):
        data = {}
    for part in ("choices", "tokenizers"):
        if not isinstance(data.get(part), dict):
            data[part] = {}
    return data


def write_records(data: dict) -> None:
    """Write the records file atomically (a read-only folder: not kept, said once)."""
    folder = paths.models_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{RECORDS_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(folder / RECORDS_FILE)
    except OSError as e:
        log.warning("the draft chosen is not remembered: cannot write %s (%s)",
                    folder / RECORDS_FILE, e.strerror or e)


def record_key(target: Candidate) -> str:
    """The record's key: the target file's identity and this CPU."""
    text = f"{target.key}\n{target.size}\n{target.mtime_ns}\n{machine_id()}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def still_valid(rec: object, found: list[Candidate]) -> bool:
    """Whether ``rec`` holds for the candidates ``found`` now: none is new or changed (size,
    mtime) since it was measured, and its chosen draft is still one of them."""
    if not isinstance(rec, dict) or not isinstance(rec.get("candidates"), dict):
        return False
    known = rec["candidates"]
    if any(known.get(c.key) != [c.size, c.mtime_ns] for c in found):
        return False
    choice = rec.get("choice")
    return choice is None or any(c.key == choice for c in found)


def measure_again(rec: dict, key: str) -> bool:
    """A provisional record (measured on a busy machine) is measured again at a later start,
    at most :data:`MAX_TRIES` measurements in all; never twice in one process."""
    tries = rec.get("tries", 1)
    return bool(rec.get("provisional")) and key not in _MEASURED_HERE and \
        isinstance(tries, int) and tries < MAX_TRIES


def from_record(target: Path, rec: dict, found: list[Candidate]) -> DraftChoice:
    chosen = next((c for c in found if c.key == rec.get("choice")), None)
    return DraftChoice(target, chosen.path if chosen else None,
                       chosen.name if chosen else "", str(rec.get("reason", "")),
                       float(rec.get("speedup") or 0.0), bool(rec.get("provisional")),
                       remembered=True, measured=dict(rec.get("measured") or {}))


# ---------------------------------------------------------------------------------------------
# The choice


def derive_hint(target: Path) -> str:
    """How to make a lower-precision copy of ``target`` to draft with, when that can pay."""
    try:
        ftype = read_gguf(target).metadata.get("general.file_type")
    except EdgespecError:
        return ""
    return (f"; `edgespec pair derive {target}` makes a lower-precision copy to draft with"
            if ftype in DERIVABLE else "")


def decide(probe: Probe, target: Path, again: bool = True) -> tuple[Optional[Measured], str]:
    """The draft ``probe`` finds paying (None: n-gram drafting) and the reason, in words
    (``again``: a busy measurement is measured again at the next start)."""
    best = probe.drafts[0] if probe.drafts else None
    figures = (f"agrees on {best.agreement:.0%} of tokens, a step costs "
               f"{best.step_share:.2f} of the target's: expected {best.whole:.2f}x"
               ) if best else ""
    if best is not None and best.whole > MIN_SPEEDUP:
        reason = f"same tokenizer; {figures}"
    elif best is not None:
        reason = (f"no smaller model of its tokenizer pays here: the best, {best.name}, "
                  f"{figures}{derive_hint(target)}")
        best = None
    else:
        reason = "no smaller model of its tokenizer could be measured" + derive_hint(target)
    if probe.busy:
        reason += ("; measured on a busy machine: again at the next start" if again else
                   f"; measured on a busy machine {MAX_TRIES} times: kept")
    return best, reason


def _measured(target: Candidate, found: list[Candidate], key: str, tries: int, *,
              n_threads: Optional[int], tokens: int, rounds: int,
              watch: Callable[[], LoadWatch], say: Callable[[str], None]) -> DraftChoice:
    """Measure, choose, record."""
    chosen = to_measure(found, target.size)
    say(f"choosing a draft for {target.path.name}: measuring {len(chosen)} smaller "
        f"model{'s' if len(chosen) != 1 else ''} of its tokenizer on this machine (once)…")
    probe = measure(target.path, [(c.name, c.path) for c in chosen], n_threads=n_threads,
                    tokens=tokens, rounds=rounds, watch=watch, log=say)
    best, reason = decide(probe, target.path, again=tries < MAX_TRIES)
    pick = next((c for c in chosen if best is not None and c.path == best.path), None)
    measured = {d.name: d.figures() for d in probe.drafts}
    data = read_records()
    data["choices"] = {k: r for k, r in data["choices"].items()     # (the file's older states)
                       if not (isinstance(r, dict) and r.get("target") == target.key
                               and r.get("machine") == machine_id())}
    data["choices"][key] = {
        "target": target.key, "machine": machine_id(), "at": time.time(),
        "candidates": {c.key: [c.size, c.mtime_ns] for c in found},
        "choice": pick.key if pick else None, "reason": reason,
        "speedup": round(best.whole, 4) if best else 0.0, "measured": measured,
        "provisional": probe.busy, "tries": tries, "others": probe.others,
        "failed": probe.failed}
    write_records(data)
    _MEASURED_HERE.add(key)
    return DraftChoice(target.path, pick.path if pick else None, pick.name if pick else "",
                       reason, best.whole if best else 0.0, probe.busy, measured=measured)


def choose_draft(target, *, n_threads: Optional[int] = None, tokens: int = PROBE_TOKENS,
                 rounds: int = ROUNDS, watch: Callable[[], LoadWatch] = LoadWatch,
                 say: Callable[[str], None] = lambda s: None) -> DraftChoice:
    """The draft for ``target`` (a path) on this machine: remembered, else measured (see the
    module docstring). ``say`` is told what measuring does (lines ending in "…"); the choice's
    own line is :meth:`DraftChoice.line`. Raises :class:`~edgespec.errors.EdgespecError` when
    the target cannot be read (the loader's own message)."""
    target = Path(target).expanduser()
    read_gguf(target)                            # (a missing or broken file: its one line)
    me = Candidate.of(target.stem, target)
    data = read_records()
    verdicts = dict(data["tokenizers"])
    found = candidates(me, data["tokenizers"])
    if data["tokenizers"] != verdicts:           # llama.cpp's rule was asked: kept
        write_records(data)
    if not found:
        return DraftChoice(target, None, "", "no smaller model of its tokenizer on this "
                           "machine" + derive_hint(target))
    key = record_key(me)
    rec = data["choices"].get(key)
    if still_valid(rec, found) and not measure_again(rec, key):
        return from_record(target, rec, found)
    tries = rec.get("tries", 1) + 1 if still_valid(rec, found) else 1
    return _measured(me, found, key, tries, n_threads=n_threads, tokens=tokens,
                     rounds=rounds, watch=watch, say=say)



def engine_draft(target, spec_settings: dict, model_settings: dict,
                 progress: Callable[[str], None]) -> tuple[Optional[Path], Optional[DraftChoice]]:
    """``Engine.load(draft="auto")``: (the draft, the choice) for ``target``, the choice's line
    said to ``progress``. None chosen: n-gram drafting (``spec_settings["drafter"]``, unless
    one was named). A named drafter that takes no draft model chooses nothing: (None, None)."""
    from ..config import DrafterKind
    drafter = spec_settings.get("drafter")
    if drafter is not None and drafter not in (DrafterKind.MODEL, DrafterKind.HYBRID):
        return None, None       # (a drafter of no draft model; a bad name: the config's error)
    choice = choose_draft(target, n_threads=model_settings.get("n_threads"), say=progress)
    progress(choice.line())
    log.info("%s", choice.line())
    if choice.path is None and drafter is None:
        spec_settings["drafter"] = DrafterKind.NGRAM
    return choice.path, choice


def draft_option(args, target, say: Callable[[str], None]) -> Optional[Path]:
    """The shells' ``--draft`` (``args``: their options): a file; ``none``: no draft model;
    ``auto``, or left out where the command chooses (``args.auto_draft``: run, chat, serve)
    and no ``--drafter``/``--no-spec`` decides: the draft chosen for ``target`` here, its line
    said once (the choice kept in ``args.draft_choice``)."""
    from ..stores import model_file
    text = (args.draft or "").lower()
    if args.draft is not None and text not in (NO_DRAFT, "auto"):
        return model_file(args.draft)
    if text == NO_DRAFT or args.no_spec or args.drafter in ("ngram", "none") \
            or not text and not (getattr(args, "auto_draft", False) and args.drafter is None):
        return None
    choice = getattr(args, "draft_choice", None)
    if choice is None or not _same(choice.target, target):
        choice = args.draft_choice = choose_draft(target, n_threads=args.threads, say=say)
        say(choice.line())
    return choice.path


def _same(a, b) -> bool:
    return (a is None) == (b is None) and (a is None or Path(a).resolve() == Path(b).resolve())


def chosen(args, target, draft) -> Optional[DraftChoice]:
    """The choice ``args`` holds when ``target`` and ``draft`` are what it chose (a model the
    server loads again), else None; with one, a missing draft means n-gram drafting."""
    c = getattr(args, "draft_choice", None)
    return c if c is not None and _same(c.target, target) and _same(c.path, draft) else None
