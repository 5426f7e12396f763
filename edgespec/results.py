"""What a generation gives back: :class:`Generation` (text, tokens, why it ended, stats),
:class:`GenerationStats`, and the :class:`StreamEvent` pieces of a stream; and the records the
decoding loop (:func:`edgespec.speculative.decode`) produces on the way: the :class:`Step`
it yields per committed token, the :class:`Round` that ends a verify round, and its counters
:class:`LoopStats`. They live here, below the loop, so that plain results do not import it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class Round:
    """One verify round, told with the token that ends it: the tokens drafted (``drafted``,
    K of them; none in a plain round), how many the target accepted, and where the drafts
    came from (``"model"``, ``"ngram"``, or ``"none"``). The token that carries it is the
    target's own: the replacement for the first rejected draft, or the bonus token."""

    drafted: tuple
    accepted: int
    source: str


@dataclass
class Step:
    """One committed token. ``from_draft``: proposed by the drafter and accepted.
    ``logprob``: (its log probability, the top alternatives), when asked for. ``round``: on
    the target's own token that ends a round, that round."""

    token: int
    from_draft: bool
    logprob: Optional[tuple[float, list]] = None
    round: Optional[Round] = None


@dataclass
class LoopStats:
    """Counters of one :func:`~edgespec.speculative.decode` run (times in seconds)."""

    rounds: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    # tested_at[i]: rounds in which draft i (0-based) was checked, i.e. drafts 0..i-1 were
    # accepted; accepted_at[i]: rounds in which it was accepted. Their ratio is the acceptance
    # rate at each position, given that the earlier ones were accepted.
    tested_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    # Rounds that drafted nothing (K = 0) and their verify passes' seconds: what a plain
    # target pass costs here and now, the reference for the estimated speed-up.
    plain_passes: int = 0
    plain_seconds: float = 0.0
    # Committed tokens the draft model evaluated to reach the context beyond the last one (a
    # long prompt's in chunks between plain rounds, when catching up paid).
    caught_up: int = 0

    def record_round(self, k: int, n: int) -> None:
        for counts, upto in ((self.tested_at, min(n + 1, k)), (self.accepted_at, n)):
            if len(counts) < upto:
                counts.extend([0] * (upto - len(counts)))
            for i in range(upto):
                counts[i] += 1


