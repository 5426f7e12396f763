"""Drafting across vocabularies: a draft model whose tokenizer is not the target's.

Token-level intersection (TLI; Timor et al., "Accelerating LLM inference with lossless
speculative decoding algorithms for heterogeneous vocabularies", ICML 2025): the draft's
distribution is restricted to the tokens both vocabularies hold and renormalised
(:func:`restrict`), its ids become the target's (a :class:`~edgespec.backend.vocab_map.
VocabMap`), and the target verifies as it verifies any draft. q is exactly the distribution
each proposal was drawn from, so rejection sampling stays lossless; greedy drafting takes the
draft's argmax over the shared tokens.

The draft reads the committed context in its own tokens (:class:`Translation`): a target token
it also holds is that token; a run of target tokens it lacks is re-tokenised by the draft's
tokenizer as one text (look-behind to the last shared token), so when the run grows its
draft tokens may change, and the drafter trims its cache to what still matches.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import numpy as np

from ..sampling import Dist

# A run of target tokens the draft lacks is re-tokenised whole for at most this many tokens;
# a longer run starts a new one (its head is kept as tokenised).
LOOK_BEHIND = 16


def restrict(q: Dist, to_target: np.ndarray) -> Optional[Dist]:
    """The draft's ``q`` (over its own ids) restricted to the ids that have a target
    counterpart, renormalised, over the target's ids; None when none of its mass is there."""
    if q.ids is None:       # a whole row: no ids to look up
        t = to_target[:q.probs.size]
    else:
        t = to_target[q.ids]
    live = t >= 0
    probs = q.probs[live]
    total = float(probs.sum())
    if total <= 0.0:
        return None
    return Dist(t[live], probs / total)


def _complete(raw: bytes) -> int:
    """How many leading bytes of ``raw`` end at a UTF-8 character boundary (a character
    whose last bytes have not come yet waits for them)."""
    i = len(raw) - 1
    while i >= 0 and len(raw) - i < 4 and raw[i] & 0xC0 == 0x80:
        i -= 1
    if i < 0 or raw[i] < 0xC0:
        return len(raw)
    need = 2 if raw[i] < 0xE0 else 3 if raw[i] < 0xF0 else 4
    return i if len(raw) - i < need else len(raw)


class Translation:
    """The committed context (target ids) as the draft reads it (draft ids), kept up to date
    as the context grows and shrinks.

    ``piece(t)``: the text of target token ``t`` (control tokens as their text);
    ``tokenize(raw)``: the draft's tokens of ``raw`` (no BOS, control texts not parsed);
    ``bos``: the target's BOS id and what it becomes in the draft (its BOS when it adds one,
    else nothing).
    """

    def __init__(self, to_draft: np.ndarray, piece: Callable[[int], bytes],
                 tokenize: Callable[[bytes], list[int]], bos: tuple[int, list[int]]):
        self._to_draft = to_draft.tolist()      # Python ints: indexed once per token
        self._piece, self._tokenize = piece, tokenize
        self._bos, self._bos_out = bos
        self._src: list[int] = []       # target tokens translated
        self._out: list[int] = []       # their draft tokens
        self._ends: list[int] = []      # len(_out) after each target token (a run: its last)
        self._start: list[int] = []     # where each target token's run begins (itself: mapped)
        self.seconds = 0.0              # spent translating the context, cumulative
        # spent making each draft step's q over the shared tokens in the target's ids (the
        # drafter adds it: masking, restricting, mapping), cumulative
        self.q_seconds = 0.0

    def count_q_seconds(self, seconds: float) -> None:
        """A draft step's q over the target's ids took ``seconds`` (:attr:`q_seconds`)."""
        self.q_seconds += seconds

    def tokens(self, context: Sequence[int]) -> list[int]:
        """The draft's tokens for ``context`` (a list owned by this object: read, do not
        change it)."""
        t0 = time.perf_counter()
        n = len(self._src)
        if n > len(context) or (n and context[n - 1] != self._src[-1]) \
                or list(context[:n]) != self._src:
            self._cut(self._shared(context))
        for t in context[len(self._src):]:
            self._push(int(t))
        self.seconds += time.perf_counter() - t0
        return self._out

    def truncate(self, n: int) -> int:
        """Forget all but the first ``n`` target tokens; the draft length of what is kept."""
        t0 = time.perf_counter()
        if n < len(self._src):
            self._cut(n)
        self.seconds += time.perf_counter() - t0
        return len(self._out)

    def extend(self, tokens: Sequence[int]) -> list[int]:
        """The draft's tokens for ``tokens`` following the context, each on its own (a draft
        step's: its proposal and the tokens a grammar forces after it)."""
        t0 = time.perf_counter()
        out: list[int] = []
        for t in tokens:
            d = self._to_draft[t]
            out += [d] if d >= 0 else self._tokenize(self._piece(t))
        self.seconds += time.perf_counter() - t0
        return out

    # -- inside -----------------------------------------------------------------------------

    def _shared(self, context: Sequence[int]) -> int:
        n = min(len(self._src), len(context))
        for i in range(n):
            if self._src[i] != context[i]:
                return i
        return n

    def _cut(self, n: int) -> None:
        """Keep the first ``n`` target tokens: to the end of a shared token exactly, into a run
        by tokenising the run's kept part again."""
        if n == 0:
            self._src, self._out, self._ends, self._start = [], [], [], []
            return
        r = self._start[n - 1]
        redo = self._src[r:n] if r < n - 1 or self._to_draft[self._src[n - 1]] < 0 else []
        keep = r if redo else n
        del self._src[keep:], self._ends[keep:], self._start[keep:]
        del self._out[self._ends[-1] if keep else 0:]
        for t in redo:
            self._push(t)

    def _push(self, t: int) -> None:
        i = len(self._src)
        self._src.append(t)
        d = self._to_draft[t]
        if t == self._bos or d >= 0:
            self._out += self._bos_out if t == self._bos else [d]
            self._ends.append(len(self._out))
            self._start.append(i)
            return
        # A target token the draft lacks: its run (since the last shared token) as one text.
        r = i
        if i and self._to_draft[self._src[i - 1]] < 0 and self._src[i - 1] != self._bos:
            r = self._start[i - 1]
            if i - r >= LOOK_BEHIND:
                r = i
        base = self._ends[r - 1] if r else 0
        raw = b"".join(self._piece(s) for s in self._src[r:])
        del self._out[base:]
        self._out += self._tokenize(raw[:_complete(raw)])
        self._ends.append(len(self._out))
        self._start.append(r)
