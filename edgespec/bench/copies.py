"""What an answer's copies of its context could give: the passes of an n-gram drafter that knew
how far each of its matches runs.

The bound of perfect drafts (:meth:`~edgespec.drafting.costs.Costs.perfect_drafts`) prices
every token of an answer at a long pass's share, its new text included. This one asks the
context's own lookup (:func:`~edgespec.drafting.ngram.lookup`, as the n-gram drafter does) at
each pass: the pass drafts exactly the tokens of its match that the answer goes on with, and
its last row gives the token after them; a position with no match, or a match whose first
token is wrong, costs a one-row pass. What this reaches and the default does not is the
length policy's; what the perfect drafts' bound reaches and this does not is text the context
cannot predict (`edgespec bench --prompts tasks`, the ``copies`` column).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..drafting.ngram import NGRAM_MAX, NGRAM_MIN, WINDOW, lookup


def copy_passes(prompt: Sequence[int], answer: Sequence[int], max_rows: int,
                ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX,
                window: int = WINDOW) -> list[int]:
    """The rows of each verify pass that would decode ``answer`` after ``prompt`` with the
    context's matches drafted to exactly their agreeing length (at most ``max_rows`` - 1), by
    the n-gram drafter's own lookup settings unless given."""
    context = list(prompt)
    rows: list[int] = []
    i = 0
    while i < len(answer):
        x, _ = lookup(context, max_rows - 1, ngram_min, ngram_max, window)
        m = 0
        while m < len(x) and i + m < len(answer) and x[m] == answer[i + m]:
            m += 1
        rows.append(m + 1)
        context.extend(answer[i:i + m + 1])
        i += m + 1
    return rows


def in_one_row_passes(rows: Sequence[int], bare) -> float:
    """What passes of these ``rows`` cost, in one-row passes, by ``bare`` (seconds for a pass of
    n rows: :meth:`~edgespec.drafting.costs.Costs.bare`)."""
    if not rows:
        return 0.0
    return float(np.sum(bare(np.asarray(rows, dtype=float)))) / float(bare(1.0))