@dataclass
class GenerationStats:
    """What one generation cost and how speculation did (times in seconds).

    The decoding loop's own counters are in ``loop`` (:class:`LoopStats`) and read through
    the properties ``drafted``, ``accepted``, ``target_passes`` and the rest.
    """

    prompt_tokens: int = 0
    prompt_tokens_evaluated: int = 0   # not found in the KV cache, so evaluated (target)
    prompt_tokens_restored: int = 0    # brought back from the prompt cache (target)
    completion_tokens: int = 0
    prompt_seconds: float = 0.0
    # From the turn's start (prompt processing) to the first generated token committed: what a
    # user waits before anything appears (0: no token came).
    first_token_seconds: float = 0.0
    decode_seconds: float = 0.0
    llama_seconds: float = 0.0         # inside llama_decode, both models, decoding phase
    head_seconds: float = 0.0          # the draft's reduced output layer (numpy), decoding
    grammar_seconds: float = 0.0       # in the grammar engine (a constrained generation)
    # Going back after rejected drafts on a recurrent or hybrid model, both models, decoding
    # phase: copying and restoring recurrent states, evaluating accepted tokens again
    # (edgespec/backend/rollback.py; 0 on attention-only models).
    rollback_seconds: float = 0.0
    speculative: bool = False
    target_threads: int = 0            # CPU threads each model ran with at the end
    draft_threads: int = 0             # (0: no draft model in use)
    # Seconds of one plain (one-token) target pass where and when this generation ran: its
    # own plain rounds' passes, else the cost model's figure refined by the loop (0: unknown).
    plain_pass_seconds: float = 0.0
    loop: LoopStats = field(default_factory=LoopStats)

    # A speed-up is estimated only from this many drafting rounds; a generation whose rounds
    # were at least PLAIN_SHARE plain is reported as decoding plainly.
    MIN_DRAFT_ROUNDS = 8
    PLAIN_SHARE = 0.9

    # -- the loop's counters ----------------------------------------------------------------

    @property
    def drafted(self) -> int:
        return self.loop.drafted

    @property
    def accepted(self) -> int:
        return self.loop.accepted

    @property
    def draft_caught_up(self) -> int:
        """Committed tokens the draft evaluated to reach the context (a long prompt's when
        the cost model found reading it worth it, whole or through a window; 0 when the
        draft sat it out and the answer was decoded plainly)."""
        return self.loop.caught_up

    @property
    def target_passes(self) -> int:
        return self.loop.target_passes

    @property
    def draft_seconds(self) -> float:
        return self.loop.draft_seconds

    @property
    def verify_seconds(self) -> float:
        return self.loop.verify_seconds

    @property
    def tested_at(self) -> list[int]:
        """Per draft position: rounds in which it was checked (see LoopStats)."""
        return self.loop.tested_at

    @property
    def accepted_at(self) -> list[int]:
        return self.loop.accepted_at

    # -- derived figures ----------------------------------------------------------------------

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.completion_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decoding speed: completion tokens over decoding time (prompt processing excluded)."""
        return self.completion_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return (self.prompt_tokens_evaluated / self.prompt_seconds
                if self.prompt_seconds else 0.0)

    @property
    def decoding_plainly(self) -> bool:
        """Whether speculation was on but the drafter (nearly) never drafted: its length
        policy found that drafting does not pay here and now."""
        passes = self.loop.target_passes
        return (self.speculative and passes > 0
                and (self.drafted == 0 or self.loop.plain_passes >= self.PLAIN_SHARE * passes))

    @property
    def speedup_estimate(self) -> Optional[float]:
        """Estimated speed over plain decoding, from like-for-like measurements of this run:
        a plain target pass's cost (:attr:`plain_pass_seconds`) over the loop's seconds per
        token (drafting and verifying). None without the evidence for it: no drafts, fewer
        than MIN_DRAFT_ROUNDS drafting rounds, or no plain-pass cost. Never above the tokens
        per target pass: a batched pass does not cost less than a one-token pass."""
        lp = self.loop
        if (not self.speculative or self.decoding_plainly or self.plain_pass_seconds <= 0
                or lp.target_passes - lp.plain_passes < self.MIN_DRAFT_ROUNDS or not lp.emitted):
            return None
        per_token = (lp.draft_seconds + lp.verify_seconds) / lp.emitted
        if per_token <= 0:
            return None
        return min(self.plain_pass_seconds / per_token, self.tokens_per_pass)

    @property
    def verdict(self) -> str:
        """What speculation did, for people: the estimated speed-up, that drafting does not
        pay, or '' (not enough evidence, or speculation off)."""
        if self.decoding_plainly:
            return "the draft does not pay on this machine now: decoding plainly"
        x = self.speedup_estimate
        return f"≈{x:.2f}× plain speed" if x is not None else ""

    @property
    def python_seconds(self) -> float:
        """Decoding wall time spent outside the models' compute (drafting logic,
        verification, text): outside llama.cpp and the draft's reduced output layer."""
        return max(0.0, self.decode_seconds - self.llama_seconds - self.head_seconds)

    @property
    def python_share(self) -> float:
        return self.python_seconds / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def threads_text(self) -> str:
        t, d = self.target_threads, self.draft_threads
        if not d or d == t:
            return f"{t} thread{'s' if t != 1 else ''}"
        return f"threads: target {t}, draft {d}"

    def summary(self, detail: bool = False) -> str:
        """One line for people: speed, acceptance, tokens per target pass; with ``detail``
        also the time, the prompt (its evaluation speed), the time to the first token and the
        share of time outside llama.cpp."""
        parts = [f"{self.tokens_per_second:.1f} tok/s"]
        if self.speculative:
            parts.append(f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/"
                         f"{self.drafted})" if self.drafted else "nothing drafted")
            parts.append(f"{self.tokens_per_pass:.2f} tokens/pass")
            if self.verdict:
                parts.append(self.verdict)
        else:
            parts.append("speculation off")
        if self.target_threads:
            parts.append(self.threads_text)
        if not detail:
            return " · ".join(parts)
        d = self.decode_seconds
        outside = 1 - self.llama_seconds / d if d else 0.0
        head = self.head_seconds / d if d else 0.0
        return " · ".join(
            [f"{self.completion_tokens} tokens in {d:.2f} s", *parts,
             f"prompt {self.prompt_tokens} tokens ({self.prompt_tokens_evaluated} evaluated at "
             f"{self.prompt_tokens_per_second:.0f} tok/s)",
             *([f"first token after {self.first_token_seconds:.2f} s"]
               if self.first_token_seconds else []),
             f"outside llama.cpp {outside:.1%}" +
             (f" (draft head {head:.1%}, the rest {self.python_share:.1%})" if head else "")])

    def to_dict(self) -> dict:
        d = {name: getattr(self, name) for name in (
            "prompt_tokens", "prompt_tokens_evaluated", "completion_tokens", "drafted",
            "accepted", "target_passes", "prompt_seconds", "first_token_seconds",
            "decode_seconds", "llama_seconds", "head_seconds", "grammar_seconds",
            "draft_seconds", "verify_seconds", "speculative", "target_threads", "draft_threads",
            "acceptance_rate", "tokens_per_pass", "tokens_per_second",
            "prompt_tokens_per_second", "python_seconds", "python_share",
            "plain_pass_seconds", "speedup_estimate", "decoding_plainly", "draft_caught_up")}
        d["tested_at"], d["accepted_at"] = list(self.tested_at), list(self.accepted_at)
        return d


