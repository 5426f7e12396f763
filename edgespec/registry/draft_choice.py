"""Which precision makes the best self-speculative draft of a target on this machine: measured,
not chosen by name (``edgespec pair derive --quant auto``, the default).

A lower precision is not always a cheaper draft step: on a CPU the kernels differ by type
(llama.cpp repacks Q4_0 for its fast matrix kernels, not Q4_1; F32 goes through its own
GEMM), a small model's step is dominated by per-layer overhead rather than by reading its
weights, and requantising weights that were already quantised loses agreement (SmolLM2's
F32, the Q4_1 weights upcast: a Q8_0 draft agrees with it on 95.6% of greedy tokens, a Q4_0
one on 57%). So each candidate is derived, and measured against the target on one text:

- its *agreement*: the share of positions where its greedy token is the target's, the text
  read by both in one pass each (what greedy drafting of that text would accept per token);
- its *step*: the median seconds of a one-token pass, as a share ``c`` of the target's;
- the target's pass of K + 1 rows, as a share of one row's.

The expected speed-up of the best K, S = max_K E(K) / (K c + T(K + 1) / T(1)) with E(K) = (1 −
a^(K+1)) / (1 − a), is what decoding gains. A request also has a prompt, which the draft
reads too (when it drafts from the start), and reading is not priced as a step is: llama.cpp
has fast batched kernels for F32 and Q8_0/Q4_0, none for Q4_1, so SmolLM2's Q4_1 draft reads a
prompt at half the speed of its Q8_0 (1.9 s against 1.0 s for 512 tokens here) at nearly the
same step cost. So the candidates are ranked by a whole request's expected speed-up, a prompt
as long as its answer: (r + 1) / (r + r_d + 1 / S), r and r_d the target's and the draft's
time to read a token in units of the target's step; the best is kept and the others deleted.
`edgespec pull` makes the same choice for a registry pair that lists ``draft_candidates``,
with the listed draft among the candidates (:func:`choose_pair_draft`).

The choices are recorded here too (``draft-choices.json`` in the models folder, one per pair,
with the CPU it was made on): :func:`chosen_draft` is what :func:`~.store.resolve_pair` hands
out, :func:`forget_choice` what ``edgespec rm`` undoes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .. import paths
from ..errors import EdgespecError
from .derive import derive_draft
from .pairs import registry

CANDIDATES = ("Q8_0", "Q4_K_M", "Q4_0")
TEXT_TOKENS = 192           # the text both models read
STEPS = 12                  # one-token passes timed per model
K_MAX = 16


@dataclass
class Candidate:
    quant: str
    path: Path
    agreement: float = 0.0
    step_share: float = 1.0     # its one-token step as a share of the target's
    speedup: float = 0.0        # expected while decoding, at its best K
    k: int = 0
    read_share: float = 0.0     # reading a prompt token, in target steps
    whole: float = 0.0          # a whole request's expected speed-up (prompt = answer)
    listed: bool = False        # the registry's own draft (kept whatever the choice)


def expected_speedup(agreement: float, step_share: float, rows: Callable[[int], float]
                     ) -> tuple[float, int]:
    """The best K's expected speed-up over plain decoding, and that K (``rows(n)``: a target
    pass of n rows as a share of one row's)."""
    a = min(agreement, 0.999)
    best = (1.0, 0)
    for k in range(1, K_MAX + 1):
        tokens = (1 - a ** (k + 1)) / (1 - a)
        x = tokens / (k * step_share + rows(k + 1))
        if x > best[0]:
            best = (x, k)
    return best


def whole_request(speedup: float, read_target: float, read_draft: float) -> float:
    """A request's expected speed-up when its prompt is as long as its answer: reading costs
    ``read_target`` (the target) and ``read_draft`` (the draft) target steps a token, decoding
    a token one step plainly and 1 / ``speedup`` speculatively."""
    return (read_target + 1.0) / (read_target + read_draft + 1.0 / max(speedup, 1e-9))


def _text() -> str:
    """Plain English prose every Python has (its documentation), offline."""
    try:
        from pydoc_data.topics import topics
        return " ".join(topics[k] for k in sorted(topics)[:6])
    except ImportError:             # (a stripped Python) a text of our own
        return " ".join(["The cache keeps the tokens of each request so that the next one that "
                         "shares its beginning starts from there instead of from nothing."] * 30)


