"""Chat messages → prompt text, with the model's own GGUF chat template.

A GGUF's ``tokenizer.chat_template`` is code written by whoever made the file. It is rendered
only in jinja2's ``ImmutableSandboxedEnvironment`` (CVE-2024-34359 was llama-cpp-python
rendering it without one), and under limits: template size, output size and wall time, checked
at every call, attribute access, arithmetic operator and output chunk. A template that breaks a
rule or fails to render is replaced by the ChatML fallback with a warning, so a hostile file
can neither run code nor hang the program.

:class:`Conversation` holds one chat's messages for any shell: interrupted answers, dropping
the oldest turns when the context is full, and saving to / loading from JSON.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from .errors import ContextOverflowError, EdgespecError, InvalidParameterError

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")

MAX_TEMPLATE_BYTES = 256 * 1024
MAX_OUTPUT_CHARS = 4 * 1024 * 1024
MAX_INPUT_CHARS = MAX_OUTPUT_CHARS // 2
MAX_RENDER_SECONDS = 1.0

# llama.cpp's fallback when a model carries no template.
CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class TemplateError(Exception):
    """The template could not be rendered safely (reason in the message)."""


class PromptTooLargeError(EdgespecError):
    """The conversation is too large to be turned into a prompt."""


class TemplateRefused(EdgespecError):
    """The model's own template rejected the conversation (its ``raise_exception``)."""


