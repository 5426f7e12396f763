"""The OpenAI wire format's responses: whole bodies, stream chunks, usage, log-probabilities,
tool calls, a thinking model's reasoning (``reasoning_content``, as llama.cpp's server and
DeepSeek's API send it), and the ``edgespec`` field that says how speculation did and, for
chat, what rendered the messages. Plain Python."""

from __future__ import annotations

import time
import uuid
from typing import Optional

from ...chat_template import ChatTemplate
from ..reply_fields import speculation, template_field


class Reply:
    """The identity shared by every body of one response: id, time, model; ``template``: the
    chat template that rendered a chat request's messages (its label goes in the ``edgespec``
    field, read once the generation has ended: a template that failed has fallen back)."""

    def __init__(self, kind: str, model: str, template: Optional[ChatTemplate] = None):
        self.kind = kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.template = template

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def edgespec(self, stats) -> dict:
        """The ``edgespec`` field of a whole response or a stream's last chunk."""
        return {**speculation(stats), **template_field(self.template)}

    # -- whole responses ------------------------------------------------------------------

    def response(self, gen, token_bytes) -> dict:
        """The body of a whole response; ``token_bytes(id)`` spells tokens for logprobs."""
        lp = self.logprobs(gen.logprobs, token_bytes)
        if self.kind == "chat":
            message: dict = {"role": "assistant", "content": gen.text}
            if gen.thinking:
                message["reasoning_content"] = gen.thinking
            if gen.tool_calls:
                message["content"] = gen.text or None
                message["tool_calls"] = [c.to_openai() for c in gen.tool_calls]
            choice = {"index": 0, "message": message, "logprobs": lp,
                      "finish_reason": gen.finish_reason}
            body = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": gen.text, "logprobs": lp,
                      "finish_reason": gen.finish_reason}
            body = self._base("text_completion")
        return {**body, "choices": [choice], "usage": usage(gen.stats),
                "edgespec": self.edgespec(gen.stats)}

    def logprobs(self, entries, token_bytes) -> Optional[dict]:
        """OpenAI's logprobs object for these :class:`~edgespec.results.TokenLogprob`s:
        chat's ``{"content": [{token, logprob, bytes, top_logprobs}]}``, or the completions
        API's parallel lists."""
        if entries is None:
            return None

        def spell(t: int) -> tuple[str, list[int]]:
            b = token_bytes(t)
            return b.decode("utf-8", "replace"), list(b)
        if self.kind == "chat":
            content = []
            for e in entries:
                text, raw = spell(e.token)
                top = [{"token": spell(t)[0], "logprob": lp, "bytes": spell(t)[1]}
                       for t, lp in e.top]
                content.append({"token": text, "logprob": e.logprob, "bytes": raw,
                                "top_logprobs": top})
            return {"content": content}
        tokens = [spell(e.token)[0] for e in entries]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{spell(t)[0]: lp for t, lp in e.top} for e in entries],
                "text_offset": offsets}

    # -- stream chunks --------------------------------------------------------------------

    def chunk(self, text: Optional[str], *, first: bool = False,
              finish: Optional[str] = None, include_usage: bool = False,
              logprobs: Optional[dict] = None, tool_calls: Optional[list] = None,
              edgespec: Optional[dict] = None, thinking: str = "") -> dict:
        """A chunk with ``text`` and (chat) ``thinking``, the reasoning (the role goes in the
        first delta only); ``edgespec``: how its token came (:func:`token_event`), a field
        OpenAI clients ignore."""
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": text or ""} if first else \
                ({"content": text} if text is not None and (text or not thinking) else {})
            if thinking:
                delta["reasoning_content"] = thinking
            if tool_calls:
                delta = {"tool_calls": [{"index": i, **c.to_openai()}
                                        for i, c in enumerate(tool_calls)]}
            choice = {"index": 0, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish}
            body = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs,
                      "finish_reason": finish}
            body = self._base("text_completion")
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None     # as OpenAI: null on every chunk but the usage chunk
        if edgespec is not None:
            body["edgespec"] = edgespec
        return body

    def final_chunk(self, gen, include_usage: bool) -> dict:
        body = self.chunk(None, finish=gen.finish_reason, include_usage=include_usage)
        body["edgespec"] = self.edgespec(gen.stats)
        return body

    def usage_chunk(self, gen) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage(gen.stats),
                "edgespec": self.edgespec(gen.stats)}


def token_event(event, token_bytes) -> dict:
    """What a streamed chunk says of its token: ``draft`` (proposed by the draft and accepted
    by the target, or the target's own), and on a token that ends a verify round, the round:
    the drafted tokens' texts, how many were accepted, this token's text, the drafts'
    source."""
    out: dict = {"draft": event.from_draft}
    r = event.round
    if r is not None:
        def spell(t: int) -> str:
            return token_bytes(t).decode("utf-8", "replace")
        out["round"] = {"drafted": [spell(t) for t in r.drafted], "accepted": r.accepted,
                        "token": spell(event.token), "source": r.source}
    return out


def usage(stats) -> dict:
    cached = max(0, stats.prompt_tokens - stats.prompt_tokens_evaluated)
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
            "total_tokens": stats.prompt_tokens + stats.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}
