"""``edgespec bench --prompts tasks``: the time a whole answer takes, per kind of request.

Tokens per second of decoding flatter speculation on requests whose prompt is most of the
work (a long passage to read, an article to summarise): a draft model has its prompt to read
too. This measures what a user waits for: the wall time of the whole answer, the prompt's
evaluation included, for the seven tasks of :mod:`.tasks`, every generation from cold caches:
:func:`~.long_prompts.cold` on every Engine (no prompt cache, nothing of an earlier generation
in either model's KV cache or the draft head), and a suffix index of its own, new and empty
(an ``index_key`` no other generation has: no n-gram drafts from earlier answers,
:mod:`edgespec.drafting.suffix`).

Answers are cut at ``max_tokens`` (``-n``, 64 by default), but for ``code_edit``, whose answer is
the whole file it was given: each of its answers may run to :func:`edit_budget` new tokens,
1.5 times its file's tokens and 64 more, within what the context has left after the prompt (and
at most ``-n`` when one was given: ``edit_cap``), so that it ends on its own.

Configurations (:func:`~.runner.make_configs`, one Engine each on the shared models,
:func:`~.runner.config_engines`): ``plain``; the draft length pinned to each ``--ks``;
``adaptive`` (the draft model, the cost model choosing K), ``ngram`` and ``hybrid`` (the
Engine's default drafter, marked ``*``). Each prompt is decoded by every configuration back
to back, the order rotating from prompt to prompt, as :func:`~.runner.run_bench` does. Per task:
the plain time, each configuration's speedup (plain time / its time, of the sums), the
*oracle* (the best of the other configurations for that task — a drafter or a draft length
chosen as if one had known it) and the default's speedup over the oracle's; then the
geometric mean over tasks.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..config import SamplingParams, SpecConfig
from ..errors import EdgespecError
from ..engine.request import GenerationRequest
from .copies import copy_passes, in_one_row_passes
from .long_prompts import cold
from .runner import Config, config_engines, make_configs
from .tasks import CODE_EDITS, TASKS, as_raw, task_prompts

# code_edit's budget: its file's tokens times EDIT_RATIO, plus EDIT_SPARE (edit_budget)
EDIT_RATIO = 1.5
EDIT_SPARE = 64


@dataclass
class TaskCell:
    """One configuration's summed runs on one task."""

    runs: int = 0
    seconds: float = 0.0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    ended: int = 0          # answers that ended on their own, before their token limit
    # where the time went: the prompt (the target's, and a draft's catching up after it, is in
    # the decoding's draft time), draft steps, verify (target) passes, the rest of decoding
    # (Python: drafting logic, verification, text), each summed over the runs
    prompt: float = 0.0
    draft: float = 0.0
    verify: float = 0.0
    decode: float = 0.0
    python: float = 0.0
    # plain's answers: the rows of each pass their context's copies would take with perfect
    # lengths (:func:`~.copies.copy_passes`)
    copy_rows: list = field(default_factory=list)

    def add(self, stats, wall: float, ended: bool = False, copy_rows=()) -> None:
        self.runs += 1
        self.copy_rows += copy_rows
        self.seconds += wall
        self.ended += ended
        self.tokens += stats.completion_tokens
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.prompt += stats.prompt_seconds
        self.draft += stats.draft_seconds
        self.verify += stats.verify_seconds
        self.decode += stats.decode_seconds
        # (verify passes include their own Python: argmax, acceptance; the rest is the rest)
        self.python += max(0.0, stats.decode_seconds - stats.draft_seconds
                           - stats.verify_seconds)

    def breakdown(self) -> dict:
        """Tokens per second of decoding, and each part's share of the whole answers' time."""
        whole = self.seconds or 1.0
        return {"tokens_per_second": self.tokens / self.decode if self.decode else None,
                "shares": {"prompt": self.prompt / whole, "draft": self.draft / whole,
                           "verify": self.verify / whole, "python": self.python / whole}}


