"""``edgespec bench --prompt-lengths``: what speculation does to a long prompt's answer.

Speculation pays while decoding, but a drafter has its prompt to process too: with a draft
model, the draft catches up with the prompt between the target's steps (the target reads it
alone before the first token). This measures, for each prompt
length L and answer length N, the time to first token, the decoding speed and the whole
answer's time (prompt and decoding, wall clock around the ``generate`` call), plain and
speculative (the engine's drafter, its draft length chosen by the cost model).

Like :mod:`.runner`, every figure that matters is a ratio measured in one run: each prompt is
decoded plainly and speculatively back to back, the order alternating, with the same greedy
(or seeded) sampling, so both give the same answer. Every generation starts from cold caches
(:func:`cold`): nothing of an earlier prompt is in either model's KV cache or in the prompt
cache, so each one evaluates its whole prompt.

The prompts are passages of Python's own documentation (``pydoc_data.topics``, in every
CPython installation: English prose with some code), a different passage for every prompt and
none repeated (repeated text would flatter n-gram drafting), cut at a word to L tokens (a few
under at most) and ending with an instruction to summarise. In chat mode the passage is the
system prompt and the instruction the user's message; in raw mode the text is continued
as-is.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from statistics import median
from typing import Callable, Optional, Union

from ..config import SamplingParams
from ..errors import EdgespecError

INSTRUCTION = "Summarise the text above."
# A prompt may come out this many tokens under its length (it is cut between words).
SLACK = 4

Prompt = Union[str, list]


class PromptLengthError(EdgespecError):
    """A prompt length the sweep cannot build: shorter than its fixed parts, or more text than
    the documentation holds."""


def corpus() -> str:
    """The Python documentation's topics, in a fixed order, as one text."""
    try:
        from pydoc_data.topics import topics
    except ImportError:     # pragma: no cover - a Python built without its docs
        raise EdgespecError("--prompt-lengths takes its prompts from Python's documentation "
                            "(pydoc_data), which this Python does not have") from None
    return "\n\n".join(topics[k].strip() for k in sorted(topics))


def build_prompt(passage: str, raw: bool) -> Prompt:
    """The prompt for a passage: raw text to continue, or chat messages."""
    if raw:
        return f"{passage}\n\n{INSTRUCTION}\n\nSummary:"
    return [{"role": "system", "content": passage}, {"role": "user", "content": INSTRUCTION}]


class Passages:
    """Consecutive passages of :func:`corpus`, each starting at a paragraph, none shared."""

    def __init__(self, text: Optional[str] = None):
        self.text = text if text is not None else corpus()
        self.at = 0

    def take(self, count_tokens: Callable[[Prompt], int], length: int,
             raw: bool) -> tuple[Prompt, int]:
        """The longest prompt of whole words from here with at most ``length`` tokens (and at
        least ``length - SLACK``), and its token count; the next passage starts at the
        paragraph after it."""
        overhead = count_tokens(build_prompt("", raw))
        if overhead + SLACK >= length:
            raise PromptLengthError(
                f"--prompt-lengths {length} is too short: the instruction"
                f"{' alone takes' if raw else ' and the chat template alone take'} {overhead} "
                f"tokens (ask for at least {overhead + SLACK + 1})")
        while self.at < len(self.text):
            passage, n = self._fit(count_tokens, length, raw)
            end = self.text.find("\n\n", self.at + len(passage))
            self.at = len(self.text) if end < 0 else end + 2
            if n >= length - SLACK:
                return build_prompt(passage, raw), n
            # the next word was a long one (or the text ran out): start at the next paragraph
        raise PromptLengthError("--prompt-lengths: the sweep asks for more text than Python's "
                                "documentation holds; ask for fewer or shorter prompts "
                                "(or fewer --repeats)")

    def _fit(self, count_tokens, length: int, raw: bool) -> tuple[str, int]:
        """The most words from here whose prompt has at most ``length`` tokens, and its
        token count."""
        chars = 8 * length       # tokens are ~4 characters of this text: room to spare
        while True:
            chunk = self.text[self.at:self.at + chars]
            ends = [m.end() for m in re.finditer(r"\S+", chunk)]
            if (not ends or count_tokens(build_prompt(chunk, raw)) > length
                    or self.at + chars >= len(self.text)):
                break
            chars *= 2
        lo, hi = 0, len(ends)            # f(lo) <= length (none: the overhead alone)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count_tokens(build_prompt(chunk[:ends[mid - 1]], raw)) <= length:
                lo = mid
            else:
                hi = mid - 1
        passage = chunk[:ends[lo - 1]] if lo else ""
        return passage, count_tokens(build_prompt(passage, raw))


def cold(engine) -> None:
    """Nothing of an earlier prompt left for the next generation to reuse: the prompt cache
    emptied, both models' KV caches cleared, the draft head's conversation rows dropped."""
    engine.prompt_cache.forget()
    for model in (engine.target, engine.draft):
        if model is not None:
            model.truncate(0)
    if engine.draft_head is not None:
        engine.draft_head.follow([])


