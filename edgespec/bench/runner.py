"""Running the bench: every way of decoding a pair, side by side, interleaved.

Absolute speeds on a shared machine drift by tens of percent between minutes, so every figure
that matters is a ratio measured in one run: each prompt is decoded by every configuration
back to back, the order rotating from prompt to prompt, and speedups are ratios of summed
tokens over summed decoding time.

Configurations: ``plain`` (target alone), ``K=k`` (draft length pinned), ``adaptive`` (the cost
model picks K each round), ``ngram`` (prompt lookup, no draft model), ``hybrid`` (n-gram
matches, else the draft model), and the peers a Python user would otherwise pick:
``llama_cpp.Llama`` plain and with its ``LlamaPromptLookupDecoding``.

The cost model predicts each configuration's speedup from component costs measured in
isolation (the target's time per batch size, the draft's time per token) and the acceptance
the run observed; a measured speedup well below the prediction means time lost outside
llama.cpp.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config import DrafterKind, SamplingParams, SpecConfig

PEER_PLAIN = "llama-cpp-python"
PEER_LOOKUP = "llama-cpp-python+lookup"


@dataclass
class ConfigTotals:
    """Summed measurements of one configuration over all prompts."""

    tokens: int = 0
    seconds: float = 0.0
    llama_seconds: float = 0.0
    head_seconds: float = 0.0
    grammar_seconds: float = 0.0
    valid: int = 0                  # constrained outputs that completed and match the schema
    outputs: int = 0
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    draft_seconds: float = 0.0
    tested_at: list = field(default_factory=list)
    accepted_at: list = field(default_factory=list)
    per_prompt: list = field(default_factory=list)

    def add(self, s) -> None:
        self.tokens += s.completion_tokens
        self.seconds += s.decode_seconds
        self.llama_seconds += s.llama_seconds
        self.head_seconds += s.head_seconds
        self.grammar_seconds += s.grammar_seconds
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.passes += s.target_passes
        self.draft_seconds += s.draft_seconds
        for mine, theirs in ((self.tested_at, s.tested_at), (self.accepted_at, s.accepted_at)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, c in enumerate(theirs):
                mine[i] += c
        self.per_prompt.append(s.tokens_per_second)

    def add_peer(self, n: int, seconds: float) -> None:
        self.tokens += n
        self.seconds += seconds
        self.per_prompt.append(n / seconds if seconds else 0.0)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class Config:
    name: str
    spec: Optional[SpecConfig] = None    # None: plain target decoding (or a peer)
    peer: Optional[str] = None
    k: Optional[int] = None              # pinned draft length, for the plot
    constrained: bool = False            # the output is held to the prompt set's schema
    seeded: bool = False                 # a seeded request (noise keyed by position)

    @property
    def baseline(self) -> str:
        """The configuration its speedup is measured against."""
        return ("plain+schema" if self.constrained else
                "plain+seed" if self.seeded else "plain")


def make_configs(ks: list[int], has_draft: bool, peers: bool,
                 constrained: bool = False, seeded: bool = False) -> list[Config]:
    configs = [Config("plain")]
    if has_draft:
        configs += [Config(f"K={k}", SpecConfig("model", draft_max=k), k=k) for k in ks]
        configs.append(Config("adaptive", SpecConfig("model")))
    configs.append(Config("ngram", SpecConfig("ngram")))
    if has_draft:
        configs.append(Config("hybrid", SpecConfig("hybrid")))
    main = [c for c in configs if c.name in ("plain", "adaptive", "ngram", "hybrid")]
    if constrained:     # the same, held to the schema: its own plain baseline
        configs += [Config(f"{c.name}+schema", c.spec, constrained=True) for c in main]
    if seeded:          # the same, seeded: its own plain baseline
        configs += [Config(f"{c.name}+seed", c.spec, k=None, seeded=True) for c in main]
    if peers:
        configs += [Config(PEER_PLAIN, peer="plain"), Config(PEER_LOOKUP, peer="lookup")]
    return configs


def position_acceptance(tested_at: list, accepted_at: list) -> list[float]:
    """P(draft i accepted | drafts before it accepted), per position, from a run's counts."""
    return [a / t for t, a in zip(tested_at, accepted_at + [0] * len(tested_at)) if t]


def predicted_speedup(costs, t: ConfigTotals, draft_cost: float) -> Optional[float]:
    """Cost-model speedup of a run with its observed drafts and tokens per pass."""
    if not t.passes or costs is None:
        return None
    k_eff = t.drafted / t.passes
    per_token = (k_eff * draft_cost + costs.pass_seconds(k_eff + 1)) / (t.tokens / t.passes)
    return costs.pass_seconds(1) / per_token


def config_engines(engine, configs: list[Config]) -> dict:
    """An Engine for each speculative configuration, on ``engine``'s models (loaded once,
    shared): switching configuration is picking another Engine. Plain runs use ``engine``
    itself with ``speculative=False``."""
    from ..engine.engine import Engine
    return {c.name: Engine(engine.target, engine.draft, c.spec, draft_head=engine.draft_head,
                           vocab_map=engine.vocab_map)
            for c in configs if c.spec is not None}