def geomean(xs: list[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs and min(xs) > 0 else None


def edit_budget(file_tokens: int, prompt_tokens: int = 0, n_ctx: Optional[int] = None,
                cap: Optional[int] = None) -> int:
    """The most new tokens a ``code_edit`` answer may take: ``EDIT_RATIO`` (1.5) times its
    file's tokens, rounded up, plus ``EDIT_SPARE`` (64): room for the edit (comments, type
    hints, a longer name) and the code block's fences; at most what a context of ``n_ctx``
    has left after the prompt, and at most ``cap`` (``-n``), when given."""
    budget = math.ceil(EDIT_RATIO * file_tokens) + EDIT_SPARE
    if n_ctx is not None:
        budget = min(budget, n_ctx - prompt_tokens)
    return budget if cap is None else min(budget, cap)


def edit_file_tokens(engine) -> list[int]:
    """Each ``code_edit`` prompt's file, in the target's tokens (what :func:`edit_budget`
    counts), in the prompts' order."""
    return [len(engine.tokenize(e.code(), add_special=False)) for e in CODE_EDITS]


def task_configs(ks: list[int]) -> tuple[list[Config], str]:
    """The configurations compared, and the name of the Engine's default among them."""
    configs = make_configs(ks, has_draft=True, peers=False)
    default = next((c for c in configs if c.spec == SpecConfig()), None)
    if default is None:             # a default no configuration above is: measured too
        default = Config("default", SpecConfig())
        configs.append(default)
    return configs, default.name


def answer_limits(engine, sizes: list[int], file_tokens: list[Optional[int]], max_tokens: int,
                  edit_cap: Optional[int]) -> list[int]:
    """Each prompt's limit on new tokens: ``max_tokens``, or for a code edit (its file's
    tokens in ``file_tokens``) its :func:`edit_budget`; raises when the context cannot hold
    a prompt and the least of its answer, naming the context size that would."""
    limits, short = [], []        # short: (prompt, new tokens wanted) the context cannot hold
    for size, f in zip(sizes, file_tokens):
        if f is None:
            limits.append(max_tokens)
            least = want = max_tokens
        else:           # a code edit needs room for its file back, at least (or for the cap)
            limits.append(edit_budget(f, size, engine.n_ctx, edit_cap))
            least = f if edit_cap is None else min(f, edit_cap)
            want = edit_budget(f, cap=edit_cap)
        if size + least > engine.n_ctx:
            short.append((size, want))
    if short:
        size, want = max(short, key=sum)
        need = size + want
        raise EdgespecError(f"--prompts tasks needs a context of {need} tokens (a prompt of "
                            f"{size} and {want} new ones); this one holds {engine.n_ctx}: "
                            f"load with --ctx-size {-(-need // 1024) * 1024}",
                            options=("n_ctx",))
    return limits


def run_task_bench(engine, *, tasks: tuple = TASKS, max_tokens: int,
                   sampling: SamplingParams, raw: bool, ks: list[int], repeats: int = 1,
                   edit_cap: Optional[int] = None, log=print) -> dict:
    """Every prompt of ``tasks`` decoded by every configuration, ``repeats`` times, each
    generation timed whole from cold caches; the per-task table (:func:`summarise`).
    ``max_tokens``: every answer's limit but ``code_edit``'s, which is :func:`edit_budget`
    (at most ``edit_cap`` when given)."""
    if engine.draft is None:
        raise EdgespecError("--prompts tasks compares drafters, the draft model's among them: "
                            "load a draft model (--draft, or a --pair), with a drafter that "
                            "uses it")
    if not sampling.greedy and sampling.seed is None:
        sampling = sampling.replace(seed=1234)      # every configuration, the same answer
    configs, default = task_configs(ks)
    all_prompts = task_prompts()
    items = [(task, as_raw(p, task) if raw else p) for task in tasks
             for p in all_prompts[task]]
    prompt_tokens = [engine.prompt_tokens(p, raw=raw) for _, p in items]
    sizes = [len(t) for t in prompt_tokens]
    # code_edit's answers: the whole file back, each with a budget of its own
    edits = iter(edit_file_tokens(engine))          # in its prompts' order
    file_tokens = [next(edits) if task == "code_edit" else None for task, _ in items]
    limits = answer_limits(engine, sizes, file_tokens, max_tokens, edit_cap)
    engines = config_engines(engine, configs)
    every, n_rows = [engine, *engines.values()], engine.target.n_outputs_max

    runs = itertools.count()

    def generate(c: Config, prompt, n: int, s: SamplingParams):
        for e in every:
            cold(e)
        # A suffix index of its own, new and empty: no drafts from earlier generations' tokens
        # (the other caches are emptied by cold()).
        req = GenerationRequest(prompt, max_tokens=n, sampling=s, raw=raw,
                                speculative=c.spec is not None,
                                index_key=f"edgespec-bench-cold-{next(runs)}")
        t0 = time.perf_counter()
        stream = engines.get(c.name, engine).submit(req)
        for _ in stream:
            pass
        return stream.result, time.perf_counter() - t0
    # Warm-up, not measured: each drafter built (it may calibrate), the weights paged in.
    for c in configs:
        generate(c, "The history of the Roman Empire", 4, sampling)
    cells = {t: {c.name: TaskCell() for c in configs} for t in tasks}
    warm = 0          # generations that found part of their prompt cached (expected: none)
    try:
        for r in range(repeats):
            for j, ((task, prompt), size, limit) in enumerate(zip(items, sizes, limits)):
                s = sampling if sampling.greedy else sampling.replace(seed=sampling.seed + j)
                shift = (j + r) % len(configs)
                walls = {}
                for c in configs[shift:] + configs[:shift]:
                    out, walls[c.name] = generate(c, prompt, limit, s)
                    warm += out.stats.prompt_tokens_evaluated < size
                    cells[task][c.name].add(out.stats, walls[c.name], out.finish_reason == "stop",
                                            copy_passes(prompt_tokens[j], out.tokens, n_rows)
                                            if c.name == "plain" else ())
                log(f"  {task} ({size}-token prompt"
                    + (f", up to {limit} new" if limit != max_tokens else "") + ")"
                    + (f", repeat {r + 1}" if repeats > 1 else "") + ": plain "
                    f"{walls['plain']:.2f} s; " + ", ".join(
                        f"{c.name} {walls['plain'] / walls[c.name]:.2f}x" for c in configs[1:]))
    finally:
        for e in every:
            cold(e)
    costs = engine.costs      # (as refined by the runs)
    res = summarise(cells, configs, default,
                    costs.perfect_drafts(n_rows) if costs else None,
                    (lambda rows: in_one_row_passes(rows, costs.bare)) if costs else None)

    def per_task(values: list) -> dict:
        return {t: [v for (task, _), v in zip(items, values) if task == t] for t in tasks}
    res.update(max_tokens=max_tokens, repeats=repeats, temperature=sampling.temperature,
               prompt_tokens=per_task(sizes), max_tokens_by_task=per_task(limits),
               cold=warm == 0, warm_runs=warm)
    if "code_edit" in tasks:
        res.update(file_tokens={"code_edit": per_task(file_tokens)["code_edit"]},
                   edit_budget={"ratio": EDIT_RATIO, "spare": EDIT_SPARE, "cap": edit_cap})
    return res


def _row(cells: dict, configs: list[Config], default: str, pinned: list[str],
         perfect: Optional[tuple[float, int]] = None,
         price: Optional[Callable[[list], float]] = None) -> dict:
    plain = cells["plain"]
    speedups = {c.name: plain.seconds / cells[c.name].seconds if cells[c.name].seconds
                else 0.0 for c in configs[1:]}
    # The bound: plain's answers with their decoding at the per-token cost of perfect drafts
    # (always accepted, free), their prompts and the rest as they were.
    def at(per_token: float) -> float:
        return plain.seconds / (plain.seconds - plain.decode * (1 - min(1.0, per_token)))
    bound = at(perfect[0]) if perfect and plain.seconds else None
    # The copies' bound: the same with the passes of the context's copies at perfect lengths.
    copies = (at(price(plain.copy_rows) / plain.tokens)
              if price and plain.copy_rows and plain.tokens and plain.seconds else None)
    best = max(pinned, key=lambda n: speedups[n]) if pinned else None
    oracle = speedups[best] if best else None
    d = cells[default]
    return {"prompts": plain.runs, "plain_seconds": plain.seconds / max(plain.runs, 1),
            "seconds": {c.name: cells[c.name].seconds / max(cells[c.name].runs, 1)
                        for c in configs},
            "speedups": speedups, "oracle": {"config": best, "speedup": oracle},
            "default_over_oracle": speedups[default] / oracle if oracle else None,
            "bound": bound, "default_over_bound": speedups[default] / bound if bound else None,
            "copies": copies,
            "default_over_copies": speedups[default] / copies if copies else None,
            "default_acceptance": d.accepted / d.drafted if d.drafted else None,
            "completion_tokens": {c.name: cells[c.name].tokens for c in configs},
            "time": {n: cells[n].breakdown() for n in ("plain", default)},
            "ended": plain.ended}


def summarise(cells: dict, configs: list[Config], default: str,
              perfect: Optional[tuple[float, int]] = None,
              price: Optional[Callable[[list], float]] = None) -> dict:
    """Per task: the plain time (mean seconds a prompt), each configuration's speedup, the
    oracle (the best configuration but plain and the default), the default over the oracle,
    the default's acceptance; and the geometric means over tasks (the default's acceptance:
    over all its drafts)."""
    pinned = [c.name for c in configs[1:] if c.name != default]
    rows = {t: _row(row, configs, default, pinned, perfect, price)
            for t, row in cells.items()}
    drafted = sum(row[default].drafted for row in cells.values())
    accepted = sum(row[default].accepted for row in cells.values())
    overall = {
        "prompts": sum(r["prompts"] for r in rows.values()),
        "plain_seconds": geomean([r["plain_seconds"] for r in rows.values()]),
        "speedups": {c.name: geomean([r["speedups"][c.name] for r in rows.values()])
                     for c in configs[1:]},
        "oracle": {"config": "per task" if pinned else None,
                   "speedup": geomean([r["oracle"]["speedup"] for r in rows.values()])},
        "default_over_oracle": geomean([r["default_over_oracle"] for r in rows.values()]),
        "bound": geomean([r["bound"] for r in rows.values()]),
        "default_over_bound": geomean([r["default_over_bound"] for r in rows.values()]),
        "copies": geomean([r["copies"] for r in rows.values()]),
        "default_over_copies": geomean([r["default_over_copies"] for r in rows.values()]),
        "default_acceptance": accepted / drafted if drafted else None}
    return {"tasks": rows, "geomean": overall, "configs": [c.name for c in configs],
            "default": default, "pinned": pinned,
            "perfect": None if perfect is None else {"per_token": perfect[0],
                                                     "rows": perfect[1]}}


def format_task_report(res: dict) -> str:
    """One row per task and a geometric-mean row: plain seconds, speedups, oracle,
    default/oracle, the default's acceptance."""
    names = res["configs"][1:]
    shown = [n + ("*" if n == res["default"] else "") for n in names]
    widths = [max(len(n) + 1, 6) for n in shown]

    def x(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.2f}"
    lines = [f"{'task':14}{'plain s':>8}" + "".join(f"{n:>{w}}" for n, w in zip(shown, widths))
             + f"  {'oracle':13}{'dflt/orc':>9}{'bound':>7}{'dflt/bnd':>9}{'copies':>7}"
             + f"{'dflt/cpy':>9}{'accept':>7}"]
    for name, r in [*res["tasks"].items(), ("geomean", res["geomean"])]:
        o = r["oracle"]
        oracle = f"{o['config']} {x(o['speedup'])}" if o["config"] else "-"
        a = r["default_acceptance"]
        accept = "-" if a is None else f"{a:.0%}"
        lines.append(f"{name:14}{x(r['plain_seconds']):>8}"
                     + "".join(f"{x(r['speedups'][n]):>{w}}" for n, w in zip(names, widths))
                     + f"  {oracle:13}{x(r['default_over_oracle']):>9}{x(r.get('bound')):>7}"
                     + f"{x(r.get('default_over_bound')):>9}{x(r.get('copies')):>7}"
                     + f"{x(r.get('default_over_copies')):>9}{accept:>7}")
    lines += _time_lines(res)
    cold_note = ("every generation from cold caches" if res["cold"] else
                 f"{res['warm_runs']} generation(s) found part of the prompt cached")
    lines += [
        "plain s: a whole answer's wall time (prompt and decoding), mean per prompt; the "
        "others: speedup, plain time / its time; oracle: the best other configuration for the "
        "task; "
        f"dflt/orc: the default's ({res['default']}*) speedup over the oracle's; bound: what "
        "drafts always accepted and free would give, plain's answers with their decoding at "
        + (f"{res['perfect']['per_token']:.2f} of a one-row pass a token (passes of "
           f"{res['perfect']['rows']} rows, from the cost model's measured row costs)"
           if res.get("perfect") else "(no cost model: -)")
        + "; dflt/bnd: the default's share of it; copies: the same with the context's copies "
        "drafted to exactly their agreeing length and every other token a one-row pass; "
        "dflt/cpy: the default's share of that; accept: the default's acceptance (-: it "
        "drafted nothing)",
        f"{res['geomean']['prompts']} answers per configuration, {limits_note(res)}, "
        + (f"{res['sampler']}'s sampler at " if res.get("sampler") else "")
        + f"temperature {res['temperature']}, {cold_note}",
    ]
    return "\n".join(lines)


def _time_lines(res: dict) -> list[str]:
    """Where the time went, per task: plain decoding's tokens per second and its prompt's share
    of the whole answers' time; the default's tokens per second and the shares of its prompt,
    draft steps (with the draft's catching up), verify passes and the rest (Python)."""
    default = res["default"]
    lines = ["where the time went: tok/s of decoding; % of the whole answers' time",
             f"{'':14}{'plain tok/s':>12}{'prompt':>7}  |{default + '* tok/s':>14}"
             f"{'prompt':>7}{'draft':>7}{'verify':>7}{'python':>7}"]

    def pct(v):
        return f"{v:.0%}"
    for name, r in res["tasks"].items():
        if "time" not in r:
            continue
        p, d = r["time"]["plain"], r["time"][default]
        tps = [f"{t['tokens_per_second']:.1f}" if t["tokens_per_second"] else "-" for t in (p, d)]
        sh = d["shares"]
        lines.append(f"{name:14}{tps[0]:>12}{pct(p['shares']['prompt']):>7}  |{tps[1]:>14}"
                     + "".join(f"{pct(sh[k]):>7}" for k in ("prompt", "draft", "verify",
                                                             "python")))
    return lines


def limits_note(res: dict) -> str:
    """The answers' token limits, in words: ``-n`` for every task but ``code_edit``, whose
    budgets (:func:`edit_budget`) are given as their range, with how many of its plain answers
    ended on their own."""
    others = [t for t in res["tasks"] if t != "code_edit"]
    notes = [f"up to {res['max_tokens']} new tokens"] if others else []
    edit = res.get("edit_budget")
    if "code_edit" in res["tasks"] and edit:
        b = res["max_tokens_by_task"]["code_edit"]
        row = res["tasks"]["code_edit"]
        notes.append(
            f"{'code_edit ' if others else ''}the whole file back: up to {edit['ratio']:g} × "
            f"its file's tokens + {edit['spare']}"
            + (f", at most -n {edit['cap']}" if edit["cap"] is not None else "")
            + f", within the context ({min(b)}{'' if min(b) == max(b) else f'-{max(b)}'} "
            f"new tokens; {row['ended']}/{row['prompts']} plain answers ended on their own)")
    return "; ".join(notes)