def _step_seconds(model, tokens: list[int]) -> float:
    times = []
    for i in range(STEPS):
        t0 = time.perf_counter()
        model.eval([tokens[i % len(tokens)]], 1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(target_path: Path, candidates: list[Candidate], n_threads: Optional[int] = None,
            log: Callable[[str], None] = lambda s: None) -> list[Candidate]:
    """Each candidate's agreement, step share and expected speed-up against the target, best
    first."""
    import numpy as np

    from ..backend import LlamaModel
    from ..config import ModelConfig, default_threads
    from ..drafting.costs import Costs
    threads = n_threads or default_threads()

    def load(path: Path, outputs: int):
        return LlamaModel(ModelConfig(path, n_ctx=TEXT_TOKENS + STEPS + 32,
                                      n_outputs_max=outputs, n_threads=threads))
    target = load(target_path, TEXT_TOKENS)
    try:
        tokens = target.tokenize(_text().encode(), add_special=True,
                                 parse_special=False)[:TEXT_TOKENS]
        t0 = time.perf_counter()
        truth = target.eval(tokens, len(tokens)).argmax(axis=1)
        read = time.perf_counter() - t0
        step = _step_seconds(target, tokens)
        read_target = read / len(tokens) / step
        passes = {}
        for n in (1, 4, 8):
            target.truncate(len(tokens))
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                target.eval(tokens[:n], n)
                times.append(time.perf_counter() - t0)
                target.truncate(len(tokens))
            passes[n] = statistics.median(times)
    finally:
        target.close()
    # The cost model's own table: linear between the measured sizes and beyond the last.
    table = Costs(passes, step)

    def rows(n: int) -> float:
        return float(table.bare(float(n))) / passes[1]

    for c in candidates:
        draft = load(c.path, TEXT_TOKENS)
        try:
            t0 = time.perf_counter()
            guess = draft.eval(tokens, len(tokens)).argmax(axis=1)
            c.read_share = (time.perf_counter() - t0) / len(tokens) / step
            c.agreement = float(np.mean(guess[:-1] == truth[:-1]))
            c.step_share = _step_seconds(draft, tokens) / step
        finally:
            draft.close()
        c.speedup, c.k = expected_speedup(c.agreement, c.step_share, rows)
        c.whole = whole_request(c.speedup, read_target, c.read_share)
        log(f"{c.quant}: agrees on {c.agreement:.1%} of greedy tokens, a step costs "
            f"{c.step_share:.2f} of the target's, reading a prompt token {c.read_share:.2f} "
            f"(the target: {read_target:.2f}): expected {c.speedup:.2f}x decoding at K={c.k}, "
            f"{c.whole:.2f}x a whole request")
    return sorted(candidates, key=lambda c: c.whole, reverse=True)


def derive_best(target: Path, out: Optional[Path] = None, *, force: bool = False,
                candidates: tuple = CANDIDATES, n_threads: Optional[int] = None,
                log: Callable[[str], None] = lambda s: None) -> tuple[Path, list[Candidate]]:
    """Derive each of ``candidates`` from ``target``, measure them (:func:`measure`), keep the
    best at ``out`` (default ``<models dir>/<target stem>.draft-<QUANT>.gguf``) and delete the
    others; (its path, every candidate best first)."""
    target = Path(target)
    folder = Path(out).parent if out else paths.models_dir()
    if out and Path(out).exists() and not force:    # refused before minutes of deriving
        raise EdgespecError(f"{out} already exists: pass --force to rebuild it, or "
                            "--out PATH")
    made: list[Candidate] = []
    try:
        for q in candidates:
            path = folder / f".{target.stem}.candidate-{q}.gguf"
            made.append(Candidate(q, derive_draft(target, q, path, force=True, log=log)))
        log(f"measuring {len(made)} drafts against {target.name} on this machine…")
        ranked = measure(target, made, n_threads, log)
        best = ranked[0]
        dest = Path(out) if out else folder / f"{target.stem}.draft-{best.quant}.gguf"
        if dest.exists() and not force:
            raise EdgespecError(f"{dest} already exists: pass --force to rebuild it, or "
                                "--out PATH")
        best.path = best.path.replace(dest)
        return dest, ranked
    finally:
        for c in made:
            if c.path.name.startswith(".") and c.path.exists():
                c.path.unlink()


def choose_once(name: str, target: Path, draft: Path,
                log: Callable[[str], None] = lambda s: None) -> Path:
    """Pair ``name``'s draft on this machine (``target`` and its listed ``draft`` are here):
    measured and chosen the first time (:func:`choose_pair_draft`) when the registry lists
    ``draft_candidates`` for it and nothing was chosen on this CPU yet."""
    if registry().pair(name).draft_candidates and choice_record(name) is None:
        choose_pair_draft(name, target, draft, log=log)
    return chosen_draft(name) or draft


def choose_pair_draft(name: str, target: Path, listed: Path, *, n_threads: Optional[int] = None,
                      log: Callable[[str], None] = lambda s: None) -> list[Candidate]:
    """Registry pair ``name``'s draft on this machine: its ``draft_candidates`` derived from
    ``target`` and measured beside the ``listed`` draft; the fastest is recorded as the
    pair's draft (``resolve_pair`` hands it out from then on), the others deleted. Every
    candidate, best first."""
    pair = registry().pair(name)
    folder = paths.models_dir()
    made: list[Candidate] = []
    try:
        log(f"choosing the draft of '{name}' for this machine: deriving "
            f"{', '.join(pair.draft_candidates)} from {target.name} to measure beside "
            f"{listed.name} (once; `edgespec rm {name}` forgets the choice)")
        for q in pair.draft_candidates:
            path = folder / f".{target.stem}.candidate-{q}.gguf"
            made.append(Candidate(q, derive_draft(target, q, path, force=True)))
        own = Candidate(listed.stem.rsplit(".", 1)[-1], listed, listed=True)
        ranked = measure(target, [own, *made], n_threads, log)
        best = ranked[0]
        rec = {"quant": best.quant, "file": None,
               "measured": {c.quant: {"agreement": round(c.agreement, 4),
                                      "step_share": round(c.step_share, 3),
                                      "read_share": round(c.read_share, 3),
                                      "speedup": round(c.speedup, 3),
                                      "whole": round(c.whole, 3)} for c in ranked}}
        if not best.listed:
            dest = folder / f"{target.stem}.{name}-draft-{best.quant}.gguf"
            best.path = best.path.replace(dest)
            rec["file"] = dest.name
        record_choice(name, rec)
        log(f"'{name}' drafts with {best.path.name} on this machine (expected "
            f"{best.whole:.2f}x a whole request; "
            + ", ".join(f"{c.quant} {c.whole:.2f}x" for c in ranked[1:]) + ")")
        return ranked
    finally:
        for c in made:
            if c.path.name.startswith(".") and c.path.exists():
                c.path.unlink()


# ---------------------------------------------------------------------------------------------
# The choice on record: the draft measured fastest on this machine, per pair

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
