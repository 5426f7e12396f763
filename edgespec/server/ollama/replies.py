"""Ollama's replies: stream chunks, final objects, load replies, errors, and the bodies of
``/api/tags``, ``/api/show``, ``/api/ps`` and ``/api/version``. Plain Python, no HTTP stack;
it mirrors :mod:`..openai.replies` (OpenAI's).

Replies are Ollama's newline-delimited JSON objects, checked against the official ``ollama``
client's types by the tests. Durations are in nanoseconds; ``prompt_eval_count`` is the whole
prompt, cached or not, as Ollama reports it since 0.2 (the cached part is
``prompt_eval_cached_count``, as in Ollama's newer releases). Tool calls are sent in Ollama's
shape (arguments as an object). A thinking model's reasoning is ``message.thinking`` in chat
and ``thinking`` beside ``response`` in generate, as Ollama sends it. Model names are listed
with a tag (``name:latest``), Ollama's convention, which apps display and send back.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from ... import __version__
from ...catalogue import ModelKind
from ...chat_template import ChatTemplate
from ..models_info import where
from ..reply_fields import rfc3339, speculation, template_field
from ..wire import APIError

# The Ollama version /api/version reports: clients compare it to enable features, and 0.12.11
# is the first whose API has every field edgespec serves (logprobs, structured output, tools).
OLLAMA_VERSION = "0.12.11"
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}   # as Ollama says
_MAX_DURATION_NS = 2 ** 63 - 1                       # Go's longest time.Duration ("forever")


def ollama_error_body(err: APIError) -> dict:
    """Ollama's error shape, which its clients raise as ``ResponseError``."""
    return {"error": err.message}


def calls_to_ollama(calls: Sequence) -> list[dict]:
    """:class:`~edgespec.tools.ToolCall`s in Ollama's shape: arguments as an object (with
    the call's id and index, as Ollama's newer releases send them)."""
    return [{"id": c.id, "function": {"index": i, "name": c.name,
                                      "arguments": c.parsed_arguments}}
            for i, c in enumerate(calls)]


def _at(epoch: Optional[float]) -> str:
    """An epoch time in seconds; None: forever, as Ollama writes it (now + Go's longest
    duration)."""
    if epoch is None:
        return rfc3339(time.time_ns() + _MAX_DURATION_NS)
    return rfc3339(int(epoch * 1e9))


def nanoseconds(seconds: float) -> int:
    """A duration as Ollama's replies give it: whole nanoseconds, never negative."""
    return max(0, round(seconds * 1e9))


def tagged_name(name: str) -> str:
    """A model's name as Ollama lists it, with a tag: ``x`` → ``x:latest`` (a name that has
    a tag keeps it)."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _details(entry) -> dict:
    details = {"parent_model": "", "format": "gguf", "family": "", "families": None,
               "parameter_size": "", "quantization_level": ""}
    details.update(entry.details or {})
    return details


def metrics(stats, total_seconds: float, load_seconds: float) -> dict:
    """The figures of a final reply, durations in nanoseconds. ``prompt_eval_count`` is the
    whole prompt and ``prompt_eval_duration`` the time spent on its uncached part, as Ollama
    reports them; a cache hit adds ``prompt_eval_cached_count``."""
    out = {"total_duration": nanoseconds(total_seconds),
           "load_duration": nanoseconds(load_seconds),
           "prompt_eval_count": stats.prompt_tokens,
           "prompt_eval_duration": nanoseconds(stats.prompt_seconds),
           "eval_count": stats.completion_tokens,
           "eval_duration": nanoseconds(stats.decode_seconds)}
    cached = max(0, stats.prompt_tokens - stats.prompt_tokens_evaluated)
    if cached:
        out["prompt_eval_cached_count"] = cached
    return out


class OllamaReply:
    """The bodies of one ``/api/chat`` (``kind`` "chat") or ``/api/generate`` ("generate")
    response: stream chunks, the final object, a load reply. ``model``: the name the request
    gave; ``token_bytes(id)`` spells tokens for logprobs (needed only when they were asked
    for); ``template``: the chat template that rendered the messages (None: a raw prompt), its
    label in the ``edgespec`` field (:func:`~..reply_fields.template_field`)."""

    def __init__(self, kind: str, model: str,
                 token_bytes: Optional[Callable[[int], bytes]] = None,
                 template: Optional[ChatTemplate] = None):
        self.kind = kind
        self.model = model
        self.token_bytes = token_bytes
        self.template = template

    def _body(self, text: str, tool_calls: Sequence = (), thinking: str = "") -> dict:
        body: dict = {"model": self.model, "created_at": rfc3339(time.time_ns())}
        if self.kind == "chat":
            message: dict = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = calls_to_ollama(tool_calls)
            body["message"] = message
        else:
            body["response"] = text
            if thinking:
                body["thinking"] = thinking
        return body

    def logprobs(self, entries: Sequence) -> list[dict]:
        """Ollama's ``logprobs``: per token ``{token, logprob, bytes, top_logprobs}``."""
        def one(token: int, logprob: float) -> dict:
            raw = self.token_bytes(token)
            return {"token": raw.decode("utf-8", "replace"), "logprob": logprob,
                    "bytes": list(raw)}
        return [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                for e in entries]

    def chunk(self, text: str, *, logprobs: Optional[Sequence] = None,
              tool_calls: Sequence = (), thinking: str = "") -> dict:
        """A stream chunk: a piece of text and of ``thinking``, the reasoning (with their
        tokens' :class:`~edgespec.results.TokenLogprob`s, if asked for) or, in chat, the
        calls the answer makes."""
        body = self._body(text, tool_calls, thinking)
        if logprobs:
            body["logprobs"] = self.logprobs(logprobs)
        body["done"] = False
        return body

    def final(self, gen, *, total_seconds: float, load_seconds: float = 0.0,
              streamed: bool) -> dict:
        """The last object: ``done``, why, the figures, and how speculation did
        (``edgespec``). Streamed, its text is empty (the chunks carried the text and the
        calls); else it holds the whole answer, its tool calls and logprobs."""
        body = self._body("", ()) if streamed else self._body(gen.text, gen.tool_calls,
                                                               gen.thinking)
        if not streamed and gen.logprobs is not None:
            body["logprobs"] = self.logprobs(gen.logprobs)
        body["done"] = True
        body["done_reason"] = DONE_REASONS.get(gen.finish_reason, gen.finish_reason)
        return {**body, **metrics(gen.stats, total_seconds, load_seconds),
                "edgespec": {**speculation(gen.stats), **template_field(self.template)}}

    def loaded(self, unloaded: bool = False) -> dict:
        """The reply to a load request (``done_reason`` "load"), or an unload ("unload")."""
        return {**self._body(""), "done": True, "done_reason": "unload" if unloaded else "load"}


