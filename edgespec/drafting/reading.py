"""What a draft model's cache reads, and whether bringing it up to date pays: :class:`Reading`.

The draft never delays the target's first token (the loop takes it from the prompt pass's
last row, without asking the drafter), and a draft cache far behind the context (a long
prompt, a long n-gram run) catches up one chunk per round, between target steps, and only
while the cost model says that drafting for the rest of the answer repays what catching up
costs. It may read a long prompt through a window, its first tokens and its last few hundred,
when that is expected to save more time than the acceptance it costs (docs/decisions.md, "The
first token of a long prompt"). After plain rounds within an answer the draft drafts again
only when this round's expected saving repays evaluating what those rounds committed
(docs/decisions.md, "Returning to drafting must pay for itself"). What the draft reads changes
only how fast the answer comes, never what it is.

Every judgement here is the length policy's cost oracle's (its ``economics``,
:class:`~.economics.DraftEconomics`); a policy without one (a pinned draft length) reads the
whole context, catches up whenever it is behind and drafts again at once.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from ..errors import BackendError, RPCError
from ..lm import LanguageModel
from ..prompt_cache import common_prefix
from .base import Draft, LengthPolicy
from .cross_vocab import Translation


class Reading:
    """The draft model's cache against the committed context, for one :class:`~.model.
    ModelDrafter`: how far behind it is, what it reads (the whole context or a window of a
    long prompt, in the draft's own tokens), what catching up costs, and whether it pays.

    Its cache holds a prefix of what it reads; the missing tail (at least the last committed
    token) is fed at the start of the next draft (:meth:`unread`). A hybrid drafter asks
    :meth:`behind`, :meth:`catch_up`, :meth:`catch_up_seconds` and :meth:`tokens_ahead`.
    """

    # A cache more than this many tokens behind the context catches up this many per round (a
    # plain round for the draft): a chunk batches well, and the answer's tokens keep flowing.
    CATCH_UP_CHUNK = 64
    # How fast the typical answer length (what catching up is repaid over) follows new answers.
    ANSWER_EMA = 0.3
    # A long prompt may be read through a window: its first HEAD tokens and its last W, for
    # these W, each keeping this share of the acceptance the whole prompt gives (the least
    # of both registry pairs, scripts/bench_draft_window.py, docs/decisions.md).
    HEAD = 32
    WINDOWS = ((256, 0.80), (1024, 0.90))
    # Until a catch-up was measured, a prompt token is taken to cost this share of a draft
    # step (measured: 0.2-0.4 on both pairs); the first chunk measures it.
    PROMPT_TOKEN_SHARE = 0.5

    def __init__(self, model: LanguageModel, policy: LengthPolicy,
                 translation: Optional[Translation] = None,
                 donor: Optional[LanguageModel] = None):
        self.model, self.policy = model, policy
        # The target's cache, when the draft is the target's network at another precision:
        # its cells for the context are copied in (:meth:`_take_donors`) instead of read.
        self.donor = donor
        self.taken = 0          # tokens taken from the donor, cumulative
        # The host buffer the donor's cells pass through, kept from copy to copy: touching new
        # memory of tens of MB cost up to sixty times the copy (docs/decisions.md).
        self._buffer = np.empty(0, dtype=np.uint8)
        # Seconds per token of the donor's context to copy its cells (all of them are
        # copied: llama.cpp copies a sequence whole); None until a copy was measured.
        self.take_cost: Optional[float] = None
        # Across vocabularies: the context in the draft's tokens (positions in the cache are
        # then the draft's own tokens').
        self.translation = translation
        # Seconds per token to bring the cache up to the context after others committed
        # tokens it has not seen (n-gram rounds); None until measured on a batch of 4+.
        self.catch_up_cost: Optional[float] = None
        # The generation in progress: where it started and must end (context lengths) and the
        # committed length last seen. The typical answer's length in tokens (None until one
        # answer ended).
        self._start, self._limit = 0, float("inf")
        self._seen = 0
        self.answer_tokens: Optional[float] = None
        # The context the cache leaves out, [a, b), when a window was chosen (the cache holds
        # context[:a] + context[b:]); whether this generation chose already.
        self._skip: Optional[tuple[int, int]] = None
        self._chosen = False
        self._plain_rounds = 0      # plain rounds of this answer since the model last drafted

    # -- following the generation ---------------------------------------------------------

    def begin(self, context: Sequence[int], limit: int) -> None:
        """A generation starts after ``context`` and ends by the time the context is ``limit``
        tokens long (:meth:`~.base.Drafter.begin`); the last one's length is learned."""
        if self._seen > self._start:        # the previous answer's length, learned
            n = self._seen - self._start
            # An answer cut by its budget was at least that long: it may raise the typical
            # length, never lower it (a short title or a warm-up must not make catching up
            # look unpaid for the next long answer).
            cut = self._seen >= self._limit
            if not cut or self.answer_tokens is not None and n > self.answer_tokens:
                self.answer_tokens = (n if self.answer_tokens is None else self.answer_tokens
                                      + self.ANSWER_EMA * (n - self.answer_tokens))
        self._start = self._seen = len(context)
        self._limit = limit
        self._plain_rounds = 0
        if self._skip is not None:      # a window of the last conversation: read afresh
            self.model.truncate(min(len(self.model.tokens), self._skip[0]))
        self._skip, self._chosen = None, False

    def after_round(self, drafted: bool) -> None:
        """A round ended: the model ``drafted`` in it, or the round was another source's or
        plain."""
        self._plain_rounds = 0 if drafted else self._plain_rounds + 1

    def rollback(self, n_keep: int) -> None:
        """The committed context is its first ``n_keep`` tokens plus one (the loop's
        :meth:`~.base.Drafter.rollback`): the cache keeps no more than it."""
        self._seen = n_keep + 1
        if self.translation is not None:
            # The cache may keep what it holds past the translation known so far (the
            # accepted drafts): the next draft trims it where it stops matching (_view).
            n = self.translation.truncate(n_keep)
            if self._skip is not None and n < self._skip[1]:
                self.model.truncate(min(n, self._skip[0]))
                self._skip = None
            return
        if self._skip is not None and n_keep < self._skip[1]:
            self.model.truncate(min(n_keep, self._skip[0]))     # back into the window's gap
            self._skip = None
        else:
            self.model.truncate(self._seen_len(n_keep))

    # -- a drafting round -----------------------------------------------------------------

    def tokens(self, context: Sequence[int]) -> Sequence[int]:
        """The context in the draft's tokens."""
        return context if self.translation is None else self.translation.tokens(context)

    def unread(self, context: Sequence[int]) -> Sequence[int]:
        """What the draft's first step evaluates: the tokens of what it reads that its cache
        lacks, the last one at least (the cache is trimmed to leave it out); empty only for
        an empty context."""
        if self._lag(context) > 1:
            # A short prompt, or the tokens of plain and n-gram rounds: the target's cells are
            # taken where copying them costs less than reading (reading a batch costs a
            # quantised draft as much as the F32 target, ~2.4 ms a token for SmolLM2 Q8_0).
            self._take_donors(context)
        seen = self._view(context)
        if not seen:
            return seen
        m = self.model
        n_cached = len(m.tokens)
        assert m.tokens == seen[:n_cached], "draft cache diverged from the context"
        if n_cached == len(seen):       # (across vocabularies: the last token added none)
            n_cached -= 1
            m.truncate(n_cached)
        return seen[n_cached:]

    def reentry_pays(self, lag: int, planned: int) -> bool:
        """Whether drafting ``planned`` tokens again after plain rounds of this answer is
        worth it: the first step must then also evaluate the tokens those rounds committed
        (``lag`` tokens where one is the rule), and a batch of a few tokens costs a small model
        about a step per token on a CPU (docs/decisions.md). This round's expected saving must
        repay that, or the round stays plain: a pair that barely pays would otherwise lose
        more on each return than its drafts gain. (The prompt's tokens are not counted:
        reading them is repaid over the whole answer, :meth:`catch_up_worth`.)"""
        extra = min(lag - 1, self._plain_rounds)
        if extra <= 0:
            return True
        economics = self.policy.economics
        if economics is None:       # no estimate: a pinned draft length drafts regardless
            return True
        tokens, seconds = economics.expected_round(max(1, planned))
        return tokens * economics.pass_seconds(1) > seconds + extra * self._token_seconds()

    def measured(self, lag: int, seconds: float) -> None:
        """Evaluating ``lag`` context tokens (and a step's logits) took ``seconds``. A batch
        of tokens never costs more than that many single draft steps: a figure above that
        was a stall (the machine busy, a page fault), and kept, it would make catching up
        look too dear to ever be tried and corrected again, so it is cut to a step's cost."""
        if lag >= 4:
            per_token = seconds / lag
            if self.policy.economics is not None:
                per_token = min(per_token, self.policy.economics.step_seconds())
            self.catch_up_cost = (per_token if self.catch_up_cost is None else
                                  self.catch_up_cost + 0.2 * (per_token - self.catch_up_cost))

    # -- catching up ------------------------------------------------------------------------

    def behind(self, context: Sequence[int]) -> bool:
        """Whether this round is a plain one for the model: its cache is more than a chunk
        behind. (The first token never waits for the draft: the loop gives it from the
        prompt pass, or from a plain first round, without asking the drafter.) A cache that
        can take the target's cells for the context is brought up to it first: then it is
        not behind."""
        if self._lag(context) <= self.CATCH_UP_CHUNK:
            return False
        return not self._take_donors(context)

    def _take_donors(self, context: Sequence[int]) -> bool:
        """Copy the target's cells for the context into the draft's cache (the same network
        at another precision: the cells fit, and are the better ones, computed at the target's
        precision); True when the cache then holds all but the last few tokens. The target
        holds the committed context but its last token or two between rounds; a copy costs
        ~0.005 ms a token through the kept buffer (SmolLM2, 2 cores), where reading costs the
        draft 2.4 ms a token in a batch, a step for the second of two (docs/decisions.md,
        "cell-copies"). Not across vocabularies, nor with a window of the prompt chosen.
        A copy llama.cpp refuses turns the donor off: the cache is read as before."""
        donor = self.donor
        if donor is None:
            return False
        copy = self._copy_seconds(len(donor.tokens))
        if copy is not None and (self.catch_up_cost is not None
                                 or self.policy.economics is not None):
            # A long context a few tokens or chunks ahead of the cache (after n-gram rounds)
            # may be cheaper to read than to copy whole.
            if copy > self._lag(context) * self._token_seconds():
                return False
        n = self._donor_holds(context)
        if n is None:
            return False
        t0 = time.perf_counter()
        try:
            self.model.restore_state(donor.save_state(self._scratch))
        except RPCError:
            raise           # a worker that stopped answering is the stream's error, not a refusal
        except BackendError:
            self.donor = None
            self.model.truncate(0)
            return False
        per_token = (time.perf_counter() - t0) / n
        self.take_cost = (per_token if self.take_cost is None
                          else self.take_cost + 0.2 * (per_token - self.take_cost))
        self.taken += n
        return self._lag(context) <= self.CATCH_UP_CHUNK

    def catch_up(self, context: Sequence[int], worth: Optional[bool] = None) -> Draft:
        """A plain round while :meth:`behind`: one chunk of the context the cache lacks is
        evaluated when catching up is ``worth`` it (default: this reading's own judgement,
        :meth:`catch_up_worth`)."""
        t0 = time.perf_counter()
        d = Draft()
        if worth if worth is not None else self.catch_up_worth(context):
            n = len(self.model.tokens)
            chunk = list(self._view(context)[n:n + self.CATCH_UP_CHUNK])
            self.model.eval(chunk, 0)
            self.measured(len(chunk), time.perf_counter() - t0)
            d.count_catch_up(len(chunk))
        d.took(time.perf_counter() - t0)
        return d

    def catch_up_worth(self, context: Sequence[int]) -> bool:
        """Whether bringing the cache up to the context is repaid by drafting for the rest of
        the answer (the tokens decoded plainly while catching up not counted). The first time
        in a generation, a window of a long prompt may be chosen (:meth:`_choose_window`).
        Unmeasured (neither here nor by the calibration), one chunk is the measurement, when
        drafting pays at all. A pinned length always catches up (:class:`~.policy.FixedLength`)."""
        if not self._chosen:
            self._chosen = True
            self._choose_window(context)
        economics = self.policy.economics
        if economics is None:
            # A pinned length has no cost model: it catches up whatever the typical answer's
            # length (a learned guess that a few short answers, stopped early, would lower
            # until a long prompt were never read), while the generation may still make some.
            return self._limit - len(context) > 1
        lag = self._lag(context)
        ahead = self.tokens_ahead(len(context)) - lag / self.CATCH_UP_CHUNK
        if ahead <= 1:
            return False
        seconds = self.catch_up_seconds(context)
        return economics.catch_up_pays(seconds or 0.0, ahead)

    def catch_up_seconds(self, context: Sequence[int]) -> Optional[float]:
        """What bringing this cache up to the context would cost: evaluating the tokens it
        has not seen, or copying the target's cells for them where that is cheaper (None: not
        measured yet, or only a few tokens behind). Reading is priced as this cache's catch-ups
        measured it, or, before the first, as the calibration did (:meth:`_read_seconds`)."""
        lag = self._lag(context)
        if lag < 4:
            return None
        n = self._donor_holds(context)
        copy = self._copy_seconds(n) if n is not None else None
        per_token = self._read_seconds()
        read = lag * per_token if per_token is not None else None
        if n is not None and copy is None:
            return None         # a copy not measured yet: the first one measures it
        if copy is not None:
            return copy if read is None else min(read, copy)
        return read

    def tokens_ahead(self, position: int) -> float:
        """How many more tokens this answer is expected to have at ``position`` (a context
        length), within what the generation may still make: what the typical answer has
        left, or, past the typical length, as many as it has made so far."""
        left = self._limit - position
        if self.answer_tokens is None:
            return left
        made = position - self._start
        return min(left, max(self.answer_tokens - made, made))

    # -- inside -----------------------------------------------------------------------------

    def _choose_window(self, context: Sequence[int]) -> None:
        """Read the prompt whole, or through a window (its first HEAD tokens, its last W):
        whichever the cost model expects to save the most over the rest of the answer, the
        saving at a window's acceptance less what reading it costs. Only under a cost model
        (a pinned draft length reads the whole prompt)."""
        n, size = len(self.model.tokens), len(self.tokens(context))     # (the draft's tokens)
        ahead = self.tokens_ahead(len(context))

        economics = self.policy.economics
        if economics is None:   # no estimate: the whole prompt
            return

        def net(read: int, keep: float) -> float:
            saving = economics.saving(ahead - read / self.CATCH_UP_CHUNK, keep)
            return saving - read * self._token_seconds()

        best, choice = net(size - n, 1.0), None
        a = max(n, self.HEAD)
        for w, keep in self.WINDOWS:
            b = size - w
            if b - a > self.CATCH_UP_CHUNK:
                value = net(a - n + w, keep)
                if value > best:
                    best, choice = value, (a, b)
        self._skip = choice

    def _scratch(self, size: int) -> np.ndarray:
        """At least ``size`` bytes for a copy of the donor's cells, reused (grown by a
        quarter more than asked, so that a growing context seldom allocates again)."""
        if self._buffer.size < size:
            self._buffer = np.empty(size + size // 4, dtype=np.uint8)
        return self._buffer

    def _donor_holds(self, context: Sequence[int]) -> Optional[int]:
        """How many tokens of the context the target's cache holds beyond this one's, when
        they can be copied in (None: no donor, none ahead, or a window or another vocabulary
        read)."""
        donor = self.donor
        if donor is None or self.translation is not None or self._skip is not None:
            return None
        held = donor.tokens
        n = len(held)
        if n <= len(self.model.tokens) or n > len(context) or common_prefix(held, context) < n:
            return None
        return n

    def _copy_seconds(self, n: int) -> Optional[float]:
        """Seconds to copy the target's ``n`` cells (None until a copy was measured)."""
        return None if self.take_cost is None else n * self.take_cost

    def _read_seconds(self) -> Optional[float]:
        """Seconds per context token this cache reads in a batch: as its catch-ups measured
        it, else as the calibration measured the draft reading its probe (so that no user's
        request pays for the first measurement: a 64-token chunk of the 0.5B Qwen costs 0.3 s
        on 2 cores, where the answer may not repay it); None when neither has."""
        if self.catch_up_cost is not None:
            return self.catch_up_cost
        economics = self.policy.economics
        return economics.read_seconds() if economics is not None else None

    def _token_seconds(self) -> float:
        """Seconds to evaluate one context token on the draft: as measured, or a share of a
        draft step until then (asked only under a cost model, which knows the step's)."""
        return self._read_seconds() or (self.PROMPT_TOKEN_SHARE
                                      * self.policy.economics.step_seconds())

    def _view(self, context: Sequence[int]) -> Sequence[int]:
        """The context as the draft reads it (all of it, or the window chosen), in its own
        tokens. Across vocabularies the cache is first trimmed to what still matches it (a
        re-tokenised run, drafts that were rejected)."""
        seen = self.tokens(context)
        if self._skip is not None:
            a, b = self._skip
            seen = list(seen[:a]) + list(seen[b:])
        if self.translation is not None:
            m = self.model
            n = len(m.tokens)
            if m.tokens != seen[:n]:
                m.truncate(common_prefix(m.tokens, seen))
        return seen

    def _seen_len(self, n: int) -> int:
        """How long the first ``n`` context tokens are as the draft reads them (the same
        vocabulary)."""
        return n if self._skip is None else n - (self._skip[1] - self._skip[0])

    def _lag(self, context: Sequence[int]) -> int:
        if self.translation is not None:
            return len(self._view(context)) - len(self.model.tokens)
        return self._seen_len(len(context)) - len(self.model.tokens)