@dataclass
class Side:
    """One mode's (plain or speculative) summed measurements in one (L, N) cell."""

    runs: int = 0
    first_token_seconds: float = 0.0
    prompt_seconds: float = 0.0
    prompt_evaluated: int = 0
    decode_seconds: float = 0.0
    whole_seconds: float = 0.0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    caught_up: int = 0          # tokens the draft read to reach the context
    first_token_samples: list = field(default_factory=list)
    whole_samples: list = field(default_factory=list)

    def add(self, s, wall: float) -> None:
        self.runs += 1
        self.first_token_seconds += s.first_token_seconds
        self.first_token_samples.append(s.first_token_seconds)
        self.whole_samples.append(wall)
        self.prompt_seconds += s.prompt_seconds
        self.prompt_evaluated += s.prompt_tokens_evaluated
        self.decode_seconds += s.decode_seconds
        self.whole_seconds += wall
        self.tokens += s.completion_tokens
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.passes += s.target_passes
        self.caught_up += s.draft_caught_up

    def row(self, speculative: bool) -> dict:
        n = max(self.runs, 1)
        out = {"first_token_seconds": self.first_token_seconds / n,
               "prompt_seconds": self.prompt_seconds / n,
               "prompt_tokens_per_second": (self.prompt_evaluated / self.prompt_seconds
                                            if self.prompt_seconds else 0.0),
               "prompt_tokens_evaluated": self.prompt_evaluated,
               "tokens_per_second": (self.tokens / self.decode_seconds
                                     if self.decode_seconds else 0.0),
               "whole_seconds": self.whole_seconds / n,
               "completion_tokens": self.tokens}
        if speculative:
            out.update(acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
                       tokens_per_pass=self.tokens / self.passes if self.passes else 0.0,
                       drafted=self.drafted, accepted=self.accepted,
                       draft_read=self.caught_up / n)
        return out


def _ratio(a: float, b: float) -> Optional[float]:
    return a / b if b else None


def run_long_prompt_bench(engine, *, prompt_lengths: list[int], new_tokens: list[int],
                          raw: bool, sampling: SamplingParams, repeats: int = 1,
                          log=print) -> dict:
    """For each prompt length, ``repeats`` prompts, each decoded for each answer length plainly
    and speculatively (the order alternating), every generation from cold caches."""
    if not engine.can_speculate:
        raise EdgespecError("--prompt-lengths compares plain with speculative decoding: load "
                            "a drafter (a draft model, or --drafter ngram)")
    need = max(prompt_lengths) + max(new_tokens)
    if need > engine.n_ctx:
        raise EdgespecError(f"--prompt-lengths {max(prompt_lengths)} with --new-tokens "
                            f"{max(new_tokens)} needs a context of {need} tokens; this one "
                            f"holds {engine.n_ctx}", options=("n_ctx",))
    if not sampling.greedy and sampling.seed is None:
        sampling = sampling.replace(seed=1234)      # both modes give the same answer
    passages = Passages()

    def count(prompt: Prompt) -> int:
        return len(engine.prompt_tokens(prompt, raw=raw))
    prompts = {L: [passages.take(count, L, raw) for _ in range(repeats)]
               for L in prompt_lengths}
    # Warm-up, not measured: the drafter is built (it may calibrate) and the weights paged in.
    for spec in (False, True):
        cold(engine)
        engine.generate("The history of the Roman Empire", max_tokens=4, raw=True,
                        sampling=sampling, speculative=spec)
    cells = {(L, N): {"plain": Side(), "speculative": Side()}
             for L in prompt_lengths for N in new_tokens}
    turn = 0
    try:
        for r in range(repeats):
            for L in prompt_lengths:
                prompt, n_tokens = prompts[L][r]
                for N in new_tokens:
                    modes = ("plain", "speculative") if turn % 2 == 0 else \
                        ("speculative", "plain")
                    turn += 1
                    for mode in modes:
                        cold(engine)
                        t0 = time.perf_counter()
                        out = engine.generate(prompt, max_tokens=N, sampling=sampling, raw=raw,
                                              speculative=mode == "speculative")
                        cells[(L, N)][mode].add(out.stats, time.perf_counter() - t0)
                    p, s = (cells[(L, N)][m] for m in ("plain", "speculative"))
                    log(f"  {n_tokens}-token prompt, {N} new tokens"
                        + (f" (repeat {r + 1})" if repeats > 1 else "")
                        + f": first token plain {p.first_token_seconds / p.runs:.2f} s, "
                        f"speculative {s.first_token_seconds / s.runs:.2f} s; whole answer "
                        f"{p.whole_seconds / p.runs:.2f} s / {s.whole_seconds / s.runs:.2f} s")
    finally:
        cold(engine)
    return {"sweep": _sweep_rows(cells, prompts),
            "first_token": _first_token_medians(cells, prompt_lengths, new_tokens),
            "prompt_lengths": list(prompt_lengths), "new_tokens": list(new_tokens),
            "prompts_per_length": repeats,
            "drafter": str(engine.spec.drafter), "n_ctx": engine.n_ctx,
            "temperature": sampling.temperature,
            "source": f"pydoc_data.topics (Python {sys.version_info[0]}."
                      f"{sys.version_info[1]} documentation)"}