def tags_body(entries: Sequence) -> dict:
    """``GET /api/tags``: the catalog's models (objects with ``name``, ``draft``, ``kind``,
    ``size``, ``modified`` (epoch seconds), ``digest``, ``details`` and ``store``)."""
    return {"models": [{"name": tagged_name(e.name), "model": tagged_name(e.name),
                        "modified_at": _at(e.modified), "size": e.size, "digest": e.digest,
                        "details": _details(e),
                        "edgespec": {"kind": e.kind,
                                     "draft": e.draft.name if e.draft else None, **where(e)}}
                       for e in entries]}


def ps_body(loaded: Sequence) -> dict:
    """``GET /api/ps``: the loaded models (objects with ``name``, ``entry`` (a catalog entry),
    ``size``, ``expires_at`` (epoch seconds; None: kept loaded, or in use) and ``n_ctx``
    (the context it was loaded with; None: unknown), as :class:`~..models.LoadedInfo`); in
    ``edgespec``, its ``draft`` and, when the draft was chosen here, ``draft_reason``."""
    models = []
    for m in loaded:
        described = getattr(m, "draft_choice", None)
        choice = described or {}
        body = {"name": tagged_name(m.name), "model": tagged_name(m.name), "size": m.size,
                "digest": m.entry.digest, "details": _details(m.entry),
                "expires_at": _at(m.expires_at), "size_vram": 0,
                "edgespec": {"draft": choice.get("draft") if described else
                             m.entry.draft.name if m.entry.draft else None,
                             "draft_reason": choice.get("reason")}}
        if m.n_ctx is not None:
            body["context_length"] = m.n_ctx
        models.append(body)
    return {"models": models}


def show_body(entry, info: dict, template: str, contexts: tuple, thinks: bool,
              fills: bool = False, draft_choice: Optional[dict] = None) -> dict:
    """``POST /api/show`` for a catalog entry. ``info``: :meth:`Engine.info() <edgespec.
    engine.Engine.info>` of the loaded pair ({} when the entry is not loaded); ``template``:
    the chat template (Jinja, not Ollama's Go templates); ``contexts``: the target's and the
    draft's (None: no draft model) contexts as served (loaded, or as it would load): the
    target's is ``<arch>.context_length``, so that apps size their prompts to it (the trained
    context and the draft's are in ``edgespec``); ``thinks``: its template has a thinking
    mode (the ``thinking`` capability); ``draft_choice``: the draft chosen for it here
    (:meth:`DraftChoice.describe() <edgespec.registry.auto_draft.DraftChoice.describe>`), its
    reason in ``edgespec.draft_reason``."""
    n_ctx, draft_ctx = contexts
    target = (info or {}).get("target") or {}
    arch = target.get("architecture") or (entry.details or {}).get("family") or "llama"
    model_info: dict = {"general.architecture": arch}
    if target.get("n_params"):
        model_info["general.parameter_count"] = target["n_params"]
    model_info[f"{arch}.context_length"] = n_ctx
    if target.get("n_vocab"):
        model_info[f"{arch}.vocab_size"] = target["n_vocab"]
    modelfile = (f"# Modelfile generated by edgespec\nFROM {entry.target}\n"
                 + (f"# draft model (edgespec): {entry.draft}\n" if entry.draft else "")
                 + f"PARAMETER num_ctx {n_ctx}\n")
    return {"modelfile": modelfile, "parameters": f"{'num_ctx':<30} {n_ctx}",
            "template": template, "details": _details(entry), "model_info": model_info,
            "capabilities": (["embedding"] if entry.kind is ModelKind.EMBEDDING
                             else ["completion", "tools", *(["insert"] if fills else []),
                                   *(["thinking"] if thinks else [])]),
            "modified_at": _at(entry.modified),
            "edgespec": {"kind": entry.kind, "target": str(entry.target), **where(entry),
                         "draft": str(entry.draft) if entry.draft else None,
                         "draft_reason": (draft_choice or {}).get("reason"),
                         "draft_choice": draft_choice,
                         "context_length_trained": target.get("n_ctx_train")
                         or entry.n_ctx_train or None,
                         "draft_context_length": draft_ctx, "pair": info}}


def version_body() -> dict:
    """``GET /api/version``: an Ollama version clients accept, and edgespec's own."""
    return {"version": OLLAMA_VERSION, "edgespec": __version__}