def validate_messages(messages: Any) -> list[dict[str, str]]:
    """Check a list of ``{"role", "content"}`` dicts; return plain copies."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidParameterError("messages", type(messages).__name__,
                                    "a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidParameterError(f"messages[{i}]", m, "an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise InvalidParameterError(f"messages[{i}].role", role, "one of " + ", ".join(ROLES))
        if not isinstance(content, str):
            raise InvalidParameterError(f"messages[{i}].content", content, "a string")
        out.append({"role": role, "content": content})
    return out


class _LimitedSandbox(ImmutableSandboxedEnvironment):
    """A sandbox that also enforces a deadline and output-size limits."""

    intercepted_binops = frozenset({"*", "**", "+", "//", "%"})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.deadline = float("inf")

    def _tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"rendering took longer than {MAX_RENDER_SECONDS:g} s")

    def unsafe_undefined(self, obj, attribute):
        # The stock sandbox returns an undefined value that prints as ''; a template that
        # reaches for internals is hostile, so fail loudly and fall back instead.
        raise SecurityError(f"access to {attribute!r} of a {type(obj).__name__} is not allowed")

    def call(self, __context, __obj, *args, **kwargs):
        self._tick()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj, attribute):
        self._tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        self._tick()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        self._tick()
        if operator == "+" and isinstance(left, (str, list, tuple)) and \
                isinstance(right, (str, list, tuple)) and \
                len(left) + len(right) > MAX_OUTPUT_CHARS:
            raise TemplateError("template builds an oversized value")
        if operator in ("*", "**"):
            for a, b in ((left, right), (right, left)):
                if isinstance(a, (str, list, tuple)) and isinstance(b, int) and \
                        len(a) * max(b, 0) > MAX_OUTPUT_CHARS:
                    raise TemplateError("template builds an oversized value")
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise TemplateError("template computes an oversized power")
        return super().call_binop(context, operator, left, right)


def _raise_exception(message: str) -> None:
    raise TemplateRefused(f"the model's chat template refused this conversation: {message}")


class ChatTemplate:
    """A compiled chat template with its special-token strings."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.bos_token, self.eos_token = bos_token, eos_token
        self.env = _LimitedSandbox(trim_blocks=True, lstrip_blocks=True,
                                   extensions=["jinja2.ext.loopcontrols"])
        self.env.globals.update(raise_exception=_raise_exception,
                                strftime_now=lambda fmt: datetime.now().strftime(fmt))
        self.fallback_reason: str | None = None
        self.source = source
        if source is None:
            self.fallback_reason = "the model has no chat template"
        elif len(source.encode("utf-8", "replace")) > MAX_TEMPLATE_BYTES:
            self.fallback_reason = f"its chat template is larger than {MAX_TEMPLATE_BYTES} bytes"
        else:
            try:
                self._template = self.env.from_string(source)
            except jinja2.TemplateError as e:
                self.fallback_reason = f"its chat template does not compile ({e})"
        if self.fallback_reason:
            self._template = self.env.from_string(CHATML)

    @property
    def is_fallback(self) -> bool:
        return self.fallback_reason is not None

    def render(self, messages: Sequence[Mapping[str, str]],
               add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (validated) ending with the assistant's cue."""
        msgs = validate_messages(messages)
        size = sum(len(m["content"]) for m in msgs)
        if size > MAX_INPUT_CHARS:
            # Too big for any template's limits (and far beyond any context window): the
            # conversation is at fault, not the template, so do not fall back for good.
            raise PromptTooLargeError(f"the conversation is {size} characters; the most one "
                                      f"prompt may hold is {MAX_INPUT_CHARS}")
        try:
            return self._render(self._template, msgs, add_generation_prompt)
        except (TemplateError, SecurityError, jinja2.TemplateError, TypeError, ValueError,
                AttributeError, KeyError, IndexError, RecursionError, OverflowError) as e:
            if self.is_fallback:
                raise PromptTooLargeError(f"the conversation could not be rendered ({e})") \
                    from None
            log.warning("chat template of this model failed (%s); using the ChatML fallback", e)
            self.fallback_reason = f"its chat template failed to render ({e})"
            self._template = self.env.from_string(CHATML)
            return self._render(self._template, msgs, add_generation_prompt)

    def _render(self, template: jinja2.Template, msgs: list[dict[str, str]],
                add_generation_prompt: bool) -> str:
        self.env.deadline = time.monotonic() + MAX_RENDER_SECONDS
        parts: list[str] = []
        size = 0
        try:
            for chunk in template.generate(messages=msgs,
                                           add_generation_prompt=add_generation_prompt,
                                           bos_token=self.bos_token, eos_token=self.eos_token):
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise TemplateError("template output is larger than "
                                        f"{MAX_OUTPUT_CHARS} characters")
                self.env._tick()
                parts.append(chunk)
        finally:
            self.env.deadline = float("inf")
        return "".join(parts)


def join_system(messages: Iterable[Mapping[str, str]], system: str | None) -> list[dict]:
    """``messages`` with ``system`` as the first (system) message, replacing any other."""
    rest = [dict(m) for m in messages if m.get("role") != "system"]
    return ([{"role": "system", "content": system}] if system else []) + rest


# ---------------------------------------------------------------------------------------------
# Conversation state (UI-independent: the terminal chat and any other shell can keep one)


class ConversationFileError(EdgespecError):
    """A saved conversation could not be read or written."""


CONVERSATION_FORMAT = "edgespec-conversation"


class Conversation:
    """The messages of one chat: a system prompt kept apart, then user/assistant turns.

    An answer stopped by the user stays in the conversation with ``"interrupted": True``; the
    model sees its text as it was produced. A turn is a user message and the messages after it
    up to the next user message. When the context would overflow, :meth:`make_room` drops
    whole turns from the oldest; the system prompt is never dropped.
    """

    def __init__(self, system: str | None = None, messages: Iterable[Mapping] = ()):
        self.system = system or None
        self.messages: list[dict] = [dict(m) for m in messages]

    # -- editing --------------------------------------------------------------------------

    def add_turn(self, user: str, answer: str, interrupted: bool = False) -> None:
        self.messages.append({"role": "user", "content": user})
        reply = {"role": "assistant", "content": answer}
        if interrupted:
            reply["interrupted"] = True
        self.messages.append(reply)

    def reset(self) -> None:
        """Forget every turn; keep the system prompt."""
        self.messages.clear()

    @property
    def n_turns(self) -> int:
        return sum(m["role"] == "user" for m in self.messages)

    def drop_oldest_turn(self) -> None:
        if self.messages:
            del self.messages[0]
        while self.messages and self.messages[0]["role"] != "user":
            del self.messages[0]

    # -- what the model sees --------------------------------------------------------------

    def for_model(self, pending: str | None = None) -> list[dict[str, str]]:
        """``{"role", "content"}`` messages: system prompt, turns, then ``pending`` (user)."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        out += [{"role": m["role"], "content": m["content"]} for m in self.messages]
        if pending is not None:
            out.append({"role": "user", "content": pending})
        return out

    def make_room(self, pending: str, count: Callable[[list[dict]], int], budget: int,
                  limit: int) -> int:
        """Drop the oldest turns until the conversation with ``pending`` counts at most
        ``budget`` tokens (``count`` gives the exact prompt length); return how many turns
        were dropped. If every turn is dropped and it still exceeds ``budget``, it is enough
        to stay below ``limit`` (the context size). A ``pending`` message that cannot fit
        even alone raises :class:`ContextOverflowError` and leaves the conversation as is.
        """
        n = count(self.for_model(pending))
        if n <= budget:
            return 0
        trial = Conversation(self.system, self.messages)
        dropped = 0
        while trial.messages and n > budget:
            trial.drop_oldest_turn()
            dropped += 1
            n = count(trial.for_model(pending))
        if n >= limit:
            raise ContextOverflowError(n, limit)
        self.messages = trial.messages
        return dropped

    # -- files ----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"format": CONVERSATION_FORMAT, "version": 1, "system": self.system,
                "messages": [dict(m) for m in self.messages]}

    @classmethod
    def from_dict(cls, data: Any) -> "Conversation":
        """A conversation from :meth:`to_dict`'s shape, or from a plain list of messages."""
        if isinstance(data, list):
            data = {"messages": data}
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise ValueError("expected an object with a 'messages' list, or a list of messages")
        system = data.get("system")
        if system is not None and not isinstance(system, str):
            raise ValueError("'system' must be a string")
        messages = []
        for i, m in enumerate(data["messages"]):
            if not isinstance(m, dict) or m.get("role") not in ROLES or \
                    not isinstance(m.get("content"), str):
                raise ValueError(f"message {i + 1} needs a role ({', '.join(ROLES)}) and a "
                                 "text content")
            if m["role"] == "system":
                system = system if system is not None else m["content"]
                continue
            msg = {"role": m["role"], "content": m["content"]}
            if m.get("interrupted") is True:
                msg["interrupted"] = True
            messages.append(msg)
        return cls(system, messages)

    def save(self, path: str | os.PathLike) -> None:
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.to_dict(), f, ensure_ascii=False, indent=1)
                f.write("\n")
        except OSError as e:
            raise ConversationFileError(f"cannot write {path}: {e.strerror or e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Conversation":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise ConversationFileError(f"cannot read {path}: {e.strerror or e}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConversationFileError(f"{path}: not a JSON conversation ({e})") from None
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ConversationFileError(f"{path}: not a conversation ({e})") from None