def run_bench(engine, prompts: list[str], *, max_tokens: int, sampling: SamplingParams,
              raw: bool, ks: list[int], repeats: int = 1, peers: bool = True,
              constraint=None, log=print) -> dict:
    """``constraint``: also run plain, adaptive, n-gram and hybrid decoding with every output
    held to it (a :class:`~edgespec.constraints.Constraint`). When ``sampling`` samples, the
    same configurations run seeded too (``sampling.seed``, or 1234, plus the prompt's index),
    beside the unseeded runs."""
    seed = sampling.seed if sampling.seed is not None else 1234
    sampling = sampling.replace(seed=None)
    from ..drafting import Costs, calibrate

    configs = make_configs(ks, engine.draft is not None, peers, constraint is not None,
                           seeded=not sampling.greedy)
    engines = config_engines(engine, configs)
    peer_objs = {}
    try:
        _open_peers(engine, configs, peer_objs)
        # The cost model's prediction needs costs measured on this run's machine state:
        # calibrate before and after the runs and average (a cached calibration can be days
        # old, and a shared machine's speed drifts by tens of percent).
        before = calibrate(engine.target, engine.draft, head=engine.draft_head).costs
        totals = {c.name: ConfigTotals() for c in configs}
        token_prompts = [engine.prompt_tokens(p, raw=raw) for p in prompts]
        for r in range(repeats):
            for i, prompt in enumerate(prompts):
                shift = (i + r) % len(configs)
                for c in configs[shift:] + configs[:shift]:
                    _run_config(c, engines.get(c.name, engine), peer_objs.get(c.name),
                                totals[c.name], prompt, token_prompts[i],
                                max_tokens=max_tokens, raw=raw, constraint=constraint,
                                sampling=sampling.replace(seed=seed + i) if c.seeded
                                else sampling)
                log(f"  prompt {i + 1}/{len(prompts)}" + (f" (repeat {r + 1})" if repeats > 1
                                                          else "") + ": " +
                    ", ".join(f"{c.name} {totals[c.name].per_prompt[-1]:.1f}" for c in configs)
                    + " tok/s")
        after = calibrate(engine.target, engine.draft, head=engine.draft_head).costs
        costs = Costs({n: (before.target[n] + after.target[n]) / 2 for n in before.target},
                      (before.draft + after.draft) / 2)
    finally:
        for p in peer_objs.values():
            p.close()

    return {
        "configs": {c.name: _config_row(c, totals, costs) for c in configs},
        "costs": {"target_seconds_by_batch": dict(sorted(costs.target.items())),
                  "draft_seconds_per_token": costs.draft,
                  "draft_to_target_cost": costs.draft / costs.pass_seconds(1)},
        "max_tokens": max_tokens, "prompts": len(prompts) * repeats,
        "temperature": sampling.temperature,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "model_files_mib": sum(Path(m.path).stat().st_size for m in
                               (engine.target, engine.draft) if m) / 2**20,
    }


def _open_peers(engine, configs: list[Config], peer_objs: dict) -> None:
    """A llama-cpp-python peer on the target's file for each peer configuration, into
    ``peer_objs`` as each opens (so that the caller closes those that opened if one fails)."""
    from ..backend.peer import LlamaCppPythonPeer
    for c in configs:
        if c.peer:
            peer_objs[c.name] = LlamaCppPythonPeer(
                engine.target.path, n_ctx=2048, n_threads=engine.target.config.n_threads,
                prompt_lookup=c.peer == "lookup",
                cpu_extra_buffers=engine.target.config.cpu_extra_buffers)


def _run_config(c: Config, eng, peer, totals: ConfigTotals, prompt: str, token_prompt: list[int], *,
                max_tokens: int, sampling: SamplingParams, raw: bool, constraint) -> None:
    """Decode one prompt in configuration ``c`` (on its Engine ``eng``, or its ``peer``) and
    add the measurements to its ``totals``."""
    if c.peer:
        totals.add_peer(*peer.generate(token_prompt, max_tokens))
        return
    out = eng.generate(prompt, max_tokens=max_tokens, sampling=sampling, raw=raw,
                       speculative=c.spec is not None,
                       constraint=constraint if c.constrained else None)
    totals.add(out.stats)
    if c.constrained:
        totals.outputs += 1
        totals.valid += _valid(constraint, out)


def _config_row(c: Config, totals: dict, costs) -> dict:
    """One configuration's figures: speed and speedup over its baseline, the shares of time
    outside llama.cpp, and for speculation its acceptance and the cost model's prediction."""
    t = totals[c.name]
    base = totals[c.baseline].tps
    row = {"tokens_per_second": t.tps, "speedup": t.tps / base if base else 0.0,
           "tokens": t.tokens}
    if c.spec is not None or c.name.startswith("plain"):
        row["outside_llama_share"] = 1 - t.llama_seconds / t.seconds if t.seconds else 0
        # of which the draft's reduced output layer (model compute done in numpy)
        row["draft_head_share"] = t.head_seconds / t.seconds if t.seconds else 0
    if c.constrained:
        row["grammar_share"] = t.grammar_seconds / t.seconds if t.seconds else 0
        row["valid_outputs"] = f"{t.valid}/{t.outputs}"
    if c.spec is not None:
        draft_cost = (costs.draft if c.spec.drafter is DrafterKind.MODEL else
                      t.draft_seconds / t.drafted if t.drafted else 0.0)
        row.update({
            "acceptance_rate": t.accepted / t.drafted if t.drafted else 0.0,
            "tokens_per_pass": t.tokens / t.passes if t.passes else 0.0,
            "drafts_per_pass": t.drafted / t.passes if t.passes else 0.0,
            "acceptance_by_position": position_acceptance(t.tested_at, t.accepted_at),
            "predicted_speedup": predicted_speedup(costs, t, draft_cost),
        })
    if c.k is not None:
        row["k"] = c.k
    return row


def _valid(constraint, out) -> bool:
    """Whether a constrained output completed and its value matches the constraint."""
    if out.finish_reason != "stop":
        return False
    try:
        constraint.parse(out.text)
    except Exception:   # noqa: BLE001 - any failure counts as invalid
        return False
    return True