@dataclass
class Generation:
    """The result of a generation. ``finish_reason``: ``"stop"`` (an end-of-generation token,
    a stop string, or a grammar that completed), ``"length"`` (``max_tokens`` or the context
    window; the partial output is kept), ``"cancelled"``, or ``"tool_calls"`` (the model
    called tools: ``tool_calls`` holds them, :class:`edgespec.tools.ToolCall`). ``thinking``:
    the reasoning a thinking model wrote before its answer (``text``), :mod:`edgespec.thinking`."""

    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(default_factory=GenerationStats)
    tool_calls: list = field(default_factory=list)
    logprobs: Optional[list] = None     # per token, when asked for (TokenLogprob)
    thinking: str = ""

    def to_dict(self) -> dict:
        d = {"text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
             "stats": self.stats.to_dict()}
        if self.thinking:
            d["thinking"] = self.thinking
        if self.tool_calls:
            d["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.logprobs is not None:
            d["logprobs"] = [lp.to_dict() for lp in self.logprobs]
        return d


@dataclass
class TokenLogprob:
    """A committed token's log probability under the target's own distribution (its raw
    logits, temperature 1, no sampler or grammar applied), and the most likely alternatives
    at that position as (token id, log probability), best first."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"token": self.token, "logprob": self.logprob, "top": self.top}


@dataclass
class StreamEvent:
    """A piece of streamed output: the text released with ``token`` (may be '' while a
    character or a possible stop string is incomplete); ``from_draft``: the token was proposed
    by the drafter and accepted by the target; ``logprob``: its log probability (when
    asked for); ``round``: on the target's own token that ends a verify round, that round
    (:class:`Round`: what was drafted, how much was accepted);
    ``thinking``: reasoning text released with it (a thinking model's, separated from the
    answer's ``text``: :mod:`edgespec.thinking`)."""

    text: str
    token: int
    from_draft: bool
    logprob: Optional["TokenLogprob"] = None     # when the request asked for logprobs
    round: Optional[Round] = None
    thinking: str = ""
