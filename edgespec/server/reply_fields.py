"""What every API's replies share: the ``edgespec`` field (how speculation did on a request,
what rendered its messages) and times as RFC 3339 (Ollama's ``created_at``, the times OpenAI's
``/v1/models`` lists for Anthropic's clients). Plain Python, no HTTP stack."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional

from ..chat_template import ChatTemplate


def speculation(stats) -> dict:
    """The edgespec field of every response: how speculation did on this request, and how long
    its prompt took. ``speedup`` is None until the run gives evidence for one
    (GenerationStats.speedup_estimate); ``draft_length``: tokens drafted per round that
    drafted; ``first_token_seconds``: from the generation's turn (prompt processing) to its
    first token (0: none came); ``prompt_tokens_per_second``: prompt evaluation speed (of the
    tokens not found in a cache)."""
    drafting = stats.loop.rounds - stats.loop.plain_passes
    return {"speculative": stats.speculative, "drafted": stats.drafted,
            "accepted": stats.accepted, "acceptance_rate": round(stats.acceptance_rate, 4),
            "target_passes": stats.target_passes,
            "tokens_per_pass": round(stats.tokens_per_pass, 3),
            "tokens_per_second": round(stats.tokens_per_second, 2),
            "first_token_seconds": round(stats.first_token_seconds, 4),
            "prompt_tokens_per_second": round(stats.prompt_tokens_per_second, 2),
            "prompt_tokens_restored": stats.prompt_tokens_restored,
            "draft_length": round(stats.drafted / drafting, 3) if drafting else None,
            "tested_at": list(stats.tested_at), "accepted_at": list(stats.accepted_at),
            "speedup": round(x, 3) if (x := stats.speedup_estimate) is not None else None,
            "verdict": stats.verdict,
            "threads": {"target": stats.target_threads, "draft": stats.draft_threads or None}}


def template_field(template: Optional[ChatTemplate]) -> dict:
    """What rendered a chat request's messages, for its ``edgespec`` field: ``chat_template``
    is ``"model"`` (its own template), ``"none (plain text)"`` (a model without one: the
    messages' text, continued) or ``"fallback (ChatML)"``. Nothing for a raw prompt."""
    return {} if template is None else {"chat_template": template.label}


def rfc3339(ns: int) -> str:
    """A time in nanoseconds since the epoch as Ollama writes it: RFC 3339, UTC, with
    nanoseconds (``2024-07-22T20:33:28.123648000Z``)."""
    seconds, frac = divmod(ns, 10 ** 9)
    day = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{day}.{frac:09d}Z"
