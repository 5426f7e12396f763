"""Drafts from earlier requests: a suffix index over the prompts and answers a model has
seen, shared across requests (SuffixDecoding, Oliaro et al., NeurIPS 2025).

An app that regenerates an answer, an agent that repeats a step, a template filled again:
the next answer often repeats an earlier one. :class:`SuffixIndex` keeps the token
sequences of finished requests (prompt and answer), bounded in tokens, the oldest evicted
first. A lookup finds the earlier occurrences whose preceding tokens match the context's
end longest (every occurrence of the context's last ``anchor`` tokens is a candidate; its
match is extended backwards token by token), then walks forward through those occurrences
as a suffix tree would: each next token is the one most of the remaining occurrences agree
on, kept while the share that agrees with the whole path stays at least ``min_share``, and
the draft is at most ``factor`` × the match's length (a long match predicts a long
continuation; a three-token match, a short one).

Drafts are free and deterministic (q one-hot), so they are lossless as every n-gram draft
is: the target's verification decides every token. The index only changes how fast an
answer comes, never what it is. That speed is still information: a user who sees an answer
arrive fast learns that the text was asked before. On a server with several API keys each
key gets its own index unless the operator shares one (``edgespec serve
--shared-suffix-index``).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Optional, Sequence

ANCHOR = 3              # tokens of the context's end every candidate matches at least
MAX_TOKENS = 1 << 18    # tokens the index keeps (about 40 MB of Python objects at most)
MAX_CANDIDATES = 64     # most recent occurrences of an anchor looked at
MAX_MATCH = 64          # a match is measured up to this many tokens back
FACTOR = 1.0            # a draft is at most this many times the match's length
MIN_SHARE = 0.1         # a token is drafted while this share of the matches agree with it


class SuffixIndex:
    """The earlier requests of one model (see the module docstring); safe to share between
    threads."""

    def __init__(self, max_tokens: int = MAX_TOKENS, anchor: int = ANCHOR,
                 factor: float = FACTOR, min_share: float = MIN_SHARE):
        self.max_tokens, self.anchor = max_tokens, anchor
        self.factor, self.min_share = factor, min_share
        self._docs: OrderedDict[int, list[int]] = OrderedDict()
        self._where: dict[tuple, list[tuple[int, int]]] = {}   # anchor -> (doc, position after)
        self._next_id = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, tokens: Sequence[int]) -> None:
        """Keep a finished request's tokens (its prompt and answer), evicting the oldest."""
        doc = [int(t) for t in tokens[-self.max_tokens:]]
        a = self.anchor
        if len(doc) <= a:
            return
        with self._lock:
            i, self._next_id = self._next_id, self._next_id + 1
            self._docs[i] = doc
            self.tokens += len(doc)
            where = self._where
            for p in range(a, len(doc)):
                key = tuple(doc[p - a:p])
                occ = where.get(key)
                if occ is None:
                    where[key] = [(i, p)]
                else:
                    occ.append((i, p))
                    if len(occ) > 2 * MAX_CANDIDATES:
                        del occ[:-MAX_CANDIDATES]
            while self.tokens > self.max_tokens:
                self._evict()

    def _evict(self) -> None:
        i, doc = self._docs.popitem(last=False)
        self.tokens -= len(doc)
        a = self.anchor
        for p in range(a, len(doc)):
            key = tuple(doc[p - a:p])
            occ = self._where.get(key)
            if occ is None:
                continue
            occ[:] = [o for o in occ if o[0] != i]
            if not occ:
                del self._where[key]

    def lookup(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """At most ``k`` tokens to follow ``context`` and the length of the match they
        continue (0: none)."""
        a = self.anchor
        if k <= 0 or len(context) < a:
            return [], 0
        key = tuple(int(t) for t in context[-a:])
        with self._lock:
            occ = self._where.get(key)
            if not occ:
                return [], 0
            found = [(self._docs[i], p) for i, p in occ[-MAX_CANDIDATES:]]
        # The longest match first: extend each occurrence's match backwards.
        n_ctx = len(context)
        best, cands = -1, []
        for doc, p in found:
            m, limit = a, min(MAX_MATCH, p, n_ctx)
            while m < limit and doc[p - m - 1] == context[n_ctx - m - 1]:
                m += 1
            if m > best:
                best, cands = m, [(doc, p)]
            elif m == best:
                cands.append((doc, p))
        if not cands:
            return [], 0
        # Forward, as down a suffix tree: the continuation most of the matches share.
        total, out = len(cands), []
        for j in range(min(k, max(1, int(self.factor * best)))):
            nexts = Counter(doc[p + j] for doc, p in cands if p + j < len(doc))
            if not nexts:
                break
            token, count = nexts.most_common(1)[0]
            if count < self.min_share * total:
                break
            out.append(token)
            cands = [(doc, p) for doc, p in cands if p + j < len(doc) and doc[p + j] == token]
        return out, best


class SuffixIndexes:
    """An Engine's suffix indexes, one per key (an API key's digest on a server; None: the
    Engine's own callers)."""

    def __init__(self, max_tokens: int = MAX_TOKENS):
        self.max_tokens = max_tokens
        self._by_key: dict[Optional[str], SuffixIndex] = {}
        self._lock = threading.Lock()

    def get(self, key: Optional[str] = None) -> SuffixIndex:
        with self._lock:
            index = self._by_key.get(key)
            if index is None:
                index = self._by_key[key] = SuffixIndex(self.max_tokens)
            return index

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in list(self._by_key.values()))
