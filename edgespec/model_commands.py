"""``edgespec pairs | pull | rm | pair derive``: the registry and the model files on this machine.

A shell over :mod:`.registry` (and, through it, :mod:`.registry.hub`): parse, call,
print. It lives beside the other shells, not in the registry package, which core code uses.
Results go to stdout (one ``name: path`` line per model), progress and notes to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from .errors import EdgespecError
from .shell import status as _status


def _is_hub_spec(name: str) -> bool:
    return name.count("/") >= 2


def _size(n: Optional[float], approx: bool = False) -> str:
    from .registry.downloads import human_size
    if n is None:
        return "?"
    return ("~" if approx else "") + human_size(n)


# ---------------------------------------------------------------------------------------------
# edgespec pairs


def _model_row(entry) -> tuple[str, str, str]:
    """(state, size, where) of one registry model, without touching the network."""
    from .registry.store import is_present, model_path
    if is_present(entry.name):
        p = model_path(entry.name)
        return "downloaded", _size(p.stat().st_size), str(p)
    approx = entry.size or (entry.approx_gb * 1e9 if entry.approx_gb else None)
    state = "missing"
    if entry.kind == "hub" and model_path(entry.name).is_file():
        state = "cached, unverified"
    parts = entry.wheel_parts
    if parts is not None:                   # a pull in parts that stopped half-way
        from .registry.wheel_parts import staged_parts
        here = staged_parts(model_path(entry.name), parts)
        if here:
            state = f"{here}/{len(parts)} parts"
    return state, _size(approx, approx=not entry.size), entry.origin


def cmd_pairs(args) -> int:
    from .registry import registry
    from .registry.draft_choice import choice_record, chosen_draft
    reg = registry()
    for p in reg.pairs.values():
        rows = {role: _model_row(reg.models[m]) for role, m in
                (("target", p.target), ("draft", p.draft))}
        states = {r[0] for r in rows.values()}
        state = ("downloaded" if states == {"downloaded"} else
                 "not downloaded" if states == {"missing"} else "partly downloaded")
        print(f"{p.name:20} {state:18} {p.description}")
        for role, m in (("target", p.target), ("draft", p.draft)):
            st, size, where = rows[role]
            print(f"    {role:6} {m:34} {size:>9}  {st:10}  {where}")
        chosen = chosen_draft(p.name)
        if chosen is not None:          # measured faster than the listed draft on this CPU
            rec = choice_record(p.name) or {}
            print(f"    {'drafts':6} {'with ' + str(rec.get('quant')) + ' (chosen here)':34} "
                  f"{_size(chosen.stat().st_size):>9}  {'measured':10}  {chosen}")
        if args.verbose:
            print(f"    why: {p.why}")
            licences = dict.fromkeys(reg.models[m].license for m in (p.target, p.draft))
            print(f"    licence: {', '.join(licences)}")
    for e in reg.embeddings.values():
        st, size, where = _model_row(reg.models[e.model])
        state = "downloaded" if st == "downloaded" else "not downloaded"
        print(f"{e.name:20} {state:18} (embeddings) {e.description}")
        print(f"    {'model':6} {e.model:34} {size:>9}  {st:10}  {where}")
        if args.verbose:
            print(f"    licence: {reg.models[e.model].license}")
    from .catalogue import own_files
    own = own_files()
    if own:
        print(f"{'your models':20} {'':18} files in {own[0].parent} (e.g. made by "
              "`edgespec pair derive`)")
        for p in own:
            print(f"    {p.name:41} {_size(p.stat().st_size):>9}")
    _print_stores()
    print("\n`edgespec pull NAME` downloads a pair or an embedding model; `edgespec rm NAME` "
          "frees its space (a file of your own: `edgespec rm FILE.gguf`); `-v` says why each "
          "draft suits its target, and the models' licences.", file=sys.stderr)
    return 0


def _print_stores() -> None:
    """The models of other apps' stores, read where they are: by the name that runs them
    (``--target NAME``, a request's model) and their file, or why llama.cpp cannot load
    them."""
    from .catalogue import ModelKind, other_stores, scan_catalog
    from .stores import LABELS
    own = {n: e for n, e in scan_catalog().items() if not e.store}
    listed = other_stores(own)
    for store in dict.fromkeys(f.store for f, _ in listed):
        files = sorted(((f, e) for f, e in listed if f.store == store),
                       key=lambda fe: fe[0].name)
        homes = ", ".join(dict.fromkeys(str(f.home) for f, _ in files))
        print(f"{LABELS[store]:20} {'':18} read where they are, never changed: {homes}")
        for f, entry in files:
            try:
                size = _size(f.path.stat().st_size)
            except OSError:
                size = "?"
            kind = " (embeddings)" if entry is not None and entry.kind is ModelKind.EMBEDDING \
                else ""
            name = f.name if store != "ollama" or ":" in f.name.rsplit("/", 1)[-1] \
                else f"{f.name}:latest"                 # as `ollama list` shows it
            also = f" (also: {', '.join(f.short)})" if f.short and entry is not None else ""
            print(f"    {name + also:41} {size:>9}  "
                  + (f"{f.path}{kind}" if entry is not None else f"unusable: {f.problem}"))


# ---------------------------------------------------------------------------------------------
# edgespec pull


class _PartsLine:
    """A file fetched in parts, on one changing stderr line (a terminal only): the part of how
    many, and the bytes here so far. Other downloads draw their own progress
    (``show_progress``); every log line goes through :meth:`log`, which clears the line
    first."""

    def __init__(self) -> None:
        from .shell import Progress as Line
        self._line = Line()
        self._shown = ""

    def __call__(self, p) -> None:
        from .registry.downloads import human_size
        if not p.parts or p.verifying:          # assembling it: a log line says so
            return
        text = (f"{p.file}: part {p.part} of {p.parts}, {human_size(p.done)} of "
                f"{human_size(p.total or 0)}…")
        if text != self._shown:
            self._shown = text
            self._line(text)

    def log(self, msg: str) -> None:
        self._line.clear()
        _status(msg)

    def done(self) -> None:
        self._line.done()


def cmd_pull(args) -> int:
    line = _PartsLine()
    try:
        return _pull(args, line)
    finally:
        line.done()


def _pull(args, line: _PartsLine) -> int:
    from .registry import ensure_model, local_path, pull_pair, registry
    show = sys.stderr.isatty()
    for name in args.names:
        if _is_hub_spec(name):
            from .registry.hub import HubFile, download, stop_log_propagation
            stop_log_propagation()
            path = download(HubFile.parse(name, args.revision), require_commit=args.pinned,
                            show_progress=show, log=_status)
            print(f"{name}: {path}")
            continue
        if args.revision:
            raise EdgespecError(f"--revision applies to REPO_ID/FILENAME, not to the registry "
                                f"name '{name}' (its revision is pinned in pairs.toml)")
        reg = registry()
        models = reg.models_of(name)
        if any(m.kind == "hub" for m in models):
            from .registry.hub import stop_log_propagation
            stop_log_propagation()
        if name in reg.pairs and not args.no_check:
            target, draft, across = pull_pair(name, show_progress=show, log=line.log,
                                              require_commit=args.pinned, progress=line)
            if not args.keep_draft:
                from .registry.draft_choice import choose_once
                draft = choose_once(name, target, draft, log=_status)
            print(f"{models[0].name}: {target}")
            listed = local_path(models[1].name)
            print(f"{models[1].name}: {listed}")
            if draft != listed:                 # a precision measured faster on this machine
                print(f"draft: {draft}")
            check = (f"{across}" if across else
                     f"{models[1].name} shares {models[0].name}'s tokenizer")
            _status(f"pair check passed: {check}; run `edgespec chat --pair {name}`")
            _served(target, draft)
            continue
        for m in models:
            path = ensure_model(m.name, show_progress=show, log=line.log,
                                require_commit=args.pinned, progress=line)
            print(f"{m.name}: {path}")
            if len(models) == 1:
                _served(path)
    return 0


def _served(target: Path, draft: Optional[Path] = None) -> None:
    """Say the name ``edgespec serve`` gives what was just pulled (the catalogue's)."""
    from .catalogue import served_as
    name = served_as(target, draft)
    if name is not None:
        _status(f"`edgespec serve` offers it as '{name}'")


# ---------------------------------------------------------------------------------------------
# edgespec rm


def cmd_rm(args) -> int:
    from .catalogue import own_file
    from . import paths
    from .registry import registry, remove_model
    from .registry.draft_choice import forget_choice
    from .registry.downloads import human_size
    for name in args.names:
        _not_a_store_model(name)
        if Path(name).expanduser().is_file() and own_file(name) is None:
            raise EdgespecError(f"{name} is not in the models folder ({paths.models_dir()}): "
                                "edgespec removes only the files it keeps there")
        if _is_hub_spec(name) and own_file(name) is None:
            from .registry.hub import HubFile, remove
            freed = remove(HubFile.parse(name))
            _status(f"{name}: " + (f"removed, {human_size(freed)} freed" if freed
                                  else "not downloaded"))
            continue
        reg = registry()
        local = None if name in reg.pairs or name in reg.models else own_file(name)
        if local is not None:           # e.g. a draft made by `edgespec pair derive`
            size = local.stat().st_size
            local.unlink()
            _status(f"{local.name}: removed, {human_size(size)} freed")
            continue
        if name in reg.pairs:
            freed = forget_choice(name)     # the draft chosen on this machine
            if freed:
                _status(f"{name}'s chosen draft: removed, {human_size(freed)} freed")
        for m in reg.models_of(name):
            freed = remove_model(m.name)
            others = [p for p in reg.pairs_using(m.name) if p != name]
            note = f" (also used by {', '.join(others)})" if freed and others else ""
            _status(f"{m.name}: " + (f"removed, {human_size(freed)} freed{note}" if freed
                                    else "not downloaded"))
    return 0


def _not_a_store_model(name: str) -> None:
    """Refuse to remove a model of another app's store (Ollama's, LM Studio's, …): edgespec
    never changes one. (The Hugging Face cache is also where `edgespec pull` puts hub files,
    which `edgespec rm REPO_ID/FILENAME` removes.)"""
    from .catalogue import own_file
    from .registry import registry
    from .stores import HUGGINGFACE, LABELS, store_model
    reg = registry()
    if own_file(name) is not None or name in reg.pairs or name in reg.models:
        return
    found = store_model(name)
    if found is not None and found.store != HUGGINGFACE:
        raise EdgespecError(f"'{name}' is a model of {LABELS[found.store]} ({found.path}): "
                            "edgespec never changes another app's store; remove it with that "
                            "app" + (f" (`ollama rm {found.name}`)" if found.store == "ollama"
                                     else ""))


# ---------------------------------------------------------------------------------------------
# edgespec pair derive


def cmd_pair_derive(args) -> int:
    from .catalogue import own_file
    from .registry.downloads import human_size
    from .registry import derive_draft
    target = Path(args.target)
    if args.quant.lower() == "auto":
        from .registry.draft_choice import derive_best
        draft, ranked = derive_best(target, Path(args.out) if args.out else None,
                                    force=args.force, log=_status)
        best = ranked[0]
        _status(f"chosen: {best.quant} (expected {best.whole:.2f}x plain a whole request, "
                f"{best.speedup:.2f}x decoding at K={best.k}; "
                + ", ".join(f"{c.quant} {c.whole:.2f}x" for c in ranked[1:]) + ")")
    else:
        draft = derive_draft(target, args.quant, args.out, force=args.force, log=_status)
    ratio = draft.stat().st_size / target.stat().st_size
    print(f"draft: {draft}")
    _status(f"pair check passed: {draft.name} ({human_size(draft.stat().st_size)}, "
            f"{ratio:.0%} of the target's size) shares the target's tokenizer")
    if ratio > 0.6:
        _status("note: the draft is not much smaller than the target, so drafting costs nearly "
                "as much as verifying; pick a lower --quant (e.g. Q2_K) for a real speed-up")
    _status(f"run: edgespec chat --target {target} --draft {draft}")
    if own_file(str(draft)) is not None:
        _status(f"remove it with: edgespec rm {draft.name}")
    return 0


# ---------------------------------------------------------------------------------------------
# registration


def build_models_parsers(sub) -> None:
    """Register ``pairs``, ``pull``, ``rm`` and ``pair derive`` on ``sub`` (argparse
    subparsers)."""
    p = sub.add_parser("pairs", help="list the registry's pairs, your models and other apps' "
                       "(Ollama, LM Studio, …): size, downloaded or not, where")
    p.add_argument("-v", "--verbose", action="store_true", help="say why each draft suits")
    p.set_defaults(func=cmd_pairs)

    p = sub.add_parser("pull", help="download a registry pair or model, or any hub GGUF",
                       description="Download registry pairs/models (the pair check runs after a "
                       "pair), or any single GGUF as REPO_ID/FILENAME, into the Hugging Face "
                       "cache. Every file's sha256 is verified.")
    p.add_argument("names", nargs="+", metavar="NAME|REPO_ID/FILENAME")
    p.add_argument("--revision", metavar="REV",
                   help="branch, tag or commit of a REPO_ID/FILENAME (default main)")
    p.add_argument("--pinned", action="store_true",
                   help="refuse any revision that is not a 40-hex commit id")
    p.add_argument("--no-check", action="store_true",
                   help="skip the tokenizer compatibility check after a pair")
    p.add_argument("--keep-draft", action="store_true",
                   help="keep a pair's listed draft: derive and measure no other precision "
                   "of its target on this machine (done once, at the first pull, otherwise)")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("rm", help="delete a pair's or model's files to free disk space")
    p.add_argument("names", nargs="+", metavar="NAME|REPO_ID/FILENAME")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser("pair", help="build pairs from your own models")
    pair_sub = p.add_subparsers(dest="pair_command", metavar="COMMAND", required=True,
                                parser_class=type(p))
    d = pair_sub.add_parser(
        "derive", help="make a self-speculative draft of a model with llama.cpp's quantizer",
        description="Re-quantise TARGET.gguf to a low-bit draft of the same weights. The draft "
        "shares the target's tokenizer and agrees with it on most tokens; it pays most with an "
        "F16/F32 target, whose verification passes are memory-bound.")
    d.add_argument("target", metavar="TARGET.gguf")
    d.add_argument("--quant", default="auto", metavar="TYPE",
                   help="draft precision: auto (the default: Q8_0, Q4_K_M and Q4_0 are each "
                        "derived and measured against the target on this machine, the one "
                        "expected to be fastest is kept), or one of Q4_K_M, Q4_0, Q3_K_M, "
                        "Q2_K, Q8_0, …")
    d.add_argument("--out", "-o", metavar="PATH",
                   help="where to write the draft (default: the edgespec models folder)")
    d.add_argument("--force", action="store_true", help="overwrite an existing draft")
    d.set_defaults(func=cmd_pair_derive)