def _sweep_rows(cells: dict, prompts: dict) -> list[dict]:
    """Each (prompt length, answer length) cell's figures, both modes', and their ratios."""
    rows = []
    for (L, N), sides in cells.items():
        plain, spec = sides["plain"].row(False), sides["speculative"].row(True)
        rows.append({
            "prompt_length": L, "new_tokens": N,
            "prompt_tokens": [n for _, n in prompts[L]],
            "plain": plain, "speculative": spec,
            "first_token_ratio": _ratio(spec["first_token_seconds"],
                                        plain["first_token_seconds"]),
            "whole_ratio": _ratio(spec["whole_seconds"], plain["whole_seconds"]),
            # each prompt's two answers back to back: the median of their ratios
            "whole_ratio_median": median(
                b / a for a, b in zip(sides["plain"].whole_samples,
                                      sides["speculative"].whole_samples))})
    return rows


def _first_token_medians(cells: dict, prompt_lengths: list[int],
                         new_tokens: list[int]) -> list[dict]:
    """Per prompt length, each mode's median time to the first token over all its samples
    (it does not depend on the answer's length) and the ratio of the medians: one disturbed
    prompt pass on a shared machine moves a cell's mean, not this."""
    first_token = []
    for L in prompt_lengths:
        plain, spec = ([x for N in new_tokens for x in cells[(L, N)][m].first_token_samples]
                       for m in ("plain", "speculative"))
        first_token.append({"prompt_length": L, "samples": len(plain),
                            "plain_median": median(plain), "speculative_median": median(spec),
                            "ratio": _ratio(median(spec), median(plain))})
    return first_token


def format_long_prompt_report(res: dict) -> str:
    """The sweep as a table: one row per (prompt length, answer length)."""
    lines = [f"{'prompt':>7}{'new':>5}{'TTFT plain':>12}{'TTFT spec':>11}{'ratio':>7}"
             f"{'tok/s plain':>13}{'tok/s spec':>12}{'whole plain':>13}{'whole spec':>12}"
             f"{'ratio':>7}{'median':>7}{'accept':>8}{'tok/pass':>9}{'drafted':>9}"
             f"{'draft read':>11}"]

    def ratio(x: Optional[float]) -> str:
        return f"{x:.2f}x" if x is not None else "-"
    for row in res["sweep"]:
        p, s = row["plain"], row["speculative"]
        tokens = row["prompt_tokens"]
        shown = str(tokens[0]) if len(set(tokens)) == 1 else f"~{sum(tokens) // len(tokens)}"
        lines.append(
            f"{shown:>7}{row['new_tokens']:>5}{p['first_token_seconds']:11.2f}s"
            f"{s['first_token_seconds']:10.2f}s{ratio(row['first_token_ratio']):>7}"
            f"{p['tokens_per_second']:13.1f}{s['tokens_per_second']:12.1f}"
            f"{p['whole_seconds']:12.2f}s{s['whole_seconds']:11.2f}s"
            f"{ratio(row['whole_ratio']):>7}{ratio(row['whole_ratio_median']):>7}"
            f"{s['acceptance_rate']:8.0%}"
            f"{s['tokens_per_pass']:9.2f}{s['drafted']:9d}{s['draft_read']:11.0f}")
    for ft in res.get("first_token", []):
        lines.append(f"time to first token at {ft['prompt_length']} tokens, median of "
                     f"{ft['samples']} runs each: plain {ft['plain_median']:.2f} s, speculative "
                     f"{ft['speculative_median']:.2f} s, {ratio(ft['ratio'])}")
    lines += [
        "prompt: its tokens; TTFT: time to first token; tok/s: decoding speed; whole: prompt "
        "and decoding, wall clock around generate; ratio: speculative / plain (under 1: "
        "speculative is faster), of the means; median: the median of each prompt's two "
        "answers' ratio; accept, tok/pass, drafted: the speculative runs'; draft "
        "read: context tokens the draft read to catch up, per run (what the cost model chose: "
        "0, a window, or the whole prompt)",
        f"{res['prompts_per_length']} prompt(s) per length, passages of {res['source']}, "
        f"every generation from cold caches; drafter {res['drafter']}, temperature "
        f"{res['temperature']}, context {res['n_ctx']}",
    ]
    return "\n".join(lines)
