"""Bytes of tokens → text chunks that are always whole characters and never show a stop string.

A token may end in the middle of a UTF-8 character (emoji, CJK) and a stop string may span
several tokens. :class:`TextAssembler` holds back exactly what could still turn out to be part
of either, so every chunk it releases is final: concatenating the chunks gives the same text as
decoding everything at once, cut before the first stop string.
"""

from __future__ import annotations

import codecs
from typing import Sequence


class TextAssembler:
    def __init__(self, stop: Sequence[str] = ()):
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Add a token's bytes; return the text that is now final ('' if none)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._release()

    def finish(self) -> str:
        """End of generation: return everything still held (minus a stop string).

        A character cut off by the end of generation (max_tokens in the middle of an emoji)
        is dropped rather than shown as U+FFFD: it never existed as text.
        """
        if self.stopped:
            return ""
        self._decoder.reset()
        out = self._release()
        out += self._pending
        self._pending = ""
        return out

    def _release(self) -> str:
        text = self._pending
        if not self.stop:
            self._pending = ""
            return text
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return text[:min(hits)]
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        self._pending = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold]
